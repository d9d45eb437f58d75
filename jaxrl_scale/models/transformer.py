"""The decoder (Llama 3, Qwen2, Qwen3, Qwen3-MoE): a full-sequence path and a KV-cache path.

Shapes: B batch, T tokens in this call, S key slots, D hidden, V vocab, K kv heads, H head dim.

Full-sequence path (trainer)
  `model(tokens_BT, positions_BT, mask_BT) -> logits_BTV`, or in two steps
  `h_BTD = model.hidden_states(tokens_BT, positions_BT, mask_BT)` and `model.logits(h_BTD)`.
  mask_BT is True at real tokens. Query t of row b attends key s iff s <= t (array order) and
  mask_BT[b, s]. positions_BT only feed RoPE, so left padding works with
  positions = max(cumsum(mask) - 1, 0) and right padding with positions = arange(T).
  Outputs at padding positions are finite garbage; ignore them.
  The layers are stacked and run by one `jax.lax.scan`, so a program holds one compiled
  layer body whatever the depth (`unroll_layers=True`: the same body unrolled over the
  stacks, which the trainer runs on XLA:CPU). Attention goes through `attention.causal_attention`
  (cfg.attention_impl: the Pallas kernel on TPU, an einsum elsewhere); no [B, T, T] mask is
  ever built. For training, `hidden_states(..., remat="full")` (see `REMAT_POLICIES`)
  recomputes layers in the backward pass, `activation_sharding` pins the [B, T, D]
  activations at every layer boundary (`residual_sharding`, e.g. T over 'tp', pins the
  residual stream between layers instead: sequence parallelism), and
  `token_log_probs(h_BTD, targets_BT, chunk_size=c)` never holds all [B, T, V] logits.
  `prefill(tokens_BT, positions_BT, mask_BT) -> (h_BTD, k_LBTKH, v_LBTKH)` is the same pass
  returning each layer's keys (RoPE applied) and values (what a KV cache holds for them).
  `prefill_into(tokens_BT, positions_BT, mask_BT, pool, write) -> (h_BTD, pool)` is the same
  pass writing each layer's keys and values into a page pool as it goes (`write`, inside the
  layer loop), so no layer stack of them is ever held; with `prefix=kv_cache.PromptPrefix(...)` the
  T tokens continue prompts whose earlier positions are already in that pool (chunked
  prefill): every query also attends to those.

Paged KV-cache path (sampler decode)
  The pool is `kv_cache.init_pages(cfg, shards=D, pages=P, page_size=C)`: kv of shape
  [L, D, P + 1, C, 2K, H] (models/kv_cache.py). Which pages a row holds is the caller's page
  table (generation/pages.py), passed to every call.
  `logits_B1V, cache = model.decode(tokens_B1, pos_B, active_B, cache, table_BM,
  view_pages=V, mesh=M)` feeds one token per row at position pos_B: it is written into the
  row's page for that position (not for inactive rows) and attends to the row's positions
  <= pos_B (`paged_attention.paged_attention`: on TPU meshes the ragged kernel, reading each
  row's own length; elsewhere an XLA gather of the first V pages). Prompts go in through
  `prefill` (below), whose keys and values the sampler scatters into the pages.

Dtypes: params in cfg.param_dtype, activations in cfg.dtype, softmax of attention in float32.
A model holding wider arrays than cfg.param_dtype (the trainer's float32 masters) computes
with them rounded to cfg.param_dtype (`layers.held`), so trainer and generator run one
function.
With cfg.lm_head_fp32 the LM head matmul and log-softmax run in float32 (ScaleRL "FP32
logits"; the paper traces a large gain in the asymptote to this).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_scale.models import attention, decoder, kv_cache, layers, moe, paged_attention
from jaxrl_scale.models.config import ModelConfig


class Embedder(nnx.Module):
  """Token embedding table [V, D]; also the LM head when embeddings are tied."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=0.02)
    shape = (cfg.vocab_size, cfg.hidden_size)
    self.param_dtype = jnp.dtype(cfg.param_dtype)
    # float32_grad: the gather's gradient is a scatter-add, summed in the table's dtype.
    self.embedding = layers.param(init(rngs.params(), shape, self.param_dtype),
                                  ("vocab", "embed"), float32_grad=True)

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    # Only the looked-up rows are rounded (`layers.held`), not the [V, D] table.
    return layers.held(jnp.take(self.embedding[...], tokens_BT, axis=0), self.param_dtype)


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
          param_dtype=jnp.dtype(cfg.param_dtype), dtype=jnp.dtype(cfg.dtype),
          float32_grad=cfg.lm_head_fp32)

  def hidden_states(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
                    *, remat: str = "none",
                    activation_sharding: jax.sharding.NamedSharding | None = None,
                    residual_sharding: jax.sharding.NamedSharding | None = None,
                    unroll_layers: bool = False) -> jax.Array:
    """Final-norm hidden states h_BTD.

    Args:
      remat: a name from `REMAT_POLICIES`: what each layer keeps for the backward pass; the
        rest is recomputed.
      activation_sharding: a NamedSharding for [B, T, D] activations, e.g. batch rows over
        'fsdp'. Without it the compiler may replicate the micro-batch on every chip.
      residual_sharding: sequence parallelism: a NamedSharding for the [B, T, D] residual
        stream BETWEEN layers (the layer scan's carry, which remat "full" keeps per layer),
        e.g. rows over 'fsdp' and T over 'tp'. Each layer gathers its input back to
        `activation_sharding` (rows only; its attention, MLP and MoE see exactly what they
        see without it) and its output is split again. None: the carry is pinned to
        `activation_sharding`.
      unroll_layers: run the layers as an unrolled loop over the stacked weights instead
        of one scan (the same computation). On XLA:CPU the scan's backward pass copies
        each layer's weights and residuals in and out of the stacks; the trainer unrolls
        there (`train_step.Trainer`). The program then grows with the depth.
    """
    return self.hidden_states_with_stats(tokens_BT, positions_BT, mask_BT, remat=remat,
                                         activation_sharding=activation_sharding,
                                         residual_sharding=residual_sharding,
                                         unroll_layers=unroll_layers)[0]

  def hidden_states_with_stats(
      self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array, *,
      remat: str = "none", activation_sharding: jax.sharding.NamedSharding | None = None,
      residual_sharding: jax.sharding.NamedSharding | None = None,
      recorded_BTLK: jax.Array | None = None, recorded_BT: jax.Array | None = None,
      replay: bool = False, unroll_layers: bool = False,
  ) -> tuple[jax.Array, moe.RouterStats | None]:
    """`hidden_states` and the router stats of the sparse layers over the real tokens,
    summed (None for a dense model): `stats.load_balancing_loss()` is the auxiliary loss a
    trainer adds, weighted by cfg.router_aux_loss_coef.

    Routing replay (MoE only): `recorded_BTLK` are the experts another program (the
    sampler: `prefill_into` / `decode` with record_routing) chose at each position, for
    each sparse layer in order (L = len(`sparse_layers()`)), valid where `recorded_BT`
    (None: everywhere). `stats.routing_mismatch()` is how often this model's own top-k
    differs from them; with `replay` the tokens go to the recorded experts
    (`moe.MoE.apply`). unroll_layers: see `hidden_states`."""
    policy = _remat_policy(remat)
    pin = _pinner(activation_sharding)
    mask_BT = mask_BT.astype(jnp.bool_)
    align = self._aligns_rows(activation_sharding)
    if align:  # cuDNN takes right padding only: once here, not in every layer
      (tokens_BT, positions_BT, mask_BT, recorded_BTLK, recorded_BT), undo = (
          attention.right_aligned(mask_BT, (tokens_BT, positions_BT, mask_BT, recorded_BTLK,
                                            recorded_BT)))
    x_BTD = self.embed_tokens(tokens_BT).astype(jnp.dtype(self.cfg.dtype))
    x_BTD = _pinner(residual_sharding or activation_sharding)(x_BTD)
    recorded_L = None
    if recorded_BTLK is not None and any(self.cfg.moe_layers()):
      recorded_L = self._per_layer(recorded_BTLK)
    x_BTD, (_, stats_L, _) = self._scan(x_BTD, positions_BT, mask_BT, policy,
                                        activation_sharding, recorded_L=recorded_L,
                                        recorded_BT=recorded_BT, replay=replay,
                                        residual_sharding=residual_sharding,
                                        right_padded=align, unroll=unroll_layers)
    # The final norm runs on the split sequence; the LM head gets whole rows again.
    h_BTD = self.norm(x_BTD)
    if residual_sharding is not None:
      h_BTD = _pinner(_whole_rows(residual_sharding, activation_sharding))(h_BTD)
    if align:
      h_BTD = undo(pin(h_BTD))
    return pin(h_BTD), None if stats_L is None else stats_L.sum_layers()

  def _aligns_rows(self, activation_sharding: jax.sharding.NamedSharding | None) -> bool:
    """Whether the attention is cuDNN's (right padding only): then `hidden_states_with_stats`
    right-aligns the rows itself (`attention.right_aligned`)."""
    return attention.resolved_impl(self.cfg.attention_impl, activation_sharding,
                                   jnp.dtype(self.cfg.dtype), self.cfg.head_dim) == "cudnn"

  def sparse_layers(self) -> tuple[int, ...]:
    """Indices of the layers whose MLP is a mixture of experts (the layer axis of routing
    records)."""
    return tuple(i for i, sparse in enumerate(self.cfg.moe_layers()) if sparse)

  def _per_layer(self, recorded_BTLK: jax.Array) -> jax.Array:
    """[B, T, L_sparse, K] records -> [L, B, T, K] int32 (zeros at dense layers, which
    never read them), the layer loop's input."""
    rec_LBTK = jnp.moveaxis(recorded_BTLK, 2, 0).astype(jnp.int32)
    idx = self.sparse_layers()
    if len(idx) == self.cfg.num_layers:
      return rec_LBTK
    full = jnp.zeros((self.cfg.num_layers,) + rec_LBTK.shape[1:], jnp.int32)
    return full.at[jnp.asarray(idx)].set(rec_LBTK)

  def _sparse_records(self, experts_LBTK: jax.Array) -> jax.Array:
    """Every layer's experts [L, B, T, K] -> the sparse layers' [B, T, L_sparse, K]."""
    return jnp.moveaxis(experts_LBTK[jnp.asarray(self.sparse_layers())], 0, 2)

  def decode(self, tokens_B1: jax.Array, pos_B: jax.Array, active_B: jax.Array,
             cache: kv_cache.PagedKVCache, table_BM: jax.Array, *, view_pages: int,
             mesh: jax.sharding.Mesh | None = None, layer_states: list[Any] | None = None,
             record_routing: bool = False,
             ) -> (tuple[jax.Array, kv_cache.PagedKVCache]
                   | tuple[jax.Array, kv_cache.PagedKVCache, jax.Array]):
    """One token per row through the paged cache: (logits_B1V, updated cache), and with
    `record_routing` (an MoE model) the experts each row's token went to in each sparse
    layer, experts_BLK int32 (L = len(`sparse_layers()`)).

    See the module docstring. The whole page pool rides along the layers and each layer
    scatters its new keys/values into it in place. `mesh` (the generator's) picks the TPU
    kernel when it holds TPUs. The layers run as one scan over the stacked weights, or, given
    `layer_states` (`split_layers`: each layer's weights as arrays of their own), as an
    unrolled loop over them (on CPU a scan copies each layer's weights out of the stacked
    arrays before its matmuls, every step). A cache with `views` (`with_views`) needs
    `layer_states`; its views are read and updated as well as the pool.
    """
    x_B1D = self.embed_tokens(tokens_B1).astype(jnp.dtype(self.cfg.dtype))
    graphdef, state_L = nnx.split(self.layers)
    pos_B = pos_B.astype(jnp.int32)
    views = cache.views
    # Only a mesh with an expert axis sends the MoE layers through their expert-parallel
    # shard_map (None otherwise: the program is as before expert parallelism).
    moe_sharding = moe.decode_sharding(mesh, x_B1D.shape[0])
    if views is not None and layer_states is None:
      raise ValueError("decode with per-chunk views runs the layers unrolled: pass layer_states")

    def layer(x_B1D, pool, layer_state, i, view=None):
      def attend(q_B1NH, k_B1KH, v_B1KH):
        out_B1NH, pool_out, view_out = paged_attention.paged_attention(
            q_B1NH, k_B1KH, v_B1KH, pool, i, table_BM, pos_B, active_B,
            view_pages=view_pages, mesh=mesh, view=view)
        return out_B1NH, (pool_out, view_out)

      x_B1D, aux, _, experts_B1K = nnx.merge(graphdef, layer_state)(
          x_B1D, pos_B[:, None], attend, i, active_B[:, None], moe_sharding)
      return x_B1D, aux, experts_B1K

    record_routing = record_routing and bool(self.sparse_layers())
    if layer_states is not None:
      pool, new_views, experts = cache.kv, [], []
      for i, layer_state in enumerate(layer_states):
        x_B1D, (pool, view), experts_B1K = layer(x_B1D, pool, layer_state, jnp.int32(i),
                                                 None if views is None else views[i])
        new_views.append(view)
        experts.append(experts_B1K)
      cache = kv_cache.PagedKVCache(kv=pool, views=None if views is None else tuple(new_views))
      experts_LB1K = jnp.stack(experts) if record_routing else None
    else:
      def body(carry, xs):
        x_B1D, (pool, _), experts_B1K = layer(*carry, *xs)
        return (x_B1D, pool), experts_B1K if record_routing else None

      (x_B1D, pool), experts_LB1K = jax.lax.scan(body, (x_B1D, cache.kv),
                                                 (state_L, jnp.arange(self.cfg.num_layers)))
      cache = kv_cache.PagedKVCache(kv=pool)
    logits_B1V = self.logits(self.norm(x_B1D))
    if not record_routing:
      return logits_B1V, cache
    return logits_B1V, cache, self._sparse_records(experts_LB1K)[:, 0]

  def with_views(self, cache: kv_cache.PagedKVCache, table_BM: jax.Array, view_pages: int, *,
                 mesh: jax.sharding.Mesh | None = None) -> kv_cache.PagedKVCache:
    """`cache` carrying every layer's `paged_attention.paged_view` of the rows' first
    `view_pages` pages, for a chunk of `decode(layer_states=...)` steps whose rows all stay
    within those pages (drop the views with `kv_cache.PagedKVCache(kv=cache.kv)` after the
    chunk; the pool itself is kept up to date by every step)."""
    return kv_cache.PagedKVCache(kv=cache.kv, views=tuple(
        paged_attention.paged_view(cache.kv, i, table_BM, view_pages, mesh=mesh)
        for i in range(self.cfg.num_layers)))

  def split_layers(self) -> list[Any]:
    """Each layer's weights as arrays of their own (copies of the stacked ones), for
    `decode(layer_states=...)`."""
    _, state_L = nnx.split(self.layers)
    return [jax.tree.map(lambda x, i=i: x[i], state_L) for i in range(self.cfg.num_layers)]

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
    x_BTD, ((k_LBTKH, v_LBTKH), _, _) = self._scan(x_BTD, positions_BT, mask_BT, None,
                                                   activation_sharding, keep_kv=True)
    return pin(self.norm(x_BTD)), k_LBTKH, v_LBTKH

  def prefill_into(self, tokens_BT: jax.Array, positions_BT: jax.Array, mask_BT: jax.Array,
                   pool: jax.Array, write: Callable[..., jax.Array], *,
                   activation_sharding: jax.sharding.NamedSharding | None = None,
                   prefix: kv_cache.PromptPrefix | None = None, prefix_in_loop: bool = True,
                   record_routing: bool = False,
                   ) -> tuple[jax.Array, jax.Array] | tuple[jax.Array, jax.Array, jax.Array]:
    """`prefill` writing each layer's keys and values into `pool` inside the layer loop.

    Args:
      tokens_BT, positions_BT, mask_BT, activation_sharding: as for `prefill`.
      pool: the page pool [L, D, P + 1, C, 2K, H], carried through the layers.
      write: (pool, layer, k_BTKH, v_BTKH) -> pool: puts one layer's keys (RoPE applied)
        and values where they belong (the caller's page table); it sees every token,
        masked or not.
      prefix: the positions before these tokens, already in `pool`: every query attends to
        them as well (`attention.einsum_attention` over prefix + tokens, whatever
        cfg.attention_impl says). positions_BT should continue from prefix.length, and
        `write` must not touch the prefix's positions.
      prefix_in_loop: read each layer's prefix inside the layer loop (one layer's prefix
        held at a time; what TPUs want), or every layer's once before it (XLA:CPU copied
        the whole pool twice per layer to keep an in-loop read apart from the in-place
        write). Same numbers either way.
      record_routing: (an MoE model) also return the experts each token went to in each
        sparse layer, experts_BTLK int32 (L = len(`sparse_layers()`)).

    Returns:
      (h_BTD, pool): final-norm hidden states and the updated pool. Only one layer's keys
      and values exist at a time, and the pool is updated in place (pass it donated).
    """
    pin = _pinner(activation_sharding)
    mask_BT = mask_BT.astype(jnp.bool_)
    x_BTD = pin(self.embed_tokens(tokens_BT).astype(jnp.dtype(self.cfg.dtype)))
    record_routing = record_routing and bool(self.sparse_layers())
    (x_BTD, pool), experts_LBTK = self._scan(
        (x_BTD, pool), positions_BT, mask_BT, None, activation_sharding, prefix=prefix,
        write=write, prefix_in_loop=prefix_in_loop, record=record_routing)
    if not record_routing:
      return pin(self.norm(x_BTD)), pool
    return pin(self.norm(x_BTD)), pool, self._sparse_records(experts_LBTK)

  def _scan(self, carry: Any, positions_BT: jax.Array, mask_BT: jax.Array,
            policy: Callable | None, activation_sharding: jax.sharding.NamedSharding | None,
            keep_kv: bool = False, prefix: kv_cache.PromptPrefix | None = None,
            write: Callable[..., jax.Array] | None = None, prefix_in_loop: bool = True,
            recorded_L: jax.Array | None = None, recorded_BT: jax.Array | None = None,
            replay: bool = False, record: bool = False,
            residual_sharding: jax.sharding.NamedSharding | None = None,
            right_padded: bool = False, unroll: bool = False) -> tuple[Any, Any]:
    """Runs the stacked layers with one scanned (optionally remat'd) layer body. The carry
    is x_BTD, or (x_BTD, pool) with `write` (see `prefill_into`); the stacked outputs are
    (each layer's keys and values when keep_kv, else None; router stats or None; each
    layer's experts_BTK or None), except with `write` (each layer's experts_BTK when
    `record`, else None). recorded_L [L, B, T, K], recorded_BT, replay: routing replay
    (`hidden_states_with_stats`). residual_sharding: where the carry x_BTD lives between
    layers (sequence parallelism, `hidden_states`); None: `activation_sharding`.
    right_padded: no row of mask_BT is left-padded (`attention.causal_attention`).
    unroll: the same body applied layer by layer in Python (static slices of the stacked
    weights, the outputs stacked after) instead of `jax.lax.scan`."""
    graphdef, state_L = nnx.split(self.layers)
    pin = _pinner(activation_sharding)
    gather = lambda x: x  # noqa: E731
    if residual_sharding is not None:
      # Sequence parallelism: the carry is split along T, and the layer gathers it back to
      # whole rows first, so that its attention (splash's shard_map specs), MLP and MoE run
      # exactly as without it. Its output is pinned to whole rows BEFORE it is split again:
      # otherwise the split propagates backwards into the layer (the MLP on T / tp tokens
      # with its weights gathered over tp).
      gather = _sequence_gather(residual_sharding, activation_sharding)
      whole, split = (_pinner(_whole_rows(residual_sharding, activation_sharding)),
                      _pinner(residual_sharding))
      pin = lambda x: split(whole(x))  # noqa: E731
    impl = self.cfg.attention_impl
    prefix_L = valid_BS = None  # every layer's prefix keys and values, scanned over
    if prefix is not None:  # (needs the pool: `prefill_into`)
      pool = carry[1]
      valid_BS = prefix.valid(prefix.pages_BM.shape[1] * pool.shape[3])
      if not prefix_in_loop:
        prefix_L = prefix.read(pool)

    def body(carry, xs):
      layer_state, i, prefix_kv, recorded_BTK = xs
      x_BTD, pool = carry if write is not None else (carry, None)
      x_BTD = gather(x_BTD)

      def attend(q_BTNH, k_BTKH, v_BTKH):
        if prefix is None:
          out_BTNH = attention.causal_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT, impl=impl,
                                                sharding=activation_sharding,
                                                right_padded=right_padded)
        else:  # the T queries come after the prefix's S keys
          pk_BSKH, pv_BSKH = prefix.layer(pool, i) if prefix_in_loop else prefix_kv
          out_BTNH = attention.einsum_attention(
              q_BTNH, jnp.concatenate([pk_BSKH.astype(k_BTKH.dtype), k_BTKH], axis=1),
              jnp.concatenate([pv_BSKH.astype(v_BTKH.dtype), v_BTKH], axis=1),
              jnp.concatenate([valid_BS, mask_BT], axis=1))
        return out_BTNH, ((k_BTKH, v_BTKH) if keep_kv or write is not None else None)

      x_BTD, kv, stats, experts_BTK = nnx.merge(graphdef, layer_state)(
          x_BTD, positions_BT, attend, i, mask_BT, activation_sharding, recorded_BTK,
          recorded_BT, replay)
      if write is not None:
        return (pin(x_BTD), write(pool, i, *kv)), experts_BTK if record else None
      return pin(x_BTD), (kv, stats, experts_BTK if record else None)

    if policy is not None:
      # prevent_cse=False: inside a scan the loop already keeps XLA from merging the
      # recomputation into the forward pass (the JAX docs' advice for remat under scan).
      body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    xs = (state_L, jnp.arange(self.cfg.num_layers), prefix_L, recorded_L)
    if not unroll:
      return jax.lax.scan(body, carry, xs)
    outs = []
    for i in range(self.cfg.num_layers):
      carry, out = body(carry, jax.tree.map(lambda a, i=i: a[i], xs))
      outs.append(out)
    return carry, jax.tree.map(lambda *a: jnp.stack(a), *outs)

  def head(self) -> tuple[jax.Array, str]:
    """The LM head's weights as the model computes with them, and its einsum spec.

    The weights are rounded to param_dtype (`layers.held`): the trainer's float32 master of
    a bf16 model then gives the FP32 head the generator's bf16 values. A caller that runs
    the head over chunks in a loop takes this once, outside the loop. Measured on the
    qwen3_1p7b train step (bf16, 4 x 4 x 2048, v5p-8 by compilation): temporaries 7.17 GiB
    without the rounding, 8.19 rounded inside the loop, 7.60 rounded once here.
    """
    if self.lm_head is None:
      w, spec = self.embed_tokens.embedding[...], "BTD,VD->BTV"
    else:
      w, spec = self.lm_head.kernel[...], "BTD,DV->BTV"
    return layers.held(w, self.cfg.param_dtype), spec

  def logits(self, h_BTD: jax.Array, head: tuple[jax.Array, str] | None = None,
             operand: jax.Array | None = None) -> jax.Array:
    """LM head; float32 (full-precision matmul) when cfg.lm_head_fp32. `head`: `self.head()`
    when the caller already took it; `operand`: `self.head_operand(w)`, likewise."""
    w, spec = self.head() if head is None else head
    return _logits(h_BTD, w, spec, self.cfg, operand)

  def head_operand(self, w: jax.Array) -> jax.Array | None:
    """What the FP32 head multiplies with, cast from `self.head()`'s weights, for a caller
    that runs the head over chunks to take once outside its loop (the trainer's float32
    master would otherwise be cast to bf16 in every chunk, forward and backward: ~9 ms a
    step of the qwen3_1p7b 16 x 4096 step's bound compiled for an H100); None where there is
    no cast to take (`layers.fp32_head_operand`)."""
    if not self.cfg.lm_head_fp32:
      return None
    return layers.fp32_head_operand(w, self.cfg.dtype, self.cfg.param_dtype)

  def token_log_probs(self, h_BTD: jax.Array, targets_BT: jax.Array,
                      chunk_size: int | None = None) -> jax.Array:
    """log p(targets_BT | h_BTD) as float32; the log-softmax runs in the LM head's dtype.

    With chunk_size (a divisor of T) the [B, T, V] logits are never all alive at once: chunks
    of the sequence go through the head one at a time and are recomputed in the backward
    pass, which bounds memory for large vocabularies.
    """
    w, spec = self.head()
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
               ) -> jax.Array:
    """logits_BTV."""
    return self.logits(self.hidden_states(tokens_BT, positions_BT, mask_BT))


# What a layer keeps for the backward pass: "none" stores every activation, "full" stores only
# the layer input (everything else is recomputed), "dots" stores matmul outputs that have no
# batch dims (the projections) and recomputes the cheap elementwise work and attention.
# "attention" keeps the attention block's results: the q/k/v and output projections
# (`layers.Attention`'s checkpoint names) and the attention kernel's output and log-sum-exp
# (what its backward kernel reads: splash's by name, cuDNN's by primitive), so only the
# norms and the MLP are recomputed. Per token and
# layer that is (2N + 2K) * H + D values (and N float32 log-sum-exps) beside the layer input:
# 14,336 on Qwen3-8B, against 34,816 for "dots" (which keeps the MLP's gate and up outputs,
# 2F, and reruns the attention kernel). "context" keeps only the attention kernel's output
# and log-sum-exp (D values and N float32 per token and layer): the backward pass reruns the
# layer's projections and norms, not the kernel, at a fraction of "attention"'s memory (MaxText's
# "minimal with context" keeps the projections too). The einsum path (CPU, GPU without cuDNN)
# has no kernel residuals: there the attention itself is recomputed ("context" is "full").
ATTENTION_NAMES = ("query_proj", "key_proj", "value_proj", "out_proj",
                   attention.SPLASH_RESIDUALS)
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "attention": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.save_only_these_names(*ATTENTION_NAMES),
        attention.keeps_cudnn_residuals),
    "context": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.save_only_these_names(attention.SPLASH_RESIDUALS),
        attention.keeps_cudnn_residuals),
    # "dots" and the attention kernel's output and log-sum-exp: every matmul's result is
    # kept, only elementwise work (norms, RoPE, SiLU) is recomputed.
    "matmuls": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.save_only_these_names(attention.SPLASH_RESIDUALS),
            attention.keeps_cudnn_residuals)),
}


def _pinner(sharding: jax.sharding.NamedSharding | None):
  if sharding is None:
    return lambda x: x
  return lambda x: jax.lax.with_sharding_constraint(x, sharding)


def _sequence_gather(residual: jax.sharding.NamedSharding,
                     activation: jax.sharding.NamedSharding | None) -> Callable:
  """x_BTD split along T as `residual` -> whole rows (`_whole_rows`), an explicit all-gather.

  Explicit (a shard_map), not a sharding constraint: with a constraint XLA saw the layer
  input both split and gathered, and kept the GATHERED copy as the remat residual of every
  layer (the stacked [L, B, T, D] buffer whole in T: no memory saved). Under the shard_map
  the residual can only be the split input; the backward pass reduce-scatters.
  """
  rows, seq = (tuple(residual.spec) + (None, None))[:2]
  whole = _whole_rows(residual, activation)
  gathered = jax.shard_map(
      lambda x: jax.lax.all_gather(x, seq, axis=1, tiled=True), mesh=residual.mesh,
      in_specs=jax.sharding.PartitionSpec(rows, seq, None),
      out_specs=jax.sharding.PartitionSpec(rows, None, None), check_vma=False)
  return lambda x_BTD: jax.lax.with_sharding_constraint(gathered(x_BTD), whole)


def _whole_rows(residual: jax.sharding.NamedSharding,
                activation: jax.sharding.NamedSharding | None) -> jax.sharding.NamedSharding:
  """Where a layer's [B, T, D] input lives under sequence parallelism: `activation` (rows
  split, T whole), or, without one, `residual` with its T and D axes unsplit."""
  if activation is not None:
    return activation
  rows = residual.spec[0] if len(residual.spec) else None
  return jax.sharding.NamedSharding(residual.mesh, jax.sharding.PartitionSpec(rows, None, None))


def _remat_policy(name: str) -> Callable | None:
  """The jax.checkpoint policy for `name`; None means no remat at all."""
  if name not in REMAT_POLICIES:
    raise ValueError(f"unknown remat policy {name!r}; expected one of {sorted(REMAT_POLICIES)}")
  return REMAT_POLICIES[name]


def _stacked_layers(cfg: ModelConfig, rngs: nnx.Rngs) -> decoder.DecoderLayer:
  """One DecoderLayer whose params carry a leading [L] axis named 'layers'."""

  @nnx.split_rngs(splits=cfg.num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=cfg.num_layers,
            transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(rngs: nnx.Rngs) -> decoder.DecoderLayer:
    return decoder.DecoderLayer(cfg, rngs=rngs)

  return make(rngs)


def _logits(h_BTD: jax.Array, w: jax.Array, spec: str, cfg: ModelConfig,
            operand: jax.Array | None = None) -> jax.Array:
  if cfg.lm_head_fp32:
    # ScaleRL FP32 logits
    return layers.flat_rows(h_BTD, spec, lambda h, sp: layers.fp32_logits(
        h, w, sp, cfg.param_dtype, operand))
  dtype = jnp.dtype(cfg.dtype)
  return layers.flat_rows(h_BTD, spec, lambda h, sp: jnp.einsum(sp, h.astype(dtype),
                                                                w.astype(dtype)))


def create_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model on the default device (for a mesh see sharding.py)."""
  return Transformer(cfg, rngs=nnx.Rngs(seed))
