"""Code verifier benchmark: verdicts on the labelled set, hostile programs, throughput, wall.

  python benchmarks/rewards/code_verifier_bench.py [--json] [--threads N] [--python PATH]
                                           [--baseline REV [--rounds N]]
                                           [--set tests/rewards/data/code_labelled.jsonl]

Scores every program of the labelled set (benchmarks/rewards/code_labelled_set.py builds it:
correct and subtly wrong programs, function-call and stdin/stdout tests, hand-declared
labels) with the "code" reward's judge under the default limits, through a Scorer with
--threads workers, and reports:

  labelled     every verdict's status against its label (target: all right); for the
               assertion rows, the label is HumanEval's own harness run directly, so
               "assert_agreement" is the agreement with it (target >= 98%, and no wrong
               program passing)
  hostile      the hostile programs of tests/rewards/code_hostile_test.py, each must end
               without passing and without an error or a scorer timeout (target: all inert)
  throughput   programs/s over the short programs (all but the labelled timeouts) of the
               function and stdin formats, scored as one batch (target: >= 50 on 2
               cores); the assertion rows (two processes each) apart
  wall         p99 seconds per program over the whole labelled set, and the slowest
               timed-out program, against the per-case wall limit + 0.5 s (target)
  protections  the sandbox's layers in force (code_sandbox.protections())
  baseline     with --baseline REV: the throughput of the sandbox as it was at git
               revision REV (its jaxrl_scale/ unpacked to a temporary directory) and of
               this tree, measured in turns in fresh processes, --rounds times each,
               and their ratio (target: this tree >= 0.8x)
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
# --baseline runs this script again with an older tree first on the path.
sys.path.insert(0, os.environ.get("JAXRL_BENCH_TREE", str(REPO)))

from jaxrl_scale.rewards import code  # noqa: E402
from jaxrl_scale.rewards import code_sandbox  # noqa: E402
from jaxrl_scale.rewards import scorer as scorer_lib  # noqa: E402

SET = REPO / "tests" / "rewards" / "data" / "code_labelled.jsonl"
HOSTILE = REPO / "tests" / "rewards" / "code_hostile_test.py"
THROUGHPUT_TARGET = 50.0
WALL_MARGIN_S = 0.5


def _percentile(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _score(pairs, limits, threads):
  """(verdicts, seconds per program, errors, batch seconds) through one Scorer batch."""
  seconds = {}

  def reward(response, answer):
    start = time.monotonic()
    try:
      verdict = code.judge(response, answer, limits=limits)
    finally:
      seconds[(response, answer)] = time.monotonic() - start
    return code.to_verdict(verdict)

  with scorer_lib.Scorer(reward, timeout_s=limits.total_wall_s + 30.0,
                         num_threads=threads) as scorer:
    start = time.monotonic()
    result = scorer.score(pairs)
    batch = time.monotonic() - start
  return result, [seconds.get(p, float("nan")) for p in pairs], batch


def _status(verdict) -> str | None:
  return None if verdict is None else verdict.detail.split(":", 1)[0]


def labelled(rows, limits, threads) -> dict:
  result, seconds, batch = _score([(r["response"], r["answer"]) for r in rows], limits,
                                  threads)
  mismatches, by_label = [], collections.Counter()
  for row, verdict, error in zip(rows, result.verdicts, result.errors):
    by_label[row["label"]] += 1
    got = _status(verdict) if error is None else f"error: {error!r}"
    if got != row["label"]:
      mismatches.append({"id": row["id"], "label": row["label"], "got": got,
                         "detail": verdict.detail if verdict else None})
  timeouts = [s for r, s in zip(rows, seconds) if r["label"] == "timeout"]
  by_format = collections.Counter(r["format"] for r in rows)
  asserts = [(r, v) for r, v in zip(rows, result.verdicts) if r["format"] == "assert"]
  agree = sum(_status(v) == r["label"] for r, v in asserts)
  false_pass = sum(v is not None and v.correct and r["label"] != "pass" for r, v in asserts)
  return {"programs": len(rows), "by_label": dict(by_label), "by_format": dict(by_format),
          "assert_agreement": round(agree / len(asserts), 4) if asserts else None,
          "assert_wrong_acceptances": false_pass,
          "right": len(rows) - len(mismatches), "all_right": not mismatches,
          "mismatches": mismatches, "batch_s": round(batch, 3),
          "p99_wall_s": round(_percentile(seconds, 0.99), 3),
          "max_timeout_wall_s": round(max(timeouts), 3) if timeouts else None}


def throughput(rows, limits, threads, fmt=("function", "stdin")) -> dict:
  short = [(r["response"], r["answer"]) for r in rows
           if r["label"] != "timeout" and r.get("format") in fmt]
  _, seconds, batch = _score(short, limits, threads)
  return {"programs": len(short), "threads": threads, "cores": os.cpu_count(),
          "batch_s": round(batch, 3), "programs_per_s": round(len(short) / batch, 1),
          "median_wall_s": round(sorted(seconds)[len(seconds) // 2], 4),
          "target": THROUGHPUT_TARGET, "met": len(short) / batch >= THROUGHPUT_TARGET}


def hostile(limits, threads) -> dict:
  spec = importlib.util.spec_from_file_location("code_hostile_test", HOSTILE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  outside_dir = tempfile.mkdtemp(prefix="jaxrl_outside_")
  os.chmod(outside_dir, 0o777)
  outside = os.path.join(outside_dir, "canary.txt")
  try:
    programs = module._hostile(outside)  # pylint: disable=protected-access
    answer = module.TESTS
    fence = module._fence  # pylint: disable=protected-access
    pairs = [(fence(p), answer) for p in programs.values()]
    result, seconds, batch = _score(pairs, limits, threads)
    canary = os.path.exists(outside)
  finally:
    shutil.rmtree(outside_dir)
  rows = {}
  for name, verdict, error, wall in zip(programs, result.verdicts, result.errors, seconds):
    inert = error is None and verdict is not None and not verdict.correct and not canary
    rows[name] = {"status": _status(verdict), "inert": inert, "wall_s": round(wall, 3)}
  return {"programs": len(rows), "inert": sum(r["inert"] for r in rows.values()),
          "all_inert": all(r["inert"] for r in rows.values()), "canary_written": canary,
          "batch_s": round(batch, 3), "max_wall_s": round(max(seconds), 3),
          "by_program": rows}


def baseline(rev: str, rounds: int, args) -> dict:
  """Throughput at git revision `rev` against this tree, in alternating fresh processes."""
  tree = tempfile.mkdtemp(prefix="jaxrl_bench_baseline_")
  try:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "jaxrl_scale"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    rates = {"baseline": [], "this": []}
    for _ in range(rounds):
      for name, path in (("baseline", tree), ("this", str(REPO))):
        cmd = [sys.executable, __file__, "--throughput-only", "--threads", str(args.threads),
               "--set", args.set] + (["--python", args.python] if args.python else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                             env={**os.environ, "JAXRL_BENCH_TREE": path}).stdout
        rates[name].append(json.loads(out.strip().splitlines()[-1])["programs_per_s"])
  finally:
    shutil.rmtree(tree)
  ratio = statistics.median(rates["this"]) / statistics.median(rates["baseline"])
  return {"rev": rev, "rounds": rounds, "programs_per_s": rates,
          "ratio_of_medians": round(ratio, 3), "target": 0.8, "met": ratio >= 0.8}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--set", default=str(SET))
  parser.add_argument("--threads", type=int, default=2 * (os.cpu_count() or 1))
  parser.add_argument("--python", default=None,
                      help="interpreter for the programs (default: this one)")
  parser.add_argument("--baseline", metavar="REV", default=None,
                      help="also measure the throughput of the sandbox at this git revision")
  parser.add_argument("--rounds", type=int, default=3, help="turns of --baseline")
  parser.add_argument("--throughput-only", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  args = parser.parse_args()
  limits = code_sandbox.Limits(python=args.python)
  with open(args.set, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  code_sandbox.run_python("pass", limits, single_stdin="")  # (starts the fork server)
  if args.throughput_only:
    print(json.dumps(throughput(rows, limits, args.threads)))
    return
  report = {
      "python": limits.python or code_sandbox.default_python(),
      "protections": code_sandbox.protections(limits.python),
      "limits": {"wall_s": limits.wall_s, "total_wall_s": limits.total_wall_s,
                 "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb},
      "labelled": labelled(rows, limits, args.threads),
      "throughput": throughput(rows, limits, args.threads),
      "assert_throughput": throughput(rows, limits, args.threads, ("assert",)),
      "hostile": hostile(limits, args.threads),
  }
  lab = report["labelled"]
  report["wall"] = {"p99_s": lab["p99_wall_s"], "max_timeout_s": lab["max_timeout_wall_s"],
                    "target_s": limits.wall_s + WALL_MARGIN_S,
                    "met": max(lab["p99_wall_s"], lab["max_timeout_wall_s"] or 0.0)
                    <= limits.wall_s + WALL_MARGIN_S}
  report["targets_met"] = bool(lab["all_right"] and report["hostile"]["all_inert"]
                               and report["throughput"]["met"] and report["wall"]["met"])
  if args.baseline:
    report["baseline"] = baseline(args.baseline, args.rounds, args)
    report["targets_met"] = report["targets_met"] and report["baseline"]["met"]
  if args.json:
    print(json.dumps(report))
    return
  print(f"python {report['python']}: {report['protections']}")
  print(f"labelled: {lab['right']}/{lab['programs']} right {lab['by_label']}; assertion "
        f"rows agree with the direct check {lab['assert_agreement']:.2%}, wrong "
        f"acceptances {lab['assert_wrong_acceptances']}")
  for m in lab["mismatches"]:
    print(f"  MISMATCH {m}")
  tp = report["throughput"]
  print(f"throughput: {tp['programs_per_s']} programs/s ({tp['programs']} short programs, "
        f"{tp['threads']} threads, {tp['cores']} cores; target {tp['target']}); assertion "
        f"problems {report['assert_throughput']['programs_per_s']}/s")
  print(f"wall: p99 {report['wall']['p99_s']} s, slowest timeout "
        f"{report['wall']['max_timeout_s']} s (target {report['wall']['target_s']} s)")
  ho = report["hostile"]
  print(f"hostile: {ho['inert']}/{ho['programs']} inert, slowest {ho['max_wall_s']} s")
  if args.baseline:
    ba = report["baseline"]
    print(f"baseline {ba['rev']}: programs/s {ba['programs_per_s']}, this/baseline "
          f"{ba['ratio_of_medians']} (median of {ba['rounds']}; target {ba['target']})")
  print(f"targets met: {report['targets_met']}")


if __name__ == "__main__":
  main()
