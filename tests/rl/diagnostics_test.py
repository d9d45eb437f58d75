"""Loss diagnostics: masked quantiles, mismatch numbers, combining micro-batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.rl import diagnostics


@pytest.mark.parametrize("n_valid", [1, 2, 7, 40])
def test_masked_quantiles_match_numpy(n_valid):
  rng = np.random.default_rng(n_valid)
  x = rng.normal(size=(5, 8)).astype(np.float32)
  valid = np.zeros(40, bool)
  valid[rng.choice(40, n_valid, replace=False)] = True
  valid = valid.reshape(5, 8)
  qs = [0.0, 0.01, 0.25, 0.5, 0.99, 1.0]
  got = jax.jit(diagnostics.masked_quantiles, static_argnums=2)(x, valid, tuple(qs))
  np.testing.assert_allclose(got, np.quantile(x[valid], qs), rtol=1e-5, atol=1e-6)


def test_masked_quantiles_empty_is_zero():
  got = diagnostics.masked_quantiles(jnp.ones((2, 3)), jnp.zeros((2, 3), bool), [0.5, 0.99])
  np.testing.assert_array_equal(got, [0.0, 0.0])


def test_policy_diagnostics_hand_computed():
  # Valid tokens with log-ratios +0.5, -0.5, 0 (weights 1, 1, 0 through the prompts); one
  # masked token with garbage values.
  lt = np.array([[[-1.0, -2.0]], [[-0.5, 7.0]]], np.float32)  # [P=2, G=1, T=2]
  lg = np.array([[[-1.5, -1.5]], [[-0.5, -99.0]]], np.float32)
  mask = np.array([[[1, 1]], [[1, 0]]], np.float32)
  weight = np.array([[1.0], [0.0]], np.float32)
  clipped = np.array([[[1, 0]], [[1, 1]]], np.float32)
  d = diagnostics.policy_diagnostics(lt, lg, mask, weight, clipped)
  r = np.exp([0.5, -0.5, 0.0])
  assert float(d["num_tokens"]) == 3 and float(d["num_loss_tokens"]) == 2
  assert float(d["logp_abs_diff"]) == pytest.approx(1 / 3, rel=1e-6)
  assert float(d["kl_k3"]) == pytest.approx(np.mean(r - 1 - np.log(r)), rel=1e-5)
  assert float(d["ratio_max"]) == pytest.approx(np.exp(0.5), rel=1e-6)
  assert float(d["ratio_min"]) == pytest.approx(np.exp(-0.5), rel=1e-6)
  assert float(d["ratio_p50"]) == pytest.approx(1.0, rel=1e-6)
  assert float(d["ratio_p99"]) == pytest.approx(np.quantile(r, 0.99), rel=1e-5)
  assert float(d["clipped_frac"]) == pytest.approx(0.5)  # of the 2 loss tokens, 1 clipped
  assert float(d["entropy_proxy"]) == pytest.approx((1.0 + 2.0 + 0.5) / 3, rel=1e-6)


def test_combine_diagnostics():
  stacked = {
      "num_tokens": jnp.array([3.0, 1.0, 0.0]),
      "num_loss_tokens": jnp.array([2.0, 0.0, 0.0]),
      "logp_abs_diff": jnp.array([0.1, 0.5, 0.0]),
      "clipped_frac": jnp.array([0.5, 0.0, 0.0]),
      "ratio_max": jnp.array([1.5, 2.0, 0.0]),
      "ratio_min": jnp.array([0.9, 0.7, 0.0]),  # the empty micro-batch's 0 is ignored
  }
  out = diagnostics.combine_diagnostics(stacked)
  assert float(out["num_tokens"]) == 4 and float(out["num_loss_tokens"]) == 2
  assert float(out["logp_abs_diff"]) == pytest.approx((0.3 + 0.5) / 4, rel=1e-6)
  assert float(out["clipped_frac"]) == pytest.approx(0.5)
  assert float(out["ratio_max"]) == pytest.approx(2.0)
  assert float(out["ratio_min"]) == pytest.approx(0.7)
