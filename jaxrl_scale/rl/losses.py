"""Policy-gradient losses (CISPO, GRPO, DAPO, GSPO, REINFORCE), registered by name.

Batch layout: [P, G, T] = prompts x generations per prompt x completion tokens; per-sample
values are [P, G]. Micro-batches are slices along P (see `jaxrl_scale.rl.aggregation`).

Notation (paper notes section 2): rho_{i,t} = pi_train(y_{i,t}) / pi_gen(y_{i,t}), where
pi_gen is the log-probability recorded by the sampler, so the ratio also absorbs the
numerical mismatch between the generator's and the trainer's kernels. Both log-probs are
float32 (the trainer computes its own from float32 logits).

A loss is a pure function

    fn(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT, params) -> TokenLoss

returning the per-token loss to MINIMISE (the objective negated) and a 0/1 marker of
tokens whose ratio the loss clipped or truncated. `policy_loss` sanitises masked
positions, calls the loss, aggregates (`aggregation.py`) and adds diagnostics
(`diagnostics.py`). A fork adds a loss with

    @losses.register_loss("my_loss", MyParams)
    def my_loss(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT, params): ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import aggregation as aggregation_lib
from jaxrl_scale.rl import diagnostics as diagnostics_lib
from jaxrl_scale.rl import registry


class LossBatch(NamedTuple):
  """What the batcher provides to the loss besides the trainer's log-probs (a pytree).

  Attributes:
    logp_gen_PGT: float32 log-probs recorded by the sampler for the sampled tokens.
    advantages_PG: one advantage per completion (rl/advantages.py).
    mask_PGT: 1 for completion tokens that take gradient; 0 for prompt tokens, padding,
      forced-interruption tokens and a multi-turn episode's environment tokens (those
      were not sampled from pi_gen, so they have no meaningful ratio).
    weight_PG: 0 drops a completion (all G of a prompt for zero-variance filtered or
      padding prompts), 1 keeps it.
  """
  logp_gen_PGT: jax.Array
  advantages_PG: jax.Array
  mask_PGT: jax.Array
  weight_PG: jax.Array


class TokenLoss(NamedTuple):
  """Output of one loss function.

  Attributes:
    loss_PGT: per-token loss to minimise; finite everywhere (masked positions are dropped
      by the aggregation).
    clipped_PGT: 1.0 where clipping or truncation changed this token's gradient, else 0.
  """
  loss_PGT: jax.Array
  clipped_PGT: jax.Array


@dataclasses.dataclass(frozen=True)
class NoParams:
  """For losses without hyper-parameters."""


@dataclasses.dataclass(frozen=True)
class CispoParams:
  """CISPO: eps_max is an ABSOLUTE cap on rho, not 1 + eps (the paper tried 4, 5, 8: no
  difference; 5 as in TRL / SkyRL's ScaleRL settings). There is no lower clip."""
  eps_max: float = 5.0

  def __post_init__(self):
    if not self.eps_max > 0:
      raise ValueError(f"eps_max must be > 0, got {self.eps_max}")


@dataclasses.dataclass(frozen=True)
class ClipParams:
  """PPO-style clip of rho to [1 - clip_low, 1 + clip_high]; GRPO's symmetric 0.2."""
  clip_low: float = 0.2
  clip_high: float = 0.2

  def __post_init__(self):
    if not 0 <= self.clip_low < 1:
      raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
    if not self.clip_high >= 0:
      raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")


@dataclasses.dataclass(frozen=True)
class DapoParams(ClipParams):
  """DAPO's clip-higher: 0.2 / 0.28 (DAPO paper); ScaleRL's Qwen2.5 recipe used 0.26."""
  clip_low: float = 0.2
  clip_high: float = 0.28


@dataclasses.dataclass(frozen=True)
class GspoParams(ClipParams):
  """GSPO: a clip on the sequence-level ratio. The paper found the 1e-4 scale of the GSPO
  paper too tight; lower 3e-3 / upper 5e-3 worked best.

  length_norm: True uses the GSPO paper's length-normalised geometric mean
    exp(mean_t log rho_t); False uses the raw sequence ratio exp(sum_t log rho_t), as the
    ScaleRL paper writes it (with a 1e-3 clip this clips almost everything).
  """
  clip_low: float = 3e-3
  clip_high: float = 5e-3
  length_norm: bool = True


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """A registered loss.

  Attributes:
    name: the registered name.
    fn: the loss function (see the module docstring for its signature).
    params_cls: its frozen hyper-parameter dataclass; ValueError from its __post_init__
      becomes a UserError naming the key.
    config_keys: params field -> `config.RLConfig` attribute, for `params_from_config`.
  """
  name: str
  fn: Callable[..., TokenLoss]
  params_cls: type
  config_keys: Mapping[str, str]


LOSSES: registry.Registry[LossSpec] = registry.Registry("loss", "rl.loss")


def register_loss(name: str, params_cls: type = NoParams,
                  config_keys: Mapping[str, str] | None = None
                  ) -> Callable[[Callable], Callable]:
  """Decorator: registers a loss function under `name` with its frozen params dataclass.

  `config_keys` maps params fields to `RLConfig` attributes that set them (optional).
  """

  def wrap(fn: Callable[..., TokenLoss]) -> Callable[..., TokenLoss]:
    LOSSES.add(name, LossSpec(name=name, fn=fn, params_cls=params_cls,
                              config_keys=dict(config_keys or {})))
    return fn

  return wrap


def get_loss(name: str) -> LossSpec:
  """Returns the registered loss; unknown names raise UserError with suggestions."""
  return LOSSES.get(name)


def make_params(name: str, overrides: Mapping[str, Any] | None = None,
                key_prefix: str = "rl.loss_params.") -> Any:
  """Builds the loss's params from its defaults and `overrides`.

  Errors are UserErrors naming `key_prefix + field`.
  """
  spec = get_loss(name)
  overrides = dict(overrides or {})
  fields = {f.name for f in dataclasses.fields(spec.params_cls)}
  for key in overrides:
    if key not in fields:
      known = ", ".join(sorted(fields)) or "none"
      raise UserError(f"{key_prefix}{key}: not a parameter of loss {name!r} (known: {known})")
  try:
    return spec.params_cls(**overrides)
  except ValueError as e:
    field, message = _split_field(str(e), fields)
    key = key_prefix + field if field else key_prefix.rstrip(".")
    raise UserError(f"{key}: {message}") from None


def params_from_config(rl_config: Any) -> Any:
  """The params of `rl_config.loss`, set from the config attributes named in `config_keys`."""
  spec = get_loss(rl_config.loss)
  overrides = {f: getattr(rl_config, attr) for f, attr in spec.config_keys.items()}
  try:
    return spec.params_cls(**overrides)
  except ValueError as e:
    field, message = _split_field(str(e), spec.config_keys)
    key = f"rl.{spec.config_keys[field]}" if field else "rl.loss"
    raise UserError(f"{key}: {message} (loss {spec.name!r})") from None


def _split_field(message: str, fields: Any) -> tuple[str, str]:
  """('clip_low', 'must be ...') from a params ValueError 'clip_low must be ...'."""
  for field in sorted(fields, key=len, reverse=True):
    if message.startswith(field + " "):
      return field, message[len(field) + 1:]
  return "", message


def _ratio(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array) -> jax.Array:
  # The clip only guards exp() against overflow; see diagnostics.MAX_LOG_RATIO.
  m = diagnostics_lib.MAX_LOG_RATIO
  return jnp.exp(jnp.clip(logp_train_PGT - logp_gen_PGT, -m, m))


def _clipped_surrogate(rho: jax.Array, adv: jax.Array, clip_low: float,
                       clip_high: float) -> tuple[jax.Array, jax.Array]:
  """PPO's min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A), negated; and the clipped marker."""
  objective = jnp.minimum(rho * adv, jnp.clip(rho, 1.0 - clip_low, 1.0 + clip_high) * adv)
  # Exactly the tokens where min() picked the constant, so their gradient is zero.
  clipped = ((adv > 0) & (rho > 1.0 + clip_high)) | ((adv < 0) & (rho < 1.0 - clip_low))
  return -objective, clipped.astype(rho.dtype)


@register_loss("cispo", CispoParams, {"eps_max": "eps_max"})
def cispo(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array, advantages_PG: jax.Array,
          mask_PGT: jax.Array, params: CispoParams) -> TokenLoss:
  """CISPO: -sg(min(rho, eps_max)) * A * log pi_train (paper Eq. 4).

  The truncated importance weight carries no gradient, so every token keeps the plain
  policy-gradient direction, scaled by at most eps_max; unlike the PPO clip, tokens with a
  large ratio still learn.
  """
  del mask_PGT
  rho = _ratio(logp_train_PGT, logp_gen_PGT)
  weight = jax.lax.stop_gradient(jnp.minimum(rho, params.eps_max))
  loss = -weight * advantages_PG[..., None] * logp_train_PGT
  return TokenLoss(loss, (rho > params.eps_max).astype(rho.dtype))


# GRPO's clip is symmetric: config.RLConfig's clip_high is DAPO's upper bound.
@register_loss("grpo", ClipParams, {"clip_low": "clip_low", "clip_high": "clip_low"})
def grpo(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array, advantages_PG: jax.Array,
         mask_PGT: jax.Array, params: ClipParams) -> TokenLoss:
  """GRPO without KL: token-level PPO clip, symmetric 0.2 by default (paper Eq. 7)."""
  del mask_PGT
  rho = _ratio(logp_train_PGT, logp_gen_PGT)
  return TokenLoss(*_clipped_surrogate(rho, advantages_PG[..., None], params.clip_low,
                                       params.clip_high))


@register_loss("dapo", DapoParams, {"clip_low": "clip_low", "clip_high": "clip_high"})
def dapo(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array, advantages_PG: jax.Array,
         mask_PGT: jax.Array, params: DapoParams) -> TokenLoss:
  """DAPO: the PPO clip with a higher upper bound (paper Eq. 8); pair with prompt_avg."""
  return grpo(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT, params)


@register_loss("gspo", GspoParams,
               {"clip_low": "gspo_clip_low", "clip_high": "gspo_clip_high"})
def gspo(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array, advantages_PG: jax.Array,
         mask_PGT: jax.Array, params: GspoParams) -> TokenLoss:
  """GSPO: the PPO clip applied to one sequence-level ratio per completion.

  The sequence loss is written at every token of the completion, so with `sample_avg`
  (each completion's token mean) the aggregate is exactly GSPO's per-sequence objective;
  with `prompt_avg` or `token_avg` completions are weighted by their length. The gradient
  flows through the sequence ratio into every token's log-prob.
  """
  mask_PGT = mask_PGT.astype(logp_train_PGT.dtype)
  log_rho_PG = jnp.sum(mask_PGT * (logp_train_PGT - logp_gen_PGT), axis=-1)
  if params.length_norm:
    log_rho_PG = log_rho_PG / jnp.maximum(jnp.sum(mask_PGT, axis=-1), 1.0)
  m = diagnostics_lib.MAX_LOG_RATIO
  rho_PG = jnp.exp(jnp.clip(log_rho_PG, -m, m))
  loss_PG, clipped_PG = _clipped_surrogate(rho_PG, advantages_PG, params.clip_low,
                                           params.clip_high)
  shape = logp_train_PGT.shape
  return TokenLoss(jnp.broadcast_to(loss_PG[..., None], shape),
                   jnp.broadcast_to(clipped_PG[..., None], shape))


@register_loss("reinforce", NoParams)
def reinforce(logp_train_PGT: jax.Array, logp_gen_PGT: jax.Array, advantages_PG: jax.Array,
              mask_PGT: jax.Array, params: NoParams) -> TokenLoss:
  """Plain REINFORCE: -A * log pi_train, no importance weight (assumes on-policy data)."""
  del logp_gen_PGT, mask_PGT, params
  loss = -advantages_PG[..., None] * logp_train_PGT
  return TokenLoss(loss, jnp.zeros_like(loss))


def policy_loss(name: str,
                logp_train_PGT: jax.Array,
                batch: LossBatch,
                *,
                params: Any = None,
                aggregation: str = "prompt_avg",
                total_units: jax.Array | float | None = None
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The aggregated policy loss of a (micro-)batch and its diagnostics.

  Args:
    name: a registered loss ("cispo", "grpo", "dapo", "gspo", "reinforce", ...); static.
    logp_train_PGT: the trainer's log-probs of the sampled tokens (gradient flows here).
    batch: the batcher's arrays, see `LossBatch`.
    params: the loss's params dataclass; None uses its defaults.
    aggregation: a registered aggregation name; ScaleRL uses "prompt_avg".
    total_units: `aggregation.denominator(aggregation, mask, weight)` of the FULL batch
      when this call sees one micro-batch; None when it sees the full batch.

  Returns:
    (loss, diagnostics): a scalar to minimise, and a dict of scalars (see
    `diagnostics.policy_diagnostics`; combine micro-batches' with `combine_diagnostics`).
  """
  spec = get_loss(name)
  params = spec.params_cls() if params is None else params
  dtype = jnp.promote_types(logp_train_PGT.dtype, jnp.float32)
  # A token whose recorded log-prob is not finite has no ratio: -inf would read as
  # rho = exp(+inf), i.e. the maximum IS weight, and NaN would make the whole batch's loss
  # NaN (and the step skip). It is left out like a masked token; the batcher drops its
  # group before it gets here (pipeline/rollouts.py), this keeps any other caller safe.
  valid_PGT = (batch.mask_PGT > 0) & jnp.isfinite(batch.logp_gen_PGT)
  # Prompt / padding positions may hold anything (-inf, garbage); zero them with where()
  # so neither the value nor the gradient can become NaN.
  logp_train_PGT = jnp.where(valid_PGT, logp_train_PGT.astype(dtype), 0.0)
  logp_gen_PGT = jnp.where(valid_PGT,
                           jax.lax.stop_gradient(batch.logp_gen_PGT).astype(dtype), 0.0)
  advantages_PG = jax.lax.stop_gradient(batch.advantages_PG).astype(dtype)
  mask_PGT = valid_PGT.astype(dtype)
  token = spec.fn(logp_train_PGT, logp_gen_PGT, advantages_PG, mask_PGT, params)
  loss = aggregation_lib.aggregate(aggregation, token.loss_PGT, mask_PGT, batch.weight_PG,
                                   total_units)
  diag = diagnostics_lib.policy_diagnostics(logp_train_PGT, logp_gen_PGT, mask_PGT,
                                            batch.weight_PG, token.clipped_PGT)
  return loss, diag


def make_policy_loss(name: str, params: Any = None, aggregation: str = "prompt_avg"
                     ) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
  """Resolves names now (so config errors surface before tracing) and returns
  `fn(logp_train_PGT, batch, total_units=None) -> (loss, diagnostics)` for the train step."""
  spec = get_loss(name)
  aggregation_lib.get_aggregation(aggregation)
  if params is None:
    params = spec.params_cls()
  elif not isinstance(params, spec.params_cls):
    raise UserError(f"rl.loss_params: loss {name!r} takes {spec.params_cls.__name__}, "
                    f"got {type(params).__name__}")

  def fn(logp_train_PGT: jax.Array, batch: LossBatch,
         total_units: jax.Array | float | None = None):
    return policy_loss(name, logp_train_PGT, batch, params=params, aggregation=aggregation,
                       total_units=total_units)

  return fn
