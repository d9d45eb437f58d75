"""PipelineRL-k: a generator thread streaming rollouts into the queue while the trainer trains.

    generator thread                      scoring pool             trainer (caller's thread)
    sampler.stream(admitted requests) --> verifiers per group --> queue --> next_groups()
          ^                                                                    |
          +---------------- update_params(new weights) <---- after_step() <----+

The sampler runs continuously on the generator slice. After every trainer step the new
weights are posted to it and swapped in at a decode-chunk boundary once computed (see
Overlap below), so sequences in flight continue with the new policy on their old KV cache
(in-flight updates, paper sec. 3.1 / A.11); every token records the version that produced
it.

Bounds (k = pipeline.max_staleness, P = prompts per step):
  * order: the trainer trains the groups in admission order, P per step, so group number
    s (counted from the first group of this process's run or resume) is trained by the
    trainer at version v0 + s // P; it waits for that group however long it takes, and
    nothing is ever dropped. Every group is trained exactly once and a checkpoint's
    "oldest group not trained on" is exact (no group of a resumed run is trained twice).
  * staleness (PipelineRL-k, paper sec. 3.1): a group is admitted only while the sampler's
    version a satisfies v0 + s // P <= a + k. Its tokens all come from versions >= a (the
    sampler admits only after swapping in any posted weights), so when it is trained no
    token is more than k versions old; admission pauses until the weights catch up. At
    most (k + 1) * P groups are admitted and not yet trained.
  * memory: admission also pauses while pipeline.queue_size * P finished or scoring groups
    wait for the trainer. Only admission pauses: sequences in flight always finish and
    enter the queue (it holds (k + 1) * P, which the bound above never exceeds), so the
    group the trainer waits for can never be stuck behind later ones.
  While admission is paused the request stream answers None ("nothing to admit now") as
  long as sequences are in flight, so the live slots keep decoding (and finish the groups
  the trainer waits for); it blocks only when nothing is in flight.

Overlap: `after_step` posts the new weights as soon as the trainer's step is dispatched;
the Sampler keeps them as a second buffer and swaps them in at the first decode-chunk
boundary after they are computed, so generation continues with the old weights while the
trainer computes (and the trainer never waits for the generator to take its weights).
With `sampler.weight_buffers: 1` (one copy, for generators that cannot hold two) the post
instead waits for the computed weights and a chunk boundary, and decoding pauses while they
are placed (`generation/weights.py`).

Eval through the same Sampler (`generate`): a process holds one Sampler, so validation does
not get a second copy of the weights and KV cache. The trainer thread posts an eval job;
the request stream first waits for the newest posted weights to be swapped in (so every
eval token comes from the evaluated policy), then admits the eval requests before any new
training group (training admission pauses until all of them are admitted), while the
training sequences already in flight keep decoding and reach the queue as usual. Eval
completions go back to the caller, never into the queue. Before `start()` (the initial
eval) `generate` runs the Sampler in the caller's thread.

Interrupts (`interrupt()`, e.g. on SIGTERM, see `jaxrl_scale.preempt`): a trainer waiting in
`next_groups` or `generate` raises Interrupted within one poll (50 ms), and an eval before
`start()` stops at the next decode chunk. An interrupted eval is abandoned: its requests
not yet admitted never start, and its sequences in flight are dropped as they finish.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from jaxrl_scale.generation import engine
from jaxrl_scale.generation import records
from jaxrl_scale.preempt import Interrupted  # noqa: F401  (raised here; callers catch it)
from jaxrl_scale.pipeline import queue as queue_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import sources
from jaxrl_scale.pipeline import staleness as staleness_lib

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often blocked waits re-check stop requests and conditions


class _Stopped(Exception):
  """Raised inside the sampler's loop to abandon the sequences in flight on close()."""


class GeneratorError(RuntimeError):
  """The generator thread or a scoring task failed; carries the original as __cause__."""


class _EvalTag(NamedTuple):
  """The prompt_id an eval request carries through the stream (training ids are ints)."""

  job: int
  index: int


@dataclasses.dataclass(eq=False)
class _EvalJob:
  """Eval requests posted by the trainer thread and the completions gathered for them."""

  number: int
  requests: list[records.Request]
  version: int  # the weights the eval must run on (newest posted when it was asked for)
  results: list[records.Completion | None]
  admitted: int = 0
  remaining: int = 0
  done: threading.Event = dataclasses.field(default_factory=threading.Event)


class PipelineSource:
  """The PipelineRL-k rollout source (see the module docstring).

  Args:
    sampler: on the generator slice; driven only by this object's thread.
    admitter: prompts and bookkeeping.
    scorer: verifiers.
    num_prompts: P.
    max_staleness: k >= 1.
    queue_size: batches of finished groups that may wait for the trainer before admission
      pauses.
    reward_workers: threads scoring groups.
  """

  def __init__(self, sampler: engine.Sampler, admitter: sources.Admitter,
               scorer: rollouts.GroupScorer, *, num_prompts: int, max_staleness: int,
               queue_size: int, reward_workers: int):
    if max_staleness < 1:
      raise ValueError("PipelineRL needs max_staleness >= 1 (k = 0 is the sync mode)")
    self.sampler = sampler
    self.admitter = admitter
    self.scorer = scorer
    self.num_prompts = num_prompts
    self.max_staleness = max_staleness
    self.group_size = admitter.group_size
    self.queue_limit = queue_size * num_prompts
    self.queue: queue_lib.RolloutQueue[rollouts.Group] = queue_lib.RolloutQueue(
        (max_staleness + 1) * num_prompts)
    self._pool = concurrent.futures.ThreadPoolExecutor(reward_workers,
                                                       thread_name_prefix="score")
    self._cond = threading.Condition()
    self._stop = threading.Event()
    self._interrupt = threading.Event()
    self._error: BaseException | None = None
    self._inflight: dict[int, tuple[Any, int]] = {}  # seq -> (prompt, admitted version)
    self._pending: dict[int, list[records.Completion]] = {}
    self._eval: _EvalJob | None = None  # guarded by _cond
    self._eval_count = 0
    self._thread = threading.Thread(target=self._run, name="generator", daemon=True)
    # Group `base_seq + i` is trained by the trainer at version `base_version + i // P`.
    self._base_seq = admitter.next_seq
    self._base_version = sampler.latest_version
    self._next_train_seq = self._base_seq
    self.dropped_stale = 0  # PipelineRL-k never drops a group; logged as proof
    self.throttle_wait_s = 0.0
    self.tokens = 0
    self.score_s = 0.0  # thread-seconds of scoring (a profile: is scoring the bottleneck?)
    self._score_lock = threading.Lock()
    self._last_score_s = 0.0
    self._start = time.perf_counter()
    self._last = (0.0, 0.0, 0, self._start)
    self._last_slots = (0, 0)

  # ---- generator thread ------------------------------------------------------------------

  def start(self) -> PipelineSource:
    """Starts the generator thread; the sampler holds the trainer's current weights."""
    self._base_seq = self.admitter.next_seq
    self._base_version = self.sampler.latest_version
    self._next_train_seq = self._base_seq
    self._start = time.perf_counter()
    self._last = (0.0, 0.0, 0, self._start)
    stats = getattr(self.sampler, "stats", None)  # from now on: not the SFT checks or eval 0
    self._last_slots = (stats.tokens, stats.slot_steps) if stats is not None else (0, 0)
    self._thread.start()
    return self

  def trained_at(self, seq: int) -> int:
    """The trainer version that trains group `seq` (see the module docstring)."""
    return self._base_version + (seq - self._base_seq) // self.num_prompts

  def _may_admit(self) -> bool:
    """Whether the next group may start now, on the sampler's current weights."""
    return (self.trained_at(self.admitter.next_seq) <= self.sampler.version + self.max_staleness
            and len(self.queue) + self.queue.pending < self.queue_limit)

  def _eval_waiting(self) -> bool:
    job = self._eval
    return job is not None and job.admitted < len(job.requests)

  def _requests(self) -> Iterator[records.Request | None]:
    while not self._stop.is_set():
      with self._cond:
        job = self._eval if self._eval_waiting() else None
      if job is not None:
        if self.sampler.version < job.version:
          yield None  # the sampler swaps posted weights in before it asks again
          continue
        job.admitted += 1
        yield job.requests[job.admitted - 1]
        continue
      if not self._may_admit():
        with self._cond:
          inflight = bool(self._inflight) or self._eval is not None
        if inflight or self.sampler.update_pending:
          # Sequences are decoding, or newer weights wait to be swapped in (which may open
          # admission): do not block the sampler's loop, ask again next chunk.
          yield None
          continue
        t0 = time.perf_counter()
        with self._cond:  # nothing in flight: the generator has nothing to do but wait
          while (not self._stop.is_set() and not self._may_admit()
                 and not self._eval_waiting() and not self.sampler.update_pending):
            self._cond.wait(_POLL_S)
        self.throttle_wait_s += time.perf_counter() - t0
        continue  # an eval job may have arrived: serve it before admitting training
      version = self.sampler.version
      seq, prompt, requests = self.admitter.admit(version)
      with self._cond:
        self._inflight[seq] = (prompt, version)
      yield from requests

  def _on_chunk(self, sampler: Any, index: int) -> None:
    del sampler, index
    if self._stop.is_set():
      raise _Stopped()

  def _run(self) -> None:
    try:
      for completion in self.sampler.stream(self._requests(), on_chunk=self._on_chunk):
        if isinstance(completion.prompt_id, _EvalTag):
          self._eval_done(completion)
          continue
        self.tokens += completion.num_tokens
        seq = completion.prompt_id
        done = self._pending.setdefault(seq, [])
        done.append(completion)
        if len(done) < self.group_size:
          continue
        del self._pending[seq]
        with self._cond:
          prompt, version = self._inflight.pop(seq)
        if not self.queue.reserve(timeout=0):
          if self.queue.closed:
            continue  # closed: drain the sequences still in flight, keep nothing
          raise RuntimeError(f"rollout queue full ({self.queue.capacity} groups): the "
                             "admission bound was exceeded")
        self._pool.submit(self._score, seq, prompt, done, version)
    except _Stopped:
      pass
    except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
      self._fail(e)

  def _eval_done(self, completion: records.Completion) -> None:
    tag = completion.prompt_id
    with self._cond:
      job = self._eval
      if job is None or job.number != tag.job:
        assert tag.job <= self._eval_count, "eval completion without its job"
        return  # of an interrupted eval: dropped
      job.results[tag.index] = completion
      job.remaining -= 1
      if job.remaining == 0:
        self._eval = None
        job.done.set()
        self._cond.notify_all()

  def _score(self, seq: int, prompt: Any, completions: list[records.Completion],
             version: int) -> None:
    t0 = time.perf_counter()
    try:
      group = self.scorer.group(seq, prompt, completions, version)
      group.min_version  # pylint: disable=pointless-statement  # cached off the queue lock
    except BaseException as e:  # noqa: BLE001
      self.queue.release()
      self._fail(e)
      return
    with self._score_lock:
      self.score_s += time.perf_counter() - t0
    self.queue.fill(group)

  def _fail(self, error: BaseException) -> None:
    if self._error is None:
      self._error = error
    self._stop.set()
    self.queue.close()

  # ---- trainer side ----------------------------------------------------------------------

  def _check(self) -> None:
    if self._error is not None:
      raise GeneratorError(f"generator failed: {type(self._error).__name__}: "
                           f"{self._error}") from self._error

  def interrupt(self) -> None:
    """Makes a waiting (or the next) `next_groups` or `generate` raise Interrupted;
    callable from a signal handler or another thread."""
    self._interrupt.set()

  def _check_interrupt(self, sampler: Any = None, index: int = 0) -> None:
    del sampler, index
    if self._interrupt.is_set():
      raise Interrupted()

  def next_groups(self, version: int) -> list[rollouts.Group]:
    """The next P groups in admission order, for the trainer at `version`; waits for them.

    Raises:
      Interrupted: `interrupt()` was called.
      GeneratorError: the generator thread or a scoring task failed.
    """
    first = self._next_train_seq
    if version != self.trained_at(first):
      raise RuntimeError(f"next_groups(version={version}): groups {first}.. belong to version "
                         f"{self.trained_at(first)} (one call per trainer step, in order)")
    wanted = list(range(first, first + self.num_prompts))
    while True:
      self._check()
      if self._interrupt.is_set():
        raise Interrupted()
      try:
        groups = self.queue.take(wanted, key=lambda g: g.seq, timeout=_POLL_S)
      except queue_lib.Closed:
        self._check()
        raise
      if groups is not None:
        break
    self._next_train_seq += self.num_prompts
    worst = max(version - g.min_version for g in groups)
    if worst > self.max_staleness:  # the admission bound makes this impossible
      raise RuntimeError(f"group staleness {worst} exceeds k = {self.max_staleness}")
    return groups

  @property
  def version(self) -> int:
    """Policy version of the weights the sampler decodes with now."""
    return self.sampler.version

  def update_params(self, params: Any, version: int) -> None:
    """Posts weights to the sampler (a collective across hosts: call from the main thread)."""
    self.sampler.update_params(params, version)

  def generate(self, requests: Iterable[records.Request],
               on_progress: Callable[[int, int], None] | None = None,
               ) -> list[records.Completion]:
    """Completions of `requests` in order, sampled by the generator's own Sampler.

    Called from the trainer thread (e.g. by `eval.Evaluator`); blocks until all are done.
    Runs with the newest weights posted before the call. See the module docstring.
    `on_progress(done, total)` is called from this thread every _POLL_S (completions
    finished so far) and once at the end.

    Raises:
      Interrupted: `interrupt()` was called (before or during the call).
    """
    requests = list(requests)
    if not requests:
      return []
    self._check_interrupt()
    if self._thread.ident is None:  # not started: nothing else drives the sampler
      return self.sampler.generate(requests, on_chunk=self._check_interrupt,
                                   on_progress=on_progress)
    base_seed = getattr(self.sampler, "seed", 0)
    with self._cond:
      if self._eval is not None:
        raise RuntimeError("PipelineSource.generate: another eval is running")
      self._eval_count += 1
      number = self._eval_count
      # Tagged ids route the completions back here; the seeds stay what the Sampler would
      # derive from the original ids, so an eval samples the same tokens either way.
      tagged = [dataclasses.replace(
          r, prompt_id=_EvalTag(number, i),
          seed=r.seed if r.seed is not None else records.sequence_seed(
              base_seed, r.prompt_id, r.sample_index))
                for i, r in enumerate(requests)]
      job = _EvalJob(number, tagged, version=self.sampler.latest_version,
                     results=[None] * len(tagged), remaining=len(tagged))
      self._eval = job
      self._cond.notify_all()
    while not job.done.wait(_POLL_S):
      if on_progress is not None:
        on_progress(len(tagged) - job.remaining, len(tagged))
      self._check()
      if self._stop.is_set() or not self._thread.is_alive():
        self._check()
        raise GeneratorError("generator stopped while an eval was running")
      if self._interrupt.is_set():
        with self._cond:
          if self._eval is job:  # abandon it: training admission resumes, results dropped
            self._eval = None
            self._cond.notify_all()
        raise Interrupted()
    if on_progress is not None:
      on_progress(len(tagged), len(tagged))
    return [dataclasses.replace(c, prompt_id=r.prompt_id)
            for c, r in zip(job.results, requests)]

  def after_step(self, groups: Sequence[rollouts.Group], params: Any, version: int) -> None:
    # `params` may still be computing: the sampler swaps them in once they exist and admits
    # nothing new meanwhile. Posted before admission opens, so new groups start on them.
    self.sampler.update_params(params, version)
    self.admitter.consumed([g.seq for g in groups])
    with self._cond:
      self._cond.notify_all()

  def state(self) -> dict[str, Any]:
    return self.admitter.state()

  def metrics(self, version: int) -> dict[str, float]:
    now = time.perf_counter()
    throttle, put_wait, tokens, t = self._last
    self._last = (self.throttle_wait_s, self.queue.put_wait_s, self.tokens, now)
    span = max(now - t, 1e-9)
    idle = (self.throttle_wait_s - throttle) + (self.queue.put_wait_s - put_wait)
    with self._cond:
      inflight = [v for _, v in self._inflight.values()]
    with self._score_lock:
      score_s = self.score_s
    out = {
        "gen/tokens_per_s": (self.tokens - tokens) / span,
        "gen/idle_frac": min(1.0, idle / span),
        "queue/groups": float(len(self.queue)),
        "queue/scoring": float(self.queue.pending),
        # Summed over the scoring threads: above the step's wall time only when they overlap.
        "gen/score_s": score_s - self._last_score_s,
        "pipeline/dropped_stale": float(self.dropped_stale),
    }
    self._last_score_s = score_s
    stats = getattr(self.sampler, "stats", None)
    if stats is not None:
      # Slots that decoded a valid token / slots dispatched: idle slots (e.g. waiting for
      # posted weights to be computed before new sequences start) lower it.
      slot_tokens, slot_steps = stats.tokens, stats.slot_steps
      last_tokens, last_steps = self._last_slots
      self._last_slots = (slot_tokens, slot_steps)
      if slot_steps > last_steps:
        out["gen/slot_util"] = (slot_tokens - last_tokens) / (slot_steps - last_steps)
    out.update(staleness_lib.oldest([g.min_version for g in self.queue.snapshot()], version,
                                    "staleness/queued_"))
    out.update(staleness_lib.oldest(inflight, version, "staleness/inflight_"))
    return out

  def close(self) -> None:
    self._stop.set()
    self.queue.close()
    with self._cond:
      self._cond.notify_all()
    if self._thread.is_alive():
      self._thread.join(timeout=120)
      if self._thread.is_alive():
        log.warning("generator thread did not stop within 120 s")
    self._pool.shutdown(wait=True, cancel_futures=True)
