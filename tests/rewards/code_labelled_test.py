"""Every verdict on the labelled code set (benchmarks/rewards/code_labelled_set.py) is right.

The labels were declared by hand and checked, when the set was built, by calling each
program's `solve` in-process (no sandbox, no harness, no comparison code of ours; for the
assertion rows, by running their HumanEval-style check directly); here the whole verifier
must reproduce them: extraction, sandbox, harness and comparison.
"""

import collections
import json
import pathlib

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import scorer as scorer_lib

SET = pathlib.Path(__file__).parent / "data" / "code_labelled.jsonl"
LIMITS = code_sandbox.Limits(wall_s=1.0, total_wall_s=3.0)


def test_every_verdict_matches_its_label():
  rows = [json.loads(line) for line in SET.read_text().splitlines() if line.strip()]
  assert len(rows) >= 200
  assert {r["format"] for r in rows} == {"function", "stdin", "assert"}
  assert set(collections.Counter(r["label"] for r in rows)) == set(code.STATUSES)

  def reward(response, answer):
    return code.to_verdict(code.judge(response, answer, limits=LIMITS))

  with scorer_lib.Scorer(reward, timeout_s=60.0, num_threads=4) as scorer:
    result = scorer.score([(r["response"], r["answer"]) for r in rows])
  wrong = [(r["id"], r["label"], v.detail if v else repr(e))
           for r, v, e in zip(rows, result.verdicts, result.errors)
           if v is None or v.detail.split(":", 1)[0] != r["label"]]
  assert not wrong, wrong
  assert all(v.correct == (r["label"] == "pass") for r, v in zip(rows, result.verdicts))
