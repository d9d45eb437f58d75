"""Attention: causal GQA over a full sequence (paged decode: `models.paged_attention`).

Full sequence (`causal_attention`). Semantics (both paths): query t of row b attends key s
iff s <= t (array order) and mask_BT[b, s]. Query head n reads kv head n // (N / K), as in
Hugging Face. Scores are scaled by head_dim**-0.5 and the softmax runs in float32; the
output has q's dtype. A query with no visible key (a left-padding query) gets finite
garbage, never NaN; callers ignore it.

- "einsum": plain XLA, for CPU (and the reference the kernels are tested against).
- "splash": the Pallas TPU splash-attention kernel (block-sparse causal mask, padding as
  segment ids), run per device under `jax.shard_map`.
- "cudnn": cuDNN's fused flash attention on NVIDIA GPUs, through
  `jax.nn.dot_product_attention(implementation="cudnn")` (`fused_attention`).
- "auto": "splash" when `sharding` lives on TPU devices, "cudnn" on GPUs when cuDNN can run
  the shapes (`auto_impl`), else "einsum".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("auto", "einsum", "splash", "cudnn")
# checkpoint_name of the splash forward kernel's residuals (its output and log-sum-exp).
SPLASH_RESIDUALS = "splash_residuals"
# cuDNN's fused forward (`jax.nn.dot_product_attention(implementation="cudnn")`) is one jax
# primitive whose outputs are the attention output and its softmax statistics, the two its
# fused backward reads. jax names neither, so a remat policy keeps them by primitive
# (`keeps_cudnn_residuals`); tests/models/gpu_attention_test.py fails if the name changes.
CUDNN_FORWARD = "dot_product_attention_fwd_wrapper"

# Finite (not -inf) so a query with no visible key gets a uniform softmax instead of NaN.
MASKED = float(np.finfo(np.float32).min)


def causal_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     mask_BT: jax.Array, *, impl: str = "auto",
                     sharding: jax.sharding.NamedSharding | None = None,
                     right_padded: bool = False) -> jax.Array:
  """Causal GQA attention of T queries over the same T keys.

  Args:
    q_BTNH: queries (RoPE applied), N heads.
    k_BTKH: keys (RoPE applied), K heads; N % K == 0.
    v_BTKH: values, K heads.
    mask_BT: True for real tokens; padding keys are never attended (left or right padding).
    impl: "auto", "einsum", "splash" or "cudnn".
    sharding: the sharding of q_BTNH (batch rows on its first mesh axis). Required by
      "splash"; "auto" picks by its devices' platform (`auto_impl`).
    right_padded: the caller has made every row's real tokens start at position 0
      (`Transformer.hidden_states_with_stats`); "cudnn" then skips its left-padding cond
      (`fused_attention`). A left-padded row would be attended wrongly.

  Returns:
    out_BTNH in q's dtype.
  """
  impl = resolved_impl(impl, sharding, q_BTNH.dtype, q_BTNH.shape[-1])
  if impl == "einsum":
    return einsum_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT)
  if impl == "cudnn":
    why = cudnn_unsupported(q_BTNH.dtype, q_BTNH.shape[-1], _devices(sharding))
    if why:
      raise ValueError(f"attention impl 'cudnn': {why}")
    return fused_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT, implementation="cudnn",
                           sharding=sharding, right_padded=right_padded)
  if sharding is None:
    raise ValueError("attention impl 'splash' needs the activations' sharding (a NamedSharding)")
  return splash_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT, sharding=sharding)


def mesh_platform(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None) -> str | None:
  """The platform of `mesh`'s devices ('tpu', 'gpu', 'cpu'); None without a mesh, or for an
  abstract mesh of no device kind."""
  if mesh is None:
    return None
  if isinstance(mesh, jax.sharding.AbstractMesh):
    return None if mesh.abstract_device is None else mesh.abstract_device.platform
  return mesh.devices.flat[0].platform


def on_tpu(mesh) -> bool:
  return mesh_platform(mesh) == "tpu"


def platform(sharding: jax.sharding.NamedSharding | None) -> str:
  """'tpu', 'gpu' or 'cpu': where the activations live (their mesh's devices); without a
  sharding (or with an abstract mesh of no device kind), the mesh set by `jax.set_mesh`
  (`plan` compiles every program for a TPU topology under one), else where jit puts them
  (the default backend)."""
  return (mesh_platform(None if sharding is None else sharding.mesh)
          or mesh_platform(jax.sharding.get_abstract_mesh()) or jax.default_backend())


def _devices(sharding: jax.sharding.NamedSharding | None) -> list:
  if sharding is None or isinstance(sharding.mesh, jax.sharding.AbstractMesh):
    return []
  return list(sharding.mesh.devices.flat)


def keeps_cudnn_residuals(prim, *_, **__) -> bool:
  """A jax.checkpoint policy: keep the cuDNN forward kernel's outputs (see CUDNN_FORWARD)."""
  return prim.name == CUDNN_FORWARD


def auto_impl(sharding: jax.sharding.NamedSharding | None, dtype, head_dim: int) -> str:
  """What `causal_attention(impl="auto")` runs: "splash" on TPUs (it needs the sharding),
  "cudnn" on GPUs when cuDNN runs the dtype and head dim (`cudnn_unsupported`), else
  "einsum" (CPU, and the GPU cases cuDNN refuses: float32 compute, odd head dims)."""
  where = platform(sharding)
  if where == "tpu" and sharding is not None:
    return "splash"
  if where == "gpu" and not cudnn_unsupported(dtype, head_dim, _devices(sharding)):
    return "cudnn"
  return "einsum"


def resolved_impl(impl: str, sharding: jax.sharding.NamedSharding | None, dtype,
                  head_dim: int) -> str:
  """`impl`, with "auto" resolved by `auto_impl`."""
  if impl not in IMPLS:
    raise ValueError(f"attention impl {impl!r} is not one of {', '.join(IMPLS)}")
  return auto_impl(sharding, dtype, head_dim) if impl == "auto" else impl


def cudnn_unsupported(dtype, head_dim: int, devices: Sequence = ()) -> str:
  """Why cuDNN's flash attention cannot run these activations ('' when it can): its kernels
  take bfloat16 / float16 only, and head dims that are multiples of 8 up to 128 (256 on
  Hopper and later; jax/_src/cudnn/fused_attention_stablehlo.py, check_is_flash_attention)."""
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return f"needs bfloat16 or float16 activations, got {jnp.dtype(dtype).name}"
  capability = getattr(devices[0], "compute_capability", "0") if devices else "9.0"
  hopper = tuple(int(x) for x in str(capability).split(".")) >= (9, 0)
  limit = 256 if hopper else 128
  if head_dim % 8 or head_dim > limit:
    return f"head_dim must be a multiple of 8 up to {limit} on this GPU, got {head_dim}"
  return ""


def fused_attention(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                    mask_BT: jax.Array, *, implementation: str,
                    sharding: jax.sharding.NamedSharding | None = None,
                    right_padded: bool = False) -> jax.Array:
  """`causal_attention` through `jax.nn.dot_product_attention` ("cudnn" on GPUs; "xla" is
  the same call on any platform, which is how the CPU tests check this code).

  The fused kernel's only padding input is a key length per row (keys s < len attended,
  with the causal rule s <= t), which is right padding. Left padding is made right by
  shifting each row left by its first real index (the padding wraps to the end), and the
  output is shifted back. That needs each row's real tokens to be contiguous (left and/or
  right padding, as every caller builds them; a hole inside a row would be attended). The
  shift runs only when some row is left-padded: the trainer's and prefill's batches are
  right-padded and skip it. The `lax.cond` holds the whole kernel in each branch, not the
  shifts alone: a branch that hands its operand through unchanged gets a copy (XLA gives a
  conditional's results their own buffers), so the shift-only conds copied q, k, v, the
  output and the gradients on every right-padded step: 27 ms of the qwen3_0p6b train step's
  0.696 s kernel by kernel, compiled for an H100 (`plan`). What remains is one copy each of
  q, k, v, which the forward's cond hands to the backward as the kernel's residuals; a
  caller that has made its rows right-padded itself says so (`right_padded`) and gets no
  cond at all (the train step: `Transformer.hidden_states_with_stats`).

  Queries keep every position (query lengths are T), so a right-padding query attends all
  of its row's real keys, as in `einsum_attention`. A left-padding query (no visible key)
  gets finite garbage; a row with no real token attends its first key (lengths are at
  least 1, so no kernel sees an empty row).

  Not covered here, left to `einsum_attention` by the callers: more keys than queries
  (chunked prefill after a cached prefix); the XLA implementation's causal mask is
  aligned top-left (query t sees keys s <= t), which is wrong for S > T.

  Args:
    q_BTNH, k_BTKH, v_BTKH, mask_BT: as in `causal_attention`.
    implementation: "cudnn" or "xla" (passed to `jax.nn.dot_product_attention`).
    sharding: the activations' sharding; q, k and v are pinned to rows over its batch axes
      and heads over 'tp' where that divides the kv heads, the only splits cuDNN's
      partitioner accepts (none over T or H).
    right_padded: no row is left-padded (the caller's promise): no cond, no shift.
  """
  b, t, n, h = q_BTNH.shape
  k = k_BTKH.shape[2]
  if n % k:
    raise ValueError(f"query heads {n} are not a multiple of kv heads {k}")
  mask_BT = mask_BT.astype(jnp.bool_)
  first_B = first_real(mask_BT)
  lens_B = jnp.maximum(jnp.sum(mask_BT, axis=1, dtype=jnp.int32), 1)
  left = jnp.any(first_B > 0)

  def attend(qkv):
    if sharding is not None:
      qkv = tuple(jax.lax.with_sharding_constraint(x, _fused_spec(sharding, k)) for x in qkv)
    return jax.nn.dot_product_attention(
        *qkv, scale=h ** -0.5, is_causal=True, key_value_seq_lengths=lens_B,
        implementation=implementation)

  def shifted(qkv):
    out_BTNH = attend(tuple(rotate_rows(x, first_B) for x in qkv))
    return rotate_rows(out_BTNH, t - first_B)

  if right_padded:
    out_BTNH = attend((q_BTNH, k_BTKH, v_BTKH))
  else:
    out_BTNH = jax.lax.cond(left, shifted, attend, (q_BTNH, k_BTKH, v_BTKH))
  return out_BTNH.astype(q_BTNH.dtype)


def right_aligned(mask_BT: jax.Array, rows: Any) -> tuple[Any, Callable[[jax.Array], jax.Array]]:
  """(`rows`, a pytree of [B, T, ...] arrays, with each row rotated so that its real tokens
  (`mask_BT`) start at 0, and `undo`, which rotates a [B, T, ...] array back): what
  `Transformer.hidden_states_with_stats` does once before the layers when the attention
  is cuDNN's, which takes right padding only, instead of the shift in every layer
  (`fused_attention`, whose cond copied q, k and v as the kernel's residuals on every
  right-padded batch). Each position keeps its token, RoPE position, mask and routing
  record, so causal order among a row's real tokens is unchanged. Both rotations are conds:
  nothing moves when no row is left-padded."""
  first_B = first_real(mask_BT)
  left = jnp.any(first_B > 0)
  t = mask_BT.shape[1]
  rotate = lambda xs: jax.tree.map(lambda x: rotate_rows(x, first_B), xs)  # noqa: E731
  undo = lambda x: jax.lax.cond(  # noqa: E731
      left, lambda y: rotate_rows(y, t - first_B), lambda y: y, x)
  return jax.lax.cond(left, rotate, lambda xs: xs, rows), undo


def first_real(mask_BT: jax.Array) -> jax.Array:
  """Each row's first real position (0 for a row with none), int32 [B]."""
  mask_BT = mask_BT.astype(jnp.bool_)
  return jnp.where(jnp.any(mask_BT, axis=1), jnp.argmax(mask_BT, axis=1), 0).astype(jnp.int32)


def rotate_rows(x_BT: jax.Array, by_B: jax.Array) -> jax.Array:
  """Row b rotated left by by_B[b] along axis 1 (position p takes p + by_B[b], mod T):
  with by_B = `first_real(mask)`, every row's real tokens start at 0 (left padding moves to
  the end); rotating by T - by_B undoes it."""
  t = x_BT.shape[1]
  index_BT = (jnp.arange(t, dtype=jnp.int32)[None, :] + by_B[:, None]) % t
  index = index_BT.reshape(index_BT.shape + (1,) * (x_BT.ndim - 2))
  return jnp.take_along_axis(x_BT, index, axis=1)


def _fused_spec(sharding: jax.sharding.NamedSharding, kv_heads: int
                ) -> jax.sharding.NamedSharding:
  """[B, T, heads, H] split as cuDNN's partitioner takes it: rows as the activations, heads
  over 'tp' when free and dividing the kv heads (q, k and v must share one spec)."""
  mesh = sharding.mesh
  batch_axes = spec_axes(sharding.spec[0] if len(sharding.spec) else None)
  tp = mesh.shape.get("tp", 1)
  heads = "tp" if tp > 1 and "tp" not in batch_axes and kv_heads % tp == 0 else None
  batch = tuple(batch_axes) if batch_axes else None
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(batch, None, heads, None))


def einsum_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array,
                     mask_BS: jax.Array, *, query_chunk: int = 2048) -> jax.Array:
  """The XLA path: no [B, T, S] mask input; causal & key masks are built from iotas inside.

  Args:
    q_BTNH, k_BSKH, v_BSKH, mask_BS: as in `causal_attention`, except that there may be
      more keys than queries (S >= T): the queries are then the last T of the S positions
      (query t sits at key index S - T + t and attends keys s <= S - T + t with mask_BS[b,
      s]), as when T new tokens continue a cached prefix (chunked prefill).
    query_chunk: when T is a larger multiple of it, queries go through `lax.map` in chunks
      of this many, each chunk rematerialised in the backward pass, so the float32 scores
      exist for one chunk at a time ([B, N, chunk, S] instead of [B, N, T, S]).
  """
  b, t, n, h = q_BTNH.shape
  k, s = k_BSKH.shape[2], k_BSKH.shape[1]
  if n % k:
    raise ValueError(f"query heads {n} are not a multiple of kv heads {k}")
  if s < t:
    raise ValueError(f"einsum attention: {s} keys for {t} queries (need at least as many)")
  q_BTKGH = q_BTNH.reshape(b, t, k, n // k, h)

  def chunk(q_BCKGH: jax.Array, start: jax.Array) -> jax.Array:
    c = q_BCKGH.shape[1]
    scores_BKGCS = jnp.einsum("BCKGH,BSKH->BKGCS", q_BCKGH, k_BSKH,
                              preferred_element_type=jnp.float32) * (h ** -0.5)
    query_C = (s - t) + start + jax.lax.iota(jnp.int32, c)
    causal_CS = query_C[:, None] >= jax.lax.iota(jnp.int32, s)[None, :]
    allowed_BCS = causal_CS[None, :, :] & mask_BS.astype(bool)[:, None, :]
    scores_BKGCS = jnp.where(allowed_BCS[:, None, None, :, :], scores_BKGCS, MASKED)
    probs_BKGCS = jax.nn.softmax(scores_BKGCS, axis=-1).astype(v_BSKH.dtype)
    return jnp.einsum("BKGCS,BSKH->BCKGH", probs_BKGCS, v_BSKH)

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
                     block_size: int = 512, backward_block_size: int = 1024,
                     interpret: bool = False) -> jax.Array:
  """The Pallas TPU splash-attention path, run per device under `jax.shard_map`.

  The causal mask is the kernel's static block-sparse CausalMask (blocks above the diagonal
  are skipped). Padding enters as segment ids: every query is segment 1 and a key is segment
  1 iff it is a real token, so each query sees exactly the real keys at or before it (the
  einsum path's rule, for right-padding queries too). T is padded inside to a multiple of
  the block; the padded keys are segment 0 and the padded queries are sliced off.

  Batch rows are split over the mesh axes of `sharding.spec[0]`; heads over 'tp' when the
  mesh has it (unused by the batch) and it divides N. When 'tp' divides N but not K, kv
  heads are repeated so that every tp shard holds whole groups.

  Args:
    q_BTNH, k_BTKH, v_BTKH, mask_BT: as in `causal_attention`.
    sharding: the sharding of q_BTNH; its mesh is the shard_map mesh.
    block_size: the forward kernel's q and kv tile, clipped to T rounded up to 128.
    backward_block_size: the fused backward kernel's q and kv tile (clipped likewise). The
      fused kernel computes dq, dk and dv in one pass (5 matmuls a block against 7 for the
      separate dq and dkv kernels) and keeps one dq partial per kv block: at T=16k with 32
      heads of 128, 2 GiB per row with 1024-wide blocks (4 GiB with 512). That grows with
      T^2, so beyond `FUSED_MAX_KV_BLOCKS` kv blocks (T > 16k at 1024) the backward runs
      the separate dq and dkv kernels on `block_size` tiles instead.
    interpret: run the kernel in Pallas interpret mode (CPU tests).
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  b, t, n, h = q_BTNH.shape
  k = k_BTKH.shape[2]
  if n % k:
    raise ValueError(f"query heads {n} are not a multiple of kv heads {k}")
  for size in (block_size, backward_block_size):
    if size % LANES:
      raise ValueError(f"splash block size {size} is not a multiple of {LANES}")
  block, bwd_block, t_pad = _tiling(t, block_size, backward_block_size)

  mesh = sharding.mesh
  batch_axes = spec_axes(sharding.spec[0] if len(sharding.spec) else None)
  rows_per = int(np.prod([mesh.shape[a] for a in batch_axes], dtype=np.int64))
  if b % rows_per:
    raise ValueError(f"attention batch {b} does not divide over mesh axes {batch_axes} "
                     f"({rows_per} shards)")
  head_axis = None
  tp = mesh.shape.get("tp", 1)
  if tp > 1 and "tp" not in batch_axes and n % tp == 0:
    head_axis = "tp"
    if k % tp:
      # lcm(K, tp) divides N; repeat each kv head so that the shards hold whole groups.
      repeat = tp // np.gcd(k, tp)
      k_BTKH = jnp.repeat(k_BTKH, repeat, axis=2)
      v_BTKH = jnp.repeat(v_BTKH, repeat, axis=2)

  # The kernel takes no scale: fold head_dim**-0.5 into q (in float32, then q's dtype).
  q_BTNH = (q_BTNH.astype(jnp.float32) * (h ** -0.5)).astype(q_BTNH.dtype)
  pad = ((0, 0), (0, t_pad - t), (0, 0), (0, 0))
  q_BTNH, k_BTKH, v_BTKH = (jnp.pad(x, pad) for x in (q_BTNH, k_BTKH, v_BTKH))
  kv_segment_BT = jnp.pad(mask_BT.astype(jnp.int32), ((0, 0), (0, t_pad - t)))
  if fused_backward(t, block_size, backward_block_size):
    blocks = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                           block_q_dkv=bwd_block, block_kv_dkv=bwd_block,
                           block_kv_dkv_compute=bwd_block, use_fused_bwd_kernel=True)
  else:
    blocks = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                           block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                           block_q_dq=block, block_kv_dq=block)
  n_local = n // (tp if head_axis else 1)

  def per_device(q_BTNH, k_BTKH, v_BTKH, kv_segment_BT):
    causal = sm.MultiHeadMask([sm.CausalMask((t_pad, t_pad))] * n_local)
    # The output and log-sum-exp the backward kernel reads carry a name, so a remat policy
    # can keep them instead of rerunning the forward kernel (transformer.REMAT_POLICIES).
    kernel = sk.make_splash_mha(causal, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                interpret=interpret,
                                residual_checkpoint_name=SPLASH_RESIDUALS)

    def one_row(q_NTH, k_KTH, v_KTH, kv_segment_T):
      segments = sk.SegmentIds(q=jnp.ones_like(kv_segment_T), kv=kv_segment_T)
      return kernel(q_NTH, k_KTH, v_KTH, segments)

    out_BNTH = jax.vmap(one_row)(*(jnp.swapaxes(x, 1, 2) for x in (q_BTNH, k_BTKH, v_BTKH)),
                                 kv_segment_BT)
    return jnp.swapaxes(out_BNTH, 1, 2)

  batch = tuple(batch_axes) if batch_axes else None
  spec_BTNH = jax.sharding.PartitionSpec(batch, None, head_axis, None)
  out_BTNH = jax.shard_map(
      per_device, mesh=mesh,
      in_specs=(spec_BTNH, spec_BTNH, spec_BTNH, jax.sharding.PartitionSpec(batch, None)),
      out_specs=spec_BTNH, check_vma=False)(q_BTNH, k_BTKH, v_BTKH, kv_segment_BT)
  return out_BTNH[:, :t]


def splash_flops(batch: int, seq_len: int, num_heads: int, head_dim: int, *,
                 backward: bool = False, block_size: int = 512,
                 backward_block_size: int = 1024) -> int:
  """Matmul FLOPs the splash kernels execute (the compiler's cost analysis counts none).

  A Pallas kernel is an opaque custom call to XLA's cost analysis, so a compiled program's
  FLOPs miss attention; add these. The kernel computes every block that holds at least one
  query-key pair on or below the causal diagonal in full (`splash_block_flops`). Forward:
  QK^T and PV (2 matmuls per block). Backward, fused (`fused_backward`): QK^T, dO V^T,
  dS K, P^T dO and dS^T Q (5) on the backward tiles; else the dq kernel recomputes QK^T and
  does dO V^T, dS K (3) and the dkv kernel recomputes QK^T and does dO V^T, P^T dO, dS^T Q
  (4), on the forward tiles.

  Args:
    batch, seq_len, num_heads, head_dim: query shapes (all query heads; GQA does not
      change the count).
    backward: also count the backward kernel.
    block_size, backward_block_size: as given to `splash_attention`.
  """
  block, bwd_block, t_pad = _tiling(seq_len, block_size, backward_block_size)
  flops = 2 * splash_block_flops(batch, t_pad, num_heads, head_dim, block, block)
  if backward and fused_backward(seq_len, block_size, backward_block_size):
    flops += 5 * splash_block_flops(batch, t_pad, num_heads, head_dim, bwd_block, bwd_block)
  elif backward:
    flops += 7 * splash_block_flops(batch, t_pad, num_heads, head_dim, block, block)
  return flops


# The fused backward keeps one dq partial per kv block: beyond this many blocks the separate
# dq and dkv kernels are used (their temporaries do not grow with the number of blocks).
FUSED_MAX_KV_BLOCKS = 16


def fused_backward(seq_len: int, block_size: int = 512, backward_block_size: int = 1024
                   ) -> bool:
  """Whether `splash_attention` differentiates through the fused backward kernel."""
  _, bwd_block, t_pad = _tiling(seq_len, block_size, backward_block_size)
  return t_pad // bwd_block <= FUSED_MAX_KV_BLOCKS


def splash_block_flops(batch: int, t_pad: int, num_heads: int, head_dim: int, block_q: int,
                       block_kv: int) -> int:
  """FLOPs of one [T, T] x [T, H] matmul over the causal blocks a splash kernel computes:
  the (q block, kv block) tiles of a padded length `t_pad` that hold a key at or before
  some query of the tile."""
  area = sum(min(t_pad // block_kv, ((i + 1) * block_q - 1) // block_kv + 1)
             for i in range(t_pad // block_q)) * block_q * block_kv
  return 2 * area * head_dim * num_heads * batch


# Splash tiles must be multiples of the TPU lane width.
LANES = 128


def _tiling(t: int, block_size: int, backward_block_size: int) -> tuple[int, int, int]:
  """(block, backward block, padded length): each block clipped to T rounded up to the
  lane width, T padded to a multiple of both."""
  block = min(block_size, _round_up(t, LANES))
  bwd_block = min(backward_block_size, _round_up(t, LANES))
  return block, bwd_block, _round_up(t, math.lcm(block, bwd_block))


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def spec_axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry (None, a name, or a tuple of names) as a tuple of names."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)
