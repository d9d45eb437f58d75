"""How per-token losses become one scalar: sample, prompt (ScaleRL) or token average.

Batch layout: every array is [P, G, T] (prompts x generations x completion tokens) or
[P, G]; a micro-batch is a slice along P, so a prompt's G completions never straddle two
micro-batches.

Every aggregation here is a weighted sum divided by a count of units:

    loss = sum_{p,g,t} coef_{p,g,t} * loss_{p,g,t} / N

where `coef` depends only on the prompt's own group (so a micro-batch computes it
locally) and N counts the units (tokens, samples or prompts) of the FULL batch. The train
step computes N once with `denominator()` on the full batch and passes it to every
micro-batch; the micro-batch losses then sum exactly to the full-batch loss
(paper notes section 3: sample / prompt / token average).

Weights (`weight_PG`) are normally 0 or 1: 0 drops a sample or a whole prompt (zero-variance
filtered, padding) from both the sum and the count. Fractional weights act as relative
weights inside each unit's average.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl_scale.rl import registry

# (mask_PGT, weight_PG) -> (coef_PGT, count): count is this batch's number of units.
AggregationFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]

AGGREGATIONS: registry.Registry[AggregationFn] = registry.Registry("aggregation", "rl.aggregation")


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
  """Decorator: registers `fn(mask_PGT, weight_PG) -> (coef_PGT, count)` under `name`.

  `coef` must depend on a prompt's own [G, T] slice only, so that micro-batches along P
  compose exactly; `count` must be additive over prompts.
  """
  return AGGREGATIONS.decorator(name)


def get_aggregation(name: str) -> AggregationFn:
  """Returns the registered aggregation; unknown names raise UserError with suggestions."""
  return AGGREGATIONS.get(name)


def _float(x: jax.Array) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _safe_reciprocal(x: jax.Array) -> jax.Array:
  # where() on the input (not only the output) keeps the unused branch free of inf, whose
  # gradient would otherwise turn into NaN.
  return jnp.where(x > 0, 1.0 / jnp.where(x > 0, x, 1.0), 0.0)


@register_aggregation("token_avg")
def token_avg(mask_PGT: jax.Array, weight_PG: jax.Array) -> tuple[jax.Array, jax.Array]:
  """All tokens of the batch count equally: sum(w m l) / sum(w m)."""
  coef_PGT = _float(mask_PGT) * _float(weight_PG)[..., None]
  return coef_PGT, jnp.sum(coef_PGT)


@register_aggregation("sample_avg")
def sample_avg(mask_PGT: jax.Array, weight_PG: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each completion counts equally (GRPO): mean over samples of the sample's token mean."""
  mask_PGT = _float(mask_PGT)
  weight_PG = _float(weight_PG)
  length_PG = jnp.sum(mask_PGT, axis=-1)
  coef_PGT = mask_PGT * (weight_PG * _safe_reciprocal(length_PG))[..., None]
  # Empty completions (padding slots) have nothing to average and are not counted.
  count = jnp.sum(jnp.where(length_PG > 0, weight_PG, 0.0))
  return coef_PGT, count


@register_aggregation("prompt_avg")
def prompt_avg(mask_PGT: jax.Array, weight_PG: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each prompt counts equally (ScaleRL, DAPO): per prompt sum over its tokens / its token
  count, then the mean over prompts."""
  mask_PGT = _float(mask_PGT)
  weight_PG = _float(weight_PG)
  tokens_P = jnp.sum(weight_PG * jnp.sum(mask_PGT, axis=-1), axis=-1)
  coef_PGT = mask_PGT * (weight_PG * _safe_reciprocal(tokens_P)[:, None])[..., None]
  count = jnp.sum((tokens_P > 0).astype(coef_PGT.dtype))
  return coef_PGT, count


def denominator(name: str, mask_PGT: jax.Array, weight_PG: jax.Array) -> jax.Array:
  """The number of units (tokens / samples / prompts) that `name` averages over.

  Call it on the full batch and pass the result to `aggregate` for each micro-batch.
  """
  _, count = get_aggregation(name)(mask_PGT, weight_PG)
  return count


def aggregate(name: str,
              loss_PGT: jax.Array,
              mask_PGT: jax.Array,
              weight_PG: jax.Array,
              total_units: jax.Array | float | None = None) -> jax.Array:
  """Reduces per-token losses to a scalar with the aggregation `name`.

  Args:
    name: a registered aggregation ("sample_avg", "prompt_avg", "token_avg", ...).
    loss_PGT: per-token loss; values at masked positions are ignored (must be finite).
    mask_PGT: 1 for completion tokens that take gradient, 0 for prompt, padding,
      forced-interruption and environment tokens (so those count in no average).
    weight_PG: per-sample weight, 0 to drop a sample (or all G to drop a prompt).
    total_units: the full batch's `denominator(name, ...)`; None uses this batch's own
      count (correct when this batch is the full batch).

  Returns:
    The aggregated loss; 0 when there are no units.
  """
  coef_PGT, count = get_aggregation(name)(mask_PGT, weight_PG)
  units = count if total_units is None else jnp.asarray(total_units, coef_PGT.dtype)
  return jnp.sum(coef_PGT * loss_PGT) * _safe_reciprocal(units)
