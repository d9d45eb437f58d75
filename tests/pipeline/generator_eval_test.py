"""Eval through the pipelined generator's own Sampler (PipelineSource.generate)."""

import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale import eval as eval_lib
from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import transformer
from jaxrl_scale.pipeline import generator
from jaxrl_scale.pipeline import sources

P, G = 4, 2


def _source(sampler, prompt_source, scorer, k=2, queue_size=2):
  admitter = sources.Admitter(prompt_source, G, seed=0)
  return generator.PipelineSource(sampler, admitter, scorer, num_prompts=P,
                                  max_staleness=k, queue_size=queue_size, reward_workers=2)


def _eval_requests(n, first_token=5):
  return [records.Request([first_token + i, 3], prompt_id=f"v{i}", sample_index=i % 2,
                          seed=100 + i) for i in range(n)]


def _check_groups(consumed):
  seqs = [g.seq for groups in consumed for g in groups]
  assert len(seqs) == len(set(seqs)), "a training group was handed out twice"
  for groups in consumed:
    for g in groups:
      assert isinstance(g.seq, int)
      assert sorted(c.sample_index for c in g.completions) == list(range(G))
      assert all(isinstance(c.prompt_id, int) for c in g.completions)


def test_eval_runs_between_steps_on_the_posted_weights(prompt_source, fakes):
  # Long training sequences (40 chunks) are in flight when the eval arrives: the eval waits
  # for the newest posted weights, shares the slots with them, and no training group is lost.
  sampler = fakes.Sampler(num_slots=8, length=lambda req: (
      40 if isinstance(req.prompt_id, int) and req.prompt_id % 3 == 0 else 2), chunk_s=0.0005)
  src = _source(sampler, prompt_source, fakes.Scorer()).start()
  consumed = []
  try:
    for v in range(6):
      groups = src.next_groups(v)
      consumed.append(groups)
      src.after_step(groups, None, v + 1)
      if v == 2:
        requests = _eval_requests(10)
        out = src.generate(requests)
        assert [c.prompt_id for c in out] == [r.prompt_id for r in requests]
        assert [c.sample_index for c in out] == [r.sample_index for r in requests]
        assert all(set(c.versions.tolist()) == {3} for c in out)  # only the evaluated policy
  finally:
    src.close()
  _check_groups(consumed)
  assert sum(len(g) for g in consumed) == 6 * P


def test_eval_before_start_runs_in_the_callers_thread(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=4)
  src = _source(sampler, prompt_source, fakes.Scorer())
  try:
    out = src.generate(_eval_requests(3))
    assert [c.prompt_id for c in out] == ["v0", "v1", "v2"]
    assert src.generate([]) == []
  finally:
    src.close()


def test_eval_completes_while_training_admission_is_closed(prompt_source, fakes):
  # The trainer never consumes: (k + 1) * P groups fill the admission bound and the
  # generator blocks; an eval must still be admitted and finish (no deadlock on the bound).
  sampler = fakes.Sampler(num_slots=8, length=lambda req: 1)
  src = _source(sampler, prompt_source, fakes.Scorer(), k=1, queue_size=4).start()
  try:
    give_up = time.monotonic() + 60  # bounded: a broken generator fails, never hangs
    while src.admitter.num_outstanding < 2 * P and time.monotonic() < give_up:
      time.sleep(0.01)
    assert src.admitter.num_outstanding == 2 * P
    out = src.generate(_eval_requests(12))
    assert len(out) == 12 and all(c is not None for c in out)
    assert src.admitter.num_outstanding == 2 * P  # the eval admitted no training group
  finally:
    src.close()


@pytest.mark.parametrize("started", [True, False])
def test_eval_reports_its_progress_while_it_runs(prompt_source, fakes, started):
  # 12 eval requests of 20 chunks on 4 slots: three waves, each finishing 4 completions
  # (about 0.1 s apart); the caller hears of each wave, not only of the end.
  sampler = fakes.Sampler(num_slots=4, length=lambda req: (
      2 if isinstance(req.prompt_id, int) else 20), chunk_s=0.005)
  src = _source(sampler, prompt_source, fakes.Scorer())
  if started:
    src.start()
  calls = []
  try:
    out = src.generate(_eval_requests(12), on_progress=lambda d, t: calls.append((d, t)))
  finally:
    src.close()
  assert len(out) == 12 and all(c is not None for c in out)
  assert {t for _, t in calls} == {12}
  done = [d for d, _ in calls]
  assert done == sorted(done) and done[-1] == 12
  assert any(0 < d < 12 for d in done), calls


def test_generator_failure_during_eval_raises(prompt_source, fakes):
  sampler = fakes.Sampler(num_slots=4, length=lambda req: 50, chunk_s=0.001, fail_after=20)
  src = _source(sampler, prompt_source, fakes.Scorer()).start()
  try:
    with pytest.raises(generator.GeneratorError, match="device lost"):
      src.generate(_eval_requests(4))
  finally:
    src.close()


def test_evaluator_accepts_the_pipeline_source(prompt_source, fakes):
  class Scorer:
    def score(self, prompt, completions):
      correct = np.array([c.sample_index == 0 for c in completions])
      return np.where(correct, 1.0, -1.0), correct, {}

  sampler = fakes.Sampler(num_slots=4, length=lambda req: 3)
  src = _source(sampler, prompt_source, fakes.Scorer()).start()
  try:
    evaluator = eval_lib.Evaluator(src, prompt_source.validation()[:3], Scorer(),
                                   samples_per_prompt=2, temperature=1.0)
    out = evaluator.run(params=None, version=None)
  finally:
    src.close()
  assert out["val/pass_rate"] == 0.5 and out["val/pass_at_k"] == 1.0
  assert out["val/length_mean"] == 3.0 and out["val/num_prompts"] == 3.0


def test_real_sampler_pipeline_eval_matches_direct_generate(prompt_source, fakes, monkeypatch):
  """A tiny model in pipeline mode: the eval goes through the training stream's Sampler."""
  built = []
  init = engine.Sampler.__init__
  monkeypatch.setattr(engine.Sampler, "__init__",
                      lambda self, *a, **k: (built.append(self), init(self, *a, **k))[1])
  mcfg = dataclasses.replace(model_config.tiny_llama(), num_layers=1)
  model = transformer.Transformer(mcfg, rngs=nnx.Rngs(0))
  cfg = SamplerConfig(num_slots=4, max_new_tokens=8, temperature=1.0, decode_chunk=4,
                      prompt_buckets=(16,))
  sampler = engine.Sampler(model, cfg, eos_ids=(), seed=0)
  params = [jax.tree.map(lambda x, s=s: x * (1.0 + 0.05 * s), nnx.state(model, nnx.Param))
            for s in range(4)]  # a different policy per version, so versions matter

  class Scorer:  # correct = first token even: any policy change shows in the pass rate
    def __init__(self):
      self.seen = []

    def score(self, prompt, completions):
      self.seen.append(completions)
      return None, np.array([c.tokens[0] % 2 == 0 for c in completions]), {}

  validation = prompt_source.validation()[:4]
  scorer = Scorer()
  src = _source(sampler, prompt_source, fakes.Scorer()).start()
  consumed = []
  try:
    evaluator = eval_lib.Evaluator(src, validation, scorer, samples_per_prompt=2,
                                   temperature=1.0, seed=3)
    for v in range(3):
      groups = src.next_groups(v)
      consumed.append(groups)
      src.after_step(groups, params[v + 1], v + 1)
    via_pipeline = evaluator.run(params[3], 3)  # while training sequences are in flight
    for v in range(3, 5):  # training resumes after the eval
      groups = src.next_groups(v)
      consumed.append(groups)
      src.after_step(groups, params[3], v + 1)
  finally:
    src.close()
  pipeline_completions = [c for group in scorer.seen for c in group]
  # The reference: the same Sampler driven directly, nothing else in its slots.
  scorer.seen.clear()
  direct = eval_lib.Evaluator(sampler, validation, scorer, samples_per_prompt=2,
                              temperature=1.0, seed=3).run(params[3], 3)
  direct_completions = [c for group in scorer.seen for c in group]

  assert len(built) == 1, "pipeline eval must not build a second Sampler"
  for key in ("val/pass_rate", "val/pass_at_k", "val/length_mean", "val/num_prompts"):
    assert via_pipeline[key] == direct[key], key
  assert len(pipeline_completions) == len(direct_completions) == 8
  for a, b in zip(pipeline_completions, direct_completions):
    assert a.prompt_id == b.prompt_id and a.sample_index == b.sample_index
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
    assert set(a.versions.tolist()) == {3}
  _check_groups(consumed)
  assert sum(len(g) for g in consumed) == 5 * P


def _long_eval_sampler(fakes):
  # Training sequences end in 2 chunks, eval ones take 2,000 (at paper scale an eval of
  # 16k samples of up to 14k tokens outlasts a preemption's grace period).
  return fakes.Sampler(num_slots=4, length=lambda req: (
      2 if isinstance(req.prompt_id, int) else 2000), chunk_s=0.002)


def test_interrupt_abandons_a_running_eval(prompt_source, fakes):
  sampler = _long_eval_sampler(fakes)
  src = _source(sampler, prompt_source, fakes.Scorer()).start()
  try:
    groups = src.next_groups(0)
    src.after_step(groups, None, 1)
    threading.Timer(0.3, src.interrupt).start()
    with pytest.raises(generator.Interrupted):
      src.generate(_eval_requests(4))
    chunks = sampler.chunks
  finally:
    src.close()
  assert chunks < 1000  # it returned mid-eval, not after the 2,000 chunks
  assert src._error is None  # the generator thread dropped the eval's sequences cleanly


def test_interrupt_abandons_an_eval_before_start(prompt_source, fakes):
  # The initial eval runs the Sampler in the caller's thread (the generator is not started).
  sampler = _long_eval_sampler(fakes)
  src = _source(sampler, prompt_source, fakes.Scorer())
  threading.Timer(0.3, src.interrupt).start()
  try:
    with pytest.raises(generator.Interrupted):
      src.generate(_eval_requests(4))
  finally:
    src.close()
  assert sampler.chunks < 1000
