"""Decode attention over a paged KV cache (`paged_attention`): one new token per row is
written into its page of the pool [L, D, P, C, 2K, H] and attends over the row's positions
up to its own.

- "gather": XLA; every row's first `view_pages` pages gathered into a dense view.
- "ragged": JAX's Pallas TPU ragged paged attention kernel, per device under
  `jax.shard_map`, reading each row's actual length.
- "triton": JAX's Pallas GPU (Triton) paged attention kernel
  (`paged_triton.triton_decode_attention`), reading each row's actual length straight from
  the pool (no gather); on a CPU it runs in Pallas interpret mode, which is how the tests
  compare it with "gather".
- "auto": `paged_impl`: "ragged" on TPUs, "triton" on NVIDIA GPUs, else "gather";
  `AUTO_IMPL` (from $JAXRL_SCALE_DECODE_ATTENTION) overrides it.

The full-sequence attention (prefill, training) is `models.attention`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import paged_triton
from jaxrl_scale.models.attention import LANES, MASKED, mesh_platform

PAGED_IMPLS = ("auto", "gather", "ragged", "triton")

# What "auto" runs instead of the platform's choice, when set (None: by platform). A user
# sets it for a run with the environment variable ENV_VAR (e.g. "gather" on a GPU where the
# Triton kernel fails or is slower; on an H100 it ran 1.8x the gather at batch 256). The
# tests set "triton" to run the GPU kernel on CPU (interpret mode) against the gather reference;
# benchmarks/sampler/sampler_bench.py sets "gather" on a GPU to measure the kernel against it. It is
# read when a decode program is traced, so set it before building a Sampler
# (`decode.decode_program` keys its compiled programs on it).
ENV_VAR = "JAXRL_SCALE_DECODE_ATTENTION"
AUTO_IMPL: str | None = os.environ.get(ENV_VAR) or None


def interleave_kv(k_BTKH: jax.Array, v_BTKH: jax.Array) -> jax.Array:
  """[..., K, H] keys and values -> [..., 2K, H], key of kv head k at 2k and its value at
  2k + 1: the page pool's head axis (the layout of JAX's ragged paged attention kernel)."""
  kv = jnp.stack([k_BTKH, v_BTKH], axis=-2)
  return kv.reshape(*k_BTKH.shape[:-2], 2 * k_BTKH.shape[-2], k_BTKH.shape[-1])


def paged_attention(q_B1NH: jax.Array, k_B1KH: jax.Array, v_B1KH: jax.Array,
                    kv_LDPCXH: jax.Array, layer: jax.Array, table_BM: jax.Array,
                    pos_B: jax.Array, write_B: jax.Array, *, view_pages: int,
                    impl: str = "auto", mesh: jax.sharding.Mesh | None = None,
                    view: tuple[jax.Array, jax.Array] | None = None,
                    ) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array] | None]:
  """One decode token per row: writes its key and value into the row's page for pos_B,
  then attends over the row's positions <= pos_B.

  The pool is [L, D, P, C, X, H]: L layers, D data shards, P pages per shard (the last one
  the null page), C positions per page, X = 2K heads (`interleave_kv`), H head_dim. Row b
  lives on shard b // (B / D) and its table row lists local page ids in position order, so
  position p is at page table_BM[b, p // C], offset p % C.

  Args:
    q_B1NH, k_B1KH, v_B1KH: this layer's projections of the one new token (RoPE applied).
    kv_LDPCXH: the stacked page pool.
    layer: int32 scalar, which layer.
    table_BM: int32 page table, local page ids.
    pos_B: int32 position of the new token.
    write_B: bool, whether the row writes (inactive rows write nothing: their pages may
      already belong to another sequence). Writes to the null page are dropped too.
    view_pages: static; for "gather", the pages read per row (covering every live row's
      positions). "ragged" reads each row's own pos_B + 1 positions; "triton" too, within
      the first `view_pages` pages (inactive rows read nothing and get zeros).
    impl: "gather" (XLA: the rows' pages gathered into a dense view; CPU and GPU),
      "ragged" (the Pallas TPU ragged paged attention kernel per device under
      `jax.shard_map`; needs `mesh`), "triton" (the Pallas GPU paged attention kernel over
      the pool; interpret mode off GPUs), or "auto" (`paged_impl`).
    mesh: the generator mesh: slots and pool shards over 'data', heads over 'tp'.
    view: for "gather" only, this layer's `paged_view` (k_BKHS, v_BKSH): each row's pages
      already gathered, by the caller, once for several steps. The new key and value are
      written into it as well as into the pool, and attention reads it instead of
      gathering the pages again.

  Returns:
    (out_B1NH in q's dtype, kv_LDPCXH updated, the view updated or None).
  """
  if impl not in PAGED_IMPLS:
    raise ValueError(f"paged attention impl {impl!r} is not one of {', '.join(PAGED_IMPLS)}")
  page_size = kv_LDPCXH.shape[3]
  if impl == "auto":
    impl = paged_impl(mesh, q_B1NH.shape[-1], page_size)
  if impl == "ragged" and mesh is None:
    raise ValueError("paged attention impl 'ragged' needs the generator mesh")
  if impl in ("ragged", "triton") and view is not None:
    raise ValueError(f"paged attention impl {impl!r} reads the pool itself; it takes no view")
  if impl == "triton":
    # Interpret mode (off GPUs) runs any shape, but not without the backend either.
    why = (paged_triton.UNAVAILABLE if _interpret(mesh)
           else triton_unsupported(q_B1NH.shape[-1], page_size))
    if why:
      raise ValueError(f"paged attention impl 'triton': {why}")
  return _paged(q_B1NH, interleave_kv(k_B1KH[:, 0], v_B1KH[:, 0]), kv_LDPCXH, layer, table_BM,
                pos_B, write_B, mesh, impl, view_pages, view)


def paged_impl(mesh: jax.sharding.Mesh | None, head_dim: int,
               page_size: int | None = None) -> str:
  """What `paged_attention(impl="auto")` runs on `mesh` (`AUTO_IMPL` when set): the ragged
  kernel on TPUs when head_dim is a multiple of the 128 lanes it works in (as in every model
  it is meant for); the Triton kernel on NVIDIA GPUs when head_dim and page_size suit it
  (`triton_unsupported`; page_size None: not checked); else XLA's gather."""
  if AUTO_IMPL is not None:
    if AUTO_IMPL not in PAGED_IMPLS[1:]:
      raise UserError(f"{ENV_VAR}={AUTO_IMPL}: decode attention must be one of "
                      f"{', '.join(PAGED_IMPLS[1:])}")
    return AUTO_IMPL
  platform = mesh_platform(mesh)
  if platform == "tpu" and head_dim % LANES == 0:
    return "ragged"
  if platform == "gpu" and not triton_unsupported(head_dim, page_size):
    return "triton"
  return "gather"


def _interpret(mesh: jax.sharding.Mesh | None) -> bool:
  """Whether the Triton kernel runs in Pallas interpret mode: anywhere but on a GPU."""
  return (mesh_platform(mesh) or jax.default_backend()) != "gpu"


def triton_unsupported(head_dim: int, page_size: int | None) -> str:
  """Why the Triton kernel cannot run ('' when it can): this jax has no Pallas Triton
  backend (`paged_triton.UNAVAILABLE`), or it cannot compile for these shapes (Triton tiles
  are powers of two, and its dots need at least 16 along the head dim)."""
  if paged_triton.UNAVAILABLE:
    return paged_triton.UNAVAILABLE
  if head_dim < 16 or head_dim & (head_dim - 1):
    return f"head_dim {head_dim} is not a power of two >= 16"
  if page_size is not None and page_size & (page_size - 1):
    return f"sampler.page_size {page_size} is not a power of two"
  return ""


def gather_decode_attention(q_BNH: jax.Array, pages_BVCXH: jax.Array,
                            kv_lens_B: jax.Array) -> jax.Array:
  """The XLA read for one query per row: row b attends the first kv_lens_B[b] positions of
  its gathered pages (V pages of C positions, keys at even heads and values at odd)."""
  b, v, c, x, h = pages_BVCXH.shape
  kv_B2KSH = (pages_BVCXH.astype(q_BNH.dtype).reshape(b, v * c, x // 2, 2, h)
              .transpose(0, 3, 2, 1, 4))  # the layout of `gather_kv`
  return dense_decode_attention(q_BNH, kv_B2KSH[:, 0].swapaxes(2, 3), kv_B2KSH[:, 1],
                                kv_lens_B)


def gather_kv(pages_PCXH: jax.Array, table_BV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Pages [P, C, 2K, H] (keys at even heads, values at odd), rows' page ids [B, V] -> dense
  keys [B, K, H, V*C] and values [B, K, V*C, H].

  Kv heads before positions, so each (row, head) is one contiguous matmul operand, and both
  products in plain (row-major, untransposed) form: queries [G, H] x keys [H, S], then
  probabilities [G, S] x values [S, H] (on a 2-core CPU the scores' dot was 1.4x faster than
  over keys [S, H], in a microbenchmark of one layer's write and attention per step).
  The keys and values are taken apart before the gather (a strided operand XLA reads in the
  gather itself), then each is gathered and transposed: on a 2-core CPU 2.3x faster than
  gathering whole pages and then splitting them (8 layers' views at 64 rows x 192
  positions, 25 MB each: 47 against 111 ms; results README)."""
  p, c, x, h = pages_PCXH.shape
  b, v = table_BV.shape
  kv_PCK2H = pages_PCXH.reshape(p, c, x // 2, 2, h)
  k_BKHS = kv_PCK2H[:, :, :, 0][table_BV].transpose(0, 3, 4, 1, 2).reshape(b, x // 2, h, v * c)
  v_BKSH = kv_PCK2H[:, :, :, 1][table_BV].transpose(0, 3, 1, 2, 4).reshape(b, x // 2, v * c, h)
  return k_BKHS, v_BKSH


def dense_decode_attention(q_BNH: jax.Array, k_BKHS: jax.Array, v_BKSH: jax.Array,
                           kv_lens_B: jax.Array) -> jax.Array:
  """One query per row over dense keys [B, K, H, S] and values [B, K, S, H] (`gather_kv`):
  row b attends its first kv_lens_B[b] positions."""
  b, n, h = q_BNH.shape
  k, s = k_BKHS.shape[1], k_BKHS.shape[3]
  q_BKGH = q_BNH.reshape(b, k, n // k, h)
  scores_BKGS = jnp.einsum("BKGH,BKHS->BKGS", q_BKGH, k_BKHS.astype(q_BNH.dtype),
                           preferred_element_type=jnp.float32) * (h ** -0.5)
  allowed_BS = jnp.arange(s, dtype=jnp.int32)[None, :] < kv_lens_B[:, None]
  scores_BKGS = jnp.where(allowed_BS[:, None, None, :], scores_BKGS, MASKED)
  probs_BKGS = jax.nn.softmax(scores_BKGS, axis=-1).astype(q_BNH.dtype)
  out_BKGH = jnp.einsum("BKGS,BKSH->BKGH", probs_BKGS, v_BKSH.astype(q_BNH.dtype))
  return out_BKGH.reshape(b, n, h)


def paged_view(kv_LDPCXH: jax.Array, layer: int, table_BM: jax.Array, view_pages: int, *,
               mesh: jax.sharding.Mesh | None = None) -> tuple[jax.Array, jax.Array]:
  """Layer `layer`'s keys and values of each row's first `view_pages` pages as dense arrays
  (k_BKHS, v_BKSH), S = view_pages * C: the working copy that `paged_attention(view=...)`
  reads. Gathering it once for a chunk of decode steps replaces a gather and a transpose
  per step and layer (on a 2-core CPU, +7% decode throughput for a 41.7M model; README).
  Rows and kv heads are split over the mesh as in `paged_attention`."""
  l, d, p, c, x, h = kv_LDPCXH.shape
  b = table_BM.shape[0]
  if b % d:
    raise ValueError(f"paged view: rows {b} do not divide over {d} pool shards")

  def local(kv_LDPCXH, table_BM):
    bl, dl, pl = table_BM.shape[0], kv_LDPCXH.shape[1], kv_LDPCXH.shape[2]
    # The layer's shards' pages as one set [D*P, C, 2K, H] (a reshape of leading dims): row b
    # reads its shard b // (B / D)'s pages, offset by shard * P.
    shard_B = jnp.arange(bl, dtype=jnp.int32) // (bl // dl)
    return gather_kv(kv_LDPCXH[layer].reshape(dl * pl, *kv_LDPCXH.shape[3:]),
                     shard_B[:, None] * pl + table_BM[:, :view_pages])

  if mesh is None or mesh.devices.size == 1:
    return local(kv_LDPCXH, table_BM)
  rows, heads = _paged_axes(mesh, x // 2)
  spec = jax.sharding.PartitionSpec
  view_spec = spec(rows, heads, None, None)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(spec(None, rows, None, None, heads, None), spec(rows, None)),
                       out_specs=(view_spec, view_spec), check_vma=False)(kv_LDPCXH, table_BM)


def _paged_axes(mesh: jax.sharding.Mesh, kv_heads: int) -> tuple[str | None, str | None]:
  """(rows axis, heads axis) of paged decode on `mesh`: rows over 'data', heads over 'tp'
  when it divides the kv heads (and so the query heads, a multiple of them)."""
  data, tp = mesh.shape.get("data", 1), mesh.shape.get("tp", 1)
  heads = "tp" if tp > 1 and kv_heads % tp == 0 else None
  return ("data" if data > 1 else None), heads


# KV positions one ragged-kernel block reads (its pages are double-buffered in VMEM) and the
# queries (one per decoding row) one block holds.
RAGGED_KV_TOKENS_PER_BLOCK = 1024
RAGGED_QUERIES_PER_BLOCK = 32


def _paged(q_B1NH: jax.Array, new_BXH: jax.Array, kv_LDPCXH: jax.Array, layer: jax.Array,
           table_BM: jax.Array, pos_B: jax.Array, write_B: jax.Array,
           mesh: jax.sharding.Mesh | None, impl: str, view_pages: int,
           view: tuple[jax.Array, jax.Array] | None,
           ) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array] | None]:
  """Per device: the write, then the read ("ragged": JAX's TPU kernel; "triton": JAX's GPU
  kernel, `paged_triton`; "gather": `gather_decode_attention` over the rows' first
  `view_pages` pages, or `dense_decode_attention` over a given `paged_view`).

  Under `jax.shard_map` (when there is a mesh) each device holds its data shard's rows and
  pool, heads split over 'tp' when it divides the kv heads (the pool's 2K axis then splits
  into whole key/value pairs). For the kernel, the local pool [L, 1, P, C, 2K, H] is viewed
  as L * P pages [L*P, C, 2K, H] (a reshape of leading dims: a bitcast on TPU) and layer
  `layer`'s pages are read by offsetting the page table by layer * P, so no layer slice is
  copied out of the pool.
  """
  b, _, _, h = q_B1NH.shape
  l, d, p, c, x, _ = kv_LDPCXH.shape
  width = table_BM.shape[1]
  interpret = _interpret(mesh)
  data = mesh.shape.get("data", 1) if mesh is not None else 1
  if (mesh is not None and d != data) or b % d:
    raise ValueError(f"paged attention: pool shards {d}, rows {b} and the mesh's data axis "
                     f"({data}) do not match")

  def local(q_B1NH, new_BXH, kv_LDPCXH, layer, table_BM, pos_B, write_B, view):
    # Without a mesh all D shards are here: row b holds shard b // (B / D)'s pages.
    bl, dl, xl = q_B1NH.shape[0], kv_LDPCXH.shape[1], kv_LDPCXH.shape[4]
    shard_B = jnp.arange(bl, dtype=jnp.int32) // (bl // dl)
    col_B = pos_B // c
    page_B = jnp.take_along_axis(table_BM, jnp.minimum(col_B, width - 1)[:, None],
                                 axis=1)[:, 0]
    # Inactive rows, positions past the table and the null page (p - 1: an unassigned
    # entry) write nothing: their index goes past the pool and the scatter drops it.
    keep_B = write_B & (col_B < width) & (page_B < p - 1)
    new_BXH = new_BXH.astype(kv_LDPCXH.dtype)
    lens_B = (pos_B + 1).astype(jnp.int32)
    if impl == "gather":
      # Indexing the pool [L, D, P, ...] itself: on CPU a reshaped view of the scan-carried
      # pool makes XLA copy the whole pool every layer.
      kv_LDPCXH = kv_LDPCXH.at[layer, shard_B, jnp.where(keep_B, page_B, p), pos_B % c].set(
          new_BXH, mode="drop")
      if view is None:
        pages_BVCXH = kv_LDPCXH[layer][shard_B[:, None], table_BM[:, :view_pages]]
        out_BNH = gather_decode_attention(q_B1NH[:, 0], pages_BVCXH, lens_B)
      else:
        # The view is the row's positions in order: the new token goes at pos_B (rows that
        # do not write, or are past the view, drop it).
        k_BKHS, v_BKSH = view
        at_B = jnp.where(write_B, pos_B, v_BKSH.shape[2])
        rows_B = jnp.arange(bl, dtype=jnp.int32)
        new_B2KH = new_BXH.reshape(bl, xl // 2, 2, h).astype(v_BKSH.dtype)
        k_BKHS = k_BKHS.at[rows_B, :, :, at_B].set(new_B2KH[:, :, 0], mode="drop")
        v_BKSH = v_BKSH.at[rows_B, :, at_B].set(new_B2KH[:, :, 1], mode="drop")
        view = (k_BKHS, v_BKSH)
        out_BNH = dense_decode_attention(q_B1NH[:, 0], k_BKHS, v_BKSH, lens_B)
      return out_BNH[:, None].astype(q_B1NH.dtype), kv_LDPCXH, view
    if impl == "triton":
      # The same write as "gather"; then the kernel reads the pool [L, D, P, ...] viewed as
      # L * D * P pages (a bitcast), row b's pages of this layer offset by
      # (layer * D + shard) * P, so neither a layer slice nor the rows' pages are copied.
      kv_LDPCXH = kv_LDPCXH.at[layer, shard_B, jnp.where(keep_B, page_B, p), pos_B % c].set(
          new_BXH, mode="drop")
      base_B = (layer * dl + shard_B) * p
      out_BNH = paged_triton.triton_decode_attention(
          q_B1NH[:, 0], kv_LDPCXH.reshape(l * dl * p, c, xl, h),
          base_B[:, None] + table_BM[:, :view_pages], jnp.where(write_B, lens_B, 0),
          interpret=interpret)
      return out_BNH[:, None].astype(q_B1NH.dtype), kv_LDPCXH, None
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    kv_QCXH = kv_LDPCXH.reshape(l * p, c, xl, h)  # one pool shard per device: dl == 1
    base = layer * p
    kv_QCXH = kv_QCXH.at[jnp.where(keep_B, base + page_B, l * p), pos_B % c].set(
        new_BXH, mode="drop")
    out_BNH = rpa.ragged_paged_attention(
        q_B1NH[:, 0], kv_QCXH, lens_B, (base + table_BM).astype(jnp.int32),
        jnp.arange(bl + 1, dtype=jnp.int32), jnp.full((1,), bl, jnp.int32), sm_scale=h ** -0.5,
        num_kv_pages_per_block=max(1, min(width, RAGGED_KV_TOKENS_PER_BLOCK // c)),
        num_queries_per_block=min(bl, RAGGED_QUERIES_PER_BLOCK))
    return out_BNH[:, None].astype(q_B1NH.dtype), kv_QCXH.reshape(kv_LDPCXH.shape), None

  args = (q_B1NH, new_BXH, kv_LDPCXH, layer, table_BM, pos_B, write_B, view)
  if mesh is None or mesh.devices.size == 1:
    if impl == "ragged" and d > 1:
      raise ValueError("paged attention impl 'ragged' needs one pool shard per device")
    return local(*args)
  rows, heads = _paged_axes(mesh, x // 2)
  spec = jax.sharding.PartitionSpec
  pool_spec = spec(None, rows, None, None, heads, None)
  view_spec = None if view is None else (spec(rows, heads, None, None),) * 2
  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(spec(rows, None, heads, None), spec(rows, heads, None), pool_spec, spec(),
                spec(rows, None), spec(rows), spec(rows), view_spec),
      out_specs=(spec(rows, None, heads, None), pool_spec, view_spec), check_vma=False)(*args)
