"""Group-centred advantages, their normalisation, zero-variance filtering, length penalty.

Layout: rewards and advantages are [P, G] (prompts x generations); `valid_PG` marks
real completions (False for padding slots of a fixed-shape batch). A NaN reward is a
sample the verifier could not judge (timeout, error): invalid too, so it is in neither its
group's mean and std nor the batch std nor the loss, and a group left with fewer than 2
valid samples, or with equal rewards among them, has no signal (zero variance). Shapes
stay fixed. Formulas: paper notes sections 3, 6 and 7.

    A_i = r_i - mean_group(r)                      (centring, always)
    'prompt': A_i / (std_group(r) + eps)           (GRPO)
    'batch':  A_i / (std of all A in the batch + eps), over kept groups only (ScaleRL)
    'none':   A_i                                  (Dr. GRPO)

Standard deviations are population ones (ddof = 0). A normalisation is a function
registered by name, so a fork can add e.g. a leave-one-out baseline.
Everything is jittable with `normalization` and `length_penalty` static.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import registry

# (rewards_PG, valid_PG, keep_P, eps) -> advantages_PG; entries of invalid samples are ignored.
NormalizationFn = Callable[[jax.Array, jax.Array, jax.Array, float], jax.Array]

NORMALIZATIONS: registry.Registry[NormalizationFn] = registry.Registry(
    "advantage normalization", "rl.advantage_norm")


def register_normalization(name: str) -> Callable[[NormalizationFn], NormalizationFn]:
  """Decorator: registers `fn(rewards_PG, valid_PG, keep_P, eps) -> advantages_PG`."""
  return NORMALIZATIONS.decorator(name)


def get_normalization(name: str) -> NormalizationFn:
  """Returns the registered normalisation; unknown names raise UserError with suggestions."""
  return NORMALIZATIONS.get(name)


class Advantages(NamedTuple):
  """Output of `compute_advantages`.

  Attributes:
    advantages_PG: per-completion advantages, 0 for invalid or filtered completions.
    weight_PG: 1.0 for completions that enter the loss, 0.0 for filtered prompts and
      invalid slots (the `weight_PG` of `losses.LossBatch`).
    keep_P: prompts that enter the loss.
    stats: scalars for logging (see `compute_advantages`).
  """
  advantages_PG: jax.Array
  weight_PG: jax.Array
  keep_P: jax.Array
  stats: dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LengthPenalty:
  """DAPO's overlong penalty clip((max_length - |y|) / cache_length - 1, -1, 0).

  Zero up to max_length - cache_length tokens, falling linearly to -1 at max_length.
  Paper (loo-lp): max_length 14k, cache_length 2k, added to correct traces only.
  """
  max_length: int
  cache_length: int

  def __post_init__(self):
    if not self.cache_length > 0:
      raise UserError(f"rl.length_penalty_cache: must be > 0, got {self.cache_length}")
    if not self.max_length >= self.cache_length:
      raise UserError(f"rl.length_penalty_max: must be >= cache_length "
                      f"({self.cache_length}), got {self.max_length}")


def length_penalty(lengths_PG: jax.Array, config: LengthPenalty) -> jax.Array:
  """The DAPO penalty (in [-1, 0]) for completions of the given lengths."""
  lengths_PG = jnp.asarray(lengths_PG, jnp.float32)
  return jnp.clip((config.max_length - lengths_PG) / config.cache_length - 1.0, -1.0, 0.0)


def _count(valid_PG: jax.Array) -> jax.Array:
  return jnp.sum(valid_PG, axis=-1).astype(jnp.float32)


def group_mean(rewards_PG: jax.Array, valid_PG: jax.Array) -> jax.Array:
  """Mean reward of each prompt's valid completions ([P]; 0 for an empty group)."""
  total_P = jnp.sum(jnp.where(valid_PG, rewards_PG, 0.0), axis=-1)
  return total_P / jnp.maximum(_count(valid_PG), 1.0)


def centred(rewards_PG: jax.Array, valid_PG: jax.Array) -> jax.Array:
  """r_i - mean_group(r), 0 at invalid slots."""
  return jnp.where(valid_PG, rewards_PG - group_mean(rewards_PG, valid_PG)[:, None], 0.0)


def group_std(rewards_PG: jax.Array, valid_PG: jax.Array) -> jax.Array:
  """Population std of each prompt's valid rewards ([P])."""
  dev_PG = centred(rewards_PG, valid_PG)
  return jnp.sqrt(jnp.sum(dev_PG**2, axis=-1) / jnp.maximum(_count(valid_PG), 1.0))


def zero_variance(rewards_PG: jax.Array, valid_PG: jax.Array) -> jax.Array:
  """Prompts whose valid rewards are all equal (or that have fewer than 2): no signal ([P])."""
  hi_P = jnp.max(jnp.where(valid_PG, rewards_PG, -jnp.inf), axis=-1)
  lo_P = jnp.min(jnp.where(valid_PG, rewards_PG, jnp.inf), axis=-1)
  # Exact equality on purpose: verifier rewards are discrete, and any spread, even a tiny
  # length-penalty one, is a real learning signal.
  return (_count(valid_PG) < 2) | (hi_P == lo_P)


@register_normalization("none")
def no_normalization(rewards_PG: jax.Array, valid_PG: jax.Array, keep_P: jax.Array,
                     eps: float) -> jax.Array:
  """Centred rewards only (Dr. GRPO)."""
  del keep_P, eps
  return centred(rewards_PG, valid_PG)


@register_normalization("prompt")
def prompt_normalization(rewards_PG: jax.Array, valid_PG: jax.Array, keep_P: jax.Array,
                         eps: float) -> jax.Array:
  """Centred rewards / (the group's std + eps) (GRPO)."""
  del keep_P
  return centred(rewards_PG, valid_PG) / (group_std(rewards_PG, valid_PG) + eps)[:, None]


@register_normalization("batch")
def batch_normalization(rewards_PG: jax.Array, valid_PG: jax.Array, keep_P: jax.Array,
                        eps: float) -> jax.Array:
  """Centred rewards / (std of all centred rewards of the kept groups + eps) (ScaleRL).

  Filtered groups are left out of the std: their zeros would shrink it and inflate every
  advantage by a factor that depends on how many prompts happened to be solved.
  """
  adv_PG = centred(rewards_PG, valid_PG)
  in_batch_PG = valid_PG & keep_P[:, None]
  n = jnp.maximum(jnp.sum(in_batch_PG).astype(adv_PG.dtype), 1.0)
  mean = jnp.sum(jnp.where(in_batch_PG, adv_PG, 0.0)) / n
  var = jnp.sum(jnp.where(in_batch_PG, (adv_PG - mean)**2, 0.0)) / n
  return adv_PG / (jnp.sqrt(var) + eps)


def compute_advantages(rewards_PG: jax.Array,
                       *,
                       normalization: str = "batch",
                       valid_PG: jax.Array | None = None,
                       filter_zero_variance: bool = True,
                       eps: float = 1e-6,
                       lengths_PG: jax.Array | None = None,
                       penalty: LengthPenalty | None = None,
                       correct_PG: jax.Array | None = None) -> Advantages:
  """Advantages, loss weights and logging counts for one batch of groups.

  Args:
    rewards_PG: verifier rewards (ScaleRL: +1 correct, -1 wrong); NaN for a sample without
      a verdict (invalid, see the module docstring).
    normalization: a registered normalisation: "batch" (ScaleRL), "prompt", "none".
    valid_PG: real completions; None means all.
    filter_zero_variance: drop prompts whose rewards are all equal from the loss (weight
      0). Without it they stay in the loss with zero advantage, diluting the average.
    eps: added to the std before dividing.
    lengths_PG: completion lengths in tokens; needed with `penalty`.
    penalty: DAPO length penalty, added to the rewards of correct completions before
      centring, so it also decides which groups have zero variance.
    correct_PG: which completions are correct; None means rewards_PG > 0.

  Returns:
    `Advantages`; stats holds num_invalid (NaN rewards in real slots), num_prompts (with
    any valid completion), num_zero_variance,
    num_kept, frac_zero_variance, num_all_correct / num_all_wrong (among those prompts),
    reward_mean (before the penalty), length_penalty_mean, advantage_abs_mean (kept).
  """
  normalize = get_normalization(normalization)
  rewards_PG = jnp.asarray(rewards_PG, jnp.float32)
  valid_PG = (jnp.ones(rewards_PG.shape, bool) if valid_PG is None
              else jnp.asarray(valid_PG).astype(bool))
  judged_PG = jnp.isfinite(rewards_PG)
  num_invalid = jnp.sum(valid_PG & ~judged_PG).astype(jnp.float32)
  valid_PG = valid_PG & judged_PG
  # where() keeps NaN out of every sum below, and out of their gradients.
  rewards_PG = jnp.where(valid_PG, rewards_PG, 0.0)
  correct_PG = rewards_PG > 0 if correct_PG is None else jnp.asarray(correct_PG).astype(bool)
  n_valid = jnp.maximum(jnp.sum(valid_PG), 1).astype(jnp.float32)
  reward_mean = jnp.sum(jnp.where(valid_PG, rewards_PG, 0.0)) / n_valid

  penalty_PG = jnp.zeros_like(rewards_PG)
  if penalty is not None:
    if lengths_PG is None:
      raise ValueError("compute_advantages: a length penalty needs lengths_PG")
    penalty_PG = jnp.where(valid_PG & correct_PG, length_penalty(lengths_PG, penalty), 0.0)
  rewards_PG = rewards_PG + penalty_PG

  present_P = jnp.any(valid_PG, axis=-1)
  zero_var_P = zero_variance(rewards_PG, valid_PG) & present_P
  keep_P = present_P & ~zero_var_P if filter_zero_variance else present_P
  weight_PG = (valid_PG & keep_P[:, None]).astype(jnp.float32)
  advantages_PG = normalize(rewards_PG, valid_PG, keep_P, eps) * weight_PG

  n_prompts = jnp.sum(present_P).astype(jnp.float32)
  n_zero_var = jnp.sum(zero_var_P).astype(jnp.float32)
  all_correct_P = jnp.all(correct_PG | ~valid_PG, axis=-1) & present_P
  all_wrong_P = jnp.all(~correct_PG | ~valid_PG, axis=-1) & present_P
  stats = {
      "num_invalid": num_invalid,
      "num_prompts": n_prompts,
      "num_zero_variance": n_zero_var,
      "num_kept": jnp.sum(keep_P).astype(jnp.float32),
      "frac_zero_variance": n_zero_var / jnp.maximum(n_prompts, 1.0),
      "num_all_correct": jnp.sum(all_correct_P).astype(jnp.float32),
      "num_all_wrong": jnp.sum(all_wrong_P).astype(jnp.float32),
      "reward_mean": reward_mean,
      "length_penalty_mean": jnp.sum(penalty_PG) / n_valid,
      "advantage_abs_mean": (jnp.sum(jnp.abs(advantages_PG)) /
                             jnp.maximum(jnp.sum(weight_PG), 1.0)),
  }
  return Advantages(advantages_PG, weight_PG, keep_P, stats)
