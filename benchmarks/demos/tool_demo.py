"""The CPU tool demo over seeds, with the tool and without it (issue 65 item 5).

    python benchmarks/demos/tool_demo.py                     # seeds 0-2, both variants
    python benchmarks/demos/tool_demo.py --seeds 0-4 --json
    python benchmarks/demos/tool_demo.py --set run.steps=10  # a quick look

Each seed runs `jaxrl-scale train configs/cpu_tool.yaml run.seed=S` as a subprocess, one
at a time: the tool variant as the config has it (episodes of the Python tool, the SFT
warm start played through it), then the no-tool variant of the same task, the same
problems and the same recipe (`data.source=multiply/d3x4_answer env.name=
sampler.stop_strings=[]`: the warm start's solutions are the bare products). Per run it
prints the validation pass rate after the warm start and at the end, and the wall time
of the whole command (start-up, compiles, SFT and RL); then the targets:

  - the tool variant ends at a validation pass rate >= 0.8 on every seed, within 6
    minutes of wall time each (a time that depends on the machine: run it alone);
  - the no-tool variant ends at least 0.3 lower, seed by seed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# pylint: disable-next=wrong-import-position
from benchmarks.demos.demo_seeds import run_seed, seed_run_arguments  # noqa: E402

CONFIG = "configs/cpu_tool.yaml"
NO_TOOL = ("data.source=multiply/d3x4_answer", "env.name=", "sampler.stop_strings=[]")
# Issue 65's targets.
FINAL_MIN = 0.8
WALL_MAX_S = 360.0
GAP_MIN = 0.3


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  seed_run_arguments(p, seeds="0-2", out_dir="tool_demo", config=CONFIG,
                     set_help="both variants")
  p.add_argument("--no-baseline", action="store_true",
                 help="only the tool variant (no gap is checked)")
  p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
  args = p.parse_args(argv)
  for o in args.overrides:
    if "=" not in o:
      p.error(f"--set {o!r}: expected KEY=VALUE")
  return args


def run_variant(seed: int, args, variant: str) -> dict:
  """One seed of one variant ("tool" or "no_tool"), as demo_seeds.run_seed reports it."""
  extra = list(NO_TOOL) if variant == "no_tool" else []
  run_args = argparse.Namespace(config=args.config, overrides=[*args.overrides, *extra],
                                mode=None)
  run_dir = pathlib.Path(args.out_dir) / variant / f"seed{seed}"
  run_dir.parent.mkdir(parents=True, exist_ok=True)
  row = run_seed(seed, run_args, run_dir)
  keep = ("seed", "wall_s", "rl_wall_s", "start", "final", "steps", "evals", "log", "error")
  return {"variant": variant, **{k: row[k] for k in keep if k in row}}


def check_targets(rows: list[dict]) -> list[tuple[str, bool]]:
  """(line, met) for each target; a failed run fails every target it enters."""
  tool = {r["seed"]: r for r in rows if r["variant"] == "tool"}
  base = {r["seed"]: r for r in rows if r["variant"] == "no_tool"}
  finals = [r.get("final") for r in tool.values()]
  ok_final = bool(tool) and all(f is not None and f >= FINAL_MIN for f in finals)
  walls = [r["wall_s"] for r in tool.values()]
  checks = [
      (f"tool: final pass rate >= {FINAL_MIN} on every seed "
       f"({', '.join(_fmt(f) for f in finals)})", ok_final),
      (f"tool: wall time <= {WALL_MAX_S:.0f} s per seed "
       f"({', '.join(f'{w:.0f}' for w in walls)} s)",
       bool(tool) and all(w <= WALL_MAX_S and "error" not in r
                          for w, r in zip(walls, tool.values())))]
  if base:
    gaps = [None if tool[s].get("final") is None or base[s].get("final") is None
            else tool[s]["final"] - base[s]["final"] for s in tool if s in base]
    checks.append((f"no tool: ends >= {GAP_MIN} lower on every seed "
                   f"(gaps {', '.join(_fmt(g) for g in gaps)})",
                   bool(gaps) and all(g is not None and g >= GAP_MIN for g in gaps)))
  return checks


def _fmt(v, digits=3) -> str:
  return "n/a" if v is None else f"{v:.{digits}f}"


def render(rows: list[dict], checks) -> str:
  lines = [f"{'variant':8} {'seed':>4} {'start':>6} {'final':>6} {'steps':>5} {'wall s':>7}"]
  for r in rows:
    if "error" in r:
      lines.append(f"{r['variant']:8} {r['seed']:>4} failed: {r['error']} (log {r['log']})")
      continue
    lines.append(f"{r['variant']:8} {r['seed']:>4} {_fmt(r['start']):>6} {_fmt(r['final']):>6} "
                 f"{r['steps']:>5} {r['wall_s']:>7.0f}")
  for variant in ("tool", "no_tool"):
    finals = [r["final"] for r in rows if r["variant"] == variant and "error" not in r]
    if finals:
      lines.append(f"{variant}: final mean {statistics.fmean(finals):.3f}, min {min(finals):.3f}"
                   f" over {len(finals)} seeds")
  lines.append("targets (issue 65 item 5):")
  lines += [f"  [{'met' if ok else 'MISSED'}] {text}" for text, ok in checks]
  return "\n".join(lines)


def main(argv=None) -> int:
  args = parse_args(argv)
  variants = ("tool",) if args.no_baseline else ("tool", "no_tool")
  rows = []
  for seed in args.seeds:
    for variant in variants:
      rows.append(run_variant(seed, args, variant))
      if not args.json:
        r = rows[-1]
        print(f"  {variant} seed {seed}: " + (r["error"] if "error" in r else
              f"{_fmt(r['start'])} -> {_fmt(r['final'])} in {r['wall_s']:.0f} s"),
              file=sys.stderr, flush=True)
  checks = check_targets(rows)
  if args.json:
    print(json.dumps({"config": args.config, "overrides": args.overrides, "no_tool": NO_TOOL,
                      "runs": rows, "targets": {t: ok for t, ok in checks}}, indent=1))
  else:
    print(render(rows, checks))
  return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
