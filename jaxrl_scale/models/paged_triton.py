"""Decode attention on NVIDIA GPUs: paged attention in a Pallas GPU (Triton) kernel read
straight from the sampler's page pool, after JAX's (`paged_attention.paged_attention(
impl="triton")`).

JAX's wrapper (`jax.experimental.pallas.ops.gpu.paged_attention.paged_attention`) wants
separate key and value pools [K, pages, C, H]. Ours interleaves them, [pages, C, 2K, H]
(keys at even heads, values at odd: the TPU kernel's layout, `paged_attention.interleave_kv`),
and splitting or transposing it would copy the whole pool every step, more than the gather
this replaces. So this module runs its own `pallas_call`, whose block specs pick kv head
k's keys (head 2k) and values (head 2k + 1) out of the one pool: the pool goes in twice as
the same buffer and stays where it is. As in JAX's wrapper, a row's pages split into parts
run in parallel only as far as a small grid needs (`num_splits`), their partial results
combined at the end (here in float32); with one split (the grid big enough: Qwen3-0.6B at
batch 256 on an H100) the kernel normalises and writes the output in the queries' dtype
itself, and nothing is combined.

The kernel (`_head_kernel`) runs JAX's kernel body's loop in our own body, one program per
(row, kv head, split of the row's pages): each page gives it that head's 256-byte key and
value rows at the pool's stride (a page of Qwen3-0.6B is 64 KB; one program reads 8 KB of
it as 32 pieces), keys and values as two tiles. A Triton dot takes 16 rows at least, so a
GQA group of fewer query heads (Qwen3: 2) is loaded as 16 rows from the row's [N, H]
queries, those past the group masked, and its results stored likewise: the padding lives
in registers, not in a padded copy of the queries and an 8x float32 output in memory (JAX's
wrapper pads both).

It has no softmax scale: queries are scaled by head_dim ** -0.5 before it. It masks each
row's positions >= its length and skips pages past it; a row of length 0 reads nothing and
gets zeros. Sliding windows do not exist in our model families (the loader refuses them)
and neither do logit softcaps, so neither is handled.

Measured and removed: on one H100 (jax 0.11.2, 2026-11-28,
benchmarks/results/gpu_h100_2026-11-28b/paged_decode_check.json, 50 reads per timed call,
Qwen3-0.6B's attention shape, 640 positions) this kernel at its defaults took 168.6 us at
batch 256 (52.7% of HBM bandwidth) and 83.9 us at 64. A whole-page kernel ("page": one
program per row, every kv head's keys of a page dotted with a block-diagonal mask) took
169.9 and 76.7 us at its best configurations (within the 80-88 us this kernel took at
batch 64 over three machine starts), and this kernel loading a step's keys and values as
one tile took 121-429 us (1.4-2.5x its defaults' time). Both were removed (git history:
commits ba80656 and 11d8b78).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

# JAX deprecated its Pallas Triton backend in 0.11 ("will be removed in a future JAX
# version"; still in 0.12.0.1). Without it decode on a GPU gathers instead
# (`paged_attention.triton_unsupported` names why); the rest of the package imports as ever.
try:
  from jax.experimental.pallas import triton as plgpu
  UNAVAILABLE = ""
except ImportError as e:  # pragma: no cover - only a jax without the backend
  plgpu = None
  UNAVAILABLE = (f"jax {jax.__version__} has no Pallas Triton backend "
                 f"(jax.experimental.pallas.triton: {e})")

# A masked score: JAX's paged-attention kernels' value (finite, so that a block with every
# position masked keeps its softmax sums finite).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

# KV positions one kernel step loads per (row, kv head), the most splits of a row's pages
# run in parallel (JAX's default k_splits), and query heads per block (the smallest a Triton
# dot takes; a GQA group of fewer is padded). Tuned on an H100 (2026-11-27, jax 0.11.2,
# benchmarks/gpu/paged_decode_check.py --sweep at Qwen3-0.6B's attention shape, batch 64 and
# 256, 640 positions; benchmarks/results/gpu_h100_2026-11-27*/): 64 positions, 4 warps and
# one stage were the fastest at both batches in the first sweep (79.8 / 184.0 us against
# 92.9 / 226.3 us for JAX's 128 positions, 8 warps, 2 stages) and within 8% of the fastest
# in the second (the run-to-run spread); 32 positions were no faster. The sweep of
# 2026-11-28 (benchmarks/results/gpu_h100_2026-11-28b/) confirmed them (64 positions, 4
# warps, 1 stage, a target of 1024 programs): nothing it ran was faster at batch 256, nor
# faster at 64 by more than the spread between machine starts.
KV_TOKENS_PER_BLOCK = 64
MAX_SPLITS = 16
QUERY_HEADS_PER_BLOCK = 16
# Grid programs (rows x kv heads x query-head blocks x splits) to aim for: a row's pages are
# split only while the grid has fewer programs than this (about 8 per SM of an H100, enough
# loads in flight to keep HBM busy). With several splits, each writes a float32 partial
# output of the row's query heads, live pages or not, which the combine reads back: with a
# split per 128-position block (and JAX's 16 padded rows a kv head), Qwen3-0.6B at batch
# 256 and 128 + 512 tokens spent a fifth of its decode bytes on them (`plan --topology
# h100`). On the H100, 1 and 4096 were within the sweep's spread of 1024 at both batches.
TARGET_PROGRAMS = 1024
# Triton's launch parameters for the kernel (JAX's wrapper: 8 warps, 2 stages; tuned as
# above).
NUM_WARPS = 4
NUM_STAGES = 1


def triton_decode_attention(q_BNH: jax.Array, kv_QCXH: jax.Array, table_BM: jax.Array,
                            lens_B: jax.Array, *, interpret: bool = False,
                            kv_tokens_per_block: int | None = None,
                            max_splits: int = MAX_SPLITS,
                            target_programs: int | None = None,
                            num_warps: int | None = None,
                            num_stages: int | None = None) -> jax.Array:
  """One query per row over its pages of an interleaved pool.

  Args:
    q_BNH: the rows' queries (RoPE applied, unscaled), N = a multiple of K heads.
    kv_QCXH: Q pages of C positions, X = 2K heads: key of kv head k at 2k, value at 2k + 1.
    table_BM: int32 page ids into Q in position order: position p of row b is at page
      table_BM[b, p // C], offset p % C. Every entry must lie in [0, Q) (pages past a row's
      length are loaded a block at a time, then masked).
    lens_B: int32 positions each row attends, [0, lens_B[b]) (0: none; zeros out).
    interpret: run the kernel in Pallas interpret mode (any platform; for tests on CPU).
    kv_tokens_per_block, max_splits, target_programs: block sizes and how far a row's
      pages split (see the module constants and `num_splits`).
    num_warps, num_stages: Triton's launch parameters.
    Each of kv_tokens_per_block, target_programs, num_warps and num_stages left None is the
    module's constant when traced (`KV_TOKENS_PER_BLOCK`, `TARGET_PROGRAMS`, `NUM_WARPS`,
    `NUM_STAGES`), which a benchmark may set before it compiles.

  Returns:
    out_BNH in q's dtype.
  """
  if UNAVAILABLE:
    raise ValueError(f"triton paged attention: {UNAVAILABLE}")
  b, n, h = q_BNH.shape
  _, c, x, _ = kv_QCXH.shape
  if x % 2 or n % (x // 2):
    raise ValueError(f"triton paged attention: {n} query heads do not group over "
                     f"{x // 2} kv heads")
  kv_tokens_per_block = (KV_TOKENS_PER_BLOCK if kv_tokens_per_block is None
                         else kv_tokens_per_block)
  target_programs = TARGET_PROGRAMS if target_programs is None else target_programs
  num_warps = NUM_WARPS if num_warps is None else num_warps
  num_stages = NUM_STAGES if num_stages is None else num_stages
  pages_per_block = max(1, kv_tokens_per_block // c)
  width = table_BM.shape[1]
  blocks = -(-width // pages_per_block)
  splits = num_splits(b, n, x // 2, blocks, max_splits, target_programs)
  per_split = -(-blocks // splits) * pages_per_block
  # Padding columns point at page 0: loaded with the block they fall in, masked by length.
  table_BM = table_BM.astype(jnp.int32)
  if splits * per_split > width:
    table_BM = jnp.pad(table_BM, ((0, 0), (0, splits * per_split - width)))
  # The kernel applies no softmax scale; the queries go in scaled, in the pool's dtype (the
  # kernel's dots take one dtype).
  dtype = q_BNH.dtype
  q_BNH = (q_BNH.astype(jnp.float32) * h ** -0.5).astype(kv_QCXH.dtype)
  one = functools.partial(_row, pages_per_block=pages_per_block, splits=splits,
                          interpret=interpret, num_warps=num_warps, num_stages=num_stages)
  out_BNH = jax.vmap(one, (0, None, 0, 0))(q_BNH, kv_QCXH, table_BM,
                                           lens_B.astype(jnp.int32)[:, None])
  return out_BNH.astype(dtype)


def num_splits(rows: int, heads: int, kv_heads: int, blocks: int,
               max_splits: int = MAX_SPLITS, target_programs: int = TARGET_PROGRAMS) -> int:
  """How many parts a row's `blocks` kv blocks split into: enough for the grid to reach
  `target_programs` programs, at most `max_splits` and one per block. A row is
  kv_heads x (query-head blocks of its group) programs."""
  groups = -(-(heads // kv_heads) // QUERY_HEADS_PER_BLOCK)
  programs = rows * kv_heads * groups
  return max(1, min(max_splits, blocks, -(-target_programs // programs)))


def _row(q_NH: jax.Array, kv_QCXH: jax.Array, table_M: jax.Array, len_1: jax.Array, *,
         pages_per_block: int, splits: int, interpret: bool, num_warps: int,
         num_stages: int) -> jax.Array:
  """One row (vmapped over rows): a program per (kv head, block of 16 of its query heads,
  split of the row's pages)."""
  n, h = q_NH.shape
  q_pages, c, x, _ = kv_QCXH.shape
  k = x // 2
  g = n // k
  per_split = table_M.shape[0] // splits
  block_h = QUERY_HEADS_PER_BLOCK
  # The kernel loads its group's query heads straight from the row's [N, H] (16 rows from
  # the group's first, those past the group masked): no copy of the queries padded to 16 a
  # group. Only a row of fewer than 16 heads is padded, so that 16 rows exist to address.
  q_RH = q_NH if n >= block_h else jnp.pad(q_NH, ((0, block_h - n), (0, 0)))
  rows = q_RH.shape[0]
  kernel = functools.partial(_head_kernel, group=g, pages_per_block=pages_per_block)
  # Every page of one kv head (the kernel indexes the pages): its keys (pool head 2i) and
  # values (2i + 1) as two refs on the one pool.
  in_specs = [
      pl.BlockSpec((rows, h), lambda i, j, s: (0, 0)),
      pl.BlockSpec((q_pages, c, None, h), lambda i, j, s: (0, 0, 2 * i, 0)),
      pl.BlockSpec((q_pages, c, None, h), lambda i, j, s: (0, 0, 2 * i + 1, 0)),
      pl.BlockSpec((None, per_split), lambda i, j, s: (s, 0)),
      pl.BlockSpec((1,), lambda i, j, s: (0,)),
  ]
  args = (q_RH, kv_QCXH, kv_QCXH, table_M.reshape(splits, per_split), len_1)
  grid = (k, -(-g // block_h), splits)
  return _call(kernel, grid, in_specs, args, rows, h, splits, q_RH.dtype, interpret=interpret,
               num_warps=num_warps, num_stages=num_stages)[:n]


def _call(kernel, grid, in_specs, args, rows: int, h: int, splits: int, dtype, *,
          interpret: bool, num_warps: int, num_stages: int) -> jax.Array:
  """Runs a row's kernel (its pallas_call named "paged_decode_attention", which
  `plan.custom_calls` finds in compiled HLO): with one split, its output [rows, H] comes
  normalised in the queries' dtype straight from the kernel; with several, each split's
  float32 partial output and softmax sums and maxima, combined here (`_combine`, float32).
  A program writes only its own query heads' rows of the row's block."""
  params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  if splits == 1:
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs,
        out_specs=pl.BlockSpec((rows, h), lambda *_: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, h), dtype),
        interpret=interpret, compiler_params=params, name="paged_decode_attention")(*args)
  # Float32 partial outputs (JAX's wrapper keeps them in q's dtype): the combine then
  # rounds once, not once per split.
  o_SRH, l_SR, m_SR = pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, rows, h), lambda *ids: (ids[-1], 0, 0)),
                 pl.BlockSpec((None, rows), lambda *ids: (ids[-1], 0)),
                 pl.BlockSpec((None, rows), lambda *ids: (ids[-1], 0))],
      out_shape=[jax.ShapeDtypeStruct((splits, rows, h), jnp.float32),
                 jax.ShapeDtypeStruct((splits, rows), jnp.float32),
                 jax.ShapeDtypeStruct((splits, rows), jnp.float32)],
      interpret=interpret, compiler_params=params, name="paged_decode_attention")(*args)
  return _combine(o_SRH, l_SR, m_SR)


def _finish(o, l, m, out_refs, rows, mask) -> None:
  """Writes a program's results for query rows `rows` (a `pl.ds`; where `mask`): with one
  output ref (one split), the output normalised in its dtype (zeros for a row of length 0);
  with three, the split's unnormalised float32 output, softmax sums and maxima (what
  `_combine` takes)."""
  rows_mask = mask[:, None]
  if len(out_refs) == 1:
    (o_ref,) = out_refs
    out = jnp.where(l[:, None] > 0, o / jnp.maximum(l, 1e-30)[:, None], 0.0)
    plgpu.store(o_ref.at[rows], out.astype(o_ref.dtype), mask=rows_mask)
    return
  o_ref, l_ref, m_ref = out_refs
  plgpu.store(o_ref.at[rows], o, mask=rows_mask)
  plgpu.store(l_ref.at[rows], l, mask=mask)
  plgpu.store(m_ref.at[rows], m, mask=mask)


def _attend(q, k_ref, v_ref, table_ref, length, first, *, pages_per_block: int,
            positions_per_page: int):
  """The kernel's loop (JAX's kernel body's): queries q [R, H] over a split's pages, page
  `first` of the row on, `pages_per_block` pages a step (JAX's online softmax in base 2).
  k_ref and v_ref: [pages, positions_per_page, H]; table_ref: the split's page ids;
  positions >= `length` masked. Pages past the length are not read. Returns the
  unnormalised output [R, H] and the softmax maxima and sums [R], float32 (zeros, float32
  min and zeros when no page is live)."""
  r, h = q.shape
  c = positions_per_page
  end = jnp.minimum(pl.cdiv(length, c), first + table_ref.shape[0])
  cols = pages_per_block * c
  col = jax.lax.broadcasted_iota(jnp.int32, (r, cols), 1)
  log2e = math.log2(math.e)

  def body(t, carry):
    o, m, l = carry
    ids = table_ref[pl.ds(t * pages_per_block, pages_per_block)]
    keys = k_ref[ids].reshape(cols, h)
    values = v_ref[ids].reshape(cols, h)
    live = (first + t * pages_per_block) * c + col < length
    s = jnp.where(live, plgpu.dot(q, keys.T), MASK_VALUE)
    m_next = jnp.maximum(m, s.max(axis=-1))
    correction = jnp.exp2((m - m_next) * log2e)
    p = jnp.exp2((s - m_next[:, None]) * log2e)
    o = correction[:, None] * o + plgpu.dot(p.astype(values.dtype), values)
    return o, m_next, correction * l + p.sum(axis=-1)

  init = (jnp.zeros((r, h), jnp.float32), jnp.full((r,), jnp.finfo(jnp.float32).min,
                                                   jnp.float32), jnp.zeros((r,), jnp.float32))
  return jax.lax.cond(
      first >= end, lambda: init,
      lambda: jax.lax.fori_loop(0, pl.cdiv(end - first, pages_per_block), body, init))


def _head_kernel(q_ref, k_ref, v_ref, table_ref, len_ref, *out_refs, group: int,
                 pages_per_block: int):
  """One (kv head i, block j of 16 of its query heads, split) of one row: q_ref the row's
  queries [R, H] (kv head i's at rows i * group ...), k_ref and v_ref head i's keys and
  values [pages, C, H], table_ref the split's page ids, len_ref [1] the row's length. The
  loop is JAX's kernel body's (`paged_attention_kernel`); the queries are loaded and the
  results stored 16 rows at a time, masked past the group."""
  i, j, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  block_h = QUERY_HEADS_PER_BLOCK
  c = k_ref.shape[1]
  per_split = table_ref.shape[0]
  live = jax.lax.broadcasted_iota(jnp.int32, (block_h,), 0) + j * block_h < group
  rows = pl.ds(i * group + j * block_h, block_h)
  q = plgpu.load(q_ref.at[rows], mask=live[:, None], other=0.0)
  o, m, l = _attend(q, k_ref, v_ref, table_ref, len_ref[0], split * per_split,
                    pages_per_block=pages_per_block, positions_per_page=c)
  _finish(o, l, m, out_refs, rows, live)


def _combine(o_S_H: jax.Array, l_S_: jax.Array, m_S_: jax.Array) -> jax.Array:
  """The splits' partial results [S, ..., H], [S, ...], [S, ...] combined (float32)."""
  # Each split holds sum_s exp(score_s - m) v_s and sum_s exp(score_s - m) over its pages
  # (m its own max; a split past the length: zeros and m = float32 min).
  m_ = m_S_.max(axis=0)
  scale_S_ = jnp.exp(m_S_ - m_[None])
  l_ = (l_S_ * scale_S_).sum(axis=0)
  o__H = (o_S_H * scale_S_[..., None]).sum(axis=0)
  return jnp.where(l_[..., None] > 0, o__H / jnp.maximum(l_, 1e-30)[..., None], 0.0)
