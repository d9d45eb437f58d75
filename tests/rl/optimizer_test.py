import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from jaxrl_scale import config
from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import optimizer
from jaxrl_scale.rl import sft


def test_warmup_then_constant():
  schedule = optimizer.warmup_constant_schedule(1e-3, 4)
  got = [float(schedule(i)) for i in range(7)]
  np.testing.assert_allclose(got, [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3, 1e-3], rtol=1e-6)
  assert float(optimizer.warmup_constant_schedule(2e-3, 0)(0)) == pytest.approx(2e-3)


def test_warmup_then_cosine_by_hand():
  # lr 1e-3, 4 warmup updates, cosine over 4 more to 0.1 x lr: the rate of update n is
  # 1e-4 + 9e-4 * (1 + cos(pi * (n - 3) / 4)) / 2 from update 3 on.
  schedule = optimizer.warmup_cosine_schedule(1e-3, 4, 4, 0.1)
  got = [float(schedule(i)) for i in range(10)]
  c = [1e-4 + 9e-4 * (1 + np.cos(np.pi * t / 4)) / 2 for t in range(5)]
  np.testing.assert_allclose(got, [2.5e-4, 5e-4, 7.5e-4] + c + [1e-4, 1e-4], rtol=1e-5)
  no_warmup = optimizer.warmup_cosine_schedule(1e-3, 0, 4, 0.0)
  np.testing.assert_allclose([float(no_warmup(i)) for i in range(5)],
                             [5e-4 * (1 + np.cos(np.pi * t / 4)) for t in range(1, 6)][:4] + [0.0],
                             rtol=1e-5, atol=1e-12)


def test_make_optimizer_picks_the_schedule_and_sft_keeps_constant():
  cfg = config.OptimConfig(lr=1e-3, warmup_steps=2, schedule="cosine", decay_steps=10,
                           min_lr_ratio=0.5)
  _, schedule = optimizer.make_optimizer(cfg)
  assert float(schedule(1)) == pytest.approx(1e-3)
  assert float(schedule(50)) == pytest.approx(5e-4)
  sft_cfg = sft.optim_config(cfg, config.SFTConfig(steps=10, lr=3e-3))
  _, sft_schedule = optimizer.make_optimizer(sft_cfg)
  assert float(sft_schedule(50)) == pytest.approx(3e-3)


def _numpy_adamw(grads, params, lr_t, b1, b2, eps, wd, clip):
  """Reference AdamW (decoupled decay, bias-corrected), with global-norm clipping."""
  mu = {k: np.zeros_like(v) for k, v in params.items()}
  nu = {k: np.zeros_like(v) for k, v in params.items()}
  params = {k: v.copy() for k, v in params.items()}
  for t, g in enumerate(grads, start=1):
    norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))
    scale = min(1.0, clip / norm) if clip is not None else 1.0
    for k in params:
      gk = g[k] * scale
      mu[k] = b1 * mu[k] + (1 - b1) * gk
      nu[k] = b2 * nu[k] + (1 - b2) * gk * gk
      mhat, vhat = mu[k] / (1 - b1 ** t), nu[k] / (1 - b2 ** t)
      update = mhat / (np.sqrt(vhat) + eps)
      if params[k].ndim >= 2:  # decay on matrices only
        update = update + wd * params[k]
      params[k] = params[k] - lr_t(t - 1) * update
  return params


@pytest.mark.parametrize("clip", [None, 1.0])
def test_matches_reference_adamw(clip):
  cfg = config.OptimConfig(lr=1e-2, warmup_steps=2, weight_decay=0.1, eps=1e-15,
                           max_grad_norm=clip)
  tx, schedule = optimizer.make_optimizer(cfg)
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(4,)).astype(np.float32)}
  # Norms 10 then 0.1: clipping changes the first gradient only.
  grads = []
  for norm in (10.0, 0.1, 1.0):
    g = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
    total = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    grads.append({k: v * norm / total for k, v in g.items()})
  p = jax.tree.map(jnp.asarray, params)
  state = tx.init(p)
  for g in grads:
    updates, state = tx.update(jax.tree.map(jnp.asarray, g), state, p)
    p = optax.apply_updates(p, updates)
  want = _numpy_adamw(grads, params, lambda t: float(schedule(t)), cfg.b1, cfg.b2, cfg.eps,
                      cfg.weight_decay, clip)
  for k in params:
    np.testing.assert_allclose(np.asarray(p[k]), want[k], rtol=1e-5, atol=1e-6)


def test_tiny_eps_keeps_tiny_gradients_moving():
  # With eps = 1e-8 a 1e-10 gradient barely moves the weight (eps acts as a clip); the
  # paper's 1e-15 gives a full-size first Adam step.
  params = {"w": jnp.ones((2, 2))}
  grads = {"w": jnp.full((2, 2), 1e-10)}
  moved = {}
  for eps in (1e-15, 1e-8):
    tx, _ = optimizer.make_optimizer(config.OptimConfig(lr=1.0, warmup_steps=0, eps=eps,
                                                        weight_decay=0.0))
    updates, _ = tx.update(grads, tx.init(params), params)
    moved[eps] = float(jnp.abs(updates["w"]).max())
  assert moved[1e-15] == pytest.approx(1.0, rel=1e-4)
  assert moved[1e-8] < 0.02


def test_decay_mask_spares_vectors():
  mask = optimizer.decay_mask({"w": jnp.ones((2, 3)), "scale": jnp.ones((3,))})
  assert mask == {"w": True, "scale": False}


def test_state_shardings_follow_params():
  mesh = jax.make_mesh((4, 2), mesh_lib.TRAINER_AXES, axis_types=(AxisType.Auto,) * 2)
  shardings = {"w": NamedSharding(mesh, PartitionSpec("fsdp", "tp")),
               "b": NamedSharding(mesh, PartitionSpec())}
  params = jax.device_put({"w": jnp.ones((8, 4)), "b": jnp.ones((4,))}, shardings)
  tx, _ = optimizer.make_optimizer(config.OptimConfig(max_grad_norm=1.0))
  opt_shardings = optimizer.state_shardings(tx, params, shardings, mesh)
  state = optimizer.init_sharded(tx, params, opt_shardings)
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  (adam,) = [s for s in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(s)]
  assert adam.mu["w"].sharding.spec == PartitionSpec("fsdp", "tp")
  assert adam.nu["w"].sharding.spec == PartitionSpec("fsdp", "tp")
  assert adam.count.sharding.spec == PartitionSpec()
  jax.tree.map(lambda s, x: (s.spec == x.sharding.spec) or pytest.fail(f"{s} vs {x.sharding}"),
               opt_shardings, state)


def test_config_validation():
  with pytest.raises(UserError, match="optim.max_grad_norm"):
    config.OptimConfig(max_grad_norm=0.0)
  with pytest.raises(UserError, match="optim.decay_steps"):
    config.OptimConfig(schedule="cosine")
  with pytest.raises(UserError, match="optim.min_lr_ratio"):
    config.OptimConfig(schedule="cosine", decay_steps=5, min_lr_ratio=1.5)
  with pytest.raises(UserError, match="optim.schedule"):
    config.OptimConfig(schedule="linear")
  with pytest.raises(UserError, match="sft.micro_batch_size"):
    config.SFTConfig(batch_size=32, micro_batch_size=5)
  cfg = dataclasses.replace(config.SFTConfig(), lr=3e-3)
  assert cfg.lr == 3e-3
