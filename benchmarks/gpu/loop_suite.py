"""Issue 62's device measurements for `gpu_suite.py --suite loop`: the runs and their
commands (the suite runs them, each in its own process, and `gpu_suite_report` sums them up).

    python benchmarks/gpu/gpu_suite.py --suite loop --dry-run
    python benchmarks/gpu/gpu_suite.py --suite loop --cpu-smoke
    GIT_COMMIT=... python3 benchmarks/gpu/gpu_suite.py --suite loop --only loop --budget-s 300 --deadline-s 570
    GIT_COMMIT=... python3 benchmarks/gpu/gpu_suite.py --suite loop --only gpu_small_seed0 --deadline-s 570

The whole RL loop at 0.6B and 1.7B colocated on one GPU (rl_loop_bench), then
configs/gpu_small.yaml's run per seed; the summary sets each against issue 62's targets and
the loops' peak memory against `plan`'s (gpu_plan_configs_h100.json's `bench_plans`).
"""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLANS_FILE = os.path.join(ROOT, "benchmarks", "results", "gpu_plan_configs_h100.json")

# Issue 62's device measurements (`--suite loop`), most important first: the whole RL loop
# at real size, colocated on one GPU (rl_loop_bench: each phase's time, loop efficiency, the
# weight update's share of a step, tokens/s per GPU, peak memory per phase against `plan`'s
# prediction in gpu_plan_configs_h100.json's `bench_plans`), then configs/gpu_small.yaml's
# run that learns (the whole `jaxrl-scale train` command timed; its summary.json read back).
# The 0.6B loop and then the 1.7B one fill one device call; `--only gpu_small_seed0` and
# `--only gpu_small_seed1` (about 6 minutes each) are a call each.
LOOP_SHAPE = ["model.path=null", "data.max_prompt_tokens=128", "sampler.prompt_buckets=[128]"]
LOOP_RUNS = [
    # Targets: loop efficiency >= 0.85 (sync, colocated), the weight update <= 2% of a step.
    # The pool at full length: a random policy never stops early.
    ("loop_0p6b_colocated", 1, "loop",
     dict(config="configs/scalerl_qwen3_0p6b_h100.yaml",
          overrides=[*LOOP_SHAPE, "sampler.kv_cache_tokens=0"], steps=6, warmup=2,
          alone=True, plan_key="rl_loop_bench 0p6b")),
    # Target: 10 steps without running out of memory, the peak within 15% of the plan's.
    ("loop_1p7b_colocated", 2, "loop",
     dict(config="configs/scalerl_qwen3_1p7b_h100.yaml", overrides=LOOP_SHAPE, steps=10,
          warmup=2, alone=False, plan_key="rl_loop_bench 1p7b")),
    # Target: validation +0.25 or more after the warm start, the whole command <= 6 minutes.
    ("gpu_small_seed0", 4, "rl", dict(config="configs/gpu_small.yaml", seed=0)),
    ("gpu_small_seed1", 4, "rl", dict(config="configs/gpu_small.yaml", seed=1)),
]


def loop_argv(o: dict, smoke: bool) -> list[str]:
  """rl_loop_bench in colocated mode; the smoke run is its default CPU demo config, short."""
  if smoke:
    shape = ["--steps", "3", "--warmup", "1", "--repeats", "1"]
  else:
    shape = [os.path.join(ROOT, o["config"]), *o["overrides"], "--steps", str(o["steps"]),
             "--warmup", str(o["warmup"])]
  return ["benchmarks/train/rl_loop_bench.py", *shape, "--modes", "colocated",
          *([] if o.get("alone") else ["--no-alone"]), "--json"]


# configs/gpu_small.yaml at a size that runs on 2 CPU cores in about a minute (the smoke run).
RL_SMOKE = ["model.hidden_size=64", "model.num_layers=2", "model.intermediate_size=192",
            "model.dtype=float32", "model.param_dtype=float32", "rl.prompts_per_step=4",
            "rl.generations_per_prompt=4", "sampler.num_slots=16",
            "rl.zero_variance_filter=false", "data.num_train=100", "data.num_validation=16",
            "sft.steps=2", "sft.batch_size=8", "run.sft_stop_pass_rate=null", "run.steps=2",
            "eval.every=1", "forecast.n_boot=10"]


def rl_argv(o: dict, out_dir: str, smoke: bool) -> list[str]:
  """`jaxrl-scale train CONFIG run.seed=S` into a fresh `out_dir`."""
  return ["-m", "jaxrl_scale.cli", "train", os.path.join(ROOT, o["config"]),
          f"run.seed={o['seed']}", *(RL_SMOKE if smoke else []), "--output-dir", out_dir]


def planned_peak(key: str) -> dict | None:
  """`plan`'s prediction for a loop run: each program's GiB per GPU and the largest (the
  run's peak: colocated programs take turns), from the committed plans file."""
  try:
    with open(PLANS_FILE, encoding="utf-8") as f:
      programs = json.load(f)["bench_plans"][key]["plan"]["programs"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  gib = {name: round(p["hbm_bytes_per_chip"] / 2**30, 2) for name, p in programs.items()
         if "hbm_bytes_per_chip" in p}
  return {"plan": key, "gib": gib, "peak_gib": max(gib.values())} if gib else None


TIMEOUT_S = {"loop": 300.0, "loop_1p7b": 420.0, "rl": 480.0}


def fill(run: dict, bench: str, o: dict, smoke: bool, tokens_dir: str) -> None:
  """A loop-suite run's argv and time limit, and the plan's peak (a loop) or its fresh run
  directory beside `tokens_dir` (a gpu_small run)."""
  if bench == "loop":
    run["argv"] = loop_argv(o, smoke)
    run["timeout_s"] = TIMEOUT_S["loop_1p7b" if "1p7b" in run["name"] else "loop"]
    if not smoke and (peak := planned_peak(o["plan_key"])):
      run["predicted"] = peak
  else:
    run["out_dir"] = os.path.join(os.path.dirname(os.path.abspath(tokens_dir)),
                                  f"gpu_suite_{run['name']}")
    run["argv"] = rl_argv(o, run["out_dir"], smoke)
    run["timeout_s"] = TIMEOUT_S["rl"]
