"""The MoE grouped matmul: the megablox kernel (Pallas interpret mode on CPU) computes what
`jax.lax.ragged_dot` and a float64 NumPy loop compute, values and gradients, with empty
groups and rows past the groups; on TPU devices the MoE layer lowers to the kernel."""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxrl_scale.models import grouped_matmul as gm
from jaxrl_scale.models import moe
from jaxrl_scale.parallel import mesh as mesh_lib


def _numpy_reference(x_MK, w_GKN, sizes_G, c_MN):
  """(out_MN, d out.c / dx, d out.c / dw) in float64, one group at a time."""
  x, w, c = (np.asarray(a, np.float64) for a in (x_MK, w_GKN, c_MN))
  out, dx, dw = np.zeros(c.shape), np.zeros(x.shape), np.zeros(w.shape)
  start = 0
  for g, size in enumerate(np.asarray(sizes_G)):
    rows = slice(start, start + size)
    out[rows] = x[rows] @ w[g]
    dx[rows] = c[rows] @ w[g].T
    dw[g] = x[rows].T @ c[rows]
    start += size
  return out, dx, dw


@functools.cache
def _value_and_grads(impl):
  def loss(x_MK, w_GKN, sizes_G, c_MN):
    out_MN = gm.grouped_matmul(x_MK, w_GKN, sizes_G, impl=impl)
    return jnp.sum(out_MN * c_MN), out_MN
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


# (group sizes, rows M): empty groups first, in the middle and last; rows past the groups
# (the expert-parallel path's pairs of other shards); M not a multiple of 8 (padded rows).
CASES = [([7, 0, 13, 5, 9], 40), ([0, 0, 20, 0, 12], 37), ([3, 11, 0, 6, 0], 20)]


@pytest.mark.parametrize("sizes,m", CASES)
def test_megablox_matches_ragged_dot_and_numpy_values_and_gradients(sizes, m):
  rng = np.random.default_rng(0)
  k, n = 16, 24
  x = rng.standard_normal((m, k)).astype(np.float32)
  w = rng.standard_normal((len(sizes), k, n)).astype(np.float32)
  c = rng.standard_normal((m, n)).astype(np.float32)
  sizes_G = np.array(sizes, np.int32)
  want, want_dx, want_dw = _numpy_reference(x, w, sizes_G, c)
  for impl in ("interpret", "ragged"):
    (_, out), (dx, dw) = _value_and_grads(impl)(x, w, sizes_G, c)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5, err_msg=impl)
    np.testing.assert_allclose(dx, want_dx, atol=2e-5, rtol=1e-5, err_msg=impl)
    np.testing.assert_allclose(dw, want_dw, atol=2e-5, rtol=1e-5, err_msg=impl)
  # Rows past the groups: zero output, zero gradient (want is zero there).
  past = int(sizes_G.sum())
  (_, out), (dx, _) = _value_and_grads("interpret")(x, w, sizes_G, c)
  assert not np.any(np.asarray(out)[past:]) and not np.any(np.asarray(dx)[past:])


def test_the_interpret_impl_runs_the_pallas_kernel():
  """What the CPU tests compare is the kernel itself, not a fallback."""
  args = (jnp.ones((16, 8)), jnp.ones((2, 8, 8)), jnp.array([9, 7], jnp.int32))
  assert "pallas_call" in str(jax.make_jaxpr(
      functools.partial(gm.grouped_matmul, impl="interpret"))(*args))
  assert "pallas_call" not in str(jax.make_jaxpr(
      functools.partial(gm.grouped_matmul, impl="ragged"))(*args))


def test_tiling_and_platform_choice():
  # Qwen3-30B-A3B (D 2048, F 768; F 384 at tp 2) and the Scout preset (D 5120, F 8192).
  assert gm.tiling(65536, 2048, 768)[0] == (512, 256, 256)
  assert gm.tiling(65536, 2048, 384)[0] == (512, 128, 128)
  assert gm.tiling(65536, 5120, 8192)[0] == (512, 512, 512)
  tiles, why = gm.tiling(64, 64, 32)  # the tiny presets: no TPU-valid tile
  assert tiles is None and "multiples of 128" in why
  assert gm.auto_impl(True, 2048, 768) == "megablox"
  assert gm.auto_impl(True, 64, 32) == "ragged"
  assert gm.auto_impl(False, 2048, 768) == "ragged"
  with pytest.raises(ValueError, match="not one of"):
    gm.grouped_matmul(jnp.ones((8, 4)), jnp.ones((1, 4, 4)), jnp.array([8], jnp.int32),
                      impl="dense")


def _expert_inputs(e=8, k=2, n=24, d=16, f=8, one_shard=False):
  rng = np.random.default_rng(1)
  x_ND = rng.standard_normal((n, d)).astype(np.float32)
  weights_NK = rng.uniform(0.1, 1.0, (n, k)).astype(np.float32)
  experts_NK = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32)
  if one_shard:  # every pair on experts 5 and 6: one shard gets all of its group's pairs
    experts_NK = np.tile(np.array([[5, 6]], np.int32), (n, 1))
  params = tuple(0.3 * rng.standard_normal(s).astype(np.float32)
                 for s in ((e, d, f), (e, d, f), (e, f, d)))
  c_ND = rng.standard_normal((n, d)).astype(np.float32)
  return x_ND, weights_NK, experts_NK, params, c_ND


@pytest.mark.parametrize("one_shard", [False, True])
def test_expert_parallel_path_with_the_kernel_matches_ragged_dot(one_shard):
  """`moe._local_experts` on an (fsdp 2, expert 2, tp 2) mesh: each device's 4 experts run
  by the kernel over the gathered rows (the other shard's pairs past its groups), F split
  over tp; values and gradients (x, gates, the three expert weights) equal ragged_dot's."""
  mesh = jax.make_mesh((2, 2, 2), ("fsdp", mesh_lib.EXPERT_AXIS, "tp"),
                       axis_types=(AxisType.Auto,) * 3, devices=jax.devices()[:8])
  x_ND, weights_NK, experts_NK, params, c_ND = _expert_inputs(one_shard=one_shard)
  act = NamedSharding(mesh, P(("fsdp", mesh_lib.EXPERT_AXIS), None, None))

  def run(impl):
    def loss(x_ND, weights_NK, params):
      local = moe._local_experts(act, x_ND.shape[0], params, impl=impl)
      y_ND = local(x_ND, weights_NK, experts_NK, *params)
      return jnp.sum(y_ND * c_ND), y_ND
    with jax.set_mesh(mesh):
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
          x_ND, weights_NK, params)

  (_, y_kernel), g_kernel = run("interpret")
  (_, y_ragged), g_ragged = run("ragged")
  # The single-device dispatch (no shard_map), ragged_dot: the function both must compute.
  y_one = moe._experts(x_ND, weights_NK, experts_NK, *params)
  np.testing.assert_allclose(y_ragged, y_one, atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(y_kernel, y_ragged, atol=1e-4, rtol=1e-4)
  for a, b in zip(jax.tree.leaves(g_kernel), jax.tree.leaves(g_ragged)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
  assert np.abs(np.asarray(g_kernel[2][0])).max() > 0  # the weight gradient is not empty


def test_moe_layer_lowers_to_megablox_on_tpu_devices():
  """The expert-parallel MoE layer compiled for a v5p:2x2x1 topology (libtpu, no TPU
  attached) runs the Pallas kernel, forward and weight gradient, and no ragged dot."""
  pytest.importorskip("libtpu", reason="libtpu (the tpu extra) is not installed")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
  mesh = jax.make_mesh((2, 2), ("fsdp", mesh_lib.EXPERT_AXIS), axis_types=(AxisType.Auto,) * 2,
                       devices=topo.devices)
  e, d, f, n = 4, 256, 128, 1024
  act = NamedSharding(mesh, P(("fsdp", mesh_lib.EXPERT_AXIS), None, None))
  shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((e, d, f), (e, d, f), (e, f, d))]
  x = jax.ShapeDtypeStruct((n, d), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((n, 2), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((n, 2), jnp.int32)

  def grads(x_ND, weights_NK, experts_NK, params):
    def loss(params):
      local = moe._local_experts(act, n, params)
      return jnp.sum(local(x_ND, weights_NK, experts_NK, *params).astype(jnp.float32) ** 2)
    return jax.grad(loss)(params)

  with jax.set_mesh(mesh):
    text = jax.jit(grads).lower(x, w, ids, shapes).compile().as_text()
  assert "ragged-dot" not in text and "ragged_dot" not in text
  kernels = re.findall(r"%(t?gmm)[.\d]* = ", text)
  # Forward of the 3 projections, the input gradient of the down projection only (the
  # loss differentiates the weights, not x), and the 3 weight gradients grouped (tgmm).
  assert sorted(kernels) == ["gmm"] * 4 + ["tgmm"] * 3, kernels
