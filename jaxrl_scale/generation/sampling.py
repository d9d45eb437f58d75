"""Next-token choice: greedy, temperature, top-k and top-p, with the chosen token's logprob.

The logprob is the log-probability of the chosen token under the distribution it was drawn
from, in float32: temperature-scaled, restricted to the top-k / top-p set and renormalised.
CISPO's importance ratio divides the trainer's probability by exactly this number, so it must
describe the real sampling distribution (ScaleRL, FP32 logits: paper sec. 3.2).

Greedy rows (temperature 0) record the model's own log-softmax at temperature 1 without
truncation: the argmax distribution is degenerate (logprob 0) and says nothing about the
policy, while the untempered logprob is what a trainer compares against.

Randomness is per row: each row brings its own key (raw key data, so it can live in jitted
carry and be scattered into slot state), which the caller derives from the sequence's seed
and the index of the token being generated. A row's draw therefore never depends on which
slot it sits in or what the other rows do, and a run is reproducible from its seeds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def step_keys(keys_BK: jax.Array, step_B: jax.Array) -> jax.Array:
  """The key of each row's `step_B`-th generated token, as raw key data."""

  def one(k, s):
    return jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(k), s))

  return jax.vmap(one)(keys_BK, step_B)


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


def sample(logits_BV: jax.Array, keys_BK: jax.Array, temperature_B: jax.Array,
           top_k_B: jax.Array, top_p_B: jax.Array, *, truncate: bool,
           all_greedy: bool = False) -> tuple[jax.Array, jax.Array]:
  """Chooses one token per row and returns (tokens_B int32, logprobs_B float32).

  Args:
    logits_BV: next-token logits (any float dtype; computed in float32 here).
    keys_BK: raw key data per row (see `step_keys`).
    temperature_B: 0 means greedy for that row.
    top_k_B: 0 = off. Only applied when `truncate`.
    top_p_B: 1 = off. Only applied when `truncate`.
    truncate: static; False skips the vocabulary sort when no row uses top-k / top-p
      (the caller decides; rows with top_k > 0 or top_p < 1 need it).
    all_greedy: static; True when every row is greedy, which skips drawing noise.
  """
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_tok_B = jnp.argmax(logits_BV, axis=-1)
  greedy_lp_B = jnp.take_along_axis(jax.nn.log_softmax(logits_BV, axis=-1),
                                    greedy_tok_B[:, None], axis=-1)[:, 0]
  if all_greedy:
    return greedy_tok_B.astype(jnp.int32), greedy_lp_B
  greedy_B = temperature_B <= 0
  safe_t_B = jnp.where(greedy_B, 1.0, temperature_B).astype(jnp.float32)
  scaled_BV = logits_BV / safe_t_B[:, None]

  def draw(k, row_V):
    return jax.random.categorical(jax.random.wrap_key_data(k), row_V)

  if truncate:
    order_BV, keep_BV = truncation_mask(scaled_BV, top_k_B, top_p_B)
    sorted_BV = jnp.take_along_axis(scaled_BV, order_BV, axis=-1)
    masked_BV = jnp.where(keep_BV, sorted_BV, -jnp.inf)
    pick_B = jax.vmap(draw)(keys_BK, masked_BV)
    sampled_B = jnp.take_along_axis(order_BV, pick_B[:, None], axis=-1)[:, 0]
    sampled_lp_B = jnp.take_along_axis(jax.nn.log_softmax(masked_BV, axis=-1), pick_B[:, None],
                                       axis=-1)[:, 0]
  else:
    sampled_B = jax.vmap(draw)(keys_BK, scaled_BV)
    sampled_lp_B = jnp.take_along_axis(jax.nn.log_softmax(scaled_BV, axis=-1),
                                       sampled_B[:, None], axis=-1)[:, 0]

  tokens_B = jnp.where(greedy_B, greedy_tok_B, sampled_B).astype(jnp.int32)
  logprobs_B = jnp.where(greedy_B, greedy_lp_B, sampled_lp_B)
  return tokens_B, logprobs_B


def forced_logprobs(logits_BV: jax.Array, tokens_B: jax.Array,
                    temperature_B: jax.Array) -> jax.Array:
  """Logprob of given (forced) tokens under the tempered distribution, without truncation.

  A forced token may lie outside the top-k / top-p set, where the sampling distribution
  gives it -inf. The loss excludes forced tokens, so a finite, informative value (the
  tempered model probability) is recorded instead of an -inf that could poison sums.
  """
  logits_BV = logits_BV.astype(jnp.float32)
  safe_t_B = jnp.where(temperature_B <= 0, 1.0, temperature_B).astype(jnp.float32)
  lp_BV = jax.nn.log_softmax(logits_BV / safe_t_B[:, None], axis=-1)
  return jnp.take_along_axis(lp_BV, tokens_B[:, None].astype(jnp.int32), axis=-1)[:, 0]
