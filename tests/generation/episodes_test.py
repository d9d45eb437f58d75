"""Multi-turn episodes in the real sampler (tiny random Qwen2): continuation in place from
the paged KV cache, environment tokens, environment calls off the decode loop."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import engine, records

# Turns end quickly at temperature 1: a third of the vocabulary ends a turn.
EOS = tuple(range(0, 256, 3))
CFG = SamplerConfig(num_slots=4, max_new_tokens=48, temperature=1.0, decode_chunk=4,
                    prompt_buckets=(16,))
ENV_TOKENS = ([200, 201, 202], [210, 211, 212, 213, 214, 215, 216, 217, 218])  # 8- and 16-piece


class Scripted:
  """Appends ENV_TOKENS[i] after model turn i, then ends; records what it saw."""

  def __init__(self, turns=2, sleep_s=0.0, fail=False):
    self.turns, self.sleep_s, self.fail = turns, sleep_s, fail
    self.seen = []

  def step(self, turn):
    self.seen.append(turn)
    if self.sleep_s:
      time.sleep(self.sleep_s)
    if self.fail:
      raise RuntimeError("tool crashed")
    if turn.index >= self.turns:
      return records.EnvStep(done=True, reward=1.0, correct=True)
    return records.EnvStep(tokens=ENV_TOKENS[turn.index % 2])

  def summary(self):
    return {"tool_calls": float(len(self.seen))}


def _sampler(model, **overrides):
  cfg = SamplerConfig(**{**CFG.__dict__, **overrides})
  return engine.Sampler(model, cfg, eos_ids=EOS)


def _requests(prompts, episodes=None):
  return [records.Request(p, prompt_id=i, sample_index=0,
                          episode=None if episodes is None else episodes[i].__call__)
          for i, p in enumerate(prompts)]


class _Factory:
  """A fresh Scripted per start (a preempted episode restarts with a new one)."""

  def __init__(self, **kw):
    self.kw, self.made = kw, []

  def __call__(self):
    self.made.append(Scripted(**self.kw))
    return self.made[-1]


def test_continued_episode_matches_one_forward_pass_and_prefills_only_new_tokens(
    loaded, prompts):
  model, _ = loaded["qwen2"]
  batch = prompts[:4]  # all in the 4 slots at once: one admission prefill
  single = _sampler(model)
  single.generate(_requests(batch))
  factories = [_Factory() for _ in batch]
  sampler = _sampler(model)
  outs = sampler.generate(_requests(batch, factories))

  appended = 0
  for out, factory in zip(outs, factories):
    env = out.env_mask
    assert env is not None and env.shape == out.tokens.shape
    episode = factory.made[-1]
    assert out.turns == len(episode.seen) or out.truncated
    # The environment's tokens sit where it put them, with no log-prob.
    pos = 0
    for turn in episode.seen[:out.turns - 1]:
      pos += len(turn.tokens)
      extra = ENV_TOKENS[turn.index % 2]
      assert out.tokens[pos:pos + len(extra)].tolist() == extra
      assert env[pos:pos + len(extra)].all() and (out.logprobs[pos:pos + len(extra)] == 0).all()
      pos += len(extra)
      appended += len(extra)
    assert env.sum() == sum(len(ENV_TOKENS[t.index % 2]) for t in episode.seen[:out.turns - 1])
    assert not out.trainable[env].any() and out.trainable[~env].all()
    if not out.truncated:
      assert out.reward == 1.0 and out.correct
  assert sum(o.turns >= 3 for o in outs) >= 2  # both piece lengths really ran

  # No history is prefilled again: the prompts' prefill is the single-turn run's, and each
  # continuation computed exactly its new positions (the turn's last token + the
  # environment's tokens but the last).
  assert sampler.stats.prefill_tokens == single.stats.prefill_tokens
  assert sampler.stats.resume_tokens == appended
  assert sampler.stats.resumes == sum(o.turns - 1 for o in outs)

  _assert_logprobs_of_one_forward_pass(model, outs)


def _assert_logprobs_of_one_forward_pass(model, outs):
  """Log-probs of every model token equal one forward pass over the whole episode."""
  full = jax.jit(lambda m, x: m(x, jnp.arange(64)[None], jnp.ones((1, 64), bool)))
  for out in outs:
    seq = list(out.prompt_tokens) + out.tokens.tolist()
    logits = np.asarray(full(model, jnp.asarray([seq + [0] * (64 - len(seq))])))[0]
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    p = len(out.prompt_tokens)
    ref = np.asarray([logp[p - 1 + j, t] for j, t in enumerate(out.tokens)])
    model_tok = ~out.env_mask if out.env_mask is not None else np.ones(len(ref), bool)
    np.testing.assert_allclose(out.logprobs[model_tok], ref[model_tok], atol=1e-4, rtol=0)


def test_a_slow_environment_holds_only_its_own_sequence(loaded, prompts):
  model, _ = loaded["qwen2"]
  gate = threading.Event()

  class Waits(Scripted):
    def step(self, turn):
      gate.wait(timeout=30)  # released once every other sequence has finished
      return records.EnvStep(done=True, reward=0.5)

  reqs = [records.Request(prompts[0], prompt_id="slow", episode=lambda: Waits())]
  reqs += [records.Request(p, prompt_id=i) for i, p in enumerate(prompts[1:6])]
  order = []
  sampler = _sampler(model)
  for out in sampler.stream(iter(reqs)):
    order.append(out.prompt_id)
    if len(order) == 5:
      gate.set()
  assert order[-1] == "slow" and sorted(order[:5]) == list(range(5))
  assert sampler.stats.env_calls == 1


def test_a_waiting_request_takes_the_slot_while_a_tool_runs(loaded, prompts):
  model, _ = loaded["qwen2"]
  gate = threading.Event()
  waited = []

  class Waits(Scripted):
    def step(self, turn):
      waited.append(gate.wait(timeout=20))  # released once the other requests finished
      return records.EnvStep(done=True, reward=0.5)

  reqs = [records.Request(prompts[0], prompt_id="slow", episode=lambda: Waits())]
  reqs += [records.Request(p, prompt_id=i) for i, p in enumerate(prompts[1:4])]
  order = []
  sampler = _sampler(model, num_slots=1)  # a slot kept through the call would stall them
  for out in sampler.stream(iter(reqs)):
    order.append(out.prompt_id)
    if len(order) == 3:
      gate.set()
  assert order == [0, 1, 2, "slow"] and waited == [True]
  assert sampler._pool.used_pages == 0  # the parked pages went back with the episode
  sampler._pool.check()


def test_episodes_continue_in_other_slots_from_their_own_cache(loaded, prompts):
  model, _ = loaded["qwen2"]
  episodes = [_Factory(sleep_s=0.05) for _ in range(3)]
  reqs = [records.Request(p, prompt_id=i, episode=episodes[i] if i < 3 else None)
          for i, p in enumerate(prompts[:7])]
  sampler = _sampler(model, num_slots=2)
  outs = sampler.generate(reqs)
  assert sampler.stats.moved_resumes > 0 and sampler.stats.resumes >= 3
  assert sum(o.turns for o in outs[:3]) > 3
  _assert_logprobs_of_one_forward_pass(model, outs)
  # The same tokens as with a slot for every request from the start.
  roomy = _sampler(model, num_slots=8).generate(
      [records.Request(p, prompt_id=i, episode=_Factory(sleep_s=0.05) if i < 3 else None)
       for i, p in enumerate(prompts[:7])])
  for a, b in zip(outs, roomy):
    assert a.tokens.tolist() == b.tokens.tolist()
  assert sampler._pool.used_pages == 0
  sampler._pool.check()


def test_failing_environment_ends_the_episode_without_a_verdict(loaded, prompts):
  model, _ = loaded["qwen2"]
  outs = _sampler(model).generate(_requests(prompts[:2], [_Factory(fail=True)] * 2))
  for out in outs:
    if not out.truncated:
      assert np.isnan(out.reward) and out.turns == 1 and not out.env_mask.any()


def test_environment_tokens_past_the_budget_truncate_the_episode(loaded, prompts):
  model, _ = loaded["qwen2"]

  class Floods(Scripted):
    def step(self, turn):
      return records.EnvStep(tokens=[100] * 64)  # more than the whole budget

  outs = _sampler(model).generate(
      [records.Request(p, prompt_id=i, episode=Floods) for i, p in enumerate(prompts[:3])])
  for out in outs:
    assert out.truncated and out.finish_reason == records.LENGTH
    assert not out.env_mask.any() and out.reward is None


def test_small_pool_preempts_episodes_and_restarts_them_to_the_same_tokens(loaded, prompts):
  model, _ = loaded["qwen2"]
  batch = prompts[:6]
  big = _sampler(model).generate(_requests(batch, [_Factory() for _ in batch]))
  small = _sampler(model, kv_cache_tokens=80, page_size=8)  # 10 pages per shard
  got = small.generate(_requests(batch, [_Factory() for _ in batch]))
  # The pool ran short: an episode was preempted, or parked and evicted (whichever the
  # environment threads' timing made it); either way its history prefilled again.
  assert small.stats.preemptions + small.stats.evictions > 0, small.stats
  for a, b in zip(big, got):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.env_mask.tolist() == b.env_mask.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  small._pool.check()


def test_a_short_pool_evicts_parked_caches_and_their_histories_go_in_again(loaded, prompts):
  model, _ = loaded["qwen2"]
  batch = prompts[:8]
  roomy = _sampler(model).generate(_requests(batch, [_Factory() for _ in batch]))
  small = _sampler(model, kv_cache_tokens=96, page_size=8)  # 12 pages per shard
  got = small.generate(_requests(batch, [_Factory(sleep_s=0.05) for _ in batch]))
  assert small.stats.evictions > 0 and small.stats.reprefill_tokens > 0
  for a, b in zip(roomy, got):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.env_mask.tolist() == b.env_mask.tolist()
  _assert_logprobs_of_one_forward_pass(model, got)  # the history prefilled again is right
  assert small._pool.used_pages == 0
  small._pool.check()


def test_bad_environment_tokens_are_a_user_error(loaded, prompts):
  from jaxrl_scale.errors import UserError

  model, _ = loaded["qwen2"]

  class Bad(Scripted):
    def step(self, turn):
      return records.EnvStep(tokens=[10**6])

  with pytest.raises(UserError, match="outside"):
    _sampler(model).generate([records.Request(prompts[0], episode=Bad)])
