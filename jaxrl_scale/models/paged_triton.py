"""Decode attention on NVIDIA GPUs: JAX's Pallas GPU (Triton) paged attention kernel read
straight from the sampler's page pool (`paged_attention.paged_attention(impl="triton")`).

JAX's wrapper (`jax.experimental.pallas.ops.gpu.paged_attention.paged_attention`) wants
separate key and value pools [K, pages, C, H]. Ours interleaves them, [pages, C, 2K, H]
(keys at even heads, values at odd: the TPU kernel's layout, `paged_attention.interleave_kv`),
and splitting or transposing it would copy the whole pool every step, more than the gather
this replaces. So this module runs the same kernel body (`paged_attention_kernel`) under its
own `pallas_call`, whose block specs pick kv head k's keys (head 2k) and values (head 2k + 1)
out of the one pool: the pool goes in twice as the same buffer and stays where it is. The
rest follows JAX's wrapper: one grid program per (row, kv head, block of 16 query heads,
split of the row's pages), split partial results combined at the end (here in float32);
a row's pages split only as far as a small grid needs (`num_splits`).

The kernel has no softmax scale: queries are scaled by head_dim ** -0.5 before it. It masks
each row's positions >= its length and skips pages past it; a row of length 0 reads nothing
and gets zeros. Sliding windows do not exist in our model families (the loader refuses
them) and neither do logit softcaps, so neither is passed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.experimental.pallas.ops.gpu import paged_attention as jax_paged

# KV positions one kernel step loads per (row, kv head), the most splits of a row's pages
# run in parallel (JAX's default k_splits), and query heads per block (the smallest a Triton
# dot takes; a GQA group of fewer is padded). Tuned on an H100 (2026-11-27, jax 0.11.2,
# benchmarks/paged_decode_check.py --sweep at Qwen3-0.6B's attention shape, batch 64 and
# 256, 640 positions; benchmarks/results/gpu_h100_2026-11-27*/): 64 positions, 4 warps and
# one stage were the fastest at both batches in the first sweep (79.8 / 184.0 us against
# 92.9 / 226.3 us for JAX's 128 positions, 8 warps, 2 stages) and within 8% of the fastest
# in the second (the run-to-run spread); 32 positions were no faster.
KV_TOKENS_PER_BLOCK = 64
MAX_SPLITS = 16
QUERY_HEADS_PER_BLOCK = 16
# Grid programs (rows x kv heads x query-head blocks x splits) to aim for: a row's pages are
# split only while the grid has fewer programs than this (about 8 per SM of an H100, enough
# loads in flight to keep HBM busy). Every split writes a float32 partial output of
# QUERY_HEADS_PER_BLOCK rows, padding included, live pages or not, which the combine reads
# back: with a split per 128-position block, Qwen3-0.6B at batch 256 and 128 + 512 tokens
# spent a fifth of its decode bytes on them (`plan --topology h100`). On the H100, 1 and
# 4096 were within the sweep's spread of 1024 at both batches.
TARGET_PROGRAMS = 1024
# Triton's launch parameters for the kernel (JAX's wrapper: 8 warps, 2 stages; tuned as
# above).
NUM_WARPS = 4
NUM_STAGES = 1


def triton_decode_attention(q_BNH: jax.Array, kv_QCXH: jax.Array, table_BM: jax.Array,
                            lens_B: jax.Array, *, interpret: bool = False,
                            kv_tokens_per_block: int = KV_TOKENS_PER_BLOCK,
                            max_splits: int = MAX_SPLITS,
                            target_programs: int = TARGET_PROGRAMS,
                            num_warps: int = NUM_WARPS,
                            num_stages: int = NUM_STAGES) -> jax.Array:
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
    num_warps, num_stages: Triton's launch parameters (`NUM_WARPS`, `NUM_STAGES`).

  Returns:
    out_BNH in q's dtype.
  """
  b, n, h = q_BNH.shape
  _, c, x, _ = kv_QCXH.shape
  if x % 2 or n % (x // 2):
    raise ValueError(f"triton paged attention: {n} query heads do not group over "
                     f"{x // 2} kv heads")
  pages_per_block = max(1, kv_tokens_per_block // c)
  width = table_BM.shape[1]
  blocks = -(-width // pages_per_block)
  splits = num_splits(b, n, x // 2, blocks, max_splits, target_programs)
  per_split = -(-blocks // splits) * pages_per_block
  # Padding columns point at page 0: loaded with the block they fall in, masked by length.
  table_BM = jnp.pad(table_BM.astype(jnp.int32), ((0, 0), (0, splits * per_split - width)))
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
  `target_programs` programs, at most `max_splits` and one per block."""
  groups = -(-(heads // kv_heads) // QUERY_HEADS_PER_BLOCK)
  programs = rows * kv_heads * groups
  return max(1, min(max_splits, blocks, -(-target_programs // programs)))


def _row(q_NH: jax.Array, kv_QCXH: jax.Array, table_M: jax.Array, len_1: jax.Array, *,
         pages_per_block: int, splits: int, interpret: bool, num_warps: int,
         num_stages: int) -> jax.Array:
  """One row (vmapped over rows, as JAX's `paged_attention_unbatched`)."""
  n, h = q_NH.shape
  q_pages, c, x, _ = kv_QCXH.shape
  k = x // 2
  g = n // k
  per_split = table_M.shape[0] // splits
  block_h = QUERY_HEADS_PER_BLOCK
  q_KGH = q_NH.reshape(k, g, h)
  if g % block_h:
    q_KGH = jnp.pad(q_KGH, ((0, 0), (0, -g % block_h), (0, 0)))
  gp = q_KGH.shape[1]
  kernel = functools.partial(jax_paged.paged_attention_kernel, num_heads=g,
                             pages_per_compute_block=pages_per_block,
                             mask_value=jax_paged.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None)
  pool_block = (q_pages, c, None, h)  # every page of one head: the kernel indexes the pages
  o_SKGH, l_SKG, m_SKG = pl.pallas_call(
      kernel,
      grid=(k, gp // block_h, splits),
      in_specs=[
          pl.BlockSpec((None, block_h, h), lambda i, j, s: (i, j, 0)),
          pl.BlockSpec(pool_block, lambda i, j, s: (0, 0, 2 * i, 0)),  # keys of kv head i
          None,
          pl.BlockSpec(pool_block, lambda i, j, s: (0, 0, 2 * i + 1, 0)),  # its values
          None,
          pl.BlockSpec((None, per_split), lambda i, j, s: (s, 0)),
          pl.BlockSpec((1,), lambda i, j, s: (0,)),
      ],
      out_specs=[
          pl.BlockSpec((None, None, block_h, h), lambda i, j, s: (s, i, j, 0)),
          pl.BlockSpec((None, None, block_h), lambda i, j, s: (s, i, j)),
          pl.BlockSpec((None, None, block_h), lambda i, j, s: (s, i, j)),
      ],
      # Float32 partial outputs (JAX's wrapper keeps them in q's dtype): the split combine
      # below then rounds once, not once per split.
      out_shape=[jax.ShapeDtypeStruct((splits, k, gp, h), jnp.float32),
                 jax.ShapeDtypeStruct((splits, k, gp), jnp.float32),
                 jax.ShapeDtypeStruct((splits, k, gp), jnp.float32)],
      interpret=interpret,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      name="paged_decode_attention",
  )(q_KGH, kv_QCXH, None, kv_QCXH, None, table_M.reshape(splits, per_split), len_1)
  o_SKGH, l_SKG, m_SKG = o_SKGH[:, :, :g], l_SKG[:, :, :g], m_SKG[:, :, :g]
  # Each split holds sum_s exp(score_s - m) v_s and sum_s exp(score_s - m) over its pages
  # (m its own max; a split past the length: zeros and m = float32 min).
  m_KG = m_SKG.max(axis=0)
  scale_SKG = jnp.exp(m_SKG - m_KG[None])
  l_KG = (l_SKG * scale_SKG).sum(axis=0)
  o_KGH = (o_SKGH * scale_SKG[..., None]).sum(axis=0)
  o_KGH = jnp.where(l_KG[..., None] > 0, o_KGH / jnp.maximum(l_KG, 1e-30)[..., None], 0.0)
  return o_KGH.reshape(n, h)  # float32
