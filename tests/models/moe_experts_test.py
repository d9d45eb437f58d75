"""The experts' two CPU-reachable kernels, the dense all-experts one (`moe._dense_experts`,
what CPU runs) and ragged_dot, against a float64 NumPy loop over the (token, slot) pairs:
values and gradients of x, the gates and the three expert weights, with the expert-parallel
offset; and which one the MoE layer runs on CPU."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxrl_scale.models import config, moe


def _sigmoid(a):
  return 1 / (1 + np.exp(-a))


def _numpy_reference(x_ND, weights_NK, experts_NK, gate_EDF, up_EDF, down_EFD, c_ND, first):
  """(y_ND, dL/dx, dL/dweights, dL/dgate, dL/dup, dL/ddown) of L = sum(y * c), float64,
  one (token, slot) pair at a time; pairs routed outside experts first .. first + E - 1
  add nothing."""
  x, w, g, u, dn, c = (np.asarray(a, np.float64)
                       for a in (x_ND, weights_NK, gate_EDF, up_EDF, down_EFD, c_ND))
  e_count = g.shape[0]
  y, dx, dw = np.zeros(c.shape), np.zeros(x.shape), np.zeros(w.shape)
  dg, du, dd = np.zeros(g.shape), np.zeros(u.shape), np.zeros(dn.shape)
  for n, row in enumerate(np.asarray(experts_NK)):
    for k, expert in enumerate(row):
      e = int(expert) - first
      if not 0 <= e < e_count:
        continue
      a, b = x[n] @ g[e], x[n] @ u[e]
      s = a * _sigmoid(a)
      h = s * b
      o = h @ dn[e]
      y[n] += w[n, k] * o
      dw[n, k] = o @ c[n]
      dh = w[n, k] * (dn[e] @ c[n])
      dd[e] += np.outer(h, w[n, k] * c[n])
      da = dh * b * _sigmoid(a) * (1 + a * (1 - _sigmoid(a)))
      db = dh * s
      dg[e] += np.outer(x[n], da)
      du[e] += np.outer(x[n], db)
      dx[n] += g[e] @ da + u[e] @ db
  return y, dx, dw, dg, du, dd


def _inputs(n, d, e, f, k, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, d)).astype(np.float32)
  w = rng.uniform(0.1, 1.0, (n, k)).astype(np.float32)
  experts = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32)
  params = tuple((0.3 * rng.standard_normal(s)).astype(np.float32)
                 for s in ((e, d, f), (e, d, f), (e, f, d)))
  c = rng.standard_normal((n, d)).astype(np.float32)
  return x, w, experts, params, c


# (tokens, D, all experts, F, K, first, experts held): first/held < all experts is the
# expert-parallel shard holding experts first .. first + held - 1 (the others add zero).
CASES = {"top2": (24, 16, 8, 8, 2, 0, 8), "top1": (17, 8, 4, 12, 1, 0, 4),
         "top_all": (9, 8, 4, 8, 4, 0, 4), "shard": (24, 16, 8, 8, 2, 4, 4),
         "shard_first": (20, 8, 6, 4, 3, 0, 3)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("impl", ["dense", "ragged", "einsum"])
def test_experts_match_a_float64_numpy_loop_values_and_gradients(case, impl):
  n, d, e_all, f, k, first, held = CASES[case]
  x, w, experts, params, c = _inputs(n, d, e_all, f, k, seed=len(case))
  params = tuple(p[first:first + held] for p in params)
  want = _numpy_reference(x, w, experts, *params, c, first)

  def loss(x, w, params):
    y = moe._experts(x, w, experts, *params, first=None if held == e_all else first,
                     impl=impl)
    return jnp.sum(y * c), y

  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      x, w, params)
  got = (y, grads[0], grads[1], *grads[2])
  names = ("y", "dx", "dweights", "dgate", "dup", "ddown")
  for name, a, b in zip(names, got, want):
    np.testing.assert_allclose(np.asarray(a), b, atol=1e-5, rtol=1e-5, err_msg=name)
  # An expert no pair chose gets exactly no gradient (and some expert does get one).
  chosen = set((experts.ravel() - first).tolist())
  for e in range(held):
    norm = float(np.abs(np.asarray(grads[2][0][e])).sum())
    assert (norm > 0) == (e in chosen), (e, norm)


def _layer():
  cfg = config.ModelConfig(family="qwen3_moe", vocab_size=64, hidden_size=16, num_layers=1,
                           num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32,
                           qk_norm=True, num_experts=4, experts_per_token=2,
                           moe_intermediate_size=8, norm_topk_prob=True)
  return moe.MoE(cfg, rngs=nnx.Rngs(0))


def test_the_moe_layer_runs_the_dense_experts_on_cpu_with_and_without_a_sharding():
  layer = _layer()
  x_BTD = jnp.ones((4, 3, 16), jnp.float32)
  mesh = jax.make_mesh((4,), ("fsdp",), axis_types=(AxisType.Auto,), devices=jax.devices()[:4])
  rows = NamedSharding(mesh, P("fsdp", None, None))
  for sharding in (None, rows):
    text = str(jax.make_jaxpr(lambda x, s=sharding: layer(x, None, s)[0])(x_BTD))
    assert "ragged_dot" not in text and not re.search(r"\bsort\[", text), sharding
  # The grouped path is still there when asked for (GPU, TPU and the tests use it).
  args = (jnp.ones((6, 16)), jnp.ones((6, 2)), jnp.zeros((6, 2), jnp.int32),
          *(jnp.ones(s) for s in ((4, 16, 8), (4, 16, 8), (4, 8, 16))))
  assert "ragged_dot" in str(jax.make_jaxpr(lambda *a: moe._experts(*a, impl="ragged"))(*args))


def test_under_a_tpu_mesh_the_layer_runs_the_accelerator_kernels(monkeypatch):
  """`plan` traces the sampler's programs for a TPU topology from this CPU machine, with the
  activations unsharded but the TPU mesh set (`jax.set_mesh`): the experts must be what the
  TPU runs, never the CPU's dense path (whose transposed weights XLA hoisted out of the
  decode loop: plan's Scout decode at 101.69 GiB and 19.87x the model FLOPs). A prefill's
  many tokens take the grouped matmul; a decode step's few (<= EINSUM_MAX_TOKENS) the
  einsums over the expert axis, which read the stacked weights in place (Scout's decode
  2.54x -> 1.05x its minimum bytes)."""
  pytest.importorskip("libtpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu")
  mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Auto,), devices=topo.devices)

  def cpu_path(*args, **kwargs):
    raise AssertionError("the CPU's dense experts under a TPU mesh")

  monkeypatch.setattr(moe, "_dense_experts", cpu_path)
  layer = _layer()
  for rows, want_grouped in ((moe.EINSUM_MAX_TOKENS // 4, False),
                             (moe.EINSUM_MAX_TOKENS // 4 + 1, True)):
    x = jax.ShapeDtypeStruct((4, rows, 16), jnp.float32)
    with jax.set_mesh(mesh):
      text = jax.jit(lambda x: layer(x, None, None)[0]).lower(x).as_text()
    assert ("ragged_dot" in text) == want_grouped, rows
