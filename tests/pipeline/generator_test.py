import threading
import time

import numpy as np
import pytest

from jaxrl_scale.pipeline import generator
from jaxrl_scale.pipeline import sources

P, G = 4, 2


def _source(sampler, prompt_source, fakes, k=2, queue_size=2):
  admitter = sources.Admitter(prompt_source, G, seed=0)
  return generator.PipelineSource(sampler, admitter, fakes.Scorer(), num_prompts=P,
                                  max_staleness=k, queue_size=queue_size, reward_workers=2)


def _train(src, steps, step_s=0.0):
  """Plays the trainer: takes groups, 'trains', posts version v + 1."""
  consumed = []
  for v in range(steps):
    groups = src.next_groups(v)
    assert len(groups) == P
    if step_s:
      time.sleep(step_s)
    consumed.append((v, groups))
    src.after_step(groups, None, v + 1)
  return consumed


@pytest.mark.parametrize("k", [1, 3])
def test_staleness_never_exceeds_k_and_weights_update_in_flight(prompt_source, fakes, k):
  # Long and short sequences mixed, so sequences span weight updates.
  sampler = fakes.Sampler(num_slots=8, length=lambda req: 2 + 9 * (req.prompt_id % 5 == 0),
                        chunk_s=0.001)
  src = _source(sampler, prompt_source, fakes, k=k).start()
  try:
    consumed = _train(src, 25, step_s=0.002)
  finally:
    src.close()
  worst = max(v - g.min_version for v, groups in consumed for g in groups)
  assert worst <= k
  mixed = [c for _, groups in consumed for g in groups for c in g.completions
           if len(set(c.versions.tolist())) > 1]
  assert mixed, "no sequence continued across a weight update"
  for c in mixed:  # versions only move forward within a sequence
    assert np.all(np.diff(c.versions) >= 0)
  assert sampler.posted == list(range(1, 26))
  seqs = [g.seq for _, groups in consumed for g in groups]
  assert len(seqs) == len(set(seqs))


@pytest.mark.parametrize("k", [1, 2])
def test_long_completions_are_waited_for_never_dropped(prompt_source, fakes, k):
  # Every third group's completions are 10x longer than the rest: those groups are the ones
  # that grow old. PipelineRL-k must wait for them (none dropped, none trained twice) and
  # still never train a token more than k versions old.
  def length(req):
    return 30 if req.prompt_id % 3 == 0 else 3

  sampler = fakes.Sampler(num_slots=8, length=length, chunk_s=0.0005)
  src = _source(sampler, prompt_source, fakes, k=k).start()
  steps = 12
  try:
    consumed = _train(src, steps)
    state = src.state()
  finally:
    src.close()
  seqs = [g.seq for _, groups in consumed for g in groups]
  assert seqs == list(range(steps * P))  # every admitted group, once, in admission order
  assert state["next_seq"] == steps * P  # a resume continues right after them
  assert src.dropped_stale == 0
  staleness = [v - g.min_version for v, groups in consumed for g in groups]
  assert max(staleness) <= k
  long_ones = [v - g.min_version for v, groups in consumed for g in groups if g.seq % 3 == 0]
  assert max(long_ones) >= 1  # the long groups did span weight updates
  assert all(len(c.tokens) == 30 for _, groups in consumed for g in groups if g.seq % 3 == 0
             for c in g.completions)


def _settled(read, started, quiet_s=0.2, timeout_s=30.0):
  """`read()` once `started(read())` holds and the value has not changed for `quiet_s` (a
  busy test machine may take long to get there; a generator that never stops changing it
  fails the test)."""
  deadline = time.monotonic() + timeout_s
  value, since = read(), time.monotonic()
  while not started(value) or time.monotonic() - since < quiet_s:
    assert time.monotonic() < deadline, f"not settled after {timeout_s} s: {value}"
    time.sleep(0.01)
    now = read()
    if now != value:
      value, since = now, time.monotonic()
  return value


def test_admission_bound_limits_outstanding_groups(prompt_source, fakes):
  slots = 8
  sampler = fakes.Sampler(num_slots=slots, length=lambda req: 1)
  src = _source(sampler, prompt_source, fakes, k=2, queue_size=8).start()
  try:
    # The trainer never comes: the generator must stop admitting and stop decoding
    # (stalled, not spinning: the chunk count settles too).
    outstanding, _ = _settled(lambda: (src.admitter.num_outstanding, sampler.chunks),
                              started=lambda v: v[1] > 0)
  finally:
    src.close()
  # Admitted at version 0, group s is trained at version s // P <= 0 + k: (k + 1) * P groups.
  assert outstanding == 3 * P


def test_throttled_admission_keeps_live_sequences_decoding(prompt_source, fakes):
  # k * P = 4 groups of 2 fill the admission bound while long sequences (prompt_id % 4 == 0:
  # 40 tokens) are still decoding; the request stream must answer None, not block, so those
  # finish and the trainer gets its P groups.
  sampler = fakes.Sampler(num_slots=16, length=lambda req: 40 if req.prompt_id % 4 == 0 else 1,
                          chunk_s=0.0005)
  src = _source(sampler, prompt_source, fakes, k=1).start()
  try:
    consumed = _train(src, 3)
  finally:
    src.close()
  assert len(consumed) == 3
  assert sampler.none_pulls > 0  # admission was closed while sequences were live


def test_full_queue_pauses_admission(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=P * G, length=lambda req: 1)
  src = _source(sampler, prompt_source, fakes, k=8, queue_size=1).start()
  try:
    held, outstanding = _settled(
        lambda: (len(src.queue) + src.queue.pending, src.admitter.num_outstanding),
        started=lambda v: v[0] > 0)
  finally:
    src.close()
  assert held == P  # queue_size batches of P groups, nothing more
  assert outstanding == P  # admission paused (k alone would allow 9 * P)


def test_interrupt_wakes_a_waiting_trainer(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=2, length=lambda req: 10_000, chunk_s=0.001)
  src = _source(sampler, prompt_source, fakes).start()
  threading.Timer(0.2, src.interrupt).start()
  try:
    with pytest.raises(generator.Interrupted):
      src.next_groups(0)
  finally:
    src.close()  # abandons the 10k-token sequences in flight instead of finishing them
  assert sampler.chunks < 10_000


def test_generator_failure_reaches_the_trainer(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=2, length=lambda req: 50, fail_after=3)
  src = _source(sampler, prompt_source, fakes).start()
  try:
    with pytest.raises(generator.GeneratorError, match="device lost"):
      src.next_groups(0)
  finally:
    src.close()


def test_state_points_at_the_oldest_group_not_trained_on(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=8, length=lambda req: 2)
  src = _source(sampler, prompt_source, fakes, k=2).start()
  try:
    _train(src, 3)
    state = src.state()
  finally:
    src.close()
  # 3 steps x P groups were trained on; everything after seq 12 is regenerated on resume.
  assert state["next_seq"] == 3 * P
  fresh = sources.Admitter(prompt_source, G, seed=0)
  fresh.load_state(state)
  seq, prompt, _ = fresh.admit(0)
  assert seq == 3 * P


def test_score_seconds_count_the_scoring_threads(prompt_source, fakes):
  # A verifier that takes 20 ms a group: gen/score_s holds at least that per group scored
  # since the previous row (the profile that tells a slow verifier from a slow sampler).
  class SlowScorer(fakes.Scorer):
    def group(self, *args):
      time.sleep(0.02)
      return super().group(*args)

  admitter = sources.Admitter(prompt_source, G, seed=0)
  src = generator.PipelineSource(fakes.Sampler(num_slots=8, length=lambda req: 2), admitter,
                                 SlowScorer(), num_prompts=P, max_staleness=1, queue_size=2,
                                 reward_workers=2).start()
  try:
    _train(src, 3)
    first = src.metrics(3)
    groups = src.next_groups(3)
    src.after_step(groups, None, 4)
    second = src.metrics(4)
  finally:
    src.close()
  assert first["gen/score_s"] >= 3 * P * 0.02  # every group trained so far was scored
  assert first["gen/score_s"] + second["gen/score_s"] >= 4 * P * 0.02
