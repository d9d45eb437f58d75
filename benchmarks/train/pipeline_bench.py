"""Wall-clock per RL step, PipelineRL versus synchronous, on the same config, in one run.

    python benchmarks/train/pipeline_bench.py  # configs/cpu_tiny.yaml, 30 steps
    python benchmarks/train/pipeline_bench.py CONFIG key=value ... --steps 40 --warmup 5

Both modes run the same config (no SFT, no evals, no checkpoints: only RL steps, every one
of which trains) in this process, one after the other, each from the same initial policy. The first `--warmup` steps
of each (compiles, pipeline fill) are excluded; the reported seconds per step is the median
of the remaining steps' wall-clock intervals. Idle fractions per role over the timed steps:

  trainer    time waiting for rollouts / wall time (in sync mode: all of generation)
  generator  sync: time not sampling / wall time; pipeline: time the generator thread was
             stalled by the admission bound (k) or a full queue / wall time

The speedup is trained tokens per wall-second, pipeline over sync (with every group
trained, the same as sync s/step over pipeline s/step up to the lengths sampled), measured
under the same machine load in the same process. Overlap needs the roles on separate hardware: with simulated CPU
devices both slices share the host's cores, so expect little gain there; the paper's gain
(and this benchmark's 1.5x goal) is for accelerators with generation and training balanced.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def parse_args() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("config", nargs="?", default=str(ROOT / "configs" / "cpu_tiny.yaml"))
  p.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
  p.add_argument("--steps", type=int, default=30, help="RL steps per mode")
  p.add_argument("--warmup", type=int, default=5, help="leading steps not timed")
  p.add_argument("--modes", default="sync,pipeline", help="comma-separated modes to compare")
  args = p.parse_args()
  if args.steps <= args.warmup + 1:
    p.error("--steps must exceed --warmup + 1")
  return args


def run_mode(config_path: str, overrides: list[str], mode: str, steps: int, warmup: int
             ) -> dict[str, float]:
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  times: list[float] = []
  rows: list[dict] = []

  def on_step(step: int, row: dict) -> None:
    times.append(time.perf_counter())
    rows.append(row)

  with tempfile.TemporaryDirectory() as run_dir:
    # No SFT, so a random policy earns no reward and every group would be filtered as
    # zero-variance, skipping the update: keep all groups so each step trains (the same work
    # as a real step, with zero advantages).
    cfg = config_lib.load(config_path, [
        *overrides, f"pipeline.mode={mode}", f"run.steps={steps}", "sft.steps=0",
        "rl.zero_variance_filter=false", "rl.no_positive_resampling=false",
        "eval.every=0", "checkpoint.every=0", "run.progress=false", "run.tensorboard=false",
        "forecast.enabled=false", f"run.output_dir={run_dir}"])
    wiring.train(cfg, run_dir, stream=io.StringIO(), on_step=on_step)
  timed = rows[warmup:]
  intervals = [b - a for a, b in zip(times[warmup:], times[warmup + 1:])]
  wall = times[-1] - times[warmup]
  wait = sum(r["time/wait_s"] for r in timed[1:])
  # Per-step generator idle fractions are over each step's interval: weight by it.
  gen_idle = sum(r.get("gen/idle_frac", 0.0) * dt for r, dt in zip(timed[1:], intervals))
  tokens = sum(r.get("rollout/length_mean", 0.0) * r.get("rollout/num_groups", 0.0)
               for r in timed[1:]) * cfg.rl.generations_per_prompt
  trained = sum(r.get("train/tokens", 0.0) for r in timed[1:])
  dropped = max((r.get("pipeline/dropped_stale", 0.0) for r in rows), default=0.0)
  return {
      "s_per_step": statistics.median(intervals),
      "mean_s_per_step": wall / len(intervals),
      "trainer_idle": wait / wall,
      "generator_idle": gen_idle / wall,
      "gen_tokens_per_s": tokens / wall,
      "trained_tokens_per_s": trained / wall,
      "dropped": dropped,
      "slot_util": statistics.fmean(r["gen/slot_util"] for r in timed if "gen/slot_util" in r)
                   if any("gen/slot_util" in r for r in timed) else None,
      "staleness_mean": statistics.fmean(r.get("staleness/mean", 0.0) for r in timed),
  }


def main() -> int:
  args = parse_args()
  from jaxrl_scale.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top

  cfg = config_lib.load(args.config, args.overrides)
  mesh_lib.simulate_cpu_devices(cfg.mesh.simulated_cpu_devices)
  import jax  # pylint: disable=g-import-not-at-top

  print(f"pipeline_bench: {args.config} {' '.join(args.overrides)}")
  print(f"  {jax.default_backend()} x{jax.device_count()} | {cfg.rl.prompts_per_step} prompts x "
        f"{cfg.rl.generations_per_prompt} samples per step | {args.steps} steps per mode, "
        f"first {args.warmup} untimed")
  results = {}
  for mode in args.modes.split(","):
    results[mode] = run_mode(args.config, args.overrides, mode, args.steps, args.warmup)
    r = results[mode]
    print(f"  {mode:<14} {r['s_per_step']:.3f} s/step (median; mean {r['mean_s_per_step']:.3f}) | "
          f"idle: trainer {r['trainer_idle']:.0%}, generator {r['generator_idle']:.0%} | "
          f"{r['gen_tokens_per_s']:.0f} generated tok/s | {r['trained_tokens_per_s']:.0f} "
          f"trained tok/s | staleness {r['staleness_mean']:.2f} | dropped {r['dropped']:.0f}"
          + (f" | slot use {r['slot_util']:.0%}" if r["slot_util"] is not None else ""),
          flush=True)
  if "sync" in results and "pipeline" in results:
    ratio = (results["pipeline"]["trained_tokens_per_s"]
             / max(results["sync"]["trained_tokens_per_s"], 1e-9))
    step_ratio = results["sync"]["s_per_step"] / results["pipeline"]["s_per_step"]
    print(f"  speedup pipeline vs sync: {ratio:.2f}x trained tokens per wall-second "
          f"({step_ratio:.2f}x by median s/step)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
