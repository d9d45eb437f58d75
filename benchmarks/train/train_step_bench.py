"""Train-step model FLOP/s as a fraction of this machine's measured float32 matmul peak.

    python benchmarks/train/train_step_bench.py  # ~50M params (preset 'small'), S = 512
    python benchmarks/train/train_step_bench.py --quick  # tiny shapes, seconds
    python benchmarks/train/train_step_bench.py --quick --preset tiny_qwen3_moe  # an MoE policy

Model FLOPs of one step (the MFU convention: what the model needs, not what XLA runs; no
credit for recomputation, padding positions count because the fixed-shape step computes
them):

    flops = 6 * N_matmul * tokens + 12 * L * N_heads * H * S * tokens

  tokens    = rows * S, every position of the fixed-shape batch
  N_matmul  = parameters that enter a matmul: all of them minus the input embedding table
              when it is not tied to the LM head (a gather, no FLOPs); for an MoE preset
              the ACTIVE ones (`ModelConfig.num_params(active=True)`: the router and the
              top-k experts a token runs, not all experts)
  6         = 2 (multiply-add) x 3 (forward, grad w.r.t. activations, grad w.r.t. weights)
  12 L N H S per token = QK^T and AV (2 * 2 * S * N * H forward) x 3 for the backward; the
              implementation computes the full S x S scores and masks them, so no causal
              halving.

The peak is the best rate of a jitted float32 [n, n] @ [n, n] (2 n^3 FLOPs, default
precision like the model's matmuls) measured in the same process between the timed steps;
each step is compared with the higher of the peaks just before and after it, so a ratio
compares numbers taken under the same machine load, and the reported fraction is the
median of the per-step ratios.
On a GPU (or TPU) whose exact device kind is in `jaxrl_scale.plan.chips.DEVICE_PEAKS` (an
unknown one gets no MFU line) it also prints MFU against the part's bf16 dense spec peak, with the FLOPs above (full S x S attention) and with causal attention
(half of the attention FLOPs, as MaxText counts); `--matmul-dtype bfloat16` measures the
peak with bf16 matmuls (the GPU's tensor-core rate). `--profile` runs one more step under
JAX's profiler and, on a GPU, prints its busy share and the kernels that took the time
(`gpu_profile.py`). `--json` prints one JSON line last.

The step runs the RL objective (CISPO, prompt average) through `rl.train_step.Trainer`,
exactly as training does: micro-batch scan, AdamW update, non-finite check, diagnostics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and jaxrl_scale from this tree


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", default=None,
                 help="models.config preset (default small ~ 50M; MoE presets count active "
                      "parameters)")
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--prompts", type=int, default=2)
  p.add_argument("--generations", type=int, default=4)
  p.add_argument("--micro-batches", type=int, default=1)
  p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
  p.add_argument("--matmul-size", type=int, default=2048)
  p.add_argument("--fsdp", type=int, default=1, help="trainer mesh fsdp size")
  p.add_argument("--tp", type=int, default=1, help="trainer mesh tp size")
  p.add_argument("--remat", default="full",
                 choices=("none", "full", "dots", "attention", "context", "matmuls"),
                 help="optim.remat, printed with the results (recomputation gets no FLOP "
                      "credit; 'attention' keeps the attention block's outputs and recomputes "
                      "the MLP, 'context' only the attention kernel's output, 'matmuls' every "
                      "matmul's output)")
  p.add_argument("--logits-chunk", type=int, default=512, help="optim.logits_chunk")
  p.add_argument("--attention", default="auto", choices=("auto", "einsum", "cudnn", "splash"),
                 help="model.attention_impl (auto: cuDNN on GPU for bf16, einsum on CPU)")
  p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                 help="model.dtype, the activations (default: the preset's; masters stay "
                      "param_dtype). cuDNN attention needs bfloat16")
  p.add_argument("--param-dtype", default=None, choices=("float32", "bfloat16"),
                 help="model.param_dtype, the weights as the model computes with them (the "
                      "trainer keeps float32 masters either way; default: the preset's). The "
                      "recipe's configs use bfloat16; with float32 the FP32 LM head multiplies "
                      "float32 weights at HIGHEST precision (a GPU's CUDA cores)")
  p.add_argument("--matmul-dtype", default="float32", choices=("float32", "bfloat16"),
                 help="dtype of the measured matmul peak (bfloat16: the tensor-core rate)")
  p.add_argument("--profile", action="store_true",
                 help="one more step under JAX's profiler: on a GPU, its busy share and the "
                      "kernels that took the time (benchmarks/common/gpu_profile.py)")
  p.add_argument("--json", action="store_true", help="print one JSON line of the numbers last")
  p.add_argument("--quick", action="store_true",
                 help="tiny shapes for a smoke run (preset tiny_llama unless --preset, S=128, "
                      "n=1024)")
  args = p.parse_args()
  if args.quick:
    args.preset = args.preset or "tiny_llama"
    args.seq_len, args.steps, args.matmul_size = 128, 2, 1024
  args.preset = args.preset or "small"
  return args


def matmul_peak(n: int, reps: int = 5, dtype: str = "float32") -> float:
  """Best FLOP/s of a jitted n x n matmul (float32 unless told), on the default device."""
  import jax
  import jax.numpy as jnp

  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), dtype)
  b = jax.random.normal(kb, (n, n), dtype)
  # Default precision, as the model's matmuls use (on GPU that allows TF32).
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def flop_params(cfg, num_params: int) -> int:
  """The parameter count the 6N rule takes: all `num_params` of a dense model; of an MoE
  model the active ones (router, top-k experts, shared expert, attention, embeddings), from
  the config (an interleaved model's stacked layers also hold unused MLPs)."""
  return cfg.num_params(active=True) if cfg.num_experts else num_params


def model_flops(cfg, num_params: int, rows: int, seq_len: int) -> float:
  tokens = rows * seq_len
  matmul_params = num_params - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size)
  return 6 * matmul_params * tokens + attention_flops(cfg, rows, seq_len)


def random_batch(rng, vocab: int, prompts: int, generations: int, seq_len: int):
  """Prompts of S/8 tokens and completions filling the rest (full-length rows)."""
  from jaxrl_scale.rl import batch as batch_lib

  lp = max(1, seq_len // 8)
  prompt_ids = [rng.integers(1, vocab, size=lp).tolist() for _ in range(prompts)]
  completions = [[rng.integers(1, vocab, size=seq_len - lp).tolist() for _ in range(generations)]
                 for _ in range(prompts)]
  logps = [[(-rng.uniform(0.5, 4.0, size=seq_len - lp)).tolist() for _ in range(generations)]
           for _ in range(prompts)]
  return batch_lib.pack_rl(prompt_ids, completions, logps,
                           rng.normal(size=(prompts, generations)), seq_len=seq_len)


def main() -> None:
  args = parse_args()
  import jax
  import numpy as np
  from jax.sharding import AxisType

  from jaxrl_scale import config
  from jaxrl_scale.models import config as model_config
  from jaxrl_scale.models import sharding
  from jaxrl_scale.plan import hlo_text
  from jaxrl_scale.rl import train_step

  devices = jax.devices()[:args.fsdp * args.tp]
  mesh = jax.make_mesh((args.fsdp, args.tp), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2,
                       devices=devices)
  cfg = model_config.preset(args.preset)
  cfg = dataclasses.replace(cfg, attention_impl=args.attention, dtype=args.dtype or cfg.dtype,
                            param_dtype=args.param_dtype or cfg.param_dtype)
  model = sharding.create_sharded_model(cfg, mesh, seed=0)
  num_params = sharding.param_count(nnx_params(model))
  batch = random_batch(np.random.default_rng(0), cfg.vocab_size, args.prompts,
                       args.generations, args.seq_len)
  rows = args.prompts * args.generations
  flops = model_flops(cfg, flop_params(cfg, num_params), rows, args.seq_len)

  optim = config.OptimConfig(lr=1e-6, warmup_steps=0, remat=args.remat,
                             logits_chunk=args.logits_chunk)
  trainer = train_step.Trainer(model, mesh, optim,
                               train_step.RLObjective(config.RLConfig(), temperature=1.0),
                               micro_batches=args.micro_batches)
  t = time.perf_counter()
  # Values XLA recomputed to keep the step under its memory limit (on a GPU, JAX's share
  # of it less the arguments and outputs): `plan` predicts the count without the device.
  remat = hlo_text.rematerialized(trainer.compile(batch).as_text())
  compile_s = time.perf_counter() - t
  batch = trainer.shard_batch(batch)
  trainer.step(batch)["loss"].block_until_ready()  # warm-up
  matmul_peak(args.matmul_size, reps=1, dtype=args.matmul_dtype)  # compiles the matmul
  # The peak is re-measured between steps: on a shared machine the load drifts, and a
  # ratio is only meaningful between numbers taken under the same load. Each step is
  # compared with the higher of the peaks measured just before and just after it (the
  # conservative choice).
  times, between = [], [matmul_peak(args.matmul_size, dtype=args.matmul_dtype)]
  for _ in range(args.steps):
    t = time.perf_counter()
    metrics = trainer.step(batch)
    metrics["loss"].block_until_ready()
    times.append(time.perf_counter() - t)
    between.append(matmul_peak(args.matmul_size, dtype=args.matmul_dtype))
  peaks = [max(a, b) for a, b in zip(between[:-1], between[1:])]
  fractions = [flops / t / p for t, p in zip(times, peaks)]

  step_s = statistics.median(times)
  peak = statistics.median(peaks)
  print(f"device: {devices[0].platform} x{len(devices)} ({devices[0].device_kind}), "
        f"mesh fsdp={args.fsdp} tp={args.tp}")
  active = (f" ({cfg.num_params(active=True) / 1e6:.2f}M active: {cfg.experts_per_token} of "
            f"{cfg.num_experts} experts)" if cfg.num_experts else "")
  print(f"model: {args.preset}, {num_params / 1e6:.1f}M params{active}, batch {rows} x "
        f"{args.seq_len} "
        f"tokens, {args.micro_batches} micro-batch(es), remat {args.remat}, logits chunk "
        f"{args.logits_chunk}, attention {args.attention}, {cfg.dtype} activations over "
        f"{cfg.param_dtype} params; compile {compile_s:.1f} s")
  if trainer.memory_analysis is not None:
    m = trainer.memory_analysis
    print(f"memory: temporaries {m.temp_size_in_bytes / 2**30:.2f} GiB, arguments "
          f"{m.argument_size_in_bytes / 2**30:.2f} GiB; XLA rematerialized {remat} values")
  print(f"model FLOPs per step: {flops / 1e12:.3f} TFLOP")
  print("per step: " + "; ".join(
      f"{t:.2f} s, {flops / t / 1e9:.1f} GFLOP/s vs peak {p / 1e9:.1f} = {f:.1%}"
      for t, p, f in zip(times, peaks, fractions)))
  print(f"train step: {flops / step_s / 1e9:.1f} GFLOP/s (median step {step_s:.3f} s)")
  print(f"{args.matmul_dtype} matmul peak ({args.matmul_size}^2): {peak / 1e9:.1f} GFLOP/s "
        f"(median; all: {', '.join(f'{p / 1e9:.1f}' for p in between)})")
  print(f"fraction of peak: {statistics.median(fractions):.1%} (median of per-step ratios)")
  report = dict(device=devices[0].device_kind, preset=args.preset, rows=rows,
                seq_len=args.seq_len, micro_batches=args.micro_batches, remat=args.remat,
                logits_chunk=args.logits_chunk, attention=args.attention, dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                params_m=round(num_params / 1e6, 2), compile_s=round(compile_s, 2),
                model_tflop_per_step=flops / 1e12, median_step_s=step_s,
                matmul_dtype=args.matmul_dtype, matmul_peak_tflop_s=peak / 1e12,
                fraction_of_matmul_peak=statistics.median(fractions),
                xla_rematerialized=remat)
  if trainer.memory_analysis is not None:
    report["temp_gib"] = trainer.memory_analysis.temp_size_in_bytes / 2**30
  causal = flops - attention_flops(cfg, rows, args.seq_len) / 2
  spec = spec_peak(devices[0].device_kind)
  if spec is not None:
    full_mfu, causal_mfu = flops / step_s / 1e12 / spec, causal / step_s / 1e12 / spec
    print(f"MFU vs the {spec:.0f} TFLOP/s bf16 spec peak of {devices[0].device_kind}: "
          f"{full_mfu:.1%} (full attention FLOPs), {causal_mfu:.1%} (causal: half the "
          f"attention FLOPs, as MaxText counts)")
    report.update(spec_bf16_tflop_s=spec, mfu_full_attention=full_mfu,
                  mfu_causal_attention=causal_mfu)
  report["fraction_of_matmul_peak_causal"] = statistics.median(
      [causal / t / p for t, p in zip(times, peaks)])
  if args.profile:
    from benchmarks.common import gpu_profile  # pylint: disable=g-import-not-at-top

    report.update(gpu_profile.profile(
        lambda: trainer.step(batch)["loss"].block_until_ready(), lambda: 1,
        lambda line: print(line, flush=True), "train_step_bench"))
  if args.json:
    print(json.dumps(report), flush=True)


def spec_peak(device_kind: str) -> float | None:
  """The bf16 dense spec peak (TFLOP/s) of the part whose device kind is exactly
  `device_kind` (`chips.DEVICE_PEAKS`: an H100 PCIe is not scored as an SXM); None if unknown."""
  from jaxrl_scale.plan import chips  # pylint: disable=g-import-not-at-top

  peaks = chips.device_peaks(device_kind)
  return None if peaks is None else peaks.bf16_flops / 1e12


def attention_flops(cfg, rows: int, seq_len: int) -> float:
  """The attention part of `model_flops`: full S x S scores (QK^T and AV, x3 for training)."""
  return 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len * rows * seq_len


def nnx_params(model):
  from flax import nnx

  return nnx.state(model, nnx.Param)


if __name__ == "__main__":
  main()
