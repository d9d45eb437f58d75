"""What computing with param_dtype-rounded weights (`models.layers.held`) costs the train step.

    python benchmarks/train/held_cost.py  # qwen3_1p7b, 4 x 4 x 2048, v5p:2x2x1
    python benchmarks/train/held_cost.py --preset qwen3_0p6b --seq-len 1024

Compiles the RL train step of a bf16 model (bf16 compute and params, FP32 LM head, remat
full, 2 micro-batches) for a TPU topology with libtpu (no TPU needed), twice in one process:
as the trainer runs it (float32 masters rounded to bf16 at use, so the trainer and the
generator run one policy) and with the rounding switched off (the masters used unrounded:
the pre-issue-33 program). Prints per-chip temporaries, FLOPs and bytes accessed of both and
their ratios. Measured 2026-11-26 (qwen3_1p7b, v5p:2x2x1): temporaries 7.60 vs 7.17 GiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # pylint: disable=wrong-import-position
from flax import nnx  # pylint: disable=wrong-import-position
from jax.experimental import topologies  # pylint: disable=wrong-import-position
from jax.sharding import Mesh  # pylint: disable=wrong-import-position

from jaxrl_scale import config  # pylint: disable=wrong-import-position
from jaxrl_scale.models import config as model_config  # pylint: disable=wrong-import-position
from jaxrl_scale.models import layers  # pylint: disable=wrong-import-position
from jaxrl_scale.plan import programs  # pylint: disable=wrong-import-position
from jaxrl_scale.rl import batch as batch_lib  # pylint: disable=wrong-import-position
from jaxrl_scale.rl import train_step  # pylint: disable=wrong-import-position


def compile_step(args) -> dict[str, float]:
  topo = topologies.get_topology_desc(topology_name=args.topology, platform="tpu")
  mesh = Mesh(np.array(topo.devices).reshape(-1, 1), ("fsdp", "tp"))
  mcfg = dataclasses.replace(model_config.preset(args.preset), dtype="bfloat16",
                             param_dtype="bfloat16", lm_head_fp32=True)
  graphdef, params = programs.abstract_params(mcfg, mesh)
  optim = config.OptimConfig(lr=5e-7, warmup_steps=0, logits_chunk=512, remat="full")
  trainer = train_step.Trainer(nnx.merge(graphdef, params), mesh, optim,
                               train_step.RLObjective(config.RLConfig(), temperature=1.0),
                               micro_batches=2)
  compiled = trainer.lower(batch_lib.rl_batch_spec(args.prompts, args.generations,
                                                   args.seq_len)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {"temp_gib": compiled.memory_analysis().temp_size_in_bytes / 2**30,
          "flops": float(cost["flops"]), "bytes": float(cost["bytes accessed"])}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", default="qwen3_1p7b")
  p.add_argument("--topology", default="v5p:2x2x1")
  p.add_argument("--prompts", type=int, default=4)
  p.add_argument("--generations", type=int, default=4)
  p.add_argument("--seq-len", type=int, default=2048)
  args = p.parse_args()
  rounded = compile_step(args)
  held = layers.held
  layers.held = lambda w, dtype: w  # the masters used as they are
  try:
    plain = compile_step(args)
  finally:
    layers.held = held
  for name, r in (("rounded (held)", rounded), ("unrounded", plain)):
    print(f"{name:15s} temporaries {r['temp_gib']:.3f} GiB/chip  flops {r['flops']:.4e}  "
          f"bytes accessed {r['bytes']:.4e}")
  print(f"ratio rounded/unrounded: temporaries {rounded['temp_gib'] / plain['temp_gib']:.3f}, "
        f"flops {rounded['flops'] / plain['flops']:.4f}, "
        f"bytes {rounded['bytes'] / plain['bytes']:.3f}")


if __name__ == "__main__":
  main()
