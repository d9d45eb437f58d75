"""AdamW with linear warmup then a constant rate (or a cosine decay), optional global-norm
clipping.

Paper setup (notes section 7): lr 5e-7 constant after 100 linear warmup steps, AdamW with
eps 1e-15 and weight decay 0.01. The tiny eps matters: with the usual 1e-8, an update
divides by sqrt(nu) + eps and eps dominates once gradients are ~1e-8, which silently shrinks
the update like an implicit gradient clip (Wortsman et al. 2023).

The optimizer state is laid out like the parameters: `state_shardings` maps the parameter
shardings onto every parameter-shaped subtree of the optax state, so `init` can run under
jit straight into the sharded layout (no unsharded copy of Adam's moments ever exists).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.config import OptimConfig


def warmup_constant_schedule(lr: float, warmup_steps: int) -> optax.Schedule:
  """lr * min(1, (count + 1) / warmup_steps): the first update already moves (lr /
  warmup_steps, not 0) and update number `warmup_steps` runs at the full rate."""
  if warmup_steps <= 0:
    return optax.constant_schedule(lr)

  def schedule(count: jax.Array) -> jax.Array:
    frac = (jnp.asarray(count, jnp.float32) + 1.0) / float(warmup_steps)
    return lr * jnp.minimum(frac, 1.0)

  return schedule


def warmup_cosine_schedule(lr: float, warmup_steps: int, decay_steps: int,
                           min_lr_ratio: float) -> optax.Schedule:
  """The warmup of `warmup_constant_schedule` (full rate at update `warmup_steps - 1`), then
  optax's cosine decay from lr to lr * min_lr_ratio over the next `decay_steps` updates."""
  cosine = optax.cosine_decay_schedule(lr, decay_steps, alpha=min_lr_ratio)
  if warmup_steps <= 0:
    return lambda count: cosine(count + 1)
  return optax.join_schedules([warmup_constant_schedule(lr, warmup_steps), cosine],
                              boundaries=[warmup_steps - 1])


def decay_mask(params):
  """Weight decay on matrices only (embeddings, projections); never on norm scales or
  biases, whose decay toward 0 changes the function instead of regularising it."""
  return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(cfg: OptimConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Builds the optax transformation and its learning-rate schedule.

  The SFT warm start reuses this with `dataclasses.replace(cfg, lr=..., ...)`.

  Returns:
    (transformation, schedule): schedule(count) is the rate of update number `count`.
  """
  if cfg.schedule == "cosine":
    schedule = warmup_cosine_schedule(cfg.lr, cfg.warmup_steps, cfg.decay_steps, cfg.min_lr_ratio)
  else:
    schedule = warmup_constant_schedule(cfg.lr, cfg.warmup_steps)
  parts = []
  if cfg.max_grad_norm is not None:
    parts.append(optax.clip_by_global_norm(cfg.max_grad_norm))
  parts.append(
      # mu_dtype: the first moment is float32 whatever the parameters are (optax would
      # otherwise create it in the params' dtype and return it float32 after an update).
      optax.adamw(learning_rate=schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                  weight_decay=cfg.weight_decay, mask=decay_mask, mu_dtype=jnp.float32))
  return optax.chain(*parts), schedule


def state_shardings(tx: optax.GradientTransformation, abstract_params, param_shardings,
                    mesh: Mesh):
  """Shardings for `tx`'s state: parameter-shaped subtrees (Adam's mu and nu) copy
  `param_shardings`; everything else (step counts) is replicated.

  Args:
    tx: the optimizer.
    abstract_params: the parameters or their `jax.eval_shape` structs.
    param_shardings: a tree like the parameters holding `NamedSharding`s.
    mesh: the trainer mesh.
  """
  abstract_state = jax.eval_shape(tx.init, abstract_params)
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_state, param_shardings,
      transform_non_params=lambda _: replicated)


def init_sharded(tx: optax.GradientTransformation, params, opt_shardings):
  """Runs `tx.init` under jit so the state is created directly in `opt_shardings`."""
  return jax.jit(tx.init, out_shardings=opt_shardings)(params)
