"""A fake sampler and scorer so the pipeline's threading is tested without JAX compiles."""

import threading
import time

import numpy as np
import pytest

from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.data import tasks
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.pipeline import rollouts


_END = object()


class FakeSampler:
  """Continuous batching over `num_slots` slots, one token per slot per chunk.

  Like the real Sampler it pulls requests lazily, swaps posted weights only between chunks
  and records the version of every token. A request's length comes from `length(req)`.
  """

  def __init__(self, num_slots=8, length=lambda req: 3, chunk_s=0.0, fail_after=None):
    self.num_slots = num_slots
    self.length = length
    self.chunk_s = chunk_s
    self.fail_after = fail_after
    self.version = 0
    self._pending = None
    self._lock = threading.Lock()
    self.chunks = 0
    self.none_pulls = 0
    self.posted = []

  seed = 0

  @property
  def latest_version(self):
    with self._lock:
      return self._pending if self._pending is not None else self.version

  @property
  def update_pending(self):
    with self._lock:
      return self._pending is not None

  def update_params(self, params, version):
    with self._lock:
      self._pending = version
      self.posted.append(version)

  def stream(self, requests, on_chunk=None):
    it = iter(requests)
    slots = [None] * self.num_slots
    exhausted = False
    while True:
      with self._lock:
        if self._pending is not None:
          self.version, self._pending = self._pending, None
      for i in range(self.num_slots):
        if slots[i] is None and not exhausted:
          req = next(it, _END)
          if req is _END:
            exhausted = True
          elif req is None:  # nothing to admit now: decode the live slots
            self.none_pulls += 1
            break
          else:
            slots[i] = (req, [])
      if all(s is None for s in slots):
        if exhausted:
          return
        continue  # like the real Sampler: nothing live, ask the iterator again
      if self.chunk_s:
        time.sleep(self.chunk_s)
      self.chunks += 1
      if self.fail_after is not None and self.chunks > self.fail_after:
        raise RuntimeError("device lost")
      for i, slot in enumerate(slots):
        if slot is None:
          continue
        req, versions = slot
        versions.append(self.version)
        if len(versions) >= self.length(req):
          slots[i] = None
          n = len(versions)
          yield records.Completion(
              prompt_id=req.prompt_id, sample_index=req.sample_index,
              prompt_tokens=np.asarray(req.prompt_tokens, np.int32),
              tokens=np.full((n,), 7, np.int32), logprobs=np.full((n,), -0.5, np.float32),
              versions=np.asarray(versions, np.int32), forced=np.zeros((n,), bool),
              finish_reason=records.EOS, truncated=False, text="x")
      if on_chunk is not None:
        on_chunk(self, self.chunks - 1)

  def generate(self, requests, on_chunk=None, on_progress=None):
    reqs = list(requests)
    order = {(r.prompt_id, r.sample_index): i for i, r in enumerate(reqs)}
    out = [None] * len(reqs)
    for done, c in enumerate(self.stream(reqs, on_chunk=on_chunk), 1):
      out[order[(c.prompt_id, c.sample_index)]] = c
      if on_progress is not None:
        on_progress(done, len(reqs))
    return out


class FakeScorer:
  """Reward +1 for even sample indices, -1 for odd ones (every group has signal)."""

  def group(self, seq, prompt, completions, version):
    completions = sorted(completions, key=lambda c: c.sample_index)
    correct = np.array([c.sample_index % 2 == 0 for c in completions])
    return rollouts.Group(seq=seq, prompt=prompt, completions=list(completions),
                          rewards_G=np.where(correct, 1.0, -1.0).astype(np.float32),
                          correct_G=correct, counts={"total": len(completions)},
                          admitted_version=version)

  def groups(self, items, pool=None, stop=None):
    return [self.group(*item) for item in items]


@pytest.fixture
def prompt_source():
  tok = tokenizer_lib.ByteTokenizer()
  return data_sources.PromptSource(tasks.arithmetic(120, 0, digits=2), tok,
                                   max_prompt_tokens=16, num_validation=8, seed=0)


@pytest.fixture
def fakes():
  """The fake classes (test modules cannot import conftest under importlib mode)."""
  import types
  return types.SimpleNamespace(Sampler=FakeSampler, Scorer=FakeScorer)
