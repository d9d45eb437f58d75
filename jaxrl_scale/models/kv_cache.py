"""The sampler's KV cache: a pool of pages holding every layer's keys and values.

`init_pages(cfg, shards=D, pages=P, page_size=C)` is a pool of P pages per data shard (plus
a null page), each holding C positions of every layer's keys and values: kv of shape
[L, D, P + 1, C, 2K, H], the key of kv head k at 2k and its value at 2k + 1
(`paged_attention.interleave_kv`; the layout of JAX's TPU ragged paged attention kernel,
which the GPU kernel reads too). Which pages a row holds is the caller's page table
(generation/pages.py). `PromptPrefix` names the pages of prompts' earlier positions for a
chunked prefill. The model's paths that read and write the pool are
`transformer.Transformer.decode` and `prefill_into`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_scale.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  """Keys/values of every layer in pages: [L, D, P + 1, C, 2K, H] (the last page is null;
  keys at even heads, values at odd).

  `views`, inside one chunk of decode steps only (see `Transformer.decode`): per layer, the
  rows' first pages gathered into dense (k_BKHS, v_BKSH) (`paged_attention.paged_view`), which
  the steps read and append to instead of gathering the pages every step."""

  kv: jax.Array
  views: tuple[tuple[jax.Array, jax.Array], ...] | None = None

  @property
  def page_size(self) -> int:
    return self.kv.shape[3]

  @property
  def pages_per_shard(self) -> int:
    return self.kv.shape[2] - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptPrefix:
  """The earlier positions [0, length) of B prompts, held in the page pool a `prefill_into`
  writes to, for a prefill that continues them (chunked prefill): row b's positions are in
  the pages pages_BM[b] of data shard shard_B[b] of the pool [L, D, P + 1, C, 2K, H]
  (`PagedKVCache.kv`); pages_BM covers at least `length` positions."""

  shard_B: jax.Array  # int32
  pages_BM: jax.Array  # int32 local page ids in position order
  length: jax.Array  # int32 scalar: positions before the prefill's tokens, same in every row

  def layer(self, kv: jax.Array, layer: Any) -> tuple[jax.Array, jax.Array]:
    """Layer `layer`'s prefix in pool `kv` as dense (k_BSKH, v_BSKH), S = M * C."""
    l, d, p, c, x, h = kv.shape
    b, m = self.pages_BM.shape
    kv_BSXH = kv[layer][self.shard_B[:, None], self.pages_BM].reshape(b, m * c, x, h)
    return kv_BSXH[:, :, 0::2], kv_BSXH[:, :, 1::2]

  def read(self, kv: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Every layer's prefix in pool `kv`: (k_LBSKH, v_LBSKH), one layer's gather at a time
    (one gather over all layers made the TPU compiler relay the whole pool out)."""
    ks, vs = zip(*(self.layer(kv, i) for i in range(kv.shape[0])))
    return jnp.stack(ks), jnp.stack(vs)

  def valid(self, size: int) -> jax.Array:
    """[B, size]: which of the dense prefix's positions hold the prefix."""
    b = self.pages_BM.shape[0]
    return jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32)[None, :] < self.length,
                            (b, size))


def init_pages(cfg: ModelConfig, shards: int, pages: int, page_size: int,
               dtype: str | None = None) -> PagedKVCache:
  """An empty page pool (zeros); dtype defaults to cfg.dtype. Trace it under jit with
  out_shardings (`sharding.cache_shardings`) to create it on a mesh."""
  dt = jnp.dtype(dtype or cfg.dtype)
  shape = (cfg.num_layers, shards, pages + 1, page_size, 2 * cfg.num_kv_heads, cfg.head_dim)
  return PagedKVCache(kv=jnp.zeros(shape, dt))
