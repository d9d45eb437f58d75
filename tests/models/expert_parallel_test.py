"""Expert parallelism: an MoE layer's experts split over an 'expert' mesh axis compute what
one device computes (outputs and gradients, float32), however the router spreads the tokens:
the dispatch stays dropless when every token picks the experts of one shard."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from jaxrl_scale import config as config_lib
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config, moe, sharding
from jaxrl_scale.parallel import mesh as mesh_lib

# 8 experts of which 2 per token; F = 8 splits over tp = 2, D = 16 over fsdp x expert.
CFG = config.ModelConfig(family="qwen3_moe", vocab_size=64, hidden_size=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32,
                         qk_norm=True, num_experts=8, experts_per_token=2,
                         moe_intermediate_size=8, norm_topk_prob=True)
B, T = 8, 3  # 8 rows: one per device when rows split over fsdp x expert


def _block():
  """The block with O(0.3) weights (the 0.02 init makes every expert's output ~1e-6)."""
  block = moe.MoE(CFG, rngs=nnx.Rngs(1))
  rng = np.random.default_rng(1)
  for _, v in nnx.to_flat_state(nnx.state(block, nnx.Param)):
    x = v.get_value()
    v.set_value(jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype))
  return block


def _reference(block, x_ND):
  """One token at a time in float64 NumPy: its top-2 experts by softmax, renormalised."""
  w = {k: np.asarray(v, np.float64) for k, v in nnx.to_pure_dict(nnx.state(block)).items()}
  out = np.zeros(x_ND.shape, np.float64)
  for i, x in enumerate(np.asarray(x_ND, np.float64)):
    logits = x @ w["router"]
    probs = np.exp(logits - logits.max())
    chosen = np.argsort(-probs)[:CFG.experts_per_token]
    for e, g in zip(chosen, probs[chosen] / probs[chosen].sum()):
      h = x @ w["gate_proj"][e]
      out[i] += g * ((h / (1 + np.exp(-h)) * (x @ w["up_proj"][e])) @ w["down_proj"][e])
  return out


def _mesh(fsdp, ep, tp):
  return jax.make_mesh((fsdp, ep, tp), ("fsdp", mesh_lib.EXPERT_AXIS, "tp"),
                       axis_types=(AxisType.Auto,) * 3, devices=jax.devices()[:fsdp * ep * tp])


def _inputs(one_shard: bool):
  """(block, x_BTD). `one_shard`: the router sends every token to experts 5 and 6, both on
  one shard at ep = 2 and at ep = 4, which then gets all of its expert group's pairs."""
  block = _block()
  x_BTD = np.random.default_rng(2).standard_normal((B, T, CFG.hidden_size)).astype(np.float32)
  if one_shard:
    router = np.array(block.router[...])
    router[0] = 0.0
    router[0, 5], router[0, 6] = 8.0, 7.0
    block.router.set_value(jnp.asarray(router))
    x_BTD[:, :, 0] = 3.0  # dim 0's logits (24 and 21) outweigh all the others (|.| < 8)
  return block, x_BTD


@functools.cache
def _program(mesh=None, rows=None):
  """(jitted (state, x_BTD) -> ((sum(y * c), (y_BTD, experts_BTK)), grads w.r.t. the
  params and x), the activation sharding), c a fixed random cotangent; on `mesh` with the
  rows over `rows`, or on one device. Compiled once for both routers of `_inputs`."""
  graphdef = nnx.split(_block())[0]
  c_BTD = np.random.default_rng(3).standard_normal((B, T, CFG.hidden_size)).astype(np.float32)
  act = None if mesh is None else NamedSharding(mesh, PartitionSpec(rows, None, None))

  def loss(state, x_BTD):
    y_BTD, _, experts_BTK = nnx.merge(graphdef, state).apply(x_BTD, None, act)
    return jnp.sum(y_BTD * c_BTD), (y_BTD, experts_BTK)

  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
  if mesh is None:
    return fn, None
  state, x_BTD = _placed(*_inputs(False), mesh, act)
  return fn.lower(state, x_BTD).compile(), act


def _placed(block, x_BTD, mesh, act):
  state = nnx.state(block)
  if mesh is None:
    return state, x_BTD
  return (jax.device_put(state, sharding.state_shardings(state, mesh)),
          jax.device_put(x_BTD, act))


def _value_and_grads(block, x_BTD, mesh=None, rows=None):
  """(y_BTD, experts_BTK, grads, the params as placed) of `_program`."""
  fn, act = _program(mesh, rows)
  state, x_BTD = _placed(block, x_BTD, mesh, act)
  (_, (y, experts)), grads = fn(state, x_BTD)
  return np.asarray(y), np.asarray(experts), jax.tree.map(np.asarray, grads), state


_SLOW = pytest.mark.slow  # ~10-50 s each (2 compiles); the default run keeps ep4, ep2_tp2
MESHES = {
    "ep2": ((4, 2, 1), ("fsdp", "expert")),
    "ep4": ((2, 4, 1), ("fsdp", "expert")),
    "ep2_tp2": ((2, 2, 2), ("fsdp", "expert")),
    # The sampler's layout: rows not split over the expert axis (no gather, a psum).
    "ep4_rows_whole": ((2, 4, 1), "fsdp"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_SLOW) if n in ("ep2", "ep4_rows_whole")
                                  else n for n in sorted(MESHES)])
def test_expert_sharded_block_equals_one_device(name):
  shape, rows = MESHES[name]
  mesh = _mesh(*shape)
  for one_shard in (False, True):
    block, x_BTD = _inputs(one_shard)
    want = _reference(block, x_BTD.reshape(B * T, -1)).reshape(B, T, -1)
    y1, experts1, grads1, _ = _value_and_grads(block, x_BTD)
    y, experts, grads, state = _value_and_grads(block, x_BTD, mesh, rows)
    if one_shard:
      assert set(np.unique(experts)) == {5, 6}
    np.testing.assert_array_equal(experts, experts1)
    np.testing.assert_allclose(y, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(y, y1, atol=1e-5, rtol=1e-5)
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(grads1)):
      np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)
  # Each device holds only its own experts (E / ep), never all of them: not as stored, and
  # not inside the step (before the expert axis, the shard_map all-gathered every expert's
  # [E, D, F / tp] weights on each device).
  gate = state["gate_proj"][...]
  assert gate.sharding.spec[0] == "expert"
  assert gate.addressable_shards[0].data.shape[0] == CFG.num_experts // shape[1]
  f_tp = CFG.moe_intermediate_size // shape[2]
  hlo = _program(mesh, rows)[0].as_text()
  d = CFG.hidden_size
  for whole in (f"f32[{CFG.num_experts},{d},{f_tp}]", f"f32[{CFG.num_experts},{f_tp},{d}]"):
    assert whole not in hlo, whole
  assert f"f32[{CFG.num_experts // shape[1]},{d},{f_tp}]" in hlo  # the FSDP-gathered shard


def test_expert_axis_in_the_meshes_and_bad_sizes_name_the_key():
  devices = jax.devices()[:8]
  plain = mesh_lib.make_slices(config_lib.MeshConfig(trainer_devices=4, generator_devices=4),
                               devices)
  assert plain.trainer.axis_names == mesh_lib.TRAINER_AXES  # ep = 1: the two-axis meshes
  assert plain.generator.axis_names == mesh_lib.GENERATOR_AXES
  s = mesh_lib.make_slices(config_lib.MeshConfig(trainer_devices=4, generator_devices=4,
                                                 trainer_ep=2, generator_ep=4), devices)
  assert dict(s.trainer.shape) == {"fsdp": 2, "expert": 2, "tp": 1}
  assert dict(s.generator.shape) == {"data": 1, "expert": 4, "tp": 1}
  assert mesh_lib.data_axes(s.trainer) == ("fsdp", "expert")
  with pytest.raises(UserError, match="mesh.trainer_ep.*ep=3"):
    mesh_lib.make_slices(config_lib.MeshConfig(trainer_devices=4, generator_devices=4,
                                               trainer_ep=3), devices)
  with pytest.raises(UserError, match="mesh.generator_ep"):
    config_lib.MeshConfig(generator_ep=0)


def test_weights_shard_experts_over_the_expert_axis_and_dense_dims_over_fsdp_and_expert():
  mesh = _mesh(2, 2, 2)
  spec = lambda axes, shape: sharding.logical_to_spec(axes, shape, mesh)  # noqa: E731
  assert spec(("layers", "expert", "embed", "moe_mlp"), (3, 8, 16, 8)) == \
      PartitionSpec(None, "expert", "fsdp", "tp")
  assert spec(("embed", "mlp"), (16, 32)) == PartitionSpec(("fsdp", "expert"), "tp")
  # E that the expert axis does not divide stays whole; D then takes both axes.
  assert spec(("expert", "embed"), (3, 16)) == PartitionSpec(None, ("fsdp", "expert"))
  generator = jax.make_mesh((2, 2, 2), ("data", "expert", "tp"),
                            axis_types=(AxisType.Auto,) * 3)
  # The generator's weights stay whole on D (no fsdp there), experts split.
  assert sharding.logical_to_spec(("expert", "embed", "moe_mlp"), (8, 16, 8), generator) == \
      PartitionSpec("expert", None, "tp")
  assert sharding.logical_to_spec(("embed", "mlp"), (16, 32), generator) == \
      PartitionSpec(None, "tp")

