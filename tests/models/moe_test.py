"""The mixture-of-experts MLP against a per-token NumPy reference; gradients; dtypes; config."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config, moe

BASE = config.ModelConfig(family="qwen3_moe", vocab_size=64, hidden_size=16, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=32,
                          qk_norm=True, num_experts=6, experts_per_token=2,
                          moe_intermediate_size=8, norm_topk_prob=True)


def _block(cfg, seed=0):
  block = moe.MoE(cfg, rngs=nnx.Rngs(seed))
  # Weights O(0.5): the default 0.02 init would make every expert's output ~1e-6.
  rng = np.random.default_rng(seed)
  for _, v in nnx.to_flat_state(nnx.state(block, nnx.Param)):
    x = v.get_value()
    v.set_value(jnp.asarray(0.5 * rng.standard_normal(x.shape), x.dtype))
  return block


def _silu(x):
  return x / (1 + np.exp(-x))


def _reference(block, cfg, x_ND):
  """One token at a time in float64: the experts the router picks, weighted."""
  w = {k: np.asarray(v, np.float64) for k, v in nnx.to_pure_dict(nnx.state(block)).items()
       if not isinstance(v, dict)}
  out = np.zeros_like(x_ND, np.float64)
  for i, x in enumerate(np.asarray(x_ND, np.float64)):
    logits = x @ w["router"]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if cfg.router_scoring == "softmax":
      chosen = np.argsort(-probs)[:cfg.experts_per_token]
      weights = probs[chosen]
      if cfg.norm_topk_prob:
        weights = weights / weights.sum()
    else:
      chosen = np.argsort(-logits)[:cfg.experts_per_token]
      weights = 1 / (1 + np.exp(-logits[chosen]))
    for e, g in zip(chosen, weights):
      h = _silu(x @ w["gate_proj"][e]) * (x @ w["up_proj"][e])
      out[i] += g * (h @ w["down_proj"][e])
    if cfg.shared_expert_size:
      sh = nnx.to_pure_dict(nnx.state(block))["shared_expert"]
      k = {n: np.asarray(sh[n]["kernel"], np.float64) for n in sh}
      out[i] += (_silu(x @ k["gate_proj"]) * (x @ k["up_proj"])) @ k["down_proj"]
  return out


CASES = {
    "softmax_norm": {},
    "softmax_raw": dict(norm_topk_prob=False, experts_per_token=3),
    "sigmoid_shared": dict(family="llama", qk_norm=False, router_scoring="sigmoid",
                           experts_per_token=1, shared_expert_size=12),
    "top_all": dict(experts_per_token=6),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_matches_per_token_reference(case):
  cfg = dataclasses.replace(BASE, **CASES[case])
  block = _block(cfg)
  x_BTD = jnp.asarray(np.random.default_rng(1).standard_normal((3, 7, 16)), jnp.float32)
  y_BTD, stats = nnx.jit(lambda b, x: b(x))(block, x_BTD)
  want = _reference(block, cfg, np.asarray(x_BTD).reshape(21, 16)).reshape(3, 7, 16)
  np.testing.assert_allclose(np.asarray(y_BTD), want, atol=1e-5, rtol=1e-5)
  assert float(stats.tokens) == 21
  assert float(jnp.sum(stats.chosen_E)) == 21 * cfg.experts_per_token
  np.testing.assert_allclose(float(jnp.sum(stats.prob_E)), 21, rtol=1e-6)


def test_gradients_equal_a_dense_all_experts_computation():
  """Grouped matmuls over the sorted pairs vs every expert on every token masked by the
  routing weights: same function, same gradients (router included); unchosen experts get
  exactly none. (On CPU the block runs every expert itself, `moe._dense_experts`;
  moe_experts_test checks both kernels against a float64 NumPy loop.)"""
  cfg = BASE
  block = _block(cfg, seed=2)
  x_BTD = jnp.asarray(np.random.default_rng(3).standard_normal((2, 5, 16)), jnp.float32)
  r_BTD = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5, 16)), jnp.float32)
  graphdef, params = nnx.split(block)

  def ours(p):
    return jnp.sum(nnx.merge(graphdef, p)(x_BTD)[0] * r_BTD)

  def dense(p):
    b = nnx.merge(graphdef, p)
    x_ND = x_BTD.reshape(10, 16)
    weights_NK, experts_NK, _ = b.route(x_ND)
    gates_NE = jnp.sum(jax.nn.one_hot(experts_NK, cfg.num_experts) * weights_NK[..., None], 1)
    h_NEF = (jax.nn.silu(jnp.einsum("nd,edf->nef", x_ND, b.gate_proj[...]))
             * jnp.einsum("nd,edf->nef", x_ND, b.up_proj[...]))
    y_NED = jnp.einsum("nef,efd->ned", h_NEF, b.down_proj[...])
    return jnp.sum(jnp.einsum("ne,ned->nd", gates_NE, y_NED) * r_BTD.reshape(10, 16))

  (v1, g1), (v2, g2) = (jax.jit(jax.value_and_grad(f))(params) for f in (ours, dense))
  np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)
  for (path, a), (_, b) in zip(nnx.to_flat_state(g1), nnx.to_flat_state(g2)):
    np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()),
                               atol=1e-5, rtol=1e-4, err_msg=str(path))
  assert float(jnp.abs(g1["router"][...]).max()) > 1e-3  # the gates carry gradient
  _, experts_NK, _ = block.route(x_BTD.reshape(10, 16))
  unused = sorted(set(range(cfg.num_experts)) - set(np.asarray(experts_NK).ravel().tolist()))
  grads_E = np.abs(np.asarray(g1["gate_proj"][...])).sum(axis=(1, 2))
  assert (grads_E[unused] == 0).all() and (np.delete(grads_E, unused) > 0).all()


def test_load_balancing_loss_is_k_when_balanced_and_counts_only_real_tokens():
  # Perfect balance: every expert chosen as often and equally probable -> loss = K.
  stats = moe.RouterStats(chosen_E=jnp.full((4,), 6.0), prob_E=jnp.full((4,), 3.0),
                          tokens=jnp.float32(12.0))
  np.testing.assert_allclose(float(stats.load_balancing_loss()), 2.0, rtol=1e-6)
  # Collapse onto one expert: E * 1 * 1 with top-1.
  collapsed = moe.RouterStats(chosen_E=jnp.array([5.0, 0, 0, 0]),
                              prob_E=jnp.array([5.0, 0, 0, 0]), tokens=jnp.float32(5.0))
  np.testing.assert_allclose(float(collapsed.load_balancing_loss()), 4.0, rtol=1e-6)
  block = _block(BASE)
  x_BTD = jnp.asarray(np.random.default_rng(5).standard_normal((2, 4, 16)), jnp.float32)
  mask_BT = jnp.array([[True] * 4, [False, False, True, True]])
  _, masked = block(x_BTD, mask_BT)
  _, real = block(x_BTD[:, None][mask_BT[:, None]].reshape(1, 6, 16))
  for a, b in zip(jax.tree.leaves(masked), jax.tree.leaves(real)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_float32_masters_of_a_bf16_model_compute_as_the_bf16_weights():
  """With compute wider than param_dtype every weight use is rounded (`layers.held`): the
  trainer's float32 masters give the generator's bf16 function, router included."""
  cfg = dataclasses.replace(BASE, param_dtype="bfloat16", dtype="float32")
  masters = _block(cfg)
  graphdef, state = nnx.split(masters)
  rng = np.random.default_rng(6)
  # float32 values that bf16 does not hold exactly.
  state32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32)
                         + jnp.asarray(1e-3 * rng.standard_normal(x.shape), jnp.float32), state)
  state16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), state32)
  x_BTD = jnp.asarray(rng.standard_normal((2, 6, 16)), jnp.float32)
  run = jax.jit(lambda s: nnx.merge(graphdef, s)(x_BTD)[0])
  y32, y16 = run(state32), run(state16)
  np.testing.assert_array_equal(np.asarray(y32), np.asarray(y16))
  # Without the rounding the masters compute a different function: the check can fail.
  unrounded = dataclasses.replace(cfg, param_dtype="float32")
  g2, _ = nnx.split(moe.MoE(unrounded, rngs=nnx.Rngs(0)))
  y_unrounded = jax.jit(lambda s: nnx.merge(g2, s)(x_BTD)[0])(state32)
  assert float(jnp.abs(y_unrounded - y16).max()) > 1e-5


@pytest.mark.parametrize("fields, match", [
    (dict(experts_per_token=7), "experts_per_token: must be in \\[1, num_experts=6\\]"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size: must be > 0"),
    (dict(num_experts=0), "num_experts: must be > 0 for family 'qwen3_moe'"),
    (dict(router_scoring="relu"), "router_scoring: must be one of"),
    (dict(mlp_only_layers=(3,)), "mlp_only_layers: must hold layer indices"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step: must be an int >= 1"),
])
def test_bad_moe_configs_name_the_field(fields, match):
  with pytest.raises(UserError, match=match):
    dataclasses.replace(BASE, **fields)


def test_sparse_layers_follow_the_qwen3_moe_rule_and_presets_count_active_params():
  cfg = dataclasses.replace(BASE, num_layers=6, mlp_only_layers=[0], decoder_sparse_step=2)
  assert cfg.mlp_only_layers == (0,)
  assert cfg.moe_layers() == (False, True, False, True, False, True)
  big = config.qwen3_30b_a3b()
  assert all(big.moe_layers()) and big.num_experts == 128 and big.experts_per_token == 8
  assert round(big.num_params() / 1e9, 1) == 30.5  # "30.5B total, 3.3B activated"
  assert 3.3e9 <= big.num_params(active=True) < 3.4e9
  scout = config.llama4_scout_shaped()
  assert round(scout.num_params(active=True) / 1e9) == 17 and scout.num_experts == 16
  with pytest.raises(UserError, match="has no Hugging Face form"):
    config.to_hf_config(scout)
