"""The decoder (Llama 3 / Qwen2 / Qwen3) with a full-sequence path and a KV-cache path.

Shapes: B batch, T tokens in this call, S key slots, D hidden, V vocab, K kv heads, H head dim.

Full-sequence path (trainer)
  `model(tokens_BT, positions_BT, mask_BT) -> logits_BTV`, or in two steps
  `h_BTD = model.hidden_states(tokens_BT, positions_BT, mask_BT)` and `model.logits(h_BTD)`.
  mask_BT is True at real tokens. Query t of row b attends key s iff s <= t (array order) and
  mask_BT[b, s]. positions_BT only feed RoPE, so left padding works with
  positions = max(cumsum(mask) - 1, 0) and right padding with positions = arange(T).
  Outputs at padding positions are finite garbage; ignore them.
  The layers are stacked and run by one `jax.lax.scan`, so a program holds one compiled
  layer body whatever the depth. Attention goes through `attention.causal_attention`
  (cfg.attention_impl: the Pallas kernel on TPU, an einsum elsewhere); no [B, T, T] mask is
  ever built. For training, `hidden_states(..., remat="full")` (see `REMAT_POLICIES`)
  recomputes layers in the backward pass, `activation_sharding` pins the [B, T, D]
  activations at every layer boundary, and `token_log_probs(h_BTD, targets_BT, chunk_size=c)`
  never holds all [B, T, V] logits.
  `prefill(tokens_BT, positions_BT, mask_BT) -> (h_BTD, k_LBTKH, v_LBTKH)` is the same pass
  returning each layer's keys (RoPE applied) and values, for a sampler to put in its cache.

KV-cache path (sampler)
  `cache = init_cache(cfg, batch=B, max_len=S)` holds k and v of shape [L, B, K, S, H] (all
  layers stacked; slots next to head_dim, so a decode step's attention reads each kv head's
  keys as one contiguous [S, H] matrix and XLA needs no per-step transposed copy) and a per-row slot mask `valid_BS` (all False at first).
  `h_BTD, cache = model.hidden_states(tokens_BT, positions_BT, mask_BT, cache=cache,
  cache_index_B=idx_B)` (or `model(...)` for `(logits_BTV, cache)`):
    * Write: token t of row b goes to slot idx_B[b] + t, and valid_BS[b, slot] is set to
      mask_BT[b, t] (padding is written but marked invalid). Slots >= S are dropped, never
      clamped, so idx_B[b] = S leaves row b's cache untouched. idx_B must be >= 0.
    * Read: token t of row b attends to slot s iff valid_BS[b, s] (after this call's writes)
      and s <= idx_B[b] + t. Rows are independent: one call may prefill row 0 from slot 0
      while row 1 decodes at slot 57 (its one real token first, T - 1 masked after it; the
      invalid slots it writes past its head are overwritten by its next steps).
    * Slots are storage order, positions are RoPE angles; the sampler usually keeps
      position == slot for the real tokens. Prefill: T = bucket length, right padded, idx = 0,
      mask marks the prompt's L real tokens; decode then continues at slot L, position L,
      overwriting the invalid padding slots. Decode: T = 1, each row at its own slot.
    * Valid bits are only cleared by overwriting or by `clear_rows`. Reads never look past the
      current slot, so a new sequence that starts at slot 0 and writes contiguously never
      sees an old one; `clear_rows` is for anything else.
  The result at a token with mask False is garbage; the row's logits for the next token are
  those at its last real token. `sharding.init_sharded_cache` builds the cache on a mesh.

Dtypes: params in cfg.param_dtype, activations in cfg.dtype, softmax of attention in float32.
With cfg.lm_head_fp32 the LM head matmul and log-softmax run in float32 (ScaleRL "FP32
logits"; the paper traces a large gain in the asymptote to this).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_scale.models import attention, layers
from jaxrl_scale.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys/values of every layer [L, B, K, S, H] and the written-and-real slot mask [B, S]."""

  k: jax.Array
  v: jax.Array
  valid_BS: jax.Array

  @property
  def max_len(self) -> int:
    return self.valid_BS.shape[1]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
  """An empty cache (zeros, nothing valid); dtype defaults to cfg.dtype.

  For a cache placed on a mesh see `sharding.init_sharded_cache`.
  """
  dt = jnp.dtype(dtype or cfg.dtype)
  shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  return KVCache(k=jnp.zeros(shape, dt), v=jnp.zeros(shape, dt),
                 valid_BS=jnp.zeros((batch, max_len), jnp.bool_))


def clear_rows(cache: KVCache, rows_B: jax.Array) -> KVCache:
  """Marks every slot of the rows where rows_B is True as unwritten."""
  return dataclasses.replace(cache, valid_BS=cache.valid_BS & ~rows_B[:, None])


class Embedder(nnx.Module):
  """Token embedding table [V, D]; also the LM head when embeddings are tied."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=0.02)
    shape = (cfg.vocab_size, cfg.hidden_size)
    self.embedding = layers.param(init(rngs.params(), shape, jnp.dtype(cfg.param_dtype)),
                                  ("vocab", "embed"))

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    return jnp.take(self.embedding[...], tokens_BT, axis=0)


class Transformer(nnx.Module):
  """Decoder-only transformer; see the module docstring for the call contract.

  Param tree (paths as in `nnx.state(model)`); every layer param is stacked over a leading
  layer axis L (logical axis 'layers', never sharded):
    embed_tokens.embedding                     [V, D]
    layers.input_layernorm.scale               [L, D]
    layers.self_attn.{q,k,v}_proj.kernel       [L, D, N|K, H]   (+ .bias [L, N|K, H] for qwen2)
    layers.self_attn.{q,k}_norm.scale          [L, H]           (qwen3)
    layers.self_attn.o_proj.kernel             [L, N, H, D]
    layers.post_attention_layernorm.scale      [L, D]
    layers.mlp.{gate,up}_proj.kernel           [L, D, F]
    layers.mlp.down_proj.kernel                [L, F, D]
    norm.scale                                 [D]
    lm_head.kernel                             [D, V]           (untied only)
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed_tokens = Embedder(cfg, rngs=rngs)
    self.layers = _stacked_layers(cfg, rngs)
    self.norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, jnp.dtype(cfg.param_dtype))
    if cfg.tie_embeddings:
      self.lm_head = None
    else:
      self.lm_head = layers.Einsum(
          "BTD,DV->BTV", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), rngs=rngs,
          param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype))

  def hidden_states(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
                    cache: KVCache | None = None, cache_index_B: jax.Array | None = None,
                    *, remat: str = "none",
                    activation_sharding: jax.sharding.NamedSharding | None = None,
                    ) -> jax.Array | tuple[jax.Array, KVCache]:
    """Final-norm hidden states h_BTD; with a cache, (h_BTD, new_cache).

    Args:
      remat: a name from `REMAT_POLICIES` (full-sequence path only): what each layer keeps
        for the backward pass; the rest is recomputed.
      activation_sharding: a NamedSharding for [B, T, D] activations, e.g. batch rows over
        'fsdp'. Without it the compiler may replicate the micro-batch on every chip.
    """
    if (cache is None) != (cache_index_B is None):
      raise ValueError("cache and cache_index_B must be given together")
    policy = _remat_policy(remat)
    pin = _pinner(activation_sharding)
    mask_BT = mask_BT.astype(jnp.bool_)
    x_BTD = pin(self.embed_tokens(tokens_BT).astype(jnp.dtype(self.cfg.dtype)))
    if cache is None:
      x_BTD, _ = self._scan(x_BTD, positions_BT, mask_BT, policy, activation_sharding)
      return pin(self.norm(x_BTD))

    _, t = tokens_BT.shape
    slot_BT = cache_index_B.astype(jnp.int32)[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    b_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[0])[:, None], slot_BT.shape)
    valid_BS = cache.valid_BS.at[b_BT, slot_BT].set(mask_BT, mode="drop")
    slots_S = jnp.arange(cache.max_len, dtype=jnp.int32)
    allowed_BTS = valid_BS[:, None, :] & (slots_S[None, None, :] <= slot_BT[:, :, None])
    graphdef, state_L = nnx.split(self.layers)

    # The whole stacked cache rides in the carry and each layer scatters its new tokens
    # into it: scanning per-layer slices in and out instead would hold two copies.
    def body(carry, xs):
      x_BTD, k_LBKSH, v_LBKSH = carry
      layer_state, i = xs

      def attend(q_BTNH, k_BTKH, v_BTKH):
        return layers.cached_attention(q_BTNH, k_BTKH, v_BTKH, k_LBKSH, v_LBKSH, i, slot_BT,
                                       allowed_BTS)

      x_BTD, (k_LBKSH, v_LBKSH) = nnx.merge(graphdef, layer_state)(x_BTD, positions_BT, attend)
      return (pin(x_BTD), k_LBKSH, v_LBKSH), None

    (x_BTD, k_LBKSH, v_LBKSH), _ = jax.lax.scan(
        body, (x_BTD, cache.k, cache.v), (state_L, jnp.arange(self.cfg.num_layers)))
    return pin(self.norm(x_BTD)), KVCache(k=k_LBKSH, v=v_LBKSH, valid_BS=valid_BS)

  def prefill(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array, *,
              activation_sharding: jax.sharding.NamedSharding | None = None,
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The full-sequence pass, also returning what a KV cache holds for these tokens.

    Args:
      tokens_BT, positions_BT, mask_BT: as for the full-sequence path.
      activation_sharding: as for `hidden_states`.

    Returns:
      (h_BTD, k_LBTKH, v_LBTKH): final-norm hidden states and every layer's keys (RoPE
      applied) and values in cfg.dtype. Entries at tokens with mask False are garbage.
    """
    pin = _pinner(activation_sharding)
    mask_BT = mask_BT.astype(jnp.bool_)
    x_BTD = pin(self.embed_tokens(tokens_BT).astype(jnp.dtype(self.cfg.dtype)))
    x_BTD, (k_LBTKH, v_LBTKH) = self._scan(x_BTD, positions_BT, mask_BT, None,
                                           activation_sharding, keep_kv=True)
    return pin(self.norm(x_BTD)), k_LBTKH, v_LBTKH

  def _scan(self, x_BTD: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
            policy: Callable | None, activation_sharding: jax.sharding.NamedSharding | None,
            keep_kv: bool = False) -> tuple[jax.Array, Any]:
    """Runs the stacked layers over x_BTD with one scanned (optionally remat'd) layer body."""
    graphdef, state_L = nnx.split(self.layers)
    pin = _pinner(activation_sharding)
    impl = self.cfg.attention_impl

    def attend(q_BTNH, k_BTKH, v_BTKH):
      out_BTNH = attention.causal_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT, impl=impl,
                                            sharding=activation_sharding)
      return out_BTNH, ((k_BTKH, v_BTKH) if keep_kv else None)

    def body(x_BTD, layer_state):
      x_BTD, kv = nnx.merge(graphdef, layer_state)(x_BTD, positions_BT, attend)
      return pin(x_BTD), kv

    if policy is not None:
      # prevent_cse=False: inside a scan the loop already keeps XLA from merging the
      # recomputation into the forward pass (the JAX docs' advice for remat under scan).
      body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    return jax.lax.scan(body, x_BTD, state_L)

  def _head(self) -> tuple[jax.Array, str]:
    if self.lm_head is None:
      return self.embed_tokens.embedding[...], "BTD,VD->BTV"
    return self.lm_head.kernel[...], "BTD,DV->BTV"

  def logits(self, h_BTD: jax.Array) -> jax.Array:
    """LM head; float32 (full-precision matmul) when cfg.lm_head_fp32."""
    w, spec = self._head()
    return _logits(h_BTD, w, spec, self.cfg)

  def token_log_probs(self, h_BTD: jax.Array, targets_BT: jax.Array,
                      chunk_size: int | None = None) -> jax.Array:
    """log p(targets_BT | h_BTD) as float32; the log-softmax runs in the LM head's dtype.

    With chunk_size (a divisor of T) the [B, T, V] logits are never all alive at once: chunks
    of the sequence go through the head one at a time and are recomputed in the backward
    pass, which bounds memory for large vocabularies.
    """
    w, spec = self._head()
    cfg = self.cfg

    def one(h_BtD: jax.Array, t_Bt: jax.Array) -> jax.Array:
      logp_BtV = jax.nn.log_softmax(_logits(h_BtD, w, spec, cfg), axis=-1)
      return jnp.take_along_axis(logp_BtV, t_Bt[:, :, None], axis=-1)[:, :, 0]

    b, t = targets_BT.shape
    if chunk_size is None or chunk_size >= t:
      return one(h_BTD, targets_BT).astype(jnp.float32)
    if t % chunk_size:
      raise ValueError(f"chunk_size {chunk_size} must divide the sequence length {t}")
    n = t // chunk_size
    h_NBtD = h_BTD.reshape(b, n, chunk_size, -1).transpose(1, 0, 2, 3)
    t_NBt = targets_BT.reshape(b, n, chunk_size).transpose(1, 0, 2)
    out_NBt = jax.lax.map(jax.checkpoint(lambda args: one(*args)), (h_NBtD, t_NBt))
    return out_NBt.transpose(1, 0, 2).reshape(b, t).astype(jnp.float32)

  def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
               cache: KVCache | None = None, cache_index_B: jax.Array | None = None,
               ) -> jax.Array | tuple[jax.Array, KVCache]:
    """logits_BTV; with a cache, (logits_BTV, new_cache)."""
    out = self.hidden_states(tokens_BT, positions_BT, mask_BT, cache, cache_index_B)
    if cache is None:
      return self.logits(out)
    h_BTD, new_cache = out
    return self.logits(h_BTD), new_cache


# What a layer keeps for the backward pass: "none" stores every activation, "full" stores only
# the layer input (everything else is recomputed), "dots" stores matmul outputs that have no
# batch dims (the projections) and recomputes the cheap elementwise work and attention.
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _pinner(sharding: jax.sharding.NamedSharding | None):
  if sharding is None:
    return lambda x: x
  return lambda x: jax.lax.with_sharding_constraint(x, sharding)


def _remat_policy(name: str) -> Callable | None:
  """The jax.checkpoint policy for `name`; None means no remat at all."""
  if name not in REMAT_POLICIES:
    raise ValueError(f"unknown remat policy {name!r}; expected one of {sorted(REMAT_POLICIES)}")
  return REMAT_POLICIES[name]


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> layers.DecoderLayer:
  """One DecoderLayer whose params carry a leading [L] axis named 'layers'."""

  @nnx.split_rngs(splits=cfg.num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=cfg.num_layers,
            transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(rngs: nnx.Rngs) -> layers.DecoderLayer:
    return layers.DecoderLayer(cfg, rngs=rngs)

  return make(rngs)


def _logits(h_BTD: jax.Array, w: jax.Array, spec: str, cfg: ModelConfig) -> jax.Array:
  if cfg.lm_head_fp32:
    # ScaleRL FP32 logits; HIGHEST so TPUs do not drop to a single bf16 matmul pass.
    dtype, precision = jnp.float32, jax.lax.Precision.HIGHEST
  else:
    dtype, precision = jnp.dtype(cfg.dtype), None
  return jnp.einsum(spec, h_BTD.astype(dtype), w.astype(dtype), precision=precision)


def create_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model on the default device (for a mesh see sharding.py)."""
  return Transformer(cfg, rngs=nnx.Rngs(seed))
