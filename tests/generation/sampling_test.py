"""Sampling math on hand-built logits: truncation masks, logprobs, greedy, per-row keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.generation import sampling

# Jitted once per shape: eager dispatch of the many small ops would dominate the test time.
_sample = jax.jit(sampling.sample, static_argnames="truncate")


def _keys(n, seed=0):
  return jax.vmap(lambda k: jax.random.key_data(k))(jax.random.split(jax.random.key(seed), n))


def _kept_ids(logits, top_k, top_p):
  order, keep = jax.jit(sampling.truncation_mask)(jnp.asarray([logits], jnp.float32),
                                         jnp.asarray([top_k]), jnp.asarray([top_p]))
  return sorted(np.asarray(order)[0][np.asarray(keep)[0]].tolist())


def test_top_k_and_top_p_masks():
  # probs of log([0.5, 0.2, 0.15, 0.1, 0.05]) in scrambled id order.
  probs = np.array([0.1, 0.5, 0.05, 0.2, 0.15])
  logits = np.log(probs)
  assert _kept_ids(logits, 0, 1.0) == [0, 1, 2, 3, 4]
  assert _kept_ids(logits, 2, 1.0) == [1, 3]
  # top-p: keep while the mass before a token is < p. 0.5 | 0.7 | 0.85 | 0.95.
  assert _kept_ids(logits, 0, 0.45) == [1]
  assert _kept_ids(logits, 0, 0.51) == [1, 3]
  assert _kept_ids(logits, 0, 0.8) == [1, 3, 4]
  assert _kept_ids(logits, 0, 1e-6) == [1]  # the most likely token always survives
  # top-p runs on the distribution renormalised after top-k: within {1, 3}, 0.5/0.7 = 0.71.
  assert _kept_ids(logits, 2, 0.7) == [1]
  assert _kept_ids(logits, 2, 0.72) == [1, 3]


def test_sampled_logprob_is_under_the_truncated_tempered_distribution():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 50)).astype(np.float32) * 3
  temp, top_k, top_p = 0.7, 10, 0.8
  tokens, logprobs = _sample(
      jnp.asarray(logits), _keys(64), jnp.full((64,), temp), jnp.full((64,), top_k, jnp.int32),
      jnp.full((64,), top_p), truncate=True)
  tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
  assert logprobs.dtype == np.float32
  for row in range(64):
    z = logits[row].astype(np.float64) / temp
    order = np.argsort(-z, kind="stable")[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    kept = order[(np.cumsum(p) - p) < top_p]
    assert tokens[row] in kept
    zk = z[kept]
    expected = z[tokens[row]] - zk.max() - np.log(np.exp(zk - zk.max()).sum())
    np.testing.assert_allclose(logprobs[row], expected, atol=1e-5)


def test_untruncated_matches_tempered_log_softmax_and_frequencies():
  logits = np.log(np.array([[0.6, 0.3, 0.1]], np.float32))
  n = 4000
  tokens, logprobs = _sample(
      jnp.tile(jnp.asarray(logits), (n, 1)), _keys(n, 1), jnp.ones((n,)),
      jnp.zeros((n,), jnp.int32), jnp.ones((n,)), truncate=False)
  tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
  freq = np.bincount(tokens, minlength=3) / n
  np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.03)
  np.testing.assert_allclose(logprobs, logits[0][tokens], atol=1e-5)
  # The sorted (truncating) path with top-k/top-p off samples the same distribution.
  tokens2, logprobs2 = _sample(
      jnp.tile(jnp.asarray(logits), (n, 1)), _keys(n, 2), jnp.ones((n,)),
      jnp.zeros((n,), jnp.int32), jnp.ones((n,)), truncate=True)
  tokens2 = np.asarray(tokens2)
  np.testing.assert_allclose(np.bincount(tokens2, minlength=3) / n, [0.6, 0.3, 0.1], atol=0.03)
  np.testing.assert_allclose(np.asarray(logprobs2), logits[0][tokens2], atol=1e-5)


def test_greedy_rows_take_argmax_with_model_logprob():
  logits = jnp.asarray([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]], jnp.float32)
  tokens, logprobs = _sample(logits, _keys(2), jnp.asarray([0.0, 0.5]),
                                     jnp.asarray([1, 0]), jnp.asarray([0.1, 1.0]), truncate=True)
  assert int(tokens[0]) == 1
  np.testing.assert_allclose(float(logprobs[0]), float(jax.nn.log_softmax(logits[0])[1]),
                             atol=1e-6)
  # The sampled row (temperature 0.5) is unaffected by its greedy neighbour.
  assert float(logprobs[1]) == pytest.approx(float(jax.nn.log_softmax(logits[1] / 0.5)[
      int(tokens[1])]), abs=1e-6)


def test_per_row_keys_make_draws_independent_of_the_batch():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(8, 100)), jnp.float32)
  keys = sampling.step_keys(_keys(8, 3), jnp.arange(8, dtype=jnp.int32))
  args = (jnp.ones((8,)), jnp.zeros((8,), jnp.int32), jnp.ones((8,)))
  full, _ = _sample(logits, keys, *args, truncate=False)
  perm = np.array([5, 2, 7, 0, 1, 6, 3, 4])
  shuffled, _ = _sample(logits[perm], keys[perm], *(a[perm] for a in args),
                                truncate=False)
  np.testing.assert_array_equal(np.asarray(shuffled), np.asarray(full)[perm])
  # Different step indices give different keys.
  other = sampling.step_keys(_keys(8, 3), jnp.arange(8, dtype=jnp.int32) + 1)
  assert not np.array_equal(np.asarray(keys), np.asarray(other))


def test_forced_logprobs_are_tempered_and_untruncated():
  logits = jnp.asarray([[1.0, 0.0, -1.0]], jnp.float32)
  lp = sampling.forced_logprobs(logits, jnp.asarray([2]), jnp.asarray([2.0]))
  np.testing.assert_allclose(float(lp[0]), float(jax.nn.log_softmax(logits[0] / 2.0)[2]),
                             atol=1e-6)
