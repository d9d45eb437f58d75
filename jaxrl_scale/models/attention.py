"""Causal grouped-query attention over a full sequence: an einsum path and a TPU kernel path.

Semantics (both paths): query t of row b attends key s iff s <= t (array order) and
mask_BT[b, s]. Query head n reads kv head n // (N / K), as in Hugging Face. Scores are scaled
by head_dim**-0.5 and the softmax runs in float32; the output has q's dtype. A query with no
visible key (a left-padding query) gets finite garbage, never NaN; callers ignore it.

- "einsum": plain XLA, for CPU and GPU (and the reference the kernel is tested against).
- "splash": the Pallas TPU splash-attention kernel (block-sparse causal mask, padding as
  segment ids), run per device under `jax.shard_map`.
- "auto": "splash" when `sharding` lives on TPU devices, else "einsum".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("auto", "einsum", "splash")

# Finite (not -inf) so a query with no visible key gets a uniform softmax instead of NaN.
_MASKED = float(np.finfo(np.float32).min)


def causal_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     mask_BT: jax.Array, *, impl: str = "auto",
                     sharding: jax.sharding.NamedSharding | None = None) -> jax.Array:
  """Causal GQA attention of T queries over the same T keys.

  Args:
    q_BTNH: queries (RoPE applied), N heads.
    k_BTKH: keys (RoPE applied), K heads; N % K == 0.
    v_BTKH: values, K heads.
    mask_BT: True for real tokens; padding keys are never attended (left or right padding).
    impl: "auto", "einsum" or "splash".
    sharding: the sharding of q_BTNH (batch rows on its first mesh axis). Required by
      "splash"; "auto" picks "splash" when its devices are TPUs.

  Returns:
    out_BTNH in q's dtype.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention impl {impl!r} is not one of {', '.join(IMPLS)}")
  if impl == "auto":
    impl = "splash" if sharding is not None and _on_tpu(sharding.mesh) else "einsum"
  if impl == "einsum":
    return einsum_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT)
  if sharding is None:
    raise ValueError("attention impl 'splash' needs the activations' sharding (a NamedSharding)")
  return splash_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT, sharding=sharding)


def _on_tpu(mesh) -> bool:
  if isinstance(mesh, jax.sharding.AbstractMesh):
    return mesh.abstract_device is not None and mesh.abstract_device.platform == "tpu"
  return mesh.devices.flat[0].platform == "tpu"


def einsum_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     mask_BT: jax.Array, *, query_chunk: int = 2048) -> jax.Array:
  """The XLA path: no [B, T, S] mask input; causal & key masks are built from iotas inside.

  Args:
    q_BTNH, k_BTKH, v_BTKH, mask_BT: as in `causal_attention`.
    query_chunk: when T is a larger multiple of it, queries go through `lax.map` in chunks
      of this many, each chunk rematerialised in the backward pass, so the float32 scores
      exist for one chunk at a time ([B, N, chunk, T] instead of [B, N, T, T]).
  """
  b, t, n, h = q_BTNH.shape
  k = k_BTKH.shape[2]
  if n % k:
    raise ValueError(f"query heads {n} are not a multiple of kv heads {k}")
  q_BTKGH = q_BTNH.reshape(b, t, k, n // k, h)

  def chunk(q_BCKGH: jax.Array, start: jax.Array) -> jax.Array:
    c = q_BCKGH.shape[1]
    scores_BKGCS = jnp.einsum("BCKGH,BSKH->BKGCS", q_BCKGH, k_BTKH,
                              preferred_element_type=jnp.float32) * (h ** -0.5)
    query_C = start + jax.lax.iota(jnp.int32, c)
    causal_CS = query_C[:, None] >= jax.lax.iota(jnp.int32, t)[None, :]
    allowed_BCS = causal_CS[None, :, :] & mask_BT.astype(bool)[:, None, :]
    scores_BKGCS = jnp.where(allowed_BCS[:, None, None, :, :], scores_BKGCS, _MASKED)
    probs_BKGCS = jax.nn.softmax(scores_BKGCS, axis=-1).astype(v_BTKH.dtype)
    return jnp.einsum("BKGCS,BSKH->BCKGH", probs_BKGCS, v_BTKH)

  if t > query_chunk and t % query_chunk == 0:
    num = t // query_chunk
    q_MBCKGH = jnp.moveaxis(q_BTKGH.reshape(b, num, query_chunk, k, n // k, h), 1, 0)
    starts_M = jnp.arange(num, dtype=jnp.int32) * query_chunk
    body = jax.checkpoint(lambda args: chunk(*args))
    out_MBCKGH = jax.lax.map(body, (q_MBCKGH, starts_M))
    out_BTKGH = jnp.moveaxis(out_MBCKGH, 0, 1).reshape(b, t, k, n // k, h)
  else:
    out_BTKGH = chunk(q_BTKGH, jnp.int32(0))
  return out_BTKGH.reshape(b, t, n, h).astype(q_BTNH.dtype)


def splash_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     mask_BT: jax.Array, *, sharding: jax.sharding.NamedSharding,
                     block_size: int = 512, interpret: bool = False) -> jax.Array:
  """The Pallas TPU splash-attention path (see module docstring)."""
  raise NotImplementedError("splash attention is not implemented yet")
