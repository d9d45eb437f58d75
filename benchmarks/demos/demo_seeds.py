"""The embedded demo over several seeds: its run-to-run spread, and its forecasts against outcomes.

    python benchmarks/demos/demo_seeds.py --seeds 0-4  # the config's mode, one at a time
    python benchmarks/demos/demo_seeds.py --seeds 0-9 --mode sync --jobs 2 --json
    python benchmarks/demos/demo_seeds.py --seeds 0,3 --set optim.lr=2e-3  # try a change of recipe

Each seed runs `jaxrl-scale train` (no config: the embedded demo, configs/cpu_tiny.yaml, or
`--config`) as a subprocess with `run.seed=S` (and `pipeline.mode=MODE` given `--mode`; else
the config's mode), `--jobs` of them at once,
and its summary.json and metrics.jsonl are read back. Per seed it prints the validation pass
rate after the warm start and at the end, the wall time of the whole command, and the
forecast the run made at half its compute against the outcome. Then the mean, standard
deviation and minimum of the final pass rates, and one sigmoid fitted to all seeds' evals
pooled (`jaxrl-scale fit --group`'s fit), with its A and B intervals.

The pooled fit's compute axis is cumulative training FLOPs, not accelerator-hours: hours are
wall time x devices, so runs made side by side (`--jobs 2`) or next to other work log more
hours for the same steps; FLOPs do not move with load. Wall times are only comparable with
the 5-minute budget when the runs were made alone (`--jobs 1` on a quiet machine).

`--check-repeat` runs the first seed a second time and reports whether every evaluation
matched exactly (in sync mode the same seed on the same machine must give the same numbers;
another machine rounds floats differently and follows another path; pipeline mode depends
on when each weight swap lands, so its repeats differ).

The targets of issue 18 are checked at the end (each line says met or missed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# Issue 18's numbers.
FINAL_MIN = 0.8
FINAL_SD_MAX = 0.04
START_MAX = 0.5
WALL_MAX_S = 300.0
FORECAST_TOL = 0.05
FORECAST_WITHIN_FRAC = 0.8


def parse_seeds(text: str) -> list[int]:
  """'0-4' -> [0..4]; '0,3,7' -> [0, 3, 7]; ranges and lists mix ('0-2,9')."""
  seeds: list[int] = []
  for part in text.split(","):
    part = part.strip()
    try:
      if "-" in part:
        lo, hi = (int(v) for v in part.split("-", 1))
        if hi < lo:
          raise ValueError
        seeds.extend(range(lo, hi + 1))
      else:
        seeds.append(int(part))
    except ValueError:
      raise argparse.ArgumentTypeError(f"bad seed list {text!r} (e.g. 0-4 or 0,3,7)") from None
  if len(set(seeds)) != len(seeds):
    raise argparse.ArgumentTypeError(f"seed list {text!r} repeats a seed")
  return seeds


def seed_run_arguments(p: argparse.ArgumentParser, *, seeds: str, out_dir: str,
                       config: str | None = None, set_help: str = "every seed") -> None:
  """The flags every seed-running benchmark shares: --seeds, --config, --set, --out-dir."""
  p.add_argument("--seeds", type=parse_seeds, default=parse_seeds(seeds))
  p.add_argument("--config", default=config,
                 help=f"a config file (default: {config or 'the embedded demo'})")
  p.add_argument("--set", dest="overrides", action="append", default=[],
                 metavar="KEY=VALUE", help=f"a config override for {set_help} (repeatable)")
  p.add_argument("--out-dir", default=str(ROOT / "runs" / out_dir),
                 help=f"where the runs and their logs go (default runs/{out_dir})")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  seed_run_arguments(p, seeds="0-4", out_dir="demo_seeds")
  p.add_argument("--mode", choices=("sync", "pipeline"), default=None,
                 help="override pipeline.mode (default: the config's)")
  p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
  p.add_argument("--check-repeat", action="store_true",
                 help="run the first seed twice and compare its evaluations")
  p.add_argument("--n-boot", type=int, default=1000, help="bootstrap refits of the pooled fit")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
  args = p.parse_args(argv)
  if args.jobs < 1:
    p.error("--jobs must be >= 1")
  for o in args.overrides:
    if "=" not in o:
      p.error(f"--set {o!r}: expected KEY=VALUE")
  return args


def train_subprocess(seed: int, args, run_dir: pathlib.Path, *extra: str) -> dict:
  """One `jaxrl-scale train` subprocess for `seed` (`args.config`, `args.overrides`, then
  `extra`) into `run_dir`; its seed, run dir, wall time, exit status, log and on failure
  `error`."""
  cmd = [sys.executable, "-m", "jaxrl_scale.cli", "train"]
  if args.config:
    cmd.append(args.config)
  cmd += [f"run.seed={seed}", *args.overrides, *extra,
          "--output-dir", str(run_dir), "--overwrite"]
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.setdefault("JAX_PLATFORMS", "cpu")
  log_path = run_dir.parent / f"{run_dir.name}.log"
  t0 = time.perf_counter()
  with open(log_path, "w", encoding="utf-8") as log:
    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                        check=False).returncode
  row = {"seed": seed, "run_dir": str(run_dir), "wall_s": time.perf_counter() - t0,
         "returncode": rc, "log": str(log_path)}
  if rc != 0:
    tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
    row["error"] = f"exit {rc}: " + " | ".join(tail)
  return row


def run_seed(seed: int, args, run_dir: pathlib.Path) -> dict:
  """One `jaxrl-scale train` subprocess; its summary, eval curve and wall time."""
  mode = [f"pipeline.mode={args.mode}"] if args.mode else []
  row = train_subprocess(seed, args, run_dir, *mode)
  summary_path = run_dir / "summary.json"
  if "error" in row or not summary_path.exists():
    return {**row, "error": row.get("error", "no summary.json")}
  s = json.loads(summary_path.read_text(encoding="utf-8"))
  evals = [json.loads(line) for line in open(run_dir / "metrics.jsonl", encoding="utf-8")]
  evals = [(r["step"], r["val/pass_rate"]) for r in evals if "val/pass_rate" in r]
  half = s.get("half_budget_forecast") or {}
  predicted = half.get("predicted_final")
  final = s["final_pass_rate"]
  cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
  mode = cfg["pipeline"]["mode"]
  return {**row, "mode": mode, "start": s["start_pass_rate"], "final": final, "steps": s["steps"],
          "rl_wall_s": s["rl_wall_s"], "compute_hours": s["compute_hours"],
          "flops": s["flops"],
          "forecast": predicted,
          "forecast_abs_err": None if predicted is None else abs(predicted - final),
          "forecast_interval": half.get("predicted_interval"),
          "forecast_well_determined": half.get("well_determined"),
          "forecast_A": half.get("A"),
          "evals": evals, "metrics": str(run_dir / "metrics.jsonl")}


def pooled_fit(rows: list[dict], n_boot: int) -> dict | None:
  """One sigmoid over all seeds' evals on the FLOPs axis, seeds as separate noise series."""
  from jaxrl_scale.scaling import forecast  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.scaling import io  # pylint: disable=g-import-not-at-top

  ok = [r for r in rows if "error" not in r]
  if len(ok) < 2:
    return None
  curves = [io.read_curve(r["metrics"], x_key="flops") for r in ok]
  pooled = io.pool(curves, "demo seeds")
  report = forecast.analyse(pooled, forecast.AnalysisOptions(n_boot=n_boot))
  d = report.to_dict()
  return {"n_seeds": len(ok), "A": d["A"], "A_interval": d["intervals"]["A"],
          "B": d["B"], "B_interval": d["intervals"]["B"], "C_mid_flops": d["C_mid"],
          "C_mid_interval": d["intervals"]["C_mid"], "R0": d["R0"],
          "well_determined": d["well_determined"], "residual_sd": d["residual_sd"],
          "noise": d["noise"]}


def summarise(rows: list[dict], args) -> dict:
  ok = [r for r in rows if "error" not in r]
  finals = [r["final"] for r in ok]
  errs = [r["forecast_abs_err"] for r in ok if r["forecast_abs_err"] is not None]
  wd_misses = [r["seed"] for r in ok if r["forecast_well_determined"]
               and r["forecast_abs_err"] is not None and r["forecast_abs_err"] > FORECAST_TOL]
  out = {
      "n_seeds": len(rows), "n_failed": len(rows) - len(ok),
      "mode": ",".join(sorted({r["mode"] for r in ok if r.get("mode")})) or args.mode,
      "jobs": args.jobs, "overrides": args.overrides,
      "final_mean": statistics.fmean(finals) if finals else None,
      "final_sd": statistics.stdev(finals) if len(finals) > 1 else None,
      "final_min": min(finals) if finals else None,
      "final_max": max(finals) if finals else None,
      "start_max": max(r["start"] for r in ok) if ok else None,
      "wall_s_max": max(r["wall_s"] for r in ok) if ok else None,
      "forecast_abs_err_max": max(errs) if errs else None,
      "forecast_within": sum(e <= FORECAST_TOL for e in errs),
      "forecast_n": len(errs),
      "well_determined_misses": wd_misses,
  }
  return out


def check_targets(summary: dict, rows: list[dict]) -> list[tuple[str, bool]]:
  s = summary
  ok = [r for r in rows if "error" not in r]
  n = len(ok)
  checks = [
      (f"every run finished ({s['n_failed']} failed)", s["n_failed"] == 0),
      (f"start <= {START_MAX} on every seed (max {_fmt(s['start_max'])})",
       s["start_max"] is not None and s["start_max"] <= START_MAX),
      (f"final >= {FINAL_MIN} on every seed (min {_fmt(s['final_min'])})",
       s["final_min"] is not None and s["final_min"] >= FINAL_MIN),
  ]
  if s["final_sd"] is not None:
    checks.append((f"final sd <= {FINAL_SD_MAX} ({s['final_sd']:.3f})",
                   s["final_sd"] <= FINAL_SD_MAX))
  alone = "" if s["jobs"] == 1 else f"; {s['jobs']} at once, so not 'alone'"
  checks.append((f"each run <= {WALL_MAX_S:.0f} s (max {_fmt(s['wall_s_max'], 0)} s{alone})",
                 s["wall_s_max"] is not None and s["wall_s_max"] <= WALL_MAX_S))
  need = math.ceil(FORECAST_WITHIN_FRAC * n)
  checks.append((f"half-budget forecast within {FORECAST_TOL} on >= {need} of {n} seeds "
                 f"({s['forecast_within']})", s["forecast_within"] >= need))
  checks.append((f"no well-determined forecast off by > {FORECAST_TOL} "
                 f"(seeds {s['well_determined_misses'] or 'none'})",
                 not s["well_determined_misses"]))
  return checks


def _fmt(v, digits=3) -> str:
  return "-" if v is None else f"{v:.{digits}f}"


def render(rows: list[dict], summary: dict, pooled: dict | None, checks, repeat) -> str:
  lines = [f"demo over {len(rows)} seeds, mode {summary['mode']}, {summary['jobs']} at once"
           + (f", overrides {' '.join(summary['overrides'])}" if summary["overrides"] else "")]
  lines.append(f"{'seed':>4} {'start':>6} {'final':>6} {'wall':>7} {'half-budget forecast':>21}"
               f" {'err':>6}  well determined")
  for r in sorted(rows, key=lambda r: r["seed"]):
    if "error" in r:
      lines.append(f"{r['seed']:>4} failed: {r['error']}")
      continue
    wd = {True: "yes", False: "no", None: "-"}[r["forecast_well_determined"]]
    lines.append(f"{r['seed']:>4} {r['start']:6.3f} {r['final']:6.3f} {r['wall_s']:6.0f}s "
                 f"{_fmt(r['forecast']):>21} {_fmt(r['forecast_abs_err']):>6}  {wd}")
  s = summary
  lines.append(f"final pass rate: mean {_fmt(s['final_mean'])}, sd {_fmt(s['final_sd'])}, "
               f"min {_fmt(s['final_min'])}, max {_fmt(s['final_max'])}")
  if pooled is not None:
    lines.append(
        f"pooled sigmoid over {pooled['n_seeds']} seeds (compute = training FLOPs): "
        f"A {pooled['A']:.3f} {_span(pooled['A_interval'])}, "
        f"B {pooled['B']:.2f} {_span(pooled['B_interval'], 2)}, "
        f"C_mid {pooled['C_mid_flops']:.3g} FLOPs, R0 {pooled['R0']:.3f}"
        f"{'' if pooled['well_determined'] else ' (not well determined)'}")
  if repeat is not None:
    lines.append(f"repeat of seed {repeat['seed']}: "
                 + ("identical evaluations" if repeat["identical"] else
                    f"DIFFERENT evaluations ({repeat['n_different']} of {repeat['n']})"))
  lines.append("targets (issue 18):")
  lines += [f"  [{'met' if ok else 'MISSED'}] {text}" for text, ok in checks]
  return "\n".join(lines)


def _span(p, digits=3) -> str:
  return "[-]" if p is None else f"[{p[0]:.{digits}f}, {p[1]:.{digits}f}]"


def main(argv=None) -> int:
  args = parse_args(argv)
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  jobs = [(s, out / f"seed{s}") for s in args.seeds]
  if args.check_repeat:
    jobs.append((args.seeds[0], out / f"seed{args.seeds[0]}_repeat"))
  rows: list[dict] = []
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
    futures = {ex.submit(run_seed, s, args, d): d for s, d in jobs}
    for f in concurrent.futures.as_completed(futures):
      r = f.result()
      r["run_dir"] = str(futures[f])
      if not args.json:
        state = r.get("error") or (f"{r['start']:.3f} -> {r['final']:.3f}")
        print(f"  seed {r['seed']} done in {r['wall_s']:.0f}s: {state}", file=sys.stderr,
              flush=True)
      rows.append(r)
  repeat = None
  if args.check_repeat:
    pair = [r for r in rows if r["seed"] == args.seeds[0]]
    rows = [r for r in rows if not r["run_dir"].endswith("_repeat")]
    first, again = sorted(pair, key=lambda r: r["run_dir"].endswith("_repeat"))
    if "error" not in first and "error" not in again:
      diff = sum(a != b for a, b in zip(first["evals"], again["evals"]))
      diff += abs(len(first["evals"]) - len(again["evals"]))
      repeat = {"seed": first["seed"], "identical": diff == 0, "n_different": diff,
                "n": max(len(first["evals"]), len(again["evals"]))}
  summary = summarise(rows, args)
  pooled = pooled_fit(rows, args.n_boot)
  checks = check_targets(summary, rows)
  summary["pooled_fit"] = pooled
  summary["targets"] = {text: ok for text, ok in checks}
  if repeat is not None:
    summary["repeat"] = repeat
  if args.json:
    print(json.dumps({"seeds": sorted(rows, key=lambda r: r["seed"]), "summary": summary}))
  else:
    print(render(rows, summary, pooled, checks, repeat))
  return 0


if __name__ == "__main__":
  sys.exit(main())
