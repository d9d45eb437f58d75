"""Scores batches of (response, answer) pairs on host threads, with a deadline per call.

Verification runs on daemon worker threads. Each call gets `timeout_s` from the moment a
worker starts it; a call past its deadline is abandoned (counted as a timeout), its worker
retires when (if) the call returns, and a fresh worker takes its place so the pool keeps
its size. An exception in a reward function counts as an error. Neither ever propagates:
one bad response must not stop a training run. Neither is a verdict either: the sample is
invalid (reward NaN, `valid` False), which the trainer leaves out of its group's
advantages. Scoring it "incorrect" would teach the model that whatever makes the verifier
slow or crash is a wrong answer, indistinguishable from one in the advantages.

Threads cannot be killed, so the deadline bounds the *scorer's* latency, not the CPU a
runaway call burns; the built-in verifiers bound their own work (safe_eval's limits on
length, depth and value size), which makes a runaway impossible for them. A custom reward
function that can hang inside C code while holding the GIL would stall the process; such
a function should bound its own work the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Sequence

from jaxrl_scale import preempt
from jaxrl_scale.rewards import registry

logger = logging.getLogger(__name__)

COUNT_KEYS = ("total", "correct", "wrong", "no_answer", "unparseable", "errors", "timeouts")
_QUEUED, _RUNNING, _DONE, _ABANDONED = range(4)


def environment_verdict(reward: float, correct: bool | None, correct_reward: float
                        ) -> tuple[bool, str]:
  """(correct, the COUNT_KEYS entry it counts under) of an episode whose environment gave
  its reward: the environment's own verdict when it gave one, else reward >= correct_reward;
  a NaN reward is no verdict ("errors": the sample is invalid)."""
  if not math.isfinite(reward):
    return False, "errors"
  ok = reward >= correct_reward if correct is None else bool(correct)
  return ok, "correct" if ok else "wrong"
_LOG_FIRST = 10  # log the first few errors/timeouts in full, then every _LOG_EVERY-th
_LOG_EVERY = 1000


@dataclasses.dataclass
class _Call:
  fn: registry.RewardFn
  response: str
  answer: str
  truncated: bool = False  # passed only to functions that take it (registry.takes_truncated)
  state: int = _QUEUED
  started: float = 0.0
  verdict: registry.Verdict | None = None
  error: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class ScoreResult:
  """Rewards of one batch.

  Attributes:
    rewards: one float per pair, in input order; NaN where the call raised or timed out
      (no verdict: the sample is invalid, neither correct nor wrong).
    verdicts: the Verdict per pair; None where the call raised or timed out.
    counts: this batch's counts for COUNT_KEYS.
    errors: the exception per pair where the call raised, else None.
    valid: False where the call raised or timed out.
  """
  rewards: list[float]
  verdicts: list[registry.Verdict | None]
  counts: dict[str, int]
  errors: list[BaseException | None]
  valid: list[bool]


class Scorer:
  """Applies one reward function to many pairs in parallel, never raising per item.

  Args:
    reward: a registered reward name or a function (response, answer) -> Verdict | bool.
    correct_reward: reward for a correct response (ScaleRL uses +1).
    incorrect_reward: reward for a response judged not correct (-1); errors and timeouts
      are not judged and get NaN.
    timeout_s: per-call deadline in seconds, measured from when a worker starts the call.
    num_threads: worker threads.
  """

  def __init__(self, reward: str | registry.RewardFn = "math", *, correct_reward: float = 1.0,
               incorrect_reward: float = -1.0, timeout_s: float = 5.0, num_threads: int = 4):
    if timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if num_threads < 1:
      raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    self.fn = registry.get_reward(reward) if isinstance(reward, str) else reward
    self._takes_truncated = registry.takes_truncated(self.fn)
    self.name = reward if isinstance(reward, str) else getattr(reward, "__name__", "custom")
    self.correct_reward = float(correct_reward)
    self.incorrect_reward = float(incorrect_reward)
    self.timeout_s = float(timeout_s)
    self.num_threads = num_threads
    self.totals = dict.fromkeys(COUNT_KEYS, 0)  # cumulative over all batches
    self._logged = {"errors": 0, "timeouts": 0}
    self._cond = threading.Condition()
    self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
    self._workers = 0
    self._closed = False

  def _spawn_worker(self) -> None:
    self._workers += 1
    threading.Thread(target=self._work, name=f"reward-{self.name}", daemon=True).start()

  def _work(self) -> None:
    while True:
      call = self._queue.get()
      if call is None:
        return
      with self._cond:
        call.state, call.started = _RUNNING, time.monotonic()
        self._cond.notify_all()
      verdict, error = None, None
      try:
        if call.truncated and self._takes_truncated:
          out = call.fn(call.response, call.answer, truncated=True)
        else:
          out = call.fn(call.response, call.answer)
        verdict = registry.as_verdict(out)
      except BaseException as e:  # noqa: BLE001  (anything a verifier raises is its error)
        error = e
      with self._cond:
        if call.state == _ABANDONED:
          return  # the scorer gave up on this call and already started a replacement
        call.verdict, call.error, call.state = verdict, error, _DONE
        self._cond.notify_all()

  def _wait(self, call: _Call, stop: preempt.StopRequest | None = None) -> None:
    """Blocks until `call` is done or past its deadline (then marks it abandoned); with
    `stop`, raises Interrupted within 0.1 s of a stop request."""
    poll = math.inf if stop is None else 0.1
    with self._cond:
      while call.state == _QUEUED:
        if stop is not None:
          stop.check()
        self._cond.wait(None if stop is None else poll)
      while call.state == _RUNNING:
        if stop is not None:
          stop.check()
        remaining = call.started + self.timeout_s - time.monotonic()
        if remaining <= 0:
          call.state = _ABANDONED
          self._workers -= 1
          self._spawn_worker()
          return
        self._cond.wait(min(remaining, poll))

  def score(self, pairs: Sequence[tuple[str, str]],
            truncated: Sequence[bool] | None = None,
            stop: preempt.StopRequest | None = None) -> ScoreResult:
    """Rewards for (response, answer) pairs; blocks until each is done or timed out.

    Args:
      pairs: (model response, ground-truth answer) per item.
      truncated: per item, whether the response hit its token budget without ending
        (passed to reward functions that take it: registry.takes_truncated); None = none.
      stop: a run's stop request: Interrupted within 0.1 s of it instead of waiting for
        every call (code answers can outlast a preemption's grace period); the calls
        already queued still run on the worker threads, their results dropped.

    Returns:
      ScoreResult with rewards in input order and this batch's counts (also added to
      `self.totals`).
    """
    if self._closed:
      raise RuntimeError("Scorer is closed")
    if truncated is None:
      truncated = [False] * len(pairs)
    elif len(truncated) != len(pairs):
      raise ValueError(f"score: {len(truncated)} truncated flags for {len(pairs)} pairs")
    calls = [_Call(self.fn, response, answer, bool(cut))
             for (response, answer), cut in zip(pairs, truncated)]
    with self._cond:
      while self._workers < self.num_threads:
        self._spawn_worker()
    for call in calls:
      self._queue.put(call)
    counts = dict.fromkeys(COUNT_KEYS, 0)
    rewards, verdicts, errors, valid = [], [], [], []
    for call in calls:
      self._wait(call, stop)
      counts["total"] += 1
      verdict = call.verdict if call.state == _DONE else None
      if call.state == _ABANDONED:
        counts["timeouts"] += 1
        self._log("timeouts", f"reward {self.name!r} exceeded {self.timeout_s:g}s")
      elif call.error is not None:
        counts["errors"] += 1
        self._log("errors", f"reward {self.name!r} raised {type(call.error).__name__}: "
                  f"{str(call.error)[:200]}")
      else:
        counts[verdict.reason] += 1
      verdicts.append(verdict)
      errors.append(call.error if call.state == _DONE else None)
      valid.append(verdict is not None)
      if verdict is None:
        rewards.append(math.nan)
      elif verdict.score is not None:  # partial credit (code_fraction)
        rewards.append(self.incorrect_reward
                       + verdict.score * (self.correct_reward - self.incorrect_reward))
      else:
        rewards.append(self.correct_reward if verdict.correct else self.incorrect_reward)
    for key, n in counts.items():
      self.totals[key] += n
    return ScoreResult(rewards, verdicts, counts, errors, valid)

  def _log(self, key: str, message: str) -> None:
    self._logged[key] += 1
    n = self._logged[key]
    if n <= _LOG_FIRST or n % _LOG_EVERY == 0:
      logger.warning("%s (%s so far: %d)", message, key, n)

  def close(self) -> None:
    """Stops idle workers; abandoned ones retire when their call returns."""
    with self._cond:
      self._closed = True
      for _ in range(self._workers):
        self._queue.put(None)
      self._workers = 0

  def __enter__(self) -> Scorer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
