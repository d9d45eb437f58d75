r"""The labelled corpus (tests/rewards/data): accuracy, wrong acceptances, thread determinism.

verifier_corpus.jsonl: 364 (gold, response) pairs over 12 answer types, 118 near-misses,
built from math-verify's own test cases plus new sets, intervals, inequalities, algebra,
matrices and near-misses. verifier_holdout.jsonl: 66 pairs written after the verifier, as a
check that it was not fitted to the first corpus. Targets (issue 16): accuracy >= 93%, at
most 3 wrong acceptances per 60 near-misses and none on equations; identical verdicts from 8
threads. verifier_formats.jsonl (issue 39): 192 pairs, 93 of them near misses, in the
formats models write (decimal commas and separators, decimals for exact values, mixed
numbers and percentages, named values, inequalities as sets, unboxed and per-part answers,
matrix expressions), many from math-verify's own tests (each row names its source); written
before the verifier handled them (it scored 71%). Targets: >= 98% right, <= 1% of the near
misses accepted. verifier_formats_holdout.jsonl: 48 more of math-verify's test cases (9 near
misses), scored once the formats set passed (89.6%, 0 wrong acceptances) and fixed after
(\quadx in a gold, a ratio of names NO/BO as a name). benchmarks/rewards/verifier_bench.py prints
the same numbers with timings, and math-verify's.
"""

import collections
import json
import pathlib

import pytest

from jaxrl_scale.rewards import scorer as scorer_lib
from jaxrl_scale.rewards import verifiers

DATA = pathlib.Path(__file__).parent / "data"


def _load(name):
  with open(DATA / name, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module", params=["verifier_corpus.jsonl", "verifier_holdout.jsonl",
                                        "verifier_formats.jsonl",
                                        "verifier_formats_holdout.jsonl"])
def scored(request):
  rows = _load(request.param)
  return rows, [verifiers.math_reward(r["response"], r["gold"]).correct for r in rows]


def test_corpus_is_labelled_and_covers_the_categories():
  rows = _load("verifier_corpus.jsonl")
  cats = collections.Counter(r["category"] for r in rows)
  assert len(rows) >= 300 and len(cats) >= 10 and min(cats.values()) >= 10
  assert sum(r["near_miss"] for r in rows) >= 60
  assert all(not r["expected"] for r in rows if r["near_miss"])


def test_accuracy(scored):
  rows, verdicts = scored
  right = sum(v == r["expected"] for r, v in zip(rows, verdicts))
  assert right / len(rows) >= 0.93, right / len(rows)


def test_wrong_acceptances(scored):
  rows, verdicts = scored
  near = [(r, v) for r, v in zip(rows, verdicts) if r["near_miss"]]
  accepted = [r for r, v in near if v]
  assert len(accepted) * 60 <= 3 * len(near), accepted
  assert not [r for r in accepted if r["category"] == "equations"]


def test_formats_set_is_labelled_and_half_near_misses():
  rows = _load("verifier_formats.jsonl")
  cats = collections.Counter(r["category"] for r in rows)
  near = sum(r["near_miss"] for r in rows)
  assert len(rows) >= 150 and len(cats) >= 7 and min(cats.values()) >= 20
  assert 0.45 * len(rows) <= near and all(not r["expected"] for r in rows if r["near_miss"])
  assert sum("math-verify" in r["source"] for r in rows) >= 40


def test_formats_targets():
  rows = _load("verifier_formats.jsonl")
  verdicts = [verifiers.math_reward(r["response"], r["gold"]).correct for r in rows]
  wrong = [r for r, v in zip(rows, verdicts) if v != r["expected"]]
  accepted = [r for r, v in zip(rows, verdicts) if v and r["near_miss"]]
  assert len(wrong) <= 0.02 * len(rows), wrong
  assert len(accepted) <= 0.01 * sum(r["near_miss"] for r in rows), accepted


def test_eight_threads_give_the_sequential_verdicts():
  rows = _load("verifier_corpus.jsonl") + _load("verifier_formats.jsonl")
  sequential = [verifiers.math_reward(r["response"], r["gold"]).correct for r in rows]
  pairs = [(r["response"], r["gold"]) for r in rows] * 2
  with scorer_lib.Scorer("math", num_threads=8, timeout_s=60.0) as scorer:
    result = scorer.score(pairs)
  assert result.counts["errors"] == 0 and result.counts["timeouts"] == 0
  assert [v.correct for v in result.verdicts] == sequential * 2


def test_math_verify_beside_us_on_the_formats_set():
  # The reference the set's cases come from, run as the bench runs it (gold boxed, as verl
  # does): ours must be at least as right and accept no more near misses.
  mv = pytest.importorskip("math_verify")
  rows = _load("verifier_formats.jsonl")
  ours = [verifiers.math_reward(r["response"], r["gold"]).correct for r in rows]
  theirs = []
  for r in rows:
    try:
      theirs.append(bool(mv.verify(mv.parse("\\boxed{" + r["gold"] + "}"),
                                   mv.parse(r["response"]))))
    except Exception:  # noqa: BLE001  a crash of the reference is a wrong verdict
      theirs.append(False)

  def right(verdicts):
    return sum(v == r["expected"] for r, v in zip(rows, verdicts))

  def accepted(verdicts):
    return sum(v and r["near_miss"] for r, v in zip(rows, verdicts))

  assert right(ours) >= right(theirs) and accepted(ours) <= accepted(theirs), (
      right(ours), right(theirs), accepted(ours), accepted(theirs))
