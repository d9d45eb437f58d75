"""Multi-turn episodes on the loss side (issue 65 items 3 and 4): environment tokens take
no gradient and count in no average, the trainer's log-probs of a continued episode are
the sampler's, the episode's reward is the group's, and the per-step episode metrics."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale import config
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.generation import records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import tokenizer as tokenizer_lib
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.rl import losses
from jaxrl_scale.rl import logprobs
from tests.random_model import random_model

TOK = tokenizer_lib.ByteTokenizer()
FEEDBACK = " Try again. "


def _prompt(i, answer="12"):
  ids = tuple(TOK.encode(f"{i}+0=", add_special_tokens=True))
  return data_sources.Prompt(id=f"p{i}", task="arithmetic", prompt=f"{i}+0=", text=f"{i}+0=",
                             token_ids=ids, answer=answer, solution=answer)


def _episode(turns, sample_index=0, reward=None, correct=None, truncated=False, stats=None):
  """A Completion of model turns (texts; EOS ends each) with FEEDBACK between them."""
  tokens, env = [], []
  answer_start = 0
  for k, text in enumerate(turns):
    if k:
      extra = TOK.encode(FEEDBACK)
      tokens += extra
      env += [True] * len(extra)
      answer_start = len(tokens)
    own = TOK.encode(text) + ([] if truncated and k == len(turns) - 1 else [TOK.EOS])
    tokens += own
    env += [False] * len(own)
  n = len(tokens)
  env = np.asarray(env, bool)
  rng = np.random.default_rng(sample_index)
  logp = np.where(env, 0.0, -rng.uniform(0.5, 3.0, n)).astype(np.float32)
  return records.Completion(
      prompt_id=0, sample_index=sample_index, prompt_tokens=np.zeros((3,), np.int32),
      tokens=np.asarray(tokens, np.int32), logprobs=logp, versions=np.zeros((n,), np.int32),
      forced=np.zeros((n,), bool), finish_reason=records.LENGTH if truncated else records.EOS,
      truncated=truncated, env_mask=env, turns=len(turns), answer_start=answer_start,
      reward=reward, correct=correct, env_stats=dict(stats or {}))


def _group(seq, completions, rewards):
  r = np.asarray(rewards, np.float32)
  return rollouts.Group(seq=seq, prompt=_prompt(seq), completions=list(completions),
                        rewards_G=r, correct_G=r > 0, counts={"total": len(completions)},
                        admitted_version=0)


SHAPE = rollouts.BatchShape(num_prompts=2, group_size=2, seq_len=48, pad_id=TOK.PAD)


def _batch(groups, rl=None):
  return rollouts.build_batch(groups, rl or config.RLConfig(advantage_norm="none"), SHAPE)


def _episode_groups(drop_env_mask=False):
  comps = [_episode(["13", "12"], 0), _episode(["7", "8", "12"], 1),
           _episode(["12"], 0), _episode(["1", "x"], 1)]
  comps[3].forced[0] = True  # a forced-interruption token too: one mask for both
  if drop_env_mask:
    comps = [dataclasses.replace(c, env_mask=None) for c in comps]
  return [_group(0, comps[:2], [1.0, -1.0]), _group(1, comps[2:], [1.0, -1.0])]


def _loss_fn(batch, name, aggregation):
  lb = jax.tree.map(jnp.asarray, batch.loss_batch())
  return lambda logp: losses.policy_loss(name, logp, lb, aggregation=aggregation)[0]


@pytest.mark.parametrize("aggregation", ["prompt_avg", "sample_avg", "token_avg"])
@pytest.mark.parametrize("name", ["cispo", "grpo", "gspo"])
def test_environment_tokens_carry_no_gradient_and_the_test_fails_without_the_mask(
    name, aggregation):
  groups = _episode_groups()
  batch, _, _ = _batch(groups)
  lp = len(groups[0].prompt.token_ids)
  env_PGS = np.zeros(batch.tokens_PGS.shape, bool)
  forced_PGS = np.zeros(batch.tokens_PGS.shape, bool)
  for i, grp in enumerate(groups):
    for j, c in enumerate(grp.completions):
      env_PGS[i, j, lp:lp + c.num_tokens] = c.env_mask
      forced_PGS[i, j, lp:lp + c.num_tokens] = c.forced
      assert batch.loss_mask_PGS[i, j].sum() == c.trainable.sum()
  assert env_PGS.sum() > 10 and not batch.loss_mask_PGS[env_PGS].any()
  model_PGS = batch.loss_mask_PGS > 0
  rng = np.random.default_rng(0)
  # Near the generator's on the policy's tokens (no clip hides a gradient); at the
  # environment's, what a trainer computes there (the generator recorded 0).
  logp = jnp.asarray(np.where(env_PGS, -3.0, batch.gen_logp_PGS)
                     + rng.normal(0, 1e-3, env_PGS.shape), jnp.float32)
  loss = _loss_fn(batch, name, aggregation)
  grad = np.asarray(jax.grad(loss)(logp))
  np.testing.assert_array_equal(grad[env_PGS], 0.0)
  assert (grad[model_PGS] != 0).mean() > 0.5  # the check can see a gradient
  # Any value at the environment's positions, the trainer's or the generator's: same loss.
  noisy = logp + jnp.asarray(np.where(env_PGS, rng.normal(0, 2.0, env_PGS.shape), 0.0),
                             jnp.float32)
  perturbed = dataclasses.replace(
      batch, gen_logp_PGS=np.where(env_PGS, -7.0, batch.gen_logp_PGS).astype(np.float32))
  assert float(loss(noisy)) == float(loss(logp))
  assert float(_loss_fn(perturbed, name, aggregation)(logp)) == float(loss(logp))

  # Without the environment mask the same batch trains on the environment's tokens: the
  # gradient reaches them and the loss (its average's denominator included) changes.
  unmasked, _, _ = _batch(_episode_groups(drop_env_mask=True))
  assert unmasked.loss_mask_PGS[env_PGS].all() and not unmasked.loss_mask_PGS[forced_PGS].any()
  bad = _loss_fn(unmasked, name, aggregation)
  assert np.abs(np.asarray(jax.grad(bad)(logp))[env_PGS]).max() > 1e-4
  assert abs(float(bad(logp)) - float(loss(logp))) > 1e-4


def test_environment_tokens_count_in_no_average():
  batch, _, _ = _batch(_episode_groups())
  lb = batch.loss_batch()
  own_P = [sum(int(c.trainable.sum()) for c in grp.completions) for grp in _episode_groups()]
  # prompt_avg divides each prompt's sum by its own tokens: the policy's only.
  logp = jnp.asarray(np.where(batch.loss_mask_PGS > 0, -1.0, -5.0), jnp.float32)
  adv = np.asarray(lb.advantages_PG)
  got = float(losses.policy_loss("reinforce", logp, jax.tree.map(jnp.asarray, lb),
                                 aggregation="prompt_avg")[0])
  want = np.mean([np.sum(adv[i] * batch.loss_mask_PGS[i].sum(-1)) / own_P[i]
                  for i in range(2)])
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --------------------------------------------------------------------------------------
# The real sampler on a tiny random model: a 2-turn toy episode, then the trainer's side.

VOCAB = 64
EOS = tuple(range(0, VOCAB, 3))  # a third of the vocabulary ends a turn: turns are short
ENV_TOKENS = (40, 41, 43, 44, 46)  # no EOS among them
P, G, S, PROMPT_LEN, BUDGET = 2, 4, 40, 6, 30


class TwoTurns:
  """Appends ENV_TOKENS after the first model turn; ends after the second with a reward
  of +1 when that turn is of even length, -1 otherwise; counts one tool call."""

  def __init__(self):
    self.calls = 0

  def step(self, turn):
    self.calls += 1
    if turn.index == 0:
      return records.EnvStep(tokens=ENV_TOKENS)
    even = len(turn.tokens) % 2 == 0
    return records.EnvStep(done=True, reward=1.0 if even else -1.0, correct=even)

  def summary(self):
    return {"tool_calls": 1.0, "tool_s": 0.25}


@functools.cache
def _episodes():
  """(model, groups, batch, stats) of P x G on-policy episodes of TwoTurns."""
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  cfg = model_config.ModelConfig(family="llama", vocab_size=VOCAB, hidden_size=32,
                                 num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                 intermediate_size=64, param_dtype="float32", dtype="float32")
  model = random_model(cfg, mesh_lib.single_device_mesh(), scale=0.3, seed=1)
  sampler = engine.Sampler(
      model, config.SamplerConfig(num_slots=P * G, max_new_tokens=BUDGET, temperature=1.0,
                                  decode_chunk=4, prompt_buckets=(8,)),
      eos_ids=EOS, seed=2, max_prompt_len=PROMPT_LEN)
  rng = np.random.default_rng(3)
  prompts = [[int(t) for t in rng.integers(1, VOCAB, size=PROMPT_LEN)] for _ in range(P)]
  done = sampler.generate([records.Request(prompts[p], prompt_id=p, sample_index=g,
                                           episode=TwoTurns)
                           for p in range(P) for g in range(G)])
  groups = []
  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=1)
  try:
    for p in range(P):
      prompt = dataclasses.replace(_prompt(p), token_ids=tuple(prompts[p]))
      groups.append(scorer.group(p, prompt, done[p * G:(p + 1) * G], 0))
  finally:
    scorer.close()
  shape = rollouts.BatchShape(num_prompts=P, group_size=G, seq_len=S, pad_id=0)
  batch, stats, _ = rollouts.build_batch(groups, config.RLConfig(advantage_norm="none"), shape)
  return model, groups, batch, stats


def test_trainer_logprobs_of_a_continued_episode_equal_the_samplers_on_model_tokens():
  model, groups, batch, _ = _episodes()
  comps = [c for grp in groups for c in grp.completions]
  continued = [c for c in comps if c.turns == 2 and c.num_env_tokens]
  assert len(continued) >= 4  # most episodes really ran a second turn after the env
  rows = lambda x: jnp.asarray(x).reshape(P * G, S)  # noqa: E731
  logp = nnx.jit(functools.partial(logprobs.token_logprobs, temperature=1.0))(
      model, rows(batch.tokens_PGS), rows(batch.positions_PGS), rows(batch.input_mask_PGS))[0]
  logp = np.asarray(logp).reshape(P, G, S)
  mask = batch.loss_mask_PGS > 0
  env = np.zeros(mask.shape, bool)
  for i in range(P):
    for j, c in enumerate(groups[i].completions):
      lp = len(groups[i].prompt.token_ids)
      assert mask[i, j, lp:lp + c.num_tokens].tolist() == c.trainable.tolist()
      env[i, j, lp:lp + c.num_tokens] = c.env_mask
      # Every model token of every turn is trained, the second turn's included.
      second = np.arange(c.num_tokens) >= c.answer_start
      if c.turns == 2:
        assert mask[i, j, lp:lp + c.num_tokens][second].all()
  np.testing.assert_allclose(logp[mask], batch.gen_logp_PGS[mask], atol=1e-4, rtol=0)
  # The environment's positions have a trainer log-prob but no generator one (0): trained
  # on, they would read as a ratio far from 1, which the mask keeps out of the loss.
  assert env.sum() == sum(c.num_env_tokens for c in comps)
  assert np.abs(logp[env] - batch.gen_logp_PGS[env]).min() > 0.1
  lb = jax.tree.map(jnp.asarray, batch.loss_batch())
  _, diag = losses.policy_loss("cispo", jnp.asarray(logp), lb)
  assert abs(float(diag["ratio_min"]) - 1) < 1e-4 and abs(float(diag["ratio_max"]) - 1) < 1e-4
  leaky = lb._replace(mask_PGT=jnp.asarray(mask | env, jnp.float32))
  assert float(losses.policy_loss("cispo", jnp.asarray(logp), leaky)[1]["ratio_min"]) < 0.9


def test_episode_rewards_are_the_groups_and_episode_metrics_are_logged():
  _, groups, batch, stats = _episodes()
  comps = [c for grp in groups for c in grp.completions]
  for grp in groups:
    for j, c in enumerate(grp.completions):
      if c.reward is not None:  # the environment's verdict, not the verifier's
        assert grp.rewards_G[j] == c.reward and grp.correct_G[j] == c.correct
  # Group-centred advantages of the environment's rewards (advantage_norm none).
  for i, grp in enumerate(groups):
    np.testing.assert_allclose(batch.advantages_PG[i], grp.rewards_G - grp.rewards_G.mean(),
                               atol=1e-6)
  assert stats["rollout/turns_mean"] == pytest.approx(np.mean([c.turns for c in comps]))
  assert stats["rollout/turns_max"] == max(c.turns for c in comps)
  assert stats["rollout/tool_calls"] == P * G and stats["rollout/tool_calls_mean"] == 1.0
  assert stats["rollout/tool_s"] == pytest.approx(0.25 * P * G)
  assert stats["rollout/tool_errors"] == 0 and stats["rollout/tool_timeouts"] == 0
  frac = sum(c.num_env_tokens for c in comps) / sum(c.num_tokens for c in comps)
  assert stats["rollout/env_token_frac"] == pytest.approx(frac) and frac > 0


# --------------------------------------------------------------------------------------
# GroupScorer: the environment's reward when it gave one, else the last turn verified.


def _score(completions, answer="12"):
  scorer = rollouts.GroupScorer(config.RLConfig(), TOK, num_threads=2)
  try:
    return scorer.group(0, _prompt(0, answer), completions, 0)
  finally:
    scorer.close()


def test_scorer_verifies_only_the_last_turn_of_an_episode():
  # Right first, then no answer: the whole text would verify as correct ("12" is its
  # last number), the last turn does not.
  whole = _episode(["12", "done"])
  text = TOK.decode(whole.tokens.tolist(), skip_special_tokens=True)
  from jaxrl_scale import rewards  # pylint: disable=g-import-not-at-top
  assert rewards.get_reward("arithmetic")(text, "12").correct
  group = _score([whole, _episode(["13", "12"], 1), _episode(["12"], 2),
                  _episode(["5", "1"], 3, truncated=True)])
  np.testing.assert_array_equal(group.rewards_G, [-1.0, 1.0, 1.0, -1.0])
  np.testing.assert_array_equal(group.correct_G, [False, True, True, False])
  # The truncated episode's last turn ("1", cut by the budget) earns nothing from a
  # fallback answer, as a truncated single-turn completion.
  assert group.counts["no_answer"] == 2 and group.counts["correct"] == 2
  assert group.counts["total"] == 4


def test_scorer_keeps_the_environments_reward_and_a_nan_is_invalid():
  # Rewards the verifier would contradict: the environment's stand.
  comps = [_episode(["13", "12"], 0, reward=0.0, correct=True),  # a discounted retry
           _episode(["12"], 1, reward=-1.0, correct=False),
           _episode(["13"], 2, reward=float("nan"), correct=False),  # the env failed
           _episode(["4"], 3, reward=1.0)]  # correct left to the reward
  group = _score(comps)
  np.testing.assert_array_equal(group.rewards_G[[0, 1, 3]], [0.0, -1.0, 1.0])
  assert np.isnan(group.rewards_G[2])
  np.testing.assert_array_equal(group.correct_G, [True, False, False, True])
  np.testing.assert_array_equal(group.valid_G, [True, True, False, True])
  assert group.counts == {"total": 4, "correct": 2, "wrong": 1, "no_answer": 0,
                          "unparseable": 0, "errors": 1, "timeouts": 0}
  # The invalid sample stays out of its group's advantage, as a verifier's NaN does.
  batch, stats, _ = rollouts.build_batch(
      [group], config.RLConfig(advantage_norm="none"),
      dataclasses.replace(SHAPE, num_prompts=1, group_size=4))
  assert stats["rewards/invalid"] == 1.0 and batch.weight_PG[0, 2] == 0.0
  np.testing.assert_allclose(batch.advantages_PG[0, [0, 1, 3]],
                             np.array([0.0, -1.0, 1.0]) - 0.0, atol=1e-6)


def test_episode_metrics_only_for_episodes():
  single = _group(0, [_episode(["12"]), _episode(["1"], 1)], [1.0, -1.0])
  for c in single.completions:
    c.env_mask = None
  _, stats, _ = _batch([single])
  assert not any(k.startswith("rollout/tool") or k.startswith("rollout/turns") or
                 k == "rollout/env_token_frac" for k in stats)
  stats_ep = rollouts.episode_stats(
      [_episode(["1", "2"], stats={"tool_calls": 2, "tool_errors": 1, "tool_timeouts": 1,
                                   "tool_s": 1.5}),
       _episode(["3"])])
  assert stats_ep["rollout/turns_mean"] == 1.5 and stats_ep["rollout/turns_max"] == 2
  assert stats_ep["rollout/tool_calls"] == 2 and stats_ep["rollout/tool_calls_mean"] == 1
  assert stats_ep["rollout/tool_errors"] == 1 and stats_ep["rollout/tool_timeouts"] == 1
  assert stats_ep["rollout/tool_s"] == 1.5
  env_tokens = len(TOK.encode(FEEDBACK))
  total = env_tokens + 2 * 3  # "1"+EOS, "2"+EOS, "3"+EOS
  assert stats_ep["rollout/env_token_frac"] == pytest.approx(env_tokens / total)
