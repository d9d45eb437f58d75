"""Plans every config in configs/ on the slice its header names and on the next size up
(twice the chips), and checks the paper-scale targets on both.

Each config's header carries the command that plans it (`jaxrl-scale plan configs/X.yaml
--topology NAME`); this script runs exactly that command, one subprocess per config (libtpu
and the compiled programs are freed between them), and prints one row per config:

  fits, the smallest HBM headroom over its programs, the train step's compiled/model FLOPs
  and roofline MFU bound, and the longest single compile (seconds on this machine).

Targets (issue 12), checked for every config that is not the CPU demo:
  every program fits with >= 10% HBM headroom; train step compiled FLOPs <= 1.4x model
  FLOPs; train step MFU bound >= 0.5; every compile <= 300 s.

    python benchmarks/plan/plan_configs.py  # all configs, two sizes (~5 min each)
    python benchmarks/plan/plan_configs.py configs/scalerl_qwen3_8b.yaml --json-dir runs/plans

Exit status 1 when a target is missed. Compile times depend on the machine and its load:
they are measured, not asserted anywhere else.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

from jaxrl_scale.errors import UserError
from jaxrl_scale.plan import chips

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGETS = {"headroom": 0.10, "flops_ratio": 1.4, "mfu_bound": 0.5, "compile_seconds": 300.0}


def header_topology(path: pathlib.Path) -> str | None:
  """The --topology named in the config's header comment, if any."""
  for line in path.read_text().splitlines():
    if not line.startswith("#"):
      break
    m = re.search(r"jaxrl-scale plan \S+ --topology (\S+)", line)
    if m:
      return m.group(1)
  return None


def next_size(topology: str) -> str | None:
  """The slice of twice the chips, named alike (v5p-128 -> v5p-256, h100 -> h100-2), or None
  where there is none or the name is not doubled so (a chip topology such as v5p:4x4x4)."""
  m = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+))?", topology.strip().lower())
  if m is None or (m.group(2) is None and not m.group(1).startswith(("h", "a", "b"))):
    return None
  bigger = f"{m.group(1)}-{2 * int(m.group(2) or 1)}"
  try:
    chips.resolve(bigger)
  except UserError:  # the largest slice of its kind already
    return None
  return bigger


def plan(path: pathlib.Path, topology: str) -> tuple[dict | None, str, float]:
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "jaxrl_scale.cli", "plan", str(path),
                         "--topology", topology, "--json"], cwd=ROOT, capture_output=True,
                        text=True, check=False)
  wall = time.perf_counter() - t0
  try:
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr, wall
  except (json.JSONDecodeError, IndexError):
    return None, proc.stderr, wall


def check(name: str, result: dict) -> list[str]:
  """Targets the plan misses."""
  missed = []
  for prog, r in result["programs"].items():
    if not r.get("fits"):
      missed.append(f"{prog} does not fit")
    elif r.get("headroom", 0.0) < TARGETS["headroom"]:
      missed.append(f"{prog} headroom {r['headroom']:.0%} < {TARGETS['headroom']:.0%}")
    if r.get("compile_seconds", 0.0) > TARGETS["compile_seconds"]:
      missed.append(f"{prog} compiled in {r['compile_seconds']:.0f} s")
  train = result["programs"].get("train_step", {})
  if train.get("flops_ratio") is not None and train["flops_ratio"] > TARGETS["flops_ratio"]:
    missed.append(f"train_step FLOPs {train['flops_ratio']:.2f}x model")
  if train.get("mfu_bound") is not None and train["mfu_bound"] < TARGETS["mfu_bound"]:
    missed.append(f"train_step MFU bound {train['mfu_bound']:.2f}")
  return [f"{name}: {m}" for m in missed]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("configs", nargs="*", help="config files (default: configs/*.yaml)")
  parser.add_argument("--json-dir", help="also write each plan's JSON here")
  parser.add_argument("--own-size-only", action="store_true",
                      help="plan each config on its header's topology only (by default also "
                      "on the slice of twice the chips)")
  args = parser.parse_args()
  paths = ([pathlib.Path(c) for c in args.configs] if args.configs
           else sorted((ROOT / "configs").glob("*.yaml")))
  if args.json_dir:
    pathlib.Path(args.json_dir).mkdir(parents=True, exist_ok=True)
  print(f"{'config':<28}{'topology':<12}{'fits':>5}{'headroom':>10}{'FLOPs x':>9}"
        f"{'MFU<=':>7}{'max compile':>13}{'wall':>8}", flush=True)
  missed: list[str] = []
  todo = []
  for path in paths:
    topology = header_topology(path)
    if topology is None:
      print(f"{path.stem:<28}(no --topology in its header: not planned)", flush=True)
      continue
    todo.append((path, topology))
    # One size up too (issue 68: a bigger slice once stopped the paper recipe fitting).
    bigger = None if args.own_size_only else next_size(topology)
    if bigger is not None and path.stem != "cpu_tiny":
      todo.append((path, bigger))
  for path, topology in todo:
    result, stderr, wall = plan(path, topology)
    if result is None:
      last = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
      print(f"{path.stem:<28}{topology:<12} failed: {last}", flush=True)
      missed.append(f"{path.stem} on {topology}: plan failed: {last}")
      continue
    if args.json_dir:
      (pathlib.Path(args.json_dir) / f"{path.stem}_{topology}.json").write_text(
          json.dumps(result))
    rows = result["programs"].values()
    train = result["programs"].get("train_step", {})
    headroom = min(r.get("headroom", 0.0) if r.get("fits") else 0.0 for r in rows)
    compile_s = max(r.get("compile_seconds", 0.0) for r in rows)
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(f"{path.stem:<28}{topology:<12}{'yes' if result['fits'] else 'NO':>5}"
          f"{headroom:>10.0%}{fmt(train.get('flops_ratio'), '.2f'):>9}"
          f"{fmt(train.get('mfu_bound'), '.2f'):>7}{compile_s:>12.0f}s{wall:>7.0f}s", flush=True)
    if path.stem != "cpu_tiny":
      missed += check(f"{path.stem} on {topology}", result)
  print(f"targets: headroom >= {TARGETS['headroom']:.0%}, train FLOPs <= "
        f"{TARGETS['flops_ratio']}x model, MFU bound >= {TARGETS['mfu_bound']}, compile <= "
        f"{TARGETS['compile_seconds']:.0f} s")
  for m in missed:
    print("MISSED " + m)
  print("all targets met" if not missed else f"{len(missed)} target(s) missed")
  return 1 if missed else 0


if __name__ == "__main__":
  sys.exit(main())
