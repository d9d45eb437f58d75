"""Next-token choice: greedy, temperature, top-k and top-p, with the chosen token's logprob.

The logprob is the log-probability of the chosen token under the distribution it was drawn
from, in float32: temperature-scaled, restricted to the top-k / top-p set and renormalised.
CISPO's importance ratio divides the trainer's probability by exactly this number, so it must
describe the real sampling distribution (ScaleRL, FP32 logits: paper sec. 3.2).

Greedy rows (temperature 0) record the model's own log-softmax at temperature 1 without
truncation: the argmax distribution is degenerate (logprob 0) and says nothing about the
policy, while the untempered logprob is what a trainer compares against. Forced tokens
(an interruption phrase) record the tempered, untruncated model logprob likewise.

Cost per step, over the [B, V] logits: one pass for the max of each block of the vocabulary
(the row's max follows, and so does the argmax: the first block holding the max, then the
first entry equal to it inside that block, without a value-plus-index reduction, which does
not vectorise on XLA:CPU), and one pass that sums exp(z - max) per block (the
log-normaliser and the draw's coarse CDF at once). The draw is inverse-CDF with one
uniform number per row: the block whose cumulative mass passes u * Z, then the token inside
that block from its own cumulative sum. That samples exactly softmax(z) (up to float32
rounding of the sums, the same as any CDF sampler) without a noise value per vocabulary
entry; tests/generation/sampling_test.py checks it with chi-square tests. Top-k / top-p
sort the row once and draw the same way over the kept, sorted entries.

Randomness is per row: each row brings its own key (raw key data, so it can live in jitted
carry and be scattered into slot state), which the caller derives from the sequence's seed
and the index of the token being generated. A row's draw therefore never depends on which
slot it sits in or what the other rows do, and a run is reproducible from its seeds.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def step_keys(keys_BK: jax.Array, step_B: jax.Array) -> jax.Array:
  """The key of each row's `step_B`-th generated token, as raw key data."""

  def one(k, s):
    return jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(k), s))

  return jax.vmap(one)(keys_BK, step_B)


def vocab_blocks(vocab: int) -> int:
  """Number of blocks the draw splits a vocabulary into: the divisor of `vocab` nearest
  sqrt(vocab) from below (32000 -> 160 blocks of 200), so both levels of the inverse CDF
  are short. A prime vocabulary gets one block (a plain cumulative sum)."""
  for n in range(math.isqrt(vocab), 0, -1):
    if vocab % n == 0:
      return n
  return 1


def truncation_mask(scaled_BV: jax.Array, top_k_B: jax.Array,
                    top_p_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Top-k then top-p over temperature-scaled logits, in descending-probability order.

  Order follows `transformers` (temperature, then top-k, then top-p on the distribution
  renormalised after top-k). A token survives top-p when the probability mass strictly
  before it is below top_p, so the most likely token always survives.

  Args:
    scaled_BV: float32 logits already divided by the temperature.
    top_k_B: int, 0 = no top-k.
    top_p_B: float in (0, 1], 1 = no top-p.

  Returns:
    (order_BV, keep_BV): vocabulary ids sorted by descending logit (stable, so ties keep
    id order) and whether each sorted position survives.
  """
  vocab = scaled_BV.shape[-1]
  order_BV = jnp.argsort(-scaled_BV, axis=-1, stable=True)
  sorted_BV = jnp.take_along_axis(scaled_BV, order_BV, axis=-1)
  rank_V = jnp.arange(vocab, dtype=jnp.int32)
  keep_BV = (top_k_B[:, None] <= 0) | (rank_V[None, :] < top_k_B[:, None])
  probs_BV = jax.nn.softmax(jnp.where(keep_BV, sorted_BV, -jnp.inf), axis=-1)
  mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  keep_BV &= mass_before_BV < top_p_B[:, None]
  # Round-off could drop rank 0 when top_p is tiny; it must always stay.
  keep_BV |= rank_V[None, :] == 0
  return order_BV, keep_BV


def _stats(z_BV: jax.Array, max_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(block sums of exp(z - max) [B, N], log of their total [B]); -inf entries weigh 0."""
  b, v = z_BV.shape
  n = vocab_blocks(v)
  mass_BN = _settled(jnp.exp(z_BV - max_B[:, None]).reshape(b, n, v // n).sum(axis=-1))
  return mass_BN, jnp.log(mass_BN.sum(axis=-1))


def _block_max(z_BV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(each vocabulary block's max [B, N], the row's max [B]): one pass over the logits."""
  b, v = z_BV.shape
  n = vocab_blocks(v)
  block_max_BN = _settled(jnp.max(z_BV.reshape(b, n, v // n), axis=-1))
  return block_max_BN, jnp.max(block_max_BN, axis=-1)


def _settled(x: jax.Array) -> jax.Array:
  """`x` computed as it stands: XLA would otherwise fold a reduction of these per-block
  results into a second reduction over the whole vocabulary (a second pass over [B, V],
  and for the exp-sum a second exp of every logit)."""
  return jax.lax.optimization_barrier(x)


def _first(hit_BX: jax.Array) -> jax.Array:
  """Index of each row's first True (the row's length when none)."""
  size = hit_BX.shape[-1]
  return jnp.min(jnp.where(hit_BX, jax.lax.iota(jnp.int32, size)[None, :], size), axis=-1)


def _argmax(z_BV: jax.Array, block_max_BN: jax.Array, max_B: jax.Array) -> jax.Array:
  """First index of each row's maximum (jnp.argmax's answer) from the block maxima: the
  first block holding the max, then the first entry equal to it inside that block (no
  pass over the whole vocabulary)."""
  b, v = z_BV.shape
  n = block_max_BN.shape[-1]
  c = v // n
  block_B = jnp.minimum(_first(block_max_BN == max_B[:, None]), n - 1)  # a NaN row: none
  z_BC = jnp.take_along_axis(z_BV.reshape(b, n, c), block_B[:, None, None], axis=1)[:, 0]
  return block_B * c + jnp.minimum(_first(z_BC == max_B[:, None]), c - 1)


def _last_positive(w_BN: jax.Array) -> jax.Array:
  """Index of each row's last entry > 0 (0 when none)."""
  iota_N = jax.lax.iota(jnp.int32, w_BN.shape[-1])[None, :]
  return jnp.max(jnp.where(w_BN > 0, iota_N, 0), axis=-1)


def _inverse_cdf(z_BV: jax.Array, max_B: jax.Array, mass_BN: jax.Array,
                 u_B: jax.Array) -> jax.Array:
  """Index i with probability exp(z_i - max) / sum(exp(z - max)), from u ~ U[0, 1).

  Two levels: the block whose cumulative mass first exceeds u * Z, then the entry inside it
  whose cumulative weight first exceeds what is left. An entry of weight 0 (-inf, or
  underflowed) is never chosen: rounding that would run past a row's or block's end picks
  its last entry of positive weight instead.
  """
  b, v = z_BV.shape
  n = mass_BN.shape[-1]
  c = v // n
  cum_BN = jnp.cumsum(mass_BN, axis=-1)
  target_B = u_B * cum_BN[:, -1]
  block_B = jnp.sum(cum_BN <= target_B[:, None], axis=-1, dtype=jnp.int32)
  block_B = jnp.minimum(block_B, _last_positive(mass_BN))
  before_B = jnp.where(block_B > 0, jnp.take_along_axis(
      cum_BN, jnp.maximum(block_B - 1, 0)[:, None], axis=-1)[:, 0], 0.0)
  z_BC = jnp.take_along_axis(z_BV.reshape(b, n, c), block_B[:, None, None], axis=1)[:, 0]
  w_BC = jnp.exp(z_BC - max_B[:, None])
  inner_B = jnp.sum(jnp.cumsum(w_BC, axis=-1) <= (target_B - before_B)[:, None], axis=-1,
                    dtype=jnp.int32)
  inner_B = jnp.minimum(inner_B, _last_positive(w_BC))
  return block_B * c + inner_B


def _uniforms(keys_BK: jax.Array) -> jax.Array:
  """One U[0, 1) float32 per row from its key."""
  return jax.vmap(lambda k: jax.random.uniform(jax.random.wrap_key_data(k), (),
                                               jnp.float32))(keys_BK)


def _at(x_BV: jax.Array, i_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_BV, i_B[:, None].astype(jnp.int32), axis=-1)[:, 0]


def sample(logits_BV: jax.Array, keys_BK: jax.Array, temperature_B: jax.Array,
           top_k_B: jax.Array, top_p_B: jax.Array, *, truncate: bool,
           all_greedy: bool = False, forced_B: jax.Array | None = None,
           ) -> tuple[jax.Array, jax.Array]:
  """Chooses one token per row and returns (tokens_B int32, logprobs_B float32).

  Args:
    logits_BV: next-token logits (any float dtype; computed in float32 here).
    keys_BK: raw key data per row (see `step_keys`).
    temperature_B: 0 means greedy for that row.
    top_k_B: 0 = off. Only applied when `truncate`.
    top_p_B: 1 = off. Only applied when `truncate`.
    truncate: static; False skips the vocabulary sort when no row uses top-k / top-p
      (the caller decides; rows with top_k > 0 or top_p < 1 need it).
    all_greedy: static; True when every row is greedy, which skips the draw.
    forced_B: optional int32 token per row that replaces the choice where >= 0 (a forced
      phrase); it records the tempered, untruncated logprob (it may lie outside the top-k /
      top-p set, where the sampling distribution gives it -inf).
  """
  greedy_B = temperature_B <= 0
  z_BV = logits_BV.astype(jnp.float32)
  if not all_greedy:
    safe_t_B = jnp.where(greedy_B, 1.0, temperature_B).astype(jnp.float32)
    z_BV = z_BV / safe_t_B[:, None]
  # z is the row's own distribution before truncation: tempered, or the raw logits of a
  # greedy row. Its normaliser serves greedy, untruncated and forced logprobs alike.
  block_max_BN, max_B = _block_max(z_BV)
  mass_BN, log_z_B = _stats(z_BV, max_B)
  tokens_B = _argmax(z_BV, block_max_BN, max_B)
  logprobs_B = -log_z_B  # z[argmax] - max - log Z with z[argmax] == max

  if not all_greedy:
    u_B = _uniforms(keys_BK)
    if truncate:
      order_BV, keep_BV = truncation_mask(z_BV, top_k_B, top_p_B)
      kept_BV = jnp.where(keep_BV, jnp.take_along_axis(z_BV, order_BV, axis=-1), -jnp.inf)
      kept_mass_BN, kept_log_z_B = _stats(kept_BV, max_B)  # rank 0 (the max) is always kept
      pick_B = _inverse_cdf(kept_BV, max_B, kept_mass_BN, u_B)
      drawn_B = _at(order_BV, pick_B)
      drawn_lp_B = _at(kept_BV, pick_B) - max_B - kept_log_z_B
    else:
      drawn_B = _inverse_cdf(z_BV, max_B, mass_BN, u_B)
      drawn_lp_B = _at(z_BV, drawn_B) - max_B - log_z_B
    tokens_B = jnp.where(greedy_B, tokens_B, drawn_B)
    logprobs_B = jnp.where(greedy_B, logprobs_B, drawn_lp_B)

  if forced_B is not None:
    forcing_B = forced_B >= 0
    tokens_B = jnp.where(forcing_B, forced_B, tokens_B)
    forced_lp_B = _at(z_BV, jnp.maximum(forced_B, 0)) - max_B - log_z_B
    logprobs_B = jnp.where(forcing_B, forced_lp_B, logprobs_B)
  return tokens_B.astype(jnp.int32), logprobs_B


def chunk_modes(cfg, owners) -> tuple[bool, bool]:
  """Static sampling modes of a decode chunk over the live slots' requests (`owners`:
  token records or None): (truncate: some row samples from a top-k / top-p set,
  all_greedy: every row is greedy). `cfg` is the sampler config (the requests' defaults)."""
  truncate, all_greedy = False, True
  for buf in owners:
    if buf is None:
      continue
    req = buf.request
    temperature = cfg.temperature if req.temperature is None else req.temperature
    top_k = cfg.top_k if req.top_k is None else req.top_k
    top_p = cfg.top_p if req.top_p is None else req.top_p
    all_greedy &= temperature <= 0
    truncate |= temperature > 0 and (top_k > 0 or top_p < 1)
  return truncate, all_greedy
