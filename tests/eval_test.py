import dataclasses

import numpy as np
import pytest

from jaxrl_scale import eval as eval_lib
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.generation import records


class _Sampler:
  """Answers prompt i with sample j: 'correct' when j < i (so prompt i has i of k right)."""

  version = 0

  def __init__(self):
    self.requests = []
    self.posted = []

  def update_params(self, params, version):
    self.posted.append(version)

  def generate(self, requests):
    self.requests.extend(requests)
    return [records.Completion(
        prompt_id=r.prompt_id, sample_index=r.sample_index, prompt_tokens=np.zeros(2, np.int32),
        tokens=np.full((3,), 1 if r.sample_index < r.prompt_id else 0, np.int32),
        logprobs=np.zeros(3, np.float32), versions=np.zeros(3, np.int32),
        forced=np.zeros(3, bool), finish_reason=records.EOS, truncated=r.prompt_id == 0)
        for r in requests]


class _Scorer:

  def score(self, prompt, completions):
    correct = np.array([c.tokens[0] == 1 for c in completions])
    return np.where(correct, 1.0, -1.0), correct, {}


def _prompts(n):
  return [data_sources.Prompt(id=str(i), task="arithmetic", prompt="", text="", token_ids=(1, 2),
                              answer="", solution="") for i in range(n)]


def test_mean_at_k_and_pass_at_k():
  sampler = _Sampler()
  ev = eval_lib.Evaluator(sampler, _prompts(3), _Scorer(), samples_per_prompt=4,
                          temperature=0.7, seed=3)
  out = ev.run(params="w", version=9)
  # Prompt i has i of 4 samples right: (0 + 1 + 2) / 12.
  assert out["val/pass_rate"] == pytest.approx(3 / 12)
  assert out["val/pass_at_k"] == pytest.approx(2 / 3)
  assert out["val/truncated_frac"] == pytest.approx(4 / 12)
  assert sampler.posted == [9]
  assert all(r.temperature == 0.7 for r in sampler.requests)
  seeds = [r.seed for r in sampler.requests]
  assert len(set(seeds)) == len(seeds)
  ev.run()
  assert [r.seed for r in sampler.requests[12:]] == seeds  # same draws every eval


def _domain_prompts(domains):
  return [dataclasses.replace(p, domain=d) for p, d in zip(_prompts(len(domains)), domains)]


def test_mixed_domain_eval_reports_each_domain_and_the_overall_mean():
  # Prompt i has i of 4 samples right: math = prompts 0, 2, 3 -> (0 + 2 + 3) / 12;
  # code = prompts 1, 4 -> (1 + 4) / 8 (prompt 4: all 4 right).
  prompts = _domain_prompts(["math", "code", "math", "math", "code"])
  out = eval_lib.Evaluator(_Sampler(), prompts, _Scorer(), samples_per_prompt=4,
                           temperature=1.0).run()
  assert out["val/math/pass_rate"] == pytest.approx(5 / 12)
  assert out["val/code/pass_rate"] == pytest.approx(5 / 8)
  assert out["val/pass_rate"] == pytest.approx(10 / 20)  # the mean over all samples
  assert out["val/math/pass_at_k"] == pytest.approx(2 / 3)
  assert out["val/code/pass_at_k"] == pytest.approx(1.0)
  assert (out["val/math/num_prompts"], out["val/code/num_prompts"]) == (3.0, 2.0)
  assert out["val/math/samples_per_prompt"] == out["val/code/samples_per_prompt"] == 4.0


def test_sharded_mixed_domain_eval_equals_the_single_process_one():
  prompts = _domain_prompts(["math", "code", "math", "math", "code"])
  want = eval_lib.Evaluator(_Sampler(), prompts, _Scorer(), samples_per_prompt=4,
                            temperature=1.0).run()
  # Process 1 of 2 runs first and hands its counts to process 0's exchange.
  sent = []
  eval_lib.Evaluator(_Sampler(), prompts, _Scorer(), samples_per_prompt=4, temperature=1.0,
                     shard=(1, 2), gather=lambda c: sent.append(c) or [c, c]).run()
  got = eval_lib.Evaluator(_Sampler(), prompts, _Scorer(), samples_per_prompt=4,
                           temperature=1.0, shard=(0, 2),
                           gather=lambda c: [c, sent[0]]).run()
  domain_keys = sorted(k for k in want if k.count("/") == 2)
  assert len(domain_keys) == 10  # 5 a domain: pass_rate, pass_at_k, invalid, num_prompts, k
  assert {k: got[k] for k in domain_keys} == pytest.approx({k: want[k] for k in domain_keys})
  assert got["val/pass_rate"] == pytest.approx(want["val/pass_rate"])


def test_single_source_eval_keys_are_unchanged():
  out = eval_lib.Evaluator(_Sampler(), _prompts(3), _Scorer(), samples_per_prompt=2,
                           temperature=1.0).run()
  assert sorted(out) == sorted(
      ["val/pass_rate", "val/pass_at_k", "val/invalid", "val/length_mean",
       "val/truncated_frac", "val/num_prompts", "val/samples_per_prompt", "val/seconds"])


class _CountingSampler(_Sampler):
  """Reports each completion as it 'finishes', like engine.Sampler.generate."""

  def generate(self, requests, on_progress=None):
    out = super().generate(requests)
    for done in range(1, len(out) + 1):
      if on_progress is not None:
        on_progress(done, len(out))
    return out


@pytest.mark.parametrize("shard", [(0, 1), (1, 2)])
def test_run_passes_its_progress_callback_to_the_sampler(shard):
  calls = []
  ev = eval_lib.Evaluator(_CountingSampler(), _prompts(3), _Scorer(), samples_per_prompt=2,
                          temperature=1.0, shard=shard, gather=lambda c: [c])
  ev.run(on_progress=lambda d, t: calls.append((d, t)))
  n = 2 * (3 if shard == (0, 1) else 1)  # process 1 of 2 samples prompt 1 only
  assert calls == [(d, n) for d in range(1, n + 1)]
  ev.run()  # without a callback: the sampler's plain generate(requests)


class _FlakyScorer:
  """Like _Scorer, but the verifier gives no verdict (NaN reward, as a timeout or an error
  does in rollouts.GroupScorer) on sample 3 of every prompt, and on all of prompt 2."""

  def score(self, prompt, completions):
    correct = np.array([c.tokens[0] == 1 for c in completions])
    rewards = np.where(correct, 1.0, -1.0)
    lost = np.array([c.sample_index == 3 or c.prompt_id == 2 for c in completions])
    return np.where(lost, np.nan, rewards), correct & ~lost, {}


def test_samples_without_a_verdict_are_left_out_and_counted():
  """A verifier timeout is no evidence the answer was wrong: scored as wrong, a loaded
  machine reads as a policy that got worse, and the forecast fitted on it bends."""
  out = eval_lib.Evaluator(_Sampler(), _prompts(4), _Scorer(), samples_per_prompt=4,
                           temperature=1.0).run()
  assert out["val/pass_rate"] == pytest.approx((0 + 1 + 2 + 3) / 16)
  assert out["val/invalid"] == 0
  # Prompt i: samples j < i right. Judged: samples 0-2 of prompts 0, 1, 3 (9 samples), of
  # which right: 0 + 1 + 3 = 4. Scored as wrong, it would read 4 / 16.
  flaky = eval_lib.Evaluator(_Sampler(), _prompts(4), _FlakyScorer(), samples_per_prompt=4,
                             temperature=1.0).run()
  assert flaky["val/pass_rate"] == pytest.approx(4 / 9)
  assert flaky["val/invalid"] == 3 + 4
  assert flaky["val/pass_at_k"] == pytest.approx(2 / 3)  # prompts 1 and 3 of the 3 judged
  assert flaky["val/num_prompts"] == 4
  # Sharded over two processes: the same numbers.
  sent = []
  eval_lib.Evaluator(_Sampler(), _prompts(4), _FlakyScorer(), samples_per_prompt=4,
                     temperature=1.0, shard=(1, 2),
                     gather=lambda c: sent.append(c) or [c, c]).run()
  got = eval_lib.Evaluator(_Sampler(), _prompts(4), _FlakyScorer(), samples_per_prompt=4,
                           temperature=1.0, shard=(0, 2), gather=lambda c: [c, sent[0]]).run()
  for key in ("val/pass_rate", "val/invalid", "val/pass_at_k", "val/num_prompts"):
    assert got[key] == pytest.approx(flaky[key]), key


def test_an_eval_without_any_verdict_has_no_pass_rate():
  class _Down:
    def score(self, prompt, completions):
      n = len(completions)
      return np.full(n, np.nan), np.zeros(n, bool), {}

  out = eval_lib.Evaluator(_Sampler(), _prompts(2), _Down(), samples_per_prompt=2,
                           temperature=1.0).run()
  assert np.isnan(out["val/pass_rate"]) and np.isnan(out["val/pass_at_k"])
  assert out["val/invalid"] == 4


def test_a_stop_request_ends_the_scoring_at_once():
  """SIGTERM while slow verifiers run (code answers): the eval is abandoned within the
  poll interval, not after every call, so the checkpoint fits in the grace period."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import preempt  # pylint: disable=g-import-not-at-top

  stop = preempt.StopRequest(grace_s=0)
  release = threading.Event()
  started, finished = [], []

  class _Slow(_Scorer):
    def score(self, prompt, completions):
      started.append(prompt.id)
      if len(started) == 2:
        stop.request()  # arrives while the scoring is under way
      release.wait(30)  # a verifier that runs until the test lets it go (30 s at most)
      finished.append(prompt.id)
      return super().score(prompt, completions)

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    ev = eval_lib.Evaluator(_Sampler(), _prompts(8), _Slow(), samples_per_prompt=2,
                            temperature=1.0, pool=pool, stop=stop)
    with pytest.raises(preempt.Interrupted):
      ev.run()
    # Interrupted while both calls in flight still ran: it did not wait for them.
    assert finished == []
    release.set()
  assert len(started) == 2  # the 6 prompts not started were cancelled
