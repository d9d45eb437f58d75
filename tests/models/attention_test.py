"""causal_attention against a hand-written numpy reference, and the TPU kernel path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.models import attention


def reference_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT):
  """Dense float64 attention written out loop by loop from the definition."""
  q, k, v = (np.asarray(x, np.float64) for x in (q_BTNH, k_BTKH, v_BTKH))
  b, t, n, h = q.shape
  group = n // k.shape[2]
  out = np.zeros((b, t, n, h))
  for r in range(b):
    for head in range(n):
      kv = head // group
      for i in range(t):
        visible = [s for s in range(t) if s <= i and mask_BT[r, s]]
        if not visible:
          continue
        scores = np.array([q[r, i, head] @ k[r, s, kv] for s in visible]) / np.sqrt(h)
        p = np.exp(scores - scores.max())
        p /= p.sum()
        out[r, i, head] = sum(pi * v[r, s, kv] for pi, s in zip(p, visible))
  return out


def visible_BT(mask_BT):
  """Queries with at least one visible key (the rest are garbage by contract)."""
  return np.cumsum(mask_BT, axis=1) > 0


def padded_mask(lengths, total, left):
  mask = np.zeros((len(lengths), total), bool)
  for r, n in enumerate(lengths):
    if left:
      mask[r, total - n:] = True
    else:
      mask[r, :n] = True
  return mask


def random_qkv(b, t, n, k, h, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, n, h)).astype(np.float32)
  kk = rng.normal(size=(b, t, k, h)).astype(np.float32)
  v = rng.normal(size=(b, t, k, h)).astype(np.float32)
  return tuple(jnp.asarray(x, dtype) for x in (q, kk, v))


# Rows: full, shorter, length 1, and (left padding) a row whose first queries see nothing.
LENGTHS = [12, 7, 1, 4]


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_einsum_matches_reference(left, dtype, tol):
  q, k, v = random_qkv(4, 12, 6, 2, 8, dtype)
  mask = padded_mask(LENGTHS, 12, left)
  out = attention.causal_attention(q, k, v, jnp.asarray(mask), impl="einsum")
  assert out.dtype == dtype and out.shape == q.shape
  assert np.isfinite(np.asarray(out, np.float32)).all()
  # Reference on the same (rounded) inputs, so bf16 error is the kernel's own arithmetic.
  ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                            v.astype(jnp.float32), mask)
  vis = visible_BT(mask)
  np.testing.assert_allclose(np.asarray(out, np.float32)[vis], ref[vis], atol=tol, rtol=tol)


def test_einsum_query_chunks_match_reference():
  """The chunked (lax.map + remat) path gives the same values and gradients."""
  q, k, v = random_qkv(2, 16, 4, 2, 8, jnp.float32, seed=1)
  mask = jnp.asarray(padded_mask([16, 9], 16, left=True))
  chunked = attention.einsum_attention(q, k, v, mask, query_chunk=4)
  whole = attention.einsum_attention(q, k, v, mask, query_chunk=16)
  vis = visible_BT(np.asarray(mask))
  ref = reference_attention(q, k, v, np.asarray(mask))
  np.testing.assert_allclose(np.asarray(chunked)[vis], ref[vis], atol=1e-5, rtol=1e-5)

  def loss(fn, q, k, v):
    return jnp.sum(jnp.where(jnp.asarray(vis)[:, :, None, None], fn(q, k, v, mask), 0.0) ** 2)

  g_chunked = jax.grad(lambda *a: loss(
      lambda *x: attention.einsum_attention(*x, query_chunk=4), *a), argnums=(0, 1, 2))(q, k, v)
  g_whole = jax.grad(lambda *a: loss(
      lambda *x: attention.einsum_attention(*x, query_chunk=16), *a), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g_chunked, g_whole):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(chunked, whole, atol=1e-6)


def test_unknown_impl_names_valid_ones():
  q, k, v = random_qkv(1, 4, 2, 1, 8, jnp.float32)
  with pytest.raises(ValueError, match="einsum, splash"):
    attention.causal_attention(q, k, v, jnp.ones((1, 4), bool), impl="flashy")


def test_auto_is_einsum_on_cpu():
  q, k, v = random_qkv(2, 8, 2, 1, 8, jnp.float32)
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  mask = jnp.asarray(padded_mask([8, 3], 8, left=False))
  out = attention.causal_attention(q, k, v, mask, sharding=sharding)
  np.testing.assert_array_equal(out, attention.einsum_attention(q, k, v, mask))
