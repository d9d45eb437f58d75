"""The chunked LM head's hand-written backward pass (`logprobs._recomputed_head`) against a
float64 hand computation, and its structure: the backward reruns the logits matmul and
nothing else of the forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import layers
from jaxrl_scale.models import transformer
from jaxrl_scale.rl import logprobs

B, T, D, V = 2, 5, 48, 37


def _inputs(seed: int = 0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((B, T, D)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((V, D)) * 0.3, jnp.bfloat16)
  targets = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  g = jnp.asarray(rng.standard_normal((B, T)), jnp.float32)  # not +-1: scales must show
  return h, w, targets, g


def _float64_reference(h, w, targets, g, temperature):
  """log p_T(target) and d(sum g * logp)/d(h, w) by hand, in float64."""
  h64, w64 = np.asarray(h, np.float64), np.asarray(w, np.float64)
  z = np.einsum("btd,vd->btv", h64, w64) / temperature
  lse = z.max(-1) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))
  t = np.asarray(targets)
  logp = np.take_along_axis(z, t[..., None], -1)[..., 0] - lse
  onehot = np.arange(V)[None, None, :] == t[..., None]
  dlogits = np.asarray(g, np.float64)[..., None] * (onehot - np.exp(z - lse[..., None]))
  dlogits /= temperature
  return logp, np.einsum("btv,vd->btd", dlogits, w64), np.einsum("btv,btd->vd", dlogits, h64)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_head_matches_float64_by_hand(temperature):
  """The FP32 head of bf16 operands (the recipe's case): log-probs and both gradients
  against float64 NumPy. A wrong 1/T, softmax or target term in the backward fails."""
  h, w, targets, g = _inputs()
  logits_fn = lambda h_, w_: layers.fp32_logits(h_, w_, "BTD,VD->BTV", jnp.bfloat16)

  def loss(h_, w_):
    logp, top1 = logprobs._recomputed_head(logits_fn, h_, w_, targets, temperature)
    return jnp.sum(logp * g), (logp, top1)

  (dh, dw), (logp, top1) = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(h, w)
  want_logp, want_dh, want_dw = _float64_reference(h, w, targets, g, temperature)
  np.testing.assert_allclose(np.asarray(logp), want_logp, atol=2e-5)
  z = np.einsum("btd,vd->btv", np.asarray(h, np.float64), np.asarray(w, np.float64))
  np.testing.assert_array_equal(np.asarray(top1),
                                z.argmax(-1) == np.asarray(targets))
  # The gradients come back in the operands' dtype (bfloat16): rounding of 2^-8.
  assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
  for got, want in ((dh, want_dh), (dw, want_dw)):
    np.testing.assert_allclose(np.asarray(got, np.float64), want,
                               atol=4e-3 * np.abs(want).max(), rtol=4e-3)


def _reduce_max_count(jaxpr) -> int:
  n = 0
  for eqn in jaxpr.eqns:
    n += eqn.primitive.name == "reduce_max"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, "eqns"):
          n += _reduce_max_count(sub)
  return n


def test_chunked_head_backward_reruns_only_the_matmul():
  """The gradient of the chunked head holds one max over the vocabulary (the forward's):
  the backward pass recomputes the logits but not the reductions (under jax.checkpoint
  it held two, and wrote d(logits) in float32 before casting it)."""
  cfg = model_config.ModelConfig(family="llama", vocab_size=V, hidden_size=D, num_layers=1,
                                 num_heads=4, num_kv_heads=2, head_dim=12,
                                 intermediate_size=64, param_dtype="bfloat16",
                                 dtype="bfloat16")
  model = transformer.create_model(cfg)
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, V, (B, 13)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(13), (B, 13))
  mask = jnp.ones((B, 13), bool)

  def objective(p, chunk):
    logp, _ = logprobs.token_logprobs(nnx.merge(graphdef, p), tokens, pos, mask, chunk,
                                      temperature=0.7)
    return jnp.sum(logp)

  # The layers' RMSNorm and softmax have no max over a [.., V] axis; count them all the
  # same by comparing with the unchunked head, whose autodiff keeps the forward's max.
  counts = {c: _reduce_max_count(jax.make_jaxpr(jax.grad(functools.partial(
      objective, chunk=c)))(params).jaxpr) for c in (0, 4)}
  assert counts[4] == counts[0], counts
  values = [jax.jit(jax.value_and_grad(objective), static_argnums=1)(params, c)
            for c in (0, 4)]
  (v0, g0), (v4, g4) = values
  np.testing.assert_allclose(float(v4), float(v0), rtol=1e-5)
  for a, c in zip(jax.tree.leaves(g0), jax.tree.leaves(g4)):
    scale = float(jnp.max(jnp.abs(a.astype(jnp.float32)))) or 1.0
    np.testing.assert_allclose(np.asarray(c, np.float32), np.asarray(a, np.float32),
                               atol=2e-2 * scale)
