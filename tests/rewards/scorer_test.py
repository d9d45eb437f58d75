"""The thread-pool scorer: order, reward pair, counts, errors and deadlines."""

import logging
import math
import threading

import pytest

from jaxrl_scale.rewards import registry
from jaxrl_scale.rewards import scorer as scorer_lib


def test_scores_in_order_with_counts():
  pairs = [(r"\boxed{2}", "2"), ("The answer is 3.", "4"), ("nothing", "1"),
           (r"\boxed{\frac{1}{0}}", "4"), ("1/2", "0.5")]
  with scorer_lib.Scorer("math", num_threads=3) as scorer:
    result = scorer.score(pairs)
  assert result.rewards == [1.0, -1.0, -1.0, -1.0, 1.0]
  assert [v.reason for v in result.verdicts] == [
      "correct", "wrong", "no_answer", "unparseable", "correct"]
  assert result.counts == {"total": 5, "correct": 2, "wrong": 1, "no_answer": 1,
                           "unparseable": 1, "errors": 0, "timeouts": 0}
  assert result.errors == [None] * 5


def test_configurable_reward_pair_and_totals():
  scorer = scorer_lib.Scorer("arithmetic", correct_reward=1.0, incorrect_reward=0.0)
  assert scorer.score([("5", "5"), ("6", "5")]).rewards == [1.0, 0.0]
  scorer.score([("5", "5")])
  assert scorer.totals["total"] == 3 and scorer.totals["correct"] == 2
  scorer.close()
  with pytest.raises(RuntimeError):
    scorer.score([("5", "5")])


def test_many_pairs_match_sequential_scoring():
  fn = registry.get_reward("math")
  pairs = [(f"The answer is {i % 7}.", str(i % 5)) for i in range(300)]
  expected = [1.0 if fn(r, a).correct else -1.0 for r, a in pairs]
  with scorer_lib.Scorer("math", num_threads=4) as scorer:
    assert scorer.score(pairs).rewards == expected


def test_exception_marks_the_sample_invalid_not_wrong(caplog):
  def flaky(response: str, answer: str) -> bool:
    if response == "boom":
      raise RuntimeError("verifier bug")
    return response == answer

  with scorer_lib.Scorer(flaky, num_threads=2) as scorer:
    with caplog.at_level(logging.WARNING, logger=scorer_lib.__name__):
      result = scorer.score([("a", "a"), ("boom", "a"), ("a", "a")])
  # No reward at all (NaN), not the incorrect one: a verifier bug is not the model's error.
  assert result.rewards[0] == result.rewards[2] == 1.0 and math.isnan(result.rewards[1])
  assert result.valid == [True, False, True]
  assert result.counts["errors"] == 1 and result.verdicts[1] is None
  assert isinstance(result.errors[1], RuntimeError)
  assert "verifier bug" in caplog.text


def test_bad_return_type_is_an_error():
  with scorer_lib.Scorer(lambda r, a: 1.0) as scorer:
    result = scorer.score([("a", "a")])
  assert result.counts["errors"] == 1 and math.isnan(result.rewards[0])
  assert result.valid == [False]


def test_timeout_abandons_the_call_and_the_pool_keeps_working():
  release = threading.Event()

  def slow(response: str, answer: str) -> bool:
    if response == "hang":
      release.wait(60)  # held until the test ends: only the deadline can free the scorer
    return response == answer

  scorer = scorer_lib.Scorer(slow, timeout_s=1.0, num_threads=1)
  try:
    result = scorer.score([("hang", "x"), ("a", "a"), ("b", "b")])
    assert result.counts["timeouts"] == 1
    assert math.isnan(result.rewards[0]) and result.rewards[1:] == [1.0, 1.0]
    assert result.valid == [False, True, True]
    assert result.verdicts[0] is None and result.errors[0] is None
    # A replacement worker took over; the next batch still runs.
    assert scorer.score([("c", "c")]).rewards == [1.0]
    assert scorer.totals["timeouts"] == 1
  finally:
    release.set()
    scorer.close()


def test_truncated_responses_reach_verifiers_that_take_the_flag():
  seen = []

  def aware(response: str, answer: str, *, truncated: bool = False) -> bool:
    seen.append((response, truncated))
    return True

  with scorer_lib.Scorer(aware, num_threads=1) as scorer:
    scorer.score([("a", "x"), ("b", "x")], truncated=[True, False])
  assert sorted(seen) == [("a", True), ("b", False)]
  # A verifier without the flag is called as before.
  with scorer_lib.Scorer(lambda r, a: r == a, num_threads=1) as scorer:
    assert scorer.score([("a", "a")], truncated=[True]).rewards == [1.0]


def test_truncated_response_earns_nothing_from_the_last_number():
  # Cut by the token budget mid-reasoning, no <think> tag: the trailing 12 is not an answer.
  pairs = [("Let me add: 5 + 7 = 12", "12"), (r"So \boxed{12} and now I check: 5 +", "12")]
  with scorer_lib.Scorer("math", num_threads=1) as scorer:
    cut = scorer.score(pairs, truncated=[True, True])
    whole = scorer.score(pairs)
  assert cut.rewards == [-1.0, 1.0] and cut.verdicts[0].reason == "no_answer"
  assert cut.valid == [True, True]
  assert whole.rewards == [1.0, 1.0]
  with scorer_lib.Scorer("math") as scorer, pytest.raises(ValueError, match="truncated"):
    scorer.score(pairs, truncated=[True])


def test_invalid_arguments():
  with pytest.raises(ValueError):
    scorer_lib.Scorer("math", timeout_s=0)
  with pytest.raises(ValueError):
    scorer_lib.Scorer("math", num_threads=0)


def test_a_stop_request_interrupts_the_wait_for_slow_verifiers():
  """Sandboxed code answers can outlast a preemption's grace period: with the run's stop
  request, `score` raises Interrupted while the calls still run, not after all of them."""
  from jaxrl_scale import preempt  # pylint: disable=g-import-not-at-top
  release = threading.Event()
  stop = preempt.StopRequest(grace_s=0)
  finished = []

  def slow(response: str, answer: str) -> bool:
    if response == "first":
      stop.request()  # the signal comes while the batch is being judged
    release.wait(60)  # a verifier the test holds (the scorer's deadline is 120 s)
    finished.append(response)
    return response == answer

  scorer = scorer_lib.Scorer(slow, timeout_s=120.0, num_threads=2)
  try:
    with pytest.raises(preempt.Interrupted):
      scorer.score([("first", "x"), ("second", "x"), ("third", "x")], stop=stop)
    assert finished == []  # it did not wait for a single call
  finally:
    release.set()
    scorer.close()
