"""The GPU suite's programs compiled for an NVIDIA GPU on this machine, without the GPU.

    python benchmarks/gpu/gpu_plan.py  # H100: every train and decode run
    python benchmarks/gpu/gpu_plan.py --gpu h200 --json benchmarks/results/gpu_plan_h200.json

For each run of `gpu_suite.py` (same shapes, attention, remat, logits chunk and XLA flags),
`jaxrl-scale plan --topology <gpu>-2 --programs ...` compiles the program the run times, as
the run's own code builds it, with JAX's CUDA plugin and no GPU (`plan.chips`): the trainer
alone on one GPU for the train steps (the bench holds no generator), decode of 256 or 64
slots at 128 + 512 tokens on the other. It prints what XLA's memory analysis predicts per
GPU (arguments, temporaries, the total against the share JAX preallocates: the suite's 90%
for the train steps, JAX's default 75% for decode, as the suite runs them), whether it fits,
compiled / model FLOPs and the roofline bounds (the whole program's and kernel by kernel),
and how many values XLA recomputes to keep the program under its memory limit.
When a lent GPU runs the suite, its train_step_bench reports the device's own temporaries:
the two are compared there.

This is the compiler's view without autotuning (XLA's default matmul tiles), not a timing:
the numbers that say how fast a run goes are the suite's, on the device. Each run is its own
`jaxrl-scale plan` process (XLA flags are read once per process). Needs
`pip install -e ".[plan-gpu]"` (Linux).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree
from benchmarks.gpu import gpu_suite  # noqa: E402  pylint: disable=wrong-import-position

GIB = 2**30
PROMPT = 128  # sampler_bench's --prompt-len in the suite; train runs split S the same way


def overrides(o: dict, bench: str, micro: int) -> tuple[list[str], str]:
  """(config overrides of configs/cpu_tiny.yaml, the program) for one suite run."""
  common = ["model.num_layers=null", "model.dtype=bfloat16", "sft.steps=0",
            "mesh.trainer_devices=1", "mesh.generator_devices=1",
            "mesh.simulated_cpu_devices=1", f"data.max_prompt_tokens={PROMPT}",
            f"sampler.prompt_buckets=[{PROMPT}]"]
  if bench == "train":
    return common + [
        f"model.preset={o['preset']}", f"model.attention_impl={o['attention']}",
        "model.param_dtype=bfloat16",  # the suite's --param-dtype
        f"rl.prompts_per_step={o['prompts']}", f"rl.generations_per_prompt={o['gens']}",
        f"sampler.max_new_tokens={o['seq_len'] - PROMPT}",
        f"optim.remat={o.get('remat', 'full')}",
        f"optim.logits_chunk={o.get('logits_chunk', 512)}",
        f"optim.micro_batch_prompts={o['prompts'] // micro}"], "train_step"
  # sampler_bench's checkpoint: Qwen3-0.6B's shape in bf16, slots = the batch, 512 new.
  return common + [
      "model.preset=qwen3_0p6b", "model.param_dtype=bfloat16",
      f"sampler.num_slots={o['batch']}", "sampler.max_new_tokens=512",
      f"rl.prompts_per_step={o['batch'] // 8}", "rl.generations_per_prompt=8"], "decode"


def plan_one(gpu: str, o: dict, bench: str, micro: int) -> dict:
  args, program = overrides(o, bench, micro)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if bench == "train":
    # The suite runs the train benches with this share of the GPU: XLA's memory limit on
    # the device (what it rematerializes to stay under) is set by it (`chips.gpu_target`).
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(gpu_suite.TRAIN_MEM_FRACTION)
  if o.get("xla_flags"):
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + o["xla_flags"]).strip()
  if o.get("decode"):  # sampler_bench --decode-attention
    env["JAXRL_SCALE_DECODE_ATTENTION"] = o["decode"]
  plan = ["plan", os.path.join(ROOT, "configs", "cpu_tiny.yaml"), *args, "--topology",
          f"{gpu}-2", "--programs", program, "--json"]
  cmd = [sys.executable, "-m", "jaxrl_scale.cli", *plan]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
  out = {"program": program, "overrides": args, "xla_flags": o.get("xla_flags", ""),
         "seconds": round(time.perf_counter() - t0, 1)}
  lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
  if not lines:
    err = [x for x in proc.stderr.splitlines() if x.strip()]
    out["error"] = err[-1][:300] if err else f"exit {proc.returncode}"
    return out
  row = json.loads(lines[-1])["programs"][program]
  out.update({k: row.get(k) for k in (
      "fits", "hbm_bytes_per_chip", "hbm_capacity_bytes", "arguments_bytes_per_chip",
      "temporaries_bytes_per_chip", "flops_ratio", "bound_seconds", "bound_by", "mfu_bound",
      "kernel_bound_seconds", "kernel_bound_seconds_by_family", "mfu_kernel_bound",
      "tokens_per_second", "bytes_over_min", "xla_rematerialized", "error")})
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--gpu", default="h100", help="h100, h200 or a100")
  p.add_argument("--only", default=None, help="comma-separated run-name prefixes")
  p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
  args = p.parse_args(argv)
  rows = []
  for name, _, bench, o in gpu_suite.RUNS:
    if bench not in ("train", "sampler") or (
        args.only and not any(name.startswith(x) for x in args.only.split(","))):
      continue
    micros = [1, 2] if bench == "train" else [1]  # gpu_suite picks the first that fits
    for micro in micros:
      r = plan_one(args.gpu, o, bench, micro)
      r.update(run=name, micro_batches=micro if bench == "train" else None)
      rows.append(r)
      if r.get("error"):
        print(f"{name} (micro {micro}): {r['error']}", flush=True)
        continue
      extra = (f", {r['bytes_over_min']:.2f}x min bytes" if r.get("bytes_over_min") else
               f", micro-batches {micro}")
      remat = (f", XLA recomputes {r['xla_rematerialized']} values"
               if r.get("xla_rematerialized") else "")
      print(f"{name}: {r['hbm_bytes_per_chip'] / GIB:.1f} GiB of {r['hbm_capacity_bytes'] / GIB:.1f}"
            f" ({'fits' if r['fits'] else 'DOES NOT FIT'}; arguments "
            f"{r['arguments_bytes_per_chip'] / GIB:.1f}, temporaries "
            f"{r['temporaries_bytes_per_chip'] / GIB:.1f}), FLOPs x {r['flops_ratio']:.2f}, "
            f"bound {r['bound_seconds']:.3g} s ({r['bound_by']}; "
            f"{r['kernel_bound_seconds']:.3g} s kernel by kernel){extra}{remat}; "
            f"compile {r['seconds']:.0f} s", flush=True)
  if args.json:
    import jax  # pylint: disable=g-import-not-at-top
    head = {"gpu": args.gpu, "jax": jax.__version__, "commit": gpu_suite.commit_of(None),
            "date": time.strftime("%Y-%m-%d"), "how": "jaxrl-scale plan --topology "
            f"{args.gpu}-2, compiled on a CPU machine without a GPU (no autotuning)"}
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({**head, "runs": rows}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
