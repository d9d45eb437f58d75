"""The train step's loss and gradients with cuDNN's fused attention against the einsum path.

    python benchmarks/gpu/train_attention_check.py --json   # on a GPU (issue 34's target)
    python benchmarks/gpu/train_attention_check.py --quick  # tiny, anywhere

Issue 34 asks that on a GPU the train step's loss and gradients with cuDNN attention (what
`model.attention_impl=auto` runs there in bfloat16) match the einsum reference within float
tolerance. The CPU tests can only run the cuDNN path's code through the XLA implementation of
the same JAX call (`tests/models/gpu_attention_test.py`); this runs the kernel itself.

One RL batch (CISPO through `rl.train_step.Trainer.loss_and_grads`, exactly what a step
differentiates: micro-batch loop, FP32 head, float32 masters) of rows with prompts and
completions of different lengths (padding where the trainer's batches have it), one random
model (seed 0, float32 masters), three ways:

  reference   float32 activations, einsum attention, float32 matmuls at full precision
              (not a GPU's default TF32): the truth
  einsum      bfloat16 activations, einsum attention (the CPU path at the paper's dtypes)
  cudnn       bfloat16 activations, cuDNN flash attention (on a GPU; elsewhere the same code
              through JAX's XLA implementation, as the CPU tests run it)

For each bf16 way: the loss's relative error against the reference, and the gradients'
(every parameter's gradient as one vector: the relative L2 error, and the largest per-tensor
max error relative to that tensor's largest entry). "Within float tolerance" is judged
against the einsum way's own bf16 error: cuDNN passes when its errors are at most
`TOLERANCE` times einsum's plus a small floor (bf16 rounding, not the kernel, sets both);
both ways against each other are reported too. Prints one line per way; `--json` one JSON
line last ({device, shape, ways: {einsum, cudnn: {loss_rel, grad_rel_l2, grad_max_rel}},
cudnn_vs_einsum, passed}).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

# cuDNN's errors against the float32 reference may be this many times the bf16 einsum
# path's (plus FLOOR): both are bf16 rounding of the same sums in another order.
TOLERANCE = 2.0
FLOOR = 1e-3


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny shapes, seconds, any platform")
  p.add_argument("--hidden", type=int, default=1024)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--kv-heads", type=int, default=8)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--intermediate", type=int, default=3072)
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--seq-len", type=int, default=1024)
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--generations", type=int, default=4)
  p.add_argument("--json", action="store_true", help="one JSON line last")
  args = p.parse_args(argv)
  if args.quick:
    args.hidden, args.layers, args.heads, args.kv_heads, args.head_dim = 64, 2, 4, 2, 16
    args.intermediate, args.vocab, args.seq_len = 128, 256, 48
  if args.heads % args.kv_heads:
    p.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
  if args.seq_len < 16:
    p.error(f"--seq-len {args.seq_len}: at least 16")
  return args


def model_config(args, dtype: str, impl: str):
  """Qwen3-shaped (qk norms, head_dim apart from hidden / heads), float32 masters."""
  from jaxrl_scale.models import config as model_config_lib

  return model_config_lib.ModelConfig(
      family="qwen3", vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
      num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.head_dim,
      intermediate_size=args.intermediate, qk_norm=True, tie_embeddings=True,
      max_position_embeddings=max(2048, args.seq_len), dtype=dtype, param_dtype="float32",
      attention_impl=impl)


def rl_batch(args, seed: int = 0):
  """Prompts of 1/16 .. 1/4 of S and completions of 1/8 .. all of the rest: every row padded
  differently, as the trainer's batches are. Advantages in [0.5, 1.5]: with both signs the
  loss nearly cancels (-7.7e-5 at the default shape), and a relative error of a loss near
  zero measures nothing."""
  import numpy as np

  from jaxrl_scale.rl import batch as batch_lib

  rng = np.random.default_rng(seed)
  s = args.seq_len
  prompts = [rng.integers(1, args.vocab, size=rng.integers(s // 16, s // 4 + 1)).tolist()
             for _ in range(args.prompts)]
  completions = [[rng.integers(1, args.vocab,
                               size=rng.integers((s - len(p)) // 8, s - len(p) + 1)).tolist()
                  for _ in range(args.generations)] for p in prompts]
  logps = [[(-rng.uniform(0.5, 4.0, size=len(c))).tolist() for c in cs] for cs in completions]
  return batch_lib.pack_rl(prompts, completions, logps,
                           rng.uniform(0.5, 1.5, size=(args.prompts, args.generations)),
                           seq_len=s)


def loss_and_grads(cfg, batch, mesh):
  """(loss, every gradient leaf as float32 NumPy) of one RL step's objective."""
  import jax
  import numpy as np

  from jaxrl_scale import config
  from jaxrl_scale.models import sharding
  from jaxrl_scale.rl import train_step

  model = sharding.create_sharded_model(cfg, mesh, seed=0)
  trainer = train_step.Trainer(model, mesh, config.OptimConfig(lr=1e-6, warmup_steps=0),
                               train_step.RLObjective(config.RLConfig(), temperature=1.0))
  loss, grads = trainer.loss_and_grads(batch)
  return float(loss), [np.asarray(g, np.float32) for g in jax.tree.leaves(grads)]


def errors(loss: float, grads: list, ref_loss: float, ref_grads: list) -> dict:
  """Relative errors of (loss, grads) against the reference's."""
  import numpy as np

  diff = np.sqrt(sum(float(np.sum((g - r) ** 2)) for g, r in zip(grads, ref_grads)))
  norm = np.sqrt(sum(float(np.sum(r ** 2)) for r in ref_grads))
  per_tensor = [float(np.abs(g - r).max() / max(float(np.abs(r).max()), 1e-30))
                for g, r in zip(grads, ref_grads)]
  return {"loss_rel": abs(loss - ref_loss) / max(abs(ref_loss), 1e-30),
          "grad_rel_l2": float(diff / max(norm, 1e-30)),
          "grad_max_rel": max(per_tensor)}


def passes(cudnn: dict, einsum: dict) -> bool:
  """cuDNN within `TOLERANCE` x the bf16 einsum path's own error (+ `FLOOR`), each measure."""
  return all(cudnn[k] <= TOLERANCE * einsum[k] + FLOOR for k in ("loss_rel", "grad_rel_l2"))


def main(argv=None) -> int:
  args = parse_args(argv)
  import jax
  from jax.sharding import AxisType

  from jaxrl_scale.models import attention

  platform = jax.default_backend()
  kernel = "cudnn" if platform == "gpu" else "xla"
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:1])
  batch = rl_batch(args)
  start = time.perf_counter()
  # Full float32 matmuls for the reference: a GPU's default for float32 is TF32 (10-bit
  # mantissas), which would put an error of bf16's order into the truth itself.
  with jax.default_matmul_precision("highest"):
    ref = loss_and_grads(model_config(args, "float32", "einsum"), batch, mesh)
  ways = {"einsum": loss_and_grads(model_config(args, "bfloat16", "einsum"), batch, mesh)}
  fused = attention.fused_attention
  if kernel != "cudnn":
    # Off a GPU the cuDNN path's code runs through JAX's XLA implementation of the same call
    # (what the CPU tests do), so the script runs anywhere; only a GPU checks the kernel.
    attention.fused_attention = lambda *a, implementation, **kw: fused(
        *a, implementation="xla", **kw)
  try:
    ways["cudnn"] = loss_and_grads(model_config(args, "bfloat16", "cudnn"), batch, mesh)
  finally:
    attention.fused_attention = fused
  errs = {name: errors(*way, *ref) for name, way in ways.items()}
  between = errors(*ways["cudnn"], *ways["einsum"])
  ok = passes(errs["cudnn"], errs["einsum"])
  device = jax.devices()[0].device_kind
  print(f"device: {device} ({platform}; attention kernel: {kernel}); model hidden "
        f"{args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} kv of "
        f"{args.head_dim}, vocab {args.vocab}; batch {args.prompts * args.generations} x "
        f"{args.seq_len}; float32 reference loss {ref[0]:.6g}", file=sys.stderr)
  for name, e in errs.items():
    print(f"{name:>7} bf16 vs float32: loss {e['loss_rel']:.2e}, gradients {e['grad_rel_l2']:.2e}"
          f" (L2), {e['grad_max_rel']:.2e} (worst tensor's max)", file=sys.stderr)
  print(f"cudnn vs einsum bf16: loss {between['loss_rel']:.2e}, gradients "
        f"{between['grad_rel_l2']:.2e} (L2)", file=sys.stderr)
  print(f"{'PASSED' if ok else 'FAILED'}: cuDNN's errors within {TOLERANCE}x the bf16 einsum "
        f"path's + {FLOOR} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
  if args.json:
    print(json.dumps(dict(device=device, platform=platform, kernel=kernel,
                          shape=dataclasses.asdict(model_config(args, "bfloat16", "cudnn")),
                          rows=args.prompts * args.generations, seq_len=args.seq_len,
                          reference_loss=ref[0], ways=errs, cudnn_vs_einsum=between,
                          tolerance=TOLERANCE, floor=FLOOR, passed=ok)), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
