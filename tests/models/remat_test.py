"""Remat policies: the loss and gradients of no remat, and each keeps what it names."""

import contextlib
import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_scale.models import attention, config, decoder, layers, transformer


def _seqs(cfg, n, length, seed=0):
  return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(n, length))


def test_policies_give_the_loss_and_gradients_of_no_remat(tiny_model):
  # tiny_qwen3: the q/k norms sit between the saved projections and the attention.
  cfg = config.tiny_qwen3()
  model = tiny_model("tiny_qwen3")
  tokens = jnp.asarray(_seqs(cfg, 2, 8))
  pos, mask = jnp.broadcast_to(jnp.arange(8), (2, 8)), jnp.ones((2, 8), bool)

  @nnx.jit
  def both(m):
    def loss(m, remat):
      h = m.hidden_states(tokens, pos, mask, remat=remat)
      return m.token_log_probs(h, tokens, chunk_size=4).sum()
    return [nnx.value_and_grad(loss)(m, p) for p in ("none", "attention", "context", "matmuls")]

  (loss_ref, grads_ref), *others = both(model)
  for loss_new, grads_new in others:
    np.testing.assert_allclose(float(loss_new), float(loss_ref), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads_new), jax.tree.leaves(grads_ref)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def _saved(remat: str) -> list[str]:
  """What one remat'd decoder layer (tiny_qwen3, einsum attention) keeps for its backward
  pass: one line per residual, as `jax.ad_checkpoint.print_saved_residuals` writes them."""
  cfg = config.tiny_qwen3()
  layer = decoder.DecoderLayer(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  x_BTD = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, cfg.hidden_size)),
                      jnp.float32)
  pos_BT = jnp.broadcast_to(jnp.arange(8), (2, 8))
  mask_BT = jnp.ones((2, 8), bool)

  def attend(q, k, v):
    return attention.einsum_attention(q, k, v, mask_BT), None

  def body(st, x):
    return nnx.merge(graphdef, st)(x, pos_BT, attend)[0]

  f = jax.checkpoint(body, policy=transformer.REMAT_POLICIES[remat])
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(lambda st, x: f(st, x).sum(), state, x_BTD)
  return out.getvalue().splitlines()


def test_attention_policy_keeps_the_attention_projections_and_recomputes_the_mlp():
  saved = _saved("attention")
  named = sorted(line.split("named '")[1].split("'")[0] for line in saved if "named '" in line)
  assert named == ["key_proj", "out_proj", "query_proj", "value_proj"], saved
  # Nothing else computed in the layer is kept (no MLP activation, no attention
  # probabilities): the rest are inputs, parameters and constants (positions, mask).
  computed = lambda lines: [x for x in lines if "output of" in x or "named '" in x]  # noqa: E731
  assert len(computed(saved)) == 4, saved
  # "full" keeps no computed value at all, nor does "context" on the einsum path (no kernel
  # residuals); "dots" keeps the MLP's matmul outputs as well.
  assert not computed(_saved("full"))
  assert not computed(_saved("context"))
  # q k v o gate up (the backward pass reads no down projection output); "matmuls" keeps
  # the same on the einsum path (its extra is the splash kernel's, below).
  assert sum("dot_general" in line for line in _saved("dots")) == 6
  assert sum("dot_general" in line for line in _saved("matmuls")) == 6


def test_attention_policy_keeps_the_splash_kernels_residuals():
  """With "attention" the backward pass reads the forward kernel's output and log-sum-exp
  (kept) instead of running the forward kernel again (as "full" does); same gradients."""
  b, t, n, k, h = 2, 128, 2, 1, 128
  rng = np.random.default_rng(0)
  q, kk, v = (jnp.asarray(rng.normal(size=(b, t, m, h)), jnp.float32) for m in (n, k, k))
  w_BTNH = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
  mask = jnp.ones((b, t), bool)
  mesh = Mesh(np.asarray(jax.devices()[:2]), ("fsdp",), axis_types=(AxisType.Auto,))
  splash = functools.partial(attention.splash_attention, sharding=NamedSharding(mesh, P("fsdp")),
                             block_size=128, backward_block_size=128, interpret=True)
  loss = lambda q, k, v: jnp.sum(splash(q, k, v, mask) * w_BTNH)  # noqa: E731

  def kept(remat: str) -> list[str]:
    f = jax.checkpoint(loss, policy=transformer.REMAT_POLICIES[remat])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      jax.ad_checkpoint.print_saved_residuals(f, q, kk, v)
    return [x.split(" ")[0] for x in out.getvalue().splitlines() if "output of" in x]

  assert kept("full") == []
  # The kernel's output [B, N, T, H] and log-sum-exp [B, N, T], nothing else.
  assert sorted(kept("attention")) == ["f32[2,2,128,128]", "f32[2,2,128]"]
  assert sorted(kept("matmuls")) == ["f32[2,2,128,128]", "f32[2,2,128]"]
  assert sorted(kept("context")) == ["f32[2,2,128,128]", "f32[2,2,128]"]
  assert kept("dots") == []  # the kernel is no dot: "dots" reruns it
  want = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, kk, v)
  for remat in ("attention", "context"):
    f = jax.checkpoint(loss, policy=transformer.REMAT_POLICIES[remat])
    got = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, kk, v)
    for name, a, e in zip("qkv", got, want):
      np.testing.assert_allclose(a, e, atol=1e-5, rtol=0, err_msg=f"{remat} d{name}")
