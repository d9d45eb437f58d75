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


def test_forced_tokens_record_the_tempered_untruncated_logprob():
  logits = jnp.asarray([[1.0, 0.0, -1.0], [1.0, 0.0, -1.0], [0.0, 2.0, 1.0]], jnp.float32)
  forced = jnp.asarray([2, -1, 0])
  for truncate in (False, True):
    tokens, lp = jax.jit(sampling.sample, static_argnames=("truncate", "all_greedy"))(
        logits, _keys(3), jnp.asarray([2.0, 2.0, 0.0]), jnp.asarray([1, 1, 0]),
        jnp.ones((3,)), truncate=truncate, forced_B=forced)
    assert np.asarray(tokens).tolist()[0::2] == [2, 0]
    # Token 2 lies outside top-k 1 (truncated probability 0); forced, it gets the model's.
    np.testing.assert_allclose(float(lp[0]), float(jax.nn.log_softmax(logits[0] / 2.0)[2]),
                               atol=1e-6)
    np.testing.assert_allclose(float(lp[2]), float(jax.nn.log_softmax(logits[2])[0]),
                               atol=1e-6)
    if truncate:  # the unforced row with top-k 1 takes its top token at logprob 0
      assert int(tokens[1]) == 0 and float(lp[1]) == pytest.approx(0.0, abs=1e-6)


def _chi_square_p(tokens, probs):
  from scipy import stats

  counts = np.bincount(tokens, minlength=probs.size)
  assert counts[probs == 0].sum() == 0, "a token of probability 0 was drawn"
  expected = probs * tokens.size
  # Pool the rare ids into one cell so every expected count is >= 5.
  rare = expected < 5
  obs = np.append(counts[~rare], counts[rare].sum())
  exp = np.append(expected[~rare], expected[rare].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize("vocab", [300, 97, 48])  # 15 blocks of 20; prime: one block; 6 x 8
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_follow_the_tempered_softmax(vocab, temperature):
  """Chi-square of 40,000 draws from one row's logits against softmax(logits / T), with a
  spread of logits (a few likely ids, a long tail, some masked to -inf and some whose
  weight underflows to exactly 0 in float32). A biased inverse CDF (an off-by-one block,
  a missing renormalisation, a wrong temperature) fails it at p < 1e-4; unbiased draws
  pass with probability 0.9999."""
  rng = np.random.default_rng(vocab)
  logits = rng.normal(size=vocab).astype(np.float32) * 2.5
  logits[rng.choice(vocab, 5, replace=False)] = -np.inf
  logits[rng.choice(vocab, 3, replace=False)] = -200.0  # exp(-200 / T) underflows: weight 0
  n = 40_000
  z = logits.astype(np.float64) / temperature
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  tokens, lps = _sample(jnp.tile(jnp.asarray(logits), (n, 1)), _keys(n, vocab),
                        jnp.full((n,), temperature), jnp.zeros((n,), jnp.int32),
                        jnp.ones((n,)), truncate=False)
  tokens = np.asarray(tokens)
  assert _chi_square_p(tokens, probs) > 1e-4
  np.testing.assert_allclose(np.asarray(lps), np.log(probs[tokens]), atol=2e-5)


def test_truncated_draws_follow_the_renormalised_top_p_set():
  rng = np.random.default_rng(7)
  vocab, temperature, top_k, top_p = 120, 0.8, 40, 0.9
  logits = rng.normal(size=vocab).astype(np.float32) * 2
  n = 40_000
  tokens, lps = _sample(jnp.tile(jnp.asarray(logits), (n, 1)), _keys(n, 5),
                        jnp.full((n,), temperature), jnp.full((n,), top_k, jnp.int32),
                        jnp.full((n,), top_p), truncate=True)
  z = logits.astype(np.float64) / temperature
  order = np.argsort(-z, kind="stable")[:top_k]
  p = np.exp(z[order] - z[order].max())
  p /= p.sum()
  kept = order[(np.cumsum(p) - p) < top_p]
  probs = np.zeros(vocab)
  probs[kept] = np.exp(z[kept] - z[kept].max())
  probs /= probs.sum()
  tokens = np.asarray(tokens)
  assert _chi_square_p(tokens, probs) > 1e-4
  np.testing.assert_allclose(np.asarray(lps), np.log(probs[tokens]), atol=2e-5)


def test_the_chi_square_check_catches_a_biased_sampler():
  """The guard above can fail: draws from a distribution off by one block are rejected."""
  rng = np.random.default_rng(3)
  probs = np.exp(rng.normal(size=300) * 2.5)
  probs /= probs.sum()
  biased = np.roll(probs, 20)
  tokens = rng.choice(300, size=40_000, p=biased)
  assert _chi_square_p(tokens, probs) < 1e-4
  tempered = probs ** (1 / 0.6)
  tokens = rng.choice(300, size=40_000, p=tempered / tempered.sum())
  assert _chi_square_p(tokens, probs) < 1e-4


def test_fast_argmax_matches_jnp_argmax_with_ties_and_nan():
  logits = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [-jnp.inf, -1.0, -jnp.inf, -1.0],
                        [jnp.nan, 0.0, 1.0, 2.0]], jnp.float32)
  tokens, lp = _sample(logits, _keys(3), jnp.zeros((3,)), jnp.zeros((3,), jnp.int32),
                       jnp.ones((3,)), truncate=False)
  assert np.asarray(tokens).tolist()[:2] == [1, 1]  # first of the tied maxima, like argmax
  assert 0 <= int(tokens[2]) < 4  # a NaN row yields some in-vocabulary id, never out of range
  np.testing.assert_allclose(float(lp[0]), float(jax.nn.log_softmax(logits[0])[1]), atol=1e-6)


def test_block_argmax_matches_jnp_argmax_on_many_ties():
  """The argmax goes through block maxima (60 ids: 6 blocks of 10); small integer logits tie
  within and across blocks, and the answer must still be the first maximal id."""
  logits = jnp.asarray(np.random.default_rng(0).integers(0, 4, size=(256, 60)), jnp.float32)
  tokens, _ = _sample(logits, _keys(256), jnp.zeros((256,)), jnp.zeros((256,), jnp.int32),
                      jnp.ones((256,)), truncate=False)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(jnp.argmax(logits, axis=-1)))


def test_vocab_blocks():
  assert sampling.vocab_blocks(32000) == 160
  assert sampling.vocab_blocks(151936) == 128
  assert sampling.vocab_blocks(97) == 1
  assert all(v % sampling.vocab_blocks(v) == 0 for v in range(1, 400))
