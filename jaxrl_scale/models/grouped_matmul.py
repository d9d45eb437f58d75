"""Grouped matmul of the MoE experts: rows sorted by group, each group times its own weights.

One function (`grouped_matmul`), its kernel chosen by platform (`auto_impl`):

- "ragged": `jax.lax.ragged_dot`, the CPU / GPU path and the reference. On TPU, XLA computes
  its weight gradient dense over the groups (measured on libtpu, one [65536, 2048] x
  [128, 2048, 768] product: forward and input gradient 1.0x of 2 M D F, weight gradient
  128x), so an MoE train step there runs many times the model's FLOPs.
- "megablox": the Pallas TPU grouped matmul (`jax.experimental.pallas.ops.tpu.megablox`),
  whose custom VJP computes the weight gradient grouped (`tgmm`). It runs per device, so it
  is chosen only inside the MoE layer's shard_map (`moe._local_experts`).
- "interpret": "megablox" in Pallas interpret mode, which runs anywhere (the CPU tests).

Rows past the groups (sum(group_sizes) < M: the expert-parallel path's pairs of other
shards) come back zero from every impl; their gradient is zero too.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

_log = logging.getLogger(__name__)

IMPLS = ("ragged", "megablox", "interpret")
# Feature tiles tried, largest first; on TPU a block's last dim must be a multiple of 128.
_FEATURE_TILES = (512, 256, 128)
_ROW_TILE = 512


def tiling(m: int, k: int, n: int) -> tuple[tuple[int, int, int] | None, str]:
  """((tm, tk, tn), '') for an [m, k] x [G, k, n] product, or (None, why not).

  The backward pass reuses the tiling with k and n swapped (the input gradient is an
  [m, n] x [G, n, k] product), so tk and tn are one size dividing both k and n. Rows are
  padded up to a multiple of tm (the kernel needs tm | m)."""
  del m
  t = next((t for t in _FEATURE_TILES if k % t == 0 and n % t == 0), None)
  if t is None:
    return None, f"no megablox tiling: the dims {k} and {n} are not both multiples of 128"
  return (_ROW_TILE, t, t), ""


def auto_impl(on_tpu: bool, k: int, n: int) -> str:
  """'megablox' on TPU when a tiling fits the dims (`tiling`), else 'ragged' (on TPU with
  a warning naming why: its weight gradient then runs dense over the experts)."""
  if not on_tpu:
    return "ragged"
  tiles, why = tiling(0, k, n)
  if tiles is None:
    _log.warning("MoE experts on TPU use jax.lax.ragged_dot: %s", why)
    return "ragged"
  return "megablox"


def grouped_matmul(lhs_MK: jax.Array, rhs_GKN: jax.Array, group_sizes_G: jax.Array, *,
                   impl: str = "ragged") -> jax.Array:
  """out[r] = lhs_MK[r] @ rhs_GKN[g] for the rows r of group g (groups contiguous, in
  order from row 0); rows past the last group are zero. Output in lhs's dtype."""
  if impl not in IMPLS:
    raise ValueError(f"grouped matmul impl {impl!r} is not one of {', '.join(IMPLS)}")
  if impl == "ragged":
    return jax.lax.ragged_dot(lhs_MK, rhs_GKN, group_sizes_G,
                              preferred_element_type=lhs_MK.dtype)
  from jax.experimental.pallas.ops.tpu.megablox import ops  # pylint: disable=g-import-not-at-top
  m, k = lhs_MK.shape
  g, _, n = rhs_GKN.shape
  tiles, why = tiling(m, k, n)
  if tiles is None:
    if impl == "megablox":
      raise ValueError(why)
    tiles = (_ROW_TILE, 128, 128)  # interpret mode has no block-shape rule
  # No tile taller than the rows, rounded up to 16 (a bf16 vreg holds 16 rows).
  tm = min(tiles[0], -(-m // 16) * 16)
  pad = -m % tm
  sizes_G = group_sizes_G.astype(jnp.int32)
  # One more group holds the rows past the groups (and the padding): with more groups than
  # weights the kernel zeroes the rows of groups it has no weights for, in the forward and
  # in the input gradient, where they would otherwise be left unwritten.
  rest = m + pad - jnp.sum(sizes_G)
  sizes_G = jnp.concatenate([sizes_G, rest[None].astype(jnp.int32)])
  lhs = jnp.pad(lhs_MK, ((0, pad), (0, 0))) if pad else lhs_MK
  # The kernel accumulates in a float32 scratch tile and rounds once to the output dtype;
  # a bf16 output keeps the backward's cotangent, and so its kernels' inputs, in bf16.
  out = ops.gmm(lhs, rhs_GKN, sizes_G, lhs_MK.dtype, (tm,) + tiles[1:], None, None, False,
                impl == "interpret")
  return out[:m]
