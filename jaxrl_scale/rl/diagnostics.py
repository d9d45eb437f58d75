"""Scalars logged with the policy loss: trainer-vs-generator mismatch, ratio quantiles, clipping.

The mismatch between the trainer's and the generator's log-probabilities of the same
tokens is what the FP32 LM head fixes (paper notes section 5); these numbers show it.
Everything is jittable and takes the [P, G, T] layout of `jaxrl_scale.rl.losses`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

# ratio_pXX keys logged by `policy_diagnostics`, with their quantile levels.
RATIO_QUANTILES = {"ratio_p01": 0.01, "ratio_p50": 0.5, "ratio_p99": 0.99}

# Bound on |log pi_train - log pi_gen| before exp(): e^20 ~ 5e8 is far past any clip, and
# a larger value would overflow float32 once multiplied by an advantage.
MAX_LOG_RATIO = 20.0


def masked_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
  """Mean of `x` over `valid` entries; 0 when none are valid."""
  n = jnp.sum(valid)
  return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(n, 1).astype(x.dtype)


def masked_quantiles(x: jax.Array, valid: jax.Array, qs: Sequence[float]) -> jax.Array:
  """Quantiles of the `valid` entries of `x`, linear interpolation (NumPy's default).

  Args:
    x: values, any shape.
    valid: boolean, same shape as `x`.
    qs: quantile levels in [0, 1] (static).

  Returns:
    [len(qs)] array; zeros when no entry is valid.
  """
  flat = jnp.where(valid, x, jnp.inf).reshape(-1)
  sorted_x = jnp.sort(flat)  # invalid entries (inf) sort to the end
  n = jnp.sum(valid.astype(jnp.int32))
  last = jnp.maximum(n - 1, 0)
  pos = jnp.asarray(qs, x.dtype) * last.astype(x.dtype)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, last)
  frac = pos - lo.astype(x.dtype)
  out = sorted_x[lo] * (1.0 - frac) + sorted_x[hi] * frac
  return jnp.where(n > 0, out, 0.0)


def policy_diagnostics(logp_train_PGT: jax.Array,
                       logp_gen_PGT: jax.Array,
                       mask_PGT: jax.Array,
                       weight_PG: jax.Array,
                       clipped_PGT: jax.Array) -> dict[str, jax.Array]:
  """Diagnostics of one (micro-)batch, with no gradient.

  Mismatch and ratio statistics cover every completion token (mask > 0), zero-variance
  filtered prompts included, because the mismatch is a property of the two numerical
  paths and not of the advantages. `clipped_frac` covers the tokens that enter the loss
  (mask > 0 and weight > 0).

  Returns:
    num_tokens, num_loss_tokens: token counts the averages below are over.
    logp_abs_diff: mean |log pi_train - log pi_gen|.
    kl_k3: k3 estimate of KL(pi_gen || pi_train), mean of rho - 1 - log rho (Schulman's k3;
      nonnegative, unbiased for samples drawn from pi_gen).
    ratio_p01, ratio_p50, ratio_p99, ratio_min, ratio_max: of rho = pi_train / pi_gen.
    clipped_frac: fraction of loss tokens whose ratio was clipped or truncated by the loss.
    entropy_proxy: mean -log pi_train of the sampled tokens (an entropy estimate when the
      samples are on-policy; cheap, needs no full-vocabulary pass).
  """
  logp_train_PGT = jax.lax.stop_gradient(logp_train_PGT)
  logp_gen_PGT = jax.lax.stop_gradient(logp_gen_PGT)
  valid_PGT = mask_PGT > 0
  loss_valid_PGT = valid_PGT & (weight_PG > 0)[..., None]
  diff_PGT = jnp.where(valid_PGT, logp_train_PGT - logp_gen_PGT, 0.0)
  log_rho_PGT = jnp.clip(diff_PGT, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  rho_PGT = jnp.exp(log_rho_PGT)
  any_valid = jnp.any(valid_PGT)
  quantiles = masked_quantiles(rho_PGT, valid_PGT, list(RATIO_QUANTILES.values()))
  out = {
      "num_tokens": jnp.sum(valid_PGT).astype(rho_PGT.dtype),
      "num_loss_tokens": jnp.sum(loss_valid_PGT).astype(rho_PGT.dtype),
      "logp_abs_diff": masked_mean(jnp.abs(diff_PGT), valid_PGT),
      "kl_k3": masked_mean(rho_PGT - 1.0 - log_rho_PGT, valid_PGT),
      "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(valid_PGT, rho_PGT, jnp.inf)), 0.0),
      "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(valid_PGT, rho_PGT, -jnp.inf)), 0.0),
      "clipped_frac": masked_mean(clipped_PGT.astype(rho_PGT.dtype), loss_valid_PGT),
      "entropy_proxy": masked_mean(-logp_train_PGT, valid_PGT),
  }
  for i, key in enumerate(RATIO_QUANTILES):
    out[key] = quantiles[i]
  return out


def combine_diagnostics(stacked: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Combines per-micro-batch diagnostics (each value [M], one per micro-batch).

  Counts add up, min/max combine exactly, `clipped_frac` is weighted by
  `num_loss_tokens` and every other key by `num_tokens`, which is exact for the means and
  an approximation for the quantiles (the exact ones would need all tokens at once).
  """
  n_M = stacked["num_tokens"]
  n_loss_M = stacked["num_loss_tokens"]

  def weighted(v_M: jax.Array, w_M: jax.Array) -> jax.Array:
    return jnp.sum(v_M * w_M) / jnp.maximum(jnp.sum(w_M), 1.0)

  # Micro-batches without tokens report 0 for min/max; leave them out.
  has_M = n_M > 0
  any_tokens = jnp.any(has_M)
  out = {}
  for key, v_M in stacked.items():
    if key.startswith("num_"):
      out[key] = jnp.sum(v_M)
    elif key.endswith("_max"):
      out[key] = jnp.where(any_tokens, jnp.max(jnp.where(has_M, v_M, -jnp.inf)), 0.0)
    elif key.endswith("_min"):
      out[key] = jnp.where(any_tokens, jnp.min(jnp.where(has_M, v_M, jnp.inf)), 0.0)
    elif key == "clipped_frac":
      out[key] = weighted(v_M, n_loss_M)
    else:
      out[key] = weighted(v_M, n_M)
  return out
