"""Math verifier benchmark: accuracy by answer type, time per verdict, threads, hostile inputs.

  python benchmarks/rewards/verifier_bench.py [--corpus A.jsonl B.jsonl ...] [--no-math-verify]
                                      [--json OUT.json]

Scores every (gold, response) pair of each labelled set (default: the four under
tests/rewards/data: verifier_corpus, verifier_holdout, verifier_formats and its hold-out)
with our "math" verifier and, when the `math-verify` package is installed (the [test] extra
has it), with math-verify in the same run. math-verify runs only in a worker process that is killed when one verdict takes longer than --mv-timeout
seconds (its own timeouts use signal.alarm, which works only in a main thread); the gold is
passed as "\\boxed{gold}", as verl does. Reports, for both: accuracy per category, wrong
acceptances among the near-misses (and among the equation near-misses), and the median / p99
/ max seconds per verdict. For ours also: whether 8 threads of the Scorer give the same
verdicts as one sequential pass, and the slowest hostile input of tests/rewards/hostile_test.py
(none may be accepted).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import multiprocessing as mp
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from jaxrl_scale.rewards import scorer as scorer_lib  # noqa: E402
from jaxrl_scale.rewards import verifiers  # noqa: E402


def _load(path: pathlib.Path) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def _percentile(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _summary(rows: list[dict], verdicts: list[bool | None], seconds: list[float]) -> dict:
  by_cat: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
  wrong_accept = wrong_accept_eq = near = near_eq = 0
  for row, verdict in zip(rows, verdicts):
    cell = by_cat[row["category"]]
    cell[0] += int(verdict == row["expected"])
    cell[1] += 1
    if row["near_miss"]:
      near += 1
      near_eq += row["category"] == "equations"
      if verdict:
        wrong_accept += 1
        wrong_accept_eq += row["category"] == "equations"
  right = sum(c[0] for c in by_cat.values())
  return {
      "accuracy": right / len(rows),
      "by_category": {k: v[0] / v[1] for k, v in sorted(by_cat.items())},
      "near_misses": near, "wrong_acceptances": wrong_accept,
      "equation_near_misses": near_eq, "equation_wrong_acceptances": wrong_accept_eq,
      "median_s": statistics.median(seconds), "p99_s": _percentile(seconds, 0.99),
      "max_s": max(seconds),
  }


def run_ours(rows: list[dict]) -> tuple[list[bool], list[float], list[str]]:
  verdicts, seconds, reasons = [], [], []
  for row in rows:
    start = time.perf_counter()
    verdict = verifiers.math_reward(row["response"], row["gold"])
    seconds.append(time.perf_counter() - start)
    verdicts.append(verdict.correct)
    reasons.append(verdict.reason)
  return verdicts, seconds, reasons


def threads_identical(rows: list[dict], sequential: list[bool], threads: int = 8,
                      repeats: int = 3) -> bool:
  pairs = [(row["response"], row["gold"]) for row in rows] * repeats
  with scorer_lib.Scorer("math", num_threads=threads, timeout_s=30.0) as scorer:
    result = scorer.score(pairs)
  got = [v is not None and v.correct for v in result.verdicts]
  return got == sequential * repeats


def hostile(rows_limit: int | None = None) -> dict:
  spec = importlib.util.spec_from_file_location(
      "hostile_cases", REPO / "tests" / "rewards" / "hostile_test.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  slowest, name_slowest, accepted = 0.0, None, []
  for name, make in list(module.CASES.items())[:rows_limit]:
    response = make("/nonexistent/canary")
    start = time.perf_counter()
    verdict = verifiers.math_reward(response, "42")
    elapsed = time.perf_counter() - start
    if elapsed > slowest:
      slowest, name_slowest = elapsed, name
    if verdict.correct:
      accepted.append(name)
  return {"cases": len(module.CASES), "slowest_s": slowest, "slowest_case": name_slowest,
          "accepted": accepted}


# -- math-verify in a killable worker process ------------------------------------------

def _mv_worker(conn) -> None:
  from math_verify import parse, verify  # imported in the worker only
  while True:
    item = conn.recv()
    if item is None:
      return
    gold, response = item
    start = time.perf_counter()
    try:
      ok = bool(verify(parse("\\boxed{" + gold + "}"), parse(response)))
    except Exception:  # noqa: BLE001  a crash is a wrong verdict
      ok = False
    conn.send((ok, time.perf_counter() - start))


class MathVerifyProcess:
  """math-verify behind a pipe; a verdict slower than `timeout_s` kills the worker."""

  def __init__(self, timeout_s: float):
    self.timeout_s = timeout_s
    self.kills = 0
    self._ctx = mp.get_context("spawn")
    self._start()

  def _start(self) -> None:
    self._conn, child = self._ctx.Pipe()
    self._proc = self._ctx.Process(target=_mv_worker, args=(child,), daemon=True)
    self._proc.start()

  def verify(self, gold: str, response: str) -> tuple[bool, float]:
    self._conn.send((gold, response))
    if self._conn.poll(self.timeout_s):
      return self._conn.recv()
    self._proc.kill()
    self._proc.join()
    self.kills += 1
    self._start()
    return False, self.timeout_s

  def close(self) -> None:
    self._conn.send(None)
    self._proc.join(5)


def run_math_verify(worker: MathVerifyProcess,
                    rows: list[dict]) -> tuple[list[bool], list[float], int]:
  kills = worker.kills
  verdicts, seconds = [], []
  for row in rows:
    ok, elapsed = worker.verify(row["gold"], row["response"])
    verdicts.append(ok)
    seconds.append(elapsed)
  return verdicts, seconds, worker.kills - kills


def _print_table(ours: dict, theirs: dict | None) -> None:
  cats = list(ours["by_category"])
  head = f"{'category':<20}{'ours':>8}" + (f"{'math-verify':>14}" if theirs else "")
  print(head)
  for cat in cats:
    line = f"{cat:<20}{ours['by_category'][cat]:>8.1%}"
    if theirs:
      line += f"{theirs['by_category'][cat]:>14.1%}"
    print(line)
  for key, fmt in (("accuracy", "{:.1%}"), ("wrong_acceptances", "{}"),
                   ("equation_wrong_acceptances", "{}"), ("median_s", "{:.6f}"),
                   ("p99_s", "{:.6f}"), ("max_s", "{:.6f}")):
    line = f"{key:<20}{fmt.format(ours[key]):>8}"
    if theirs:
      line += f"{fmt.format(theirs[key]):>14}"
    print(line)


DEFAULT_SETS = ("verifier_corpus.jsonl", "verifier_holdout.jsonl", "verifier_formats.jsonl",
                "verifier_formats_holdout.jsonl")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus", nargs="+",
                      default=[str(REPO / "tests/rewards/data" / n) for n in DEFAULT_SETS])
  parser.add_argument("--no-math-verify", action="store_true")
  parser.add_argument("--mv-timeout", type=float, default=10.0)
  parser.add_argument("--json", help="also write the results to this file")
  args = parser.parse_args(argv)
  verifiers.math_reward(r"\boxed{1}", "1")  # warm-up (imports)
  worker = None
  if not args.no_math_verify and importlib.util.find_spec("math_verify") is not None:
    worker = MathVerifyProcess(args.mv_timeout)
    worker.verify("1", "\\boxed{1}")  # warm-up: the import and ANTLR set-up are not verdicts
  elif not args.no_math_verify:
    print("math-verify is not installed (pip install -e '.[test]'): ours only")
  results = {}
  for path in map(pathlib.Path, args.corpus):
    rows = _load(path)
    ours_v, ours_s, _ = run_ours(rows)
    ours = _summary(rows, ours_v, ours_s)
    ours["threads_identical"] = threads_identical(rows, ours_v)
    theirs = None
    if worker is not None:
      mv_v, mv_s, kills = run_math_verify(worker, rows)
      theirs = _summary(rows, mv_v, mv_s)
      theirs["killed_after_timeout"] = kills
    print(f"\n== {path.name}: {len(rows)} pairs, {ours['near_misses']} near-misses "
          f"({ours['equation_near_misses']} equations)")
    _print_table(ours, theirs)
    print(f"ours: 8 threads x3 give the sequential verdicts: {ours['threads_identical']}")
    if theirs:
      print(f"math-verify: workers killed after {args.mv_timeout:g}s: "
            f"{theirs['killed_after_timeout']}")
      print(f"median time ratio math-verify / ours: "
            f"{theirs['median_s'] / ours['median_s']:.1f}x")
    results[path.name] = {"ours": ours, "math_verify": theirs}
  if worker is not None:
    worker.close()
  h = hostile()
  print(f"\nours: hostile {h['cases']} cases, slowest {h['slowest_s']:.3f}s "
        f"({h['slowest_case']}), accepted: {h['accepted'] or 'none'}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"sets": results, "hostile": h}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
