"""Advantages on hand-built groups: centring, the three normalisations, zero-variance
filtering and its counts, invalid slots, the DAPO length penalty."""

import functools

import jax
import numpy as np
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import advantages

EPS = 1e-6
# Mixed, all correct, mixed, all wrong.
REWARDS = np.array([[1, -1, -1, 1], [1, 1, 1, 1], [-1, -1, -1, 1], [-1, -1, -1, -1]],
                   np.float32)
CENTRED = np.array([[1, -1, -1, 1], [0, 0, 0, 0], [-0.5, -0.5, -0.5, 1.5], [0, 0, 0, 0]])


def test_prompt_normalization():
  out = advantages.compute_advantages(REWARDS, normalization="prompt", eps=EPS)
  std2 = np.sqrt(0.75)  # population std of (-1, -1, -1, 1)
  want = CENTRED / np.array([1.0, 1.0, std2, 1.0])[:, None]
  np.testing.assert_allclose(out.advantages_PG, want, rtol=1e-5, atol=1e-6)


def test_batch_normalization_uses_kept_groups_only():
  out = advantages.compute_advantages(REWARDS, normalization="batch", eps=EPS)
  # The 8 centred values of groups 0 and 2: mean 0, variance (4 + 3 * 0.25 + 2.25) / 8.
  std = np.sqrt(7 / 8)
  np.testing.assert_allclose(out.advantages_PG, CENTRED / std, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.std(np.asarray(out.advantages_PG)[[0, 2]]), 1.0, rtol=1e-5)


def test_none_normalization_is_centring():
  out = advantages.compute_advantages(REWARDS, normalization="none")
  np.testing.assert_allclose(out.advantages_PG, CENTRED, atol=1e-6)


def test_zero_variance_filter_and_counts():
  out = advantages.compute_advantages(REWARDS)
  np.testing.assert_array_equal(out.keep_P, [True, False, True, False])
  np.testing.assert_array_equal(out.weight_PG, np.repeat([[1], [0], [1], [0]], 4, 1))
  s = {k: float(v) for k, v in out.stats.items()}
  assert s["num_prompts"] == 4 and s["num_zero_variance"] == 2 and s["num_kept"] == 2
  assert s["frac_zero_variance"] == 0.5
  assert s["num_all_correct"] == 1 and s["num_all_wrong"] == 1
  assert s["reward_mean"] == pytest.approx(-2 / 16)


def test_without_filter_zero_variance_groups_stay_and_dilute_the_batch_std():
  out = advantages.compute_advantages(REWARDS, filter_zero_variance=False)
  np.testing.assert_array_equal(out.weight_PG, np.ones((4, 4)))
  assert float(out.stats["num_zero_variance"]) == 2 and float(out.stats["num_kept"]) == 4
  std = np.sqrt(7 / 16)  # the same 8 nonzero values, now among 16
  np.testing.assert_allclose(out.advantages_PG, CENTRED / std, rtol=1e-5, atol=1e-6)


def test_invalid_slots_and_padding_prompts():
  rewards = np.array([[1, -1, -1, 7], [1, 5, 5, 5], [0, 0, 0, 0]], np.float32)
  valid = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)
  out = advantages.compute_advantages(rewards, valid_PG=valid, normalization="none")
  # Group 0 mean over its 3 valid rewards = -1/3; the 7 in the invalid slot is ignored.
  np.testing.assert_allclose(out.advantages_PG[0], [4 / 3, -2 / 3, -2 / 3, 0], rtol=1e-6)
  np.testing.assert_array_equal(out.keep_P, [True, False, False])  # 1 sample: no variance
  np.testing.assert_array_equal(out.weight_PG[0], [1, 1, 1, 0])
  assert float(out.stats["num_prompts"]) == 2  # the padding prompt is not a prompt
  assert float(out.stats["num_zero_variance"]) == 1
  assert float(out.stats["reward_mean"]) == pytest.approx((1 - 1 - 1 + 1) / 4)


def test_length_penalty_values():
  cfg = advantages.LengthPenalty(max_length=10, cache_length=4)
  got = advantages.length_penalty(np.array([[0, 5, 6, 8, 10, 12]]), cfg)
  np.testing.assert_allclose(got, [[0, 0, 0, -0.5, -1, -1]], atol=1e-7)


def test_length_penalty_only_on_correct_traces_and_it_creates_variance():
  cfg = advantages.LengthPenalty(max_length=10, cache_length=4)
  rewards = np.array([[1, 1], [-1, -1]], np.float32)
  lengths = np.array([[4, 9], [4, 12]])
  out = advantages.compute_advantages(rewards, normalization="none", lengths_PG=lengths,
                                      penalty=cfg)
  # Group 0 becomes (1, 1 - 0.75): kept, centred to (+0.375, -0.375). Group 1 is wrong
  # twice, gets no penalty, stays zero-variance.
  np.testing.assert_allclose(out.advantages_PG, [[0.375, -0.375], [0, 0]], atol=1e-6)
  np.testing.assert_array_equal(out.keep_P, [True, False])
  assert float(out.stats["length_penalty_mean"]) == pytest.approx(-0.75 / 4)
  with pytest.raises(ValueError, match="needs lengths_PG"):
    advantages.compute_advantages(rewards, penalty=cfg)


def test_length_penalty_config_errors():
  with pytest.raises(UserError, match="rl.length_penalty_cache: must be > 0"):
    advantages.LengthPenalty(max_length=10, cache_length=0)
  with pytest.raises(UserError, match="rl.length_penalty_max: must be >= cache_length"):
    advantages.LengthPenalty(max_length=3, cache_length=4)


def test_jit_and_unknown_name():
  f = jax.jit(functools.partial(advantages.compute_advantages, normalization="batch"))
  out = f(REWARDS)
  eager = advantages.compute_advantages(REWARDS)
  np.testing.assert_allclose(out.advantages_PG, eager.advantages_PG, rtol=1e-6)
  with pytest.raises(UserError, match="rl.advantage_norm: unknown advantage normalization "
                     "'batch_std'; did you mean 'batch'"):
    advantages.compute_advantages(REWARDS, normalization="batch_std")


def test_a_fork_registers_a_normalization():
  name = "test_leave_one_out"
  if name not in advantages.NORMALIZATIONS:

    @advantages.register_normalization(name)
    def _loo(rewards_PG, valid_PG, keep_P, eps):
      del keep_P, eps
      n = valid_PG.sum(-1, keepdims=True)
      total = (rewards_PG * valid_PG).sum(-1, keepdims=True)
      return rewards_PG - (total - rewards_PG) / (n - 1)

  out = advantages.compute_advantages(REWARDS[:1], normalization=name)
  np.testing.assert_allclose(out.advantages_PG, [[4 / 3, -4 / 3, -4 / 3, 4 / 3]], rtol=1e-6)


def test_nan_rewards_are_invalid_samples_out_of_the_mean_std_and_loss():
  # NaN is a sample without a verdict (verifier timeout or error): neither right nor wrong.
  nan = np.nan
  rewards = np.array([[1, -1, -1, nan],      # 3 valid: mean -1/3
                      [1, nan, 1, 1],        # valid ones all equal: zero variance, dropped
                      [nan, nan, nan, -1],   # 1 valid: dropped
                      [1, 1, -1, -1]], np.float32)
  out = advantages.compute_advantages(rewards, normalization="none")
  want = np.array([[4 / 3, -2 / 3, -2 / 3, 0], [0] * 4, [0] * 4, [1, 1, -1, -1]])
  np.testing.assert_allclose(out.advantages_PG, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(out.weight_PG, [[1, 1, 1, 0], [0] * 4, [0] * 4, [1] * 4])
  np.testing.assert_array_equal(out.keep_P, [True, False, False, True])
  assert float(out.stats["num_invalid"]) == 5
  assert float(out.stats["reward_mean"]) == pytest.approx((1 - 1 - 1 + 3 - 1) / 11)
  # Batch normalisation: the std of the 7 kept centred values (4/3, -2/3, -2/3, 1, 1, -1, -1):
  # mean 0, variance (16/9 + 4/9 + 4/9 + 4) / 7 = 20/21 (the NaN slot is not an 8th zero).
  kept = np.array([4 / 3, -2 / 3, -2 / 3, 1, 1, -1, -1])
  std = np.sqrt(np.mean((kept - kept.mean())**2))
  assert std == pytest.approx(np.sqrt(20 / 21), rel=1e-12)
  out = advantages.compute_advantages(rewards, normalization="batch", eps=EPS)
  np.testing.assert_allclose(out.advantages_PG, want / (std + EPS), rtol=1e-5, atol=1e-6)
  out = advantages.compute_advantages(rewards, normalization="prompt", eps=EPS)
  np.testing.assert_allclose(out.advantages_PG[0], want[0] / (np.sqrt(8 / 9) + EPS),
                             rtol=1e-5)
  assert np.all(np.isfinite(out.advantages_PG))
