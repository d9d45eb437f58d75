"""The sampler's device side: per-slot state, prefill into slots, and jitted decode chunks.

Shapes: S slots, M page-table entries per slot, N decode steps per chunk, n rows admitted at
once from u distinct prompts, T prompt bucket length, E eos ids, F forced-phrase tokens,
V vocab.

A slot holds one sequence. Its keys and values live in the pages its row of the page table
lists (generation/pages.py keeps the table on the host and passes it to every program): the
prompt's first P-1 tokens at positions [0, P-1); `token_S` is the newest token not yet in
the cache (the last prompt token right after admission) and `pos_S` its position. Each
decode step feeds `token_S`, writes it at `pos_S`, and picks the next token from the
resulting logits. Admission thus
needs no logits at all (XLA drops the LM head from the prefill program), and the first
generated token goes through the same sampling, forcing and stopping code as every other.

Stopping on EOS ids and on token budgets happens on the device, inside the chunk, so a
finished row stops producing valid tokens at once; stop strings are matched on the host.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.generation import records, sampling
from jaxrl_scale.models import kv_cache, paged_attention, sharding, transformer
from jaxrl_scale.models.config import ModelConfig

NEVER = records.NEVER  # force_at value of a sequence that is never interrupted

# Per-step end codes (ChunkOutput.end_NS).
RUNNING, END_EOS, END_LENGTH = 0, 1, 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SlotState:
  """Everything a slot carries between decode steps (all leading dims are S)."""

  cache: kv_cache.PagedKVCache
  token_S: jax.Array  # int32: next token to feed
  pos_S: jax.Array  # int32: its slot / RoPE position
  num_gen_S: jax.Array  # int32: tokens generated so far
  active_S: jax.Array  # bool
  seed_S: jax.Array  # int32 per-sequence seed
  temperature_S: jax.Array  # float32, 0 = greedy
  top_k_S: jax.Array  # int32, 0 = off
  top_p_S: jax.Array  # float32, 1 = off
  limit_S: jax.Array  # int32: max new tokens
  force_at_S: jax.Array  # int32: generated-token index where the forced phrase starts
  answer_budget_S: jax.Array  # int32: tokens allowed after the phrase (0 = up to limit)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Admission:
  """One prefill piece: u distinct prompts, computed once each, whose keys/values go to n
  destination rows, each taking those of prompt source_n (the G completions of one prompt
  share one prefill). Padding rows carry slot index S, which is dropped.

  A prompt is prefilled whole (start 0, T covering it) or in pieces of T positions
  (chunked prefill, `sampler.prefill_chunk`): the piece holds the prompts' tokens at
  positions [start, start + T) (`start` is static: see `admit`) and attends to the
  positions before `start` through the pages of slot src_slot_u, where the earlier pieces
  wrote them. A row starts decoding (its slot state is set) with the piece that completes
  its prompt (activate_n). generation/prefill.py builds these on the host."""

  tokens_uT: jax.Array  # int32 the prompts' tokens at positions [start, start + T), padded
  length_u: jax.Array  # int32 their whole lengths (>= 1)
  source_n: jax.Array  # int32 prompt row in [0, u) of each destination row
  slot_n: jax.Array  # int32 destination slot
  src_slot_u: jax.Array  # int32 a slot holding each prompt's earlier pieces (start > 0)
  activate_n: jax.Array  # bool: this piece completes the row's prompt: it starts decoding
  last_n: jax.Array  # int32 the row's last prompt token (fed by its first decode step)
  seed_n: jax.Array
  temperature_n: jax.Array
  top_k_n: jax.Array
  top_p_n: jax.Array
  limit_n: jax.Array
  force_at_n: jax.Array
  answer_budget_n: jax.Array
  # Tokens after the prompt so far: 0 for a new sequence; a continued episode's model and
  # environment tokens (`length_u` then counts its whole history).
  gen_n: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Constants:
  """Per-sampler constants passed as arrays so they never trigger a recompile."""

  eos_E: jax.Array  # int32 ids that end a sequence (-1 = unused entry)
  phrase_F: jax.Array  # int32 forced-interruption phrase, zero-padded to a power of two
  phrase_len: jax.Array  # int32 scalar: real length of phrase_F
  think_end: jax.Array  # int32 scalar: id that ends thinking naturally (-1 = none)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkOutput:
  """Per step and slot: what was emitted. Rows with valid False emitted nothing."""

  tokens_NS: jax.Array
  logprobs_NS: jax.Array  # float32
  forced_NS: jax.Array  # bool
  valid_NS: jax.Array  # bool
  end_NS: jax.Array  # int8 RUNNING / END_EOS / END_LENGTH
  # Routing records (`record_routing`): the experts each step's fed token went to in each
  # sparse layer, [N, S, L_sparse, K] in `routing_dtype`; None when not recorded.
  routing_NSLK: jax.Array | None = None


def routing_dtype(num_experts: int) -> np.dtype:
  """The narrowest integer holding an expert index: what routing records cost per token
  and sparse layer and slot (1 byte up to 256 experts)."""
  return np.dtype(np.uint8 if num_experts <= 256 else np.int16)


def next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def state_shardings(model_cfg: ModelConfig, mesh: Mesh, num_slots: int) -> SlotState:
  """Slots and the page pool's shards over the mesh's 'data' axis (kv heads over 'tp')."""
  data = mesh.shape.get("data", 1)
  vec = NamedSharding(mesh, PartitionSpec("data" if data > 1 else None))
  return SlotState(cache=sharding.cache_shardings(model_cfg, mesh),
                   token_S=vec, pos_S=vec, num_gen_S=vec, active_S=vec, seed_S=vec,
                   temperature_S=vec, top_k_S=vec, top_p_S=vec, limit_S=vec, force_at_S=vec,
                   answer_budget_S=vec)


def constants(eos_ids: Sequence[int], phrase: Sequence[int], think_end: int) -> Constants:
  """Host-side Constants; arrays padded to power-of-two lengths (at least 8) so samplers
  with similar tokenizers and phrases share one compiled decode program."""
  eos_E = np.full((max(8, next_pow2(len(eos_ids))),), -1, np.int32)
  eos_E[:len(eos_ids)] = eos_ids
  phrase_F = np.zeros((max(8, next_pow2(len(phrase))),), np.int32)
  phrase_F[:len(phrase)] = phrase
  return Constants(eos_E=eos_E, phrase_F=phrase_F,
                   phrase_len=np.asarray(len(phrase), np.int32),
                   think_end=np.asarray(think_end, np.int32))


def table_sharding(mesh: Mesh) -> NamedSharding:
  """The page table [S, M]: rows with their slots over 'data'."""
  data = mesh.shape.get("data", 1)
  return NamedSharding(mesh, PartitionSpec("data" if data > 1 else None, None))


def empty_state(cfg: ModelConfig, num_slots: int, shards: int, pages_per_shard: int,
                page_size: int, cache_dtype: str | None) -> SlotState:
  """All slots free, an empty page pool (trace under jit with out_shardings so it is born
  sharded)."""
  s = num_slots
  zeros_i = jnp.zeros((s,), jnp.int32)
  return SlotState(
      cache=kv_cache.init_pages(cfg, shards, pages_per_shard, page_size, cache_dtype),
      token_S=zeros_i, pos_S=zeros_i, num_gen_S=zeros_i,
      active_S=jnp.zeros((s,), jnp.bool_), seed_S=zeros_i,
      temperature_S=jnp.ones((s,), jnp.float32), top_k_S=zeros_i,
      top_p_S=jnp.ones((s,), jnp.float32), limit_S=zeros_i,
      force_at_S=jnp.full((s,), NEVER, jnp.int32), answer_budget_S=zeros_i)


def admit(graphdef: nnx.GraphDef, params: nnx.State, state: SlotState,
          adm: Admission, table_SM: jax.Array, mesh: Mesh | None = None,
          start: int = 0, record_routing: bool = False,
          ) -> SlotState | tuple[SlotState, jax.Array]:
  """Prefills one piece of the admitted prompts, once per distinct prompt, and writes its
  keys/values into the pages of every row that takes them (rows sharing a prompt write its
  shared pages alike); rows whose prompt this piece completes start decoding.

  With the generator's `mesh`, the prefill's activations are split by rows over its 'data'
  axis (when it divides u), which also lets `attention.causal_attention` pick the TPU kernel.
  `start` (static, so positions and page offsets fold into constants: traced, it cost the
  8B paper prefill 6 GiB of temporaries) > 0: the piece holds positions [start, start + T)
  and attends to each prompt's positions before it, read from the pages of slot
  adm.src_slot_u (an XLA gather and einsum attention on every platform; inside the layer
  loop, except on CPU: see `Transformer.prefill_into`).
  `record_routing` (an MoE model): also returns the experts the piece's tokens went to,
  routing_uTLK in `routing_dtype` (garbage at the padding the mask excludes).
  `start` may also be a traced int32 scalar: an episode continued in place
  (generation/episodes.py), whose new tokens start wherever its history ends. The prefix
  is then read through the whole page table row (masked past `start`), so one program
  serves every history length.
  """
  model = nnx.merge(graphdef, params)
  u, t = adm.tokens_uT.shape
  act_sharding = None
  if mesh is not None:
    data = mesh.shape.get("data", 1)
    row_axis = "data" if data > 1 and u % data == 0 else None
    act_sharding = NamedSharding(mesh, PartitionSpec(row_axis, None, None))
  positions_uT = start + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (u, t))
  # The last prompt token is fed by the first decode step, so only P-1 tokens go in now.
  mask_uT = positions_uT < (adm.length_u - 1)[:, None]

  num_slots, width = table_SM.shape
  pool = state.cache.kv  # [L, D, P + 1, C, 2K, H]
  shards, past, page = pool.shape[1], pool.shape[2], pool.shape[3]
  prefix = None
  traced = not isinstance(start, int)
  if traced or start:
    src_u = jnp.clip(adm.src_slot_u, 0, num_slots - 1)
    read = width if traced else min(-(-start // page), width)
    prefix = kv_cache.PromptPrefix(
        shard_B=src_u // (num_slots // shards), pages_BM=table_SM[src_u, :read],
        length=jnp.asarray(start, jnp.int32))

  # Index pool.shape[2] is past the pool, so the scatter drops it: padding, the last prompt
  # token (the first decode step writes it) and unassigned entries (the null page) go there.
  length_n = adm.length_u[adm.source_n]
  t_T = start + jnp.arange(t, dtype=jnp.int32)
  real_n = adm.slot_n < num_slots
  slot_n = jnp.minimum(adm.slot_n, num_slots - 1)
  page_nT = table_SM[slot_n][:, jnp.minimum(t_T // page, width - 1)]
  write_nT = (real_n[:, None] & (t_T[None, :] < (length_n - 1)[:, None])
              & (t_T[None, :] // page < width) & (page_nT < past - 1))
  page_nT = jnp.where(write_nT, page_nT, past)
  shard_nT = jnp.broadcast_to((slot_n // (num_slots // shards))[:, None], page_nT.shape)
  off_nT = jnp.broadcast_to(t_T[None, :] % page, page_nT.shape)
  heads_11K = 2 * jnp.arange(pool.shape[4] // 2, dtype=jnp.int32)[None, None, :]
  at_nTK = (shard_nT[:, :, None], page_nT[:, :, None], off_nT[:, :, None])

  def write(pool, layer, k_uTKH, v_uTKH):
    # Each destination row takes its source prompt's keys (the pool's even heads) and
    # values (odd heads), one layer at a time inside the layer loop: no [L, n, T, K, H]
    # stack of them is held, and the pool is updated in place.
    for parity, new_uTKH in ((0, k_uTKH), (1, v_uTKH)):
      pool = pool.at[(layer,) + at_nTK + (heads_11K + parity,)].set(
          new_uTKH[adm.source_n].astype(pool.dtype), mode="drop")
    return pool

  # The full-sequence pass (the TPU attention kernel where there is one).
  out = model.prefill_into(adm.tokens_uT, positions_uT, mask_uT, pool, write,
                           activation_sharding=act_sharding, prefix=prefix,
                           prefix_in_loop=not on_cpu(mesh), record_routing=record_routing)
  pool = out[1]
  cache = kv_cache.PagedKVCache(kv=pool)

  # Only rows whose prompt is complete take their slot state (the others' slots stay
  # inactive until a later piece).
  starting_n = jnp.where(adm.activate_n, adm.slot_n, num_slots)

  def row(old, new):
    return old.at[starting_n].set(new.astype(old.dtype), mode="drop")

  n = adm.slot_n.shape[0]
  new = SlotState(
      cache=cache,
      token_S=row(state.token_S, adm.last_n),
      pos_S=row(state.pos_S, length_n - 1),
      num_gen_S=row(state.num_gen_S, jnp.zeros((n,), jnp.int32) if adm.gen_n is None
                    else adm.gen_n),
      active_S=row(state.active_S, jnp.ones((n,), jnp.bool_)),
      seed_S=row(state.seed_S, adm.seed_n),
      temperature_S=row(state.temperature_S, adm.temperature_n),
      top_k_S=row(state.top_k_S, adm.top_k_n),
      top_p_S=row(state.top_p_S, adm.top_p_n),
      limit_S=row(state.limit_S, adm.limit_n),
      force_at_S=row(state.force_at_S, adm.force_at_n),
      answer_budget_S=row(state.answer_budget_S, adm.answer_budget_n))
  if not record_routing:
    return new
  return new, out[2].astype(routing_dtype(model.cfg.num_experts))


def _step(model: transformer.Transformer, st: SlotState, consts: Constants, table_SM: jax.Array,
          view_pages: int, truncate: bool, all_greedy: bool, mesh: Mesh | None,
          layer_states: list[Any] | None, record_routing: bool = False,
          ) -> tuple[SlotState, tuple[jax.Array, ...]]:
  """One decode step for every slot."""
  active_S = st.active_S
  out = model.decode(st.token_S[:, None], st.pos_S, active_S, st.cache, table_SM,
                     view_pages=view_pages, mesh=mesh, layer_states=layer_states,
                     record_routing=record_routing)
  logits_S1V, cache = out[:2]
  routing = (out[2].astype(routing_dtype(model.cfg.num_experts)),) if record_routing else ()
  logits_SV = logits_S1V[:, 0].astype(jnp.float32)
  seed_keys_SK = jax.vmap(lambda s: jax.random.key_data(jax.random.key(s)))(st.seed_S)
  keys_SK = sampling.step_keys(seed_keys_SK, st.num_gen_S)
  phrase_len = consts.phrase_len
  k_S = st.num_gen_S - st.force_at_S
  forcing_S = (k_S >= 0) & (k_S < phrase_len)
  forced_tok_S = consts.phrase_F[jnp.clip(k_S, 0, consts.phrase_F.shape[0] - 1)]
  tok_S, lp_S = sampling.sample(logits_SV, keys_SK, st.temperature_S, st.top_k_S, st.top_p_S,
                                truncate=truncate, all_greedy=all_greedy,
                                forced_B=jnp.where(forcing_S, forced_tok_S, -1))

  # Thinking that ends on its own before the budget cancels the interruption.
  natural_end_S = (~forcing_S & (k_S < 0) & (tok_S == consts.think_end)
                   & (consts.think_end >= 0))
  force_at_S = jnp.where(active_S & natural_end_S, NEVER, st.force_at_S)

  num_gen_S = st.num_gen_S + 1
  interrupted_S = force_at_S < NEVER
  after_phrase_S = force_at_S + phrase_len
  answer_limit_S = jnp.where(st.answer_budget_S > 0, after_phrase_S + st.answer_budget_S,
                             st.limit_S)
  limit_S = jnp.where(interrupted_S, jnp.minimum(st.limit_S, answer_limit_S), st.limit_S)
  is_eos_S = (jnp.any((tok_S[:, None] == consts.eos_E[None, :]) & (consts.eos_E[None, :] >= 0),
                      axis=-1) & ~forcing_S)
  hit_len_S = num_gen_S >= limit_S
  end_S = jnp.where(is_eos_S, END_EOS, jnp.where(hit_len_S, END_LENGTH, RUNNING))
  end_S = jnp.where(active_S, end_S, RUNNING).astype(jnp.int8)

  new = dataclasses.replace(
      st,
      cache=cache,
      token_S=jnp.where(active_S, tok_S, st.token_S),
      pos_S=jnp.where(active_S, st.pos_S + 1, st.pos_S),
      num_gen_S=jnp.where(active_S, num_gen_S, st.num_gen_S),
      active_S=active_S & (end_S == RUNNING),
      force_at_S=force_at_S)
  return new, (tok_S, lp_S, forcing_S, active_S, end_S) + routing


def decode_chunk(graphdef: nnx.GraphDef, params: nnx.State, state: SlotState,
                 consts: Constants, table_SM: jax.Array, *, num_steps: int, view_pages: int,
                 truncate: bool, all_greedy: bool = False, mesh: Mesh | None = None,
                 layer_leaves: Sequence[jax.Array] | None = None,
                 record_routing: bool = False) -> tuple[SlotState, ChunkOutput]:
  """`num_steps` decode steps for all slots in one program (lax.scan).

  Off TPU, attention reads each slot's first `view_pages` pages: the caller guarantees they
  cover every live row's positions for the whole chunk (the engine grows the page table
  first). On a TPU `mesh` the ragged kernel reads each row's own length instead; on a GPU
  the Triton kernel reads each row's own length within those pages
  (`paged_attention.paged_impl` picks which).
  `truncate` and `all_greedy` are static sampling modes (see `sampling.sample`).
  `layer_leaves`: `layers_program`'s output for these params (the sampler passes it where
  `splits_layers`), the layers' weights already cut out of the stacked arrays. Without it
  the steps read the stacked weights, except on CPU, where the chunk cuts them itself.
  `record_routing` (an MoE model): the output carries each step's experts (`routing_NSLK`).
  """
  model = nnx.merge(graphdef, params)
  # XLA (CPU and GPU) copies a layer's weights out of the stacked arrays before its
  # matmuls, every step: given layer_leaves (cut once per weight swap by the caller), the
  # steps run the layers unrolled over those instead; without them, CPU cuts them once per
  # chunk. On CPU the rows' pages are also copied once per chunk: the steps read and append
  # to dense per-layer copies of them (the pool is written too, so nothing is copied back).
  # The GPU and TPU kernels page through the pool every step, holding no copy of every
  # layer's pages at once (as does a GPU told to gather: it gathers every step).
  layer_states = None
  if layer_leaves is not None or on_cpu(mesh):
    layer_states = model.split_layers()  # only traced for its structure when given
    if layer_leaves is not None:
      layer_states = jax.tree.unflatten(jax.tree.structure(layer_states), layer_leaves)
  impl = paged_attention.paged_impl(mesh, model.cfg.head_dim, state.cache.page_size)
  if on_cpu(mesh) and impl == "gather":
    state = dataclasses.replace(
        state, cache=model.with_views(state.cache, table_SM, view_pages, mesh=mesh))

  def body(st, _):
    return _step(model, st, consts, table_SM, view_pages, truncate, all_greedy, mesh,
                 layer_states, record_routing)

  state, (tok, lp, forced, valid, end, *routing) = jax.lax.scan(body, state, None,
                                                                length=num_steps)
  state = dataclasses.replace(state, cache=kv_cache.PagedKVCache(kv=state.cache.kv))
  return state, ChunkOutput(tokens_NS=tok, logprobs_NS=lp, forced_NS=forced, valid_NS=valid,
                            end_NS=end, routing_NSLK=routing[0] if routing else None)


# Compiled programs are memoised on static, hashable keys (graphdef, param tree structure,
# shardings, modes), so samplers built for the same model and shapes share them. Params go
# in as a flat tuple of arrays: flattening an nnx.State on every call costs more host time
# than a small decode chunk takes on the device.


@functools.lru_cache(maxsize=None)
def admit_program(graphdef: nnx.GraphDef, param_treedef: Any, shardings: SlotState,
                  start: int = 0, record_routing: bool = False) -> Callable:
  """jit(admit) taking (param_leaves, state, admission, page table); the state is donated.
  `start`: see `admit` (0 for a whole prompt or its first piece). With `record_routing`
  it returns (state, routing_uTLK)."""

  def run(param_leaves, state, adm, table_SM):
    params = jax.tree.unflatten(param_treedef, param_leaves)
    out = admit(graphdef, params, state, adm, table_SM, mesh=shardings.token_S.mesh,
                start=start, record_routing=record_routing)
    if record_routing:
      return jax.lax.with_sharding_constraint(out[0], shardings), out[1]
    return jax.lax.with_sharding_constraint(out, shardings)

  return jax.jit(run, donate_argnums=(1,))


@functools.lru_cache(maxsize=None)
def resume_program(graphdef: nnx.GraphDef, param_treedef: Any, shardings: SlotState,
                   record_routing: bool = False) -> Callable:
  """jit(admit) with a traced `start`, taking (param_leaves, state, admission, page table,
  start): continues episodes whose history ends at `start` (compiled once per piece
  length, whatever the history). The state is donated."""

  def run(param_leaves, state, adm, table_SM, start):
    params = jax.tree.unflatten(param_treedef, param_leaves)
    out = admit(graphdef, params, state, adm, table_SM, mesh=shardings.token_S.mesh,
                start=start, record_routing=record_routing)
    if record_routing:
      return jax.lax.with_sharding_constraint(out[0], shardings), out[1]
    return jax.lax.with_sharding_constraint(out, shardings)

  return jax.jit(run, donate_argnums=(1,))


def decode_program(graphdef: nnx.GraphDef, param_treedef: Any, shardings: SlotState,
                   num_steps: int, truncate: bool, all_greedy: bool,
                   view_pages: int, record_routing: bool = False,
                   rows: int | None = None) -> Callable:
  """jit(decode_chunk) taking (param_leaves, layer_leaves, state, consts, page table); the
  state is donated. layer_leaves: `layers_program`'s output where `splits_layers`, else
  None. `view_pages` bounds the attention read (see `decode_chunk`); the engine compiles a
  few values of it, so short sequences do not pay for reading the longest. Programs are
  shared per `paged_attention.AUTO_IMPL` as well (it picks the attention traced in).

  `rows` R (fewer than the slots; see `row_buckets`): the program takes one more argument,
  the R distinct slots to run (`row_index`), and decodes only those: their rows of the
  state and page table are gathered into an R-row chunk and scattered back after it (the
  page pool is shared, so nothing of it moves); the output keeps one row per slot, the
  other slots' rows empty (valid False)."""
  return _decode_program(graphdef, param_treedef, shardings, num_steps, truncate, all_greedy,
                         view_pages, record_routing, paged_attention.AUTO_IMPL, rows)


@functools.lru_cache(maxsize=None)
def _decode_program(graphdef: nnx.GraphDef, param_treedef: Any, shardings: SlotState,
                    num_steps: int, truncate: bool, all_greedy: bool, view_pages: int,
                    record_routing: bool, paged_override: str | None,
                    rows: int | None = None) -> Callable:
  del paged_override  # a cache key only: read again at trace time

  def chunk(param_leaves, layer_leaves, state, consts, table_SM):
    params = jax.tree.unflatten(param_treedef, param_leaves)
    return decode_chunk(graphdef, params, state, consts, table_SM, num_steps=num_steps,
                        view_pages=view_pages, truncate=truncate, all_greedy=all_greedy,
                        mesh=shardings.token_S.mesh, layer_leaves=layer_leaves,
                        record_routing=record_routing)

  def run(param_leaves, layer_leaves, state, consts, table_SM):
    state, out = chunk(param_leaves, layer_leaves, state, consts, table_SM)
    return jax.lax.with_sharding_constraint(state, shardings), out

  def run_rows(param_leaves, layer_leaves, state, consts, table_SM, slots_R):
    per_slot = [f.name for f in dataclasses.fields(state) if f.name != "cache"]
    sub = dataclasses.replace(state, **{k: getattr(state, k)[slots_R] for k in per_slot})
    sub, out_R = chunk(param_leaves, layer_leaves, sub, consts, table_SM[slots_R])
    state = dataclasses.replace(state, cache=sub.cache, **{
        k: getattr(state, k).at[slots_R].set(getattr(sub, k)) for k in per_slot})
    num_slots = state.token_S.shape[0]

    def widen(x_NR):  # [N, R, ...] -> [N, S, ...], zeros (valid False) off the R slots
      full = jnp.zeros((x_NR.shape[0], num_slots) + x_NR.shape[2:], x_NR.dtype)
      return full.at[:, slots_R].set(x_NR)

    out = jax.tree.map(widen, out_R)
    return jax.lax.with_sharding_constraint(state, shardings), out

  return jax.jit(run if rows is None else run_rows, donate_argnums=(2,))


# Rows below which a decode chunk does not shrink further (`row_buckets`): on CPU 2 rows'
# weight matmuls still take 0.79 of 4 rows' time (they read the same weights), and every
# bucket is one more program to compile for each view width.
MIN_ROWS = 4


def row_buckets(setting: int | None, num_slots: int, mesh: Mesh | None,
                sharded_slots: bool) -> tuple[int, ...]:
  """The row counts a decode chunk may run at (`sampler.decode_row_buckets`), largest first:
  num_slots, then its halves down to MIN_ROWS, `setting` counts in all; None: 4 on CPU,
  where decode matmuls are bound by compute (8 rows' weight matmuls take 0.79 of 16's time
  and 0.45 of 64's: `floor.matmul_floor`, 8 layers x 512, vocab 32768), 1 elsewhere (a GPU
  or TPU decode reads the weights either way, and each count is one more program to
  compile). Always only num_slots where the slots are sharded over several devices (a
  smaller chunk would gather rows across them)."""
  n = setting if setting is not None else (4 if on_cpu(mesh) else 1)
  out = [num_slots]
  while (not sharded_slots and len(out) < n and out[-1] % 2 == 0
         and out[-1] // 2 >= MIN_ROWS):
    out.append(out[-1] // 2)
  return tuple(out)


def row_index(buckets: Sequence[int], live_slots: Sequence[int]) -> np.ndarray | None:
  """The slots a decode chunk runs: None for all of them (`buckets[0]`), else the smallest
  bucket's worth holding every live slot: those first, then free slots (inactive on the
  device: they decode nothing and are written back unchanged)."""
  live = sorted(live_slots)
  rows = min((b for b in buckets if b >= len(live)), default=buckets[0])
  if rows == buckets[0]:
    return None
  taken = set(live)
  free = [s for s in range(buckets[0]) if s not in taken][:rows - len(live)]
  return np.asarray(live + free, np.int32)


decode_program.cache_clear = _decode_program.cache_clear  # forgets the compiled programs


@functools.lru_cache(maxsize=None)
def layers_program(graphdef: nnx.GraphDef, param_treedef: Any) -> Callable:
  """jit taking param_leaves (a tuple) to every layer's weights as arrays of their own (flat
  leaves of `Transformer.split_layers`), for `decode_program` where `splits_layers`: XLA
  copies a slice of the stacked weights before each matmul, so the sampler cuts them once
  per weight swap (one more copy of the layer weights held) instead of every step on GPU
  or every decode chunk on CPU (benchmarks/sampler/sampler_bench.py: README, Sampler)."""

  def run(param_leaves):
    params = jax.tree.unflatten(param_treedef, list(param_leaves))
    return tuple(jax.tree.leaves(nnx.merge(graphdef, params).split_layers()))

  return jax.jit(run)


def splits_layers(mesh: Mesh | None) -> bool:
  """Whether a sampler on `mesh` holds every layer's weights as arrays of their own
  (`layers_program`): on CPU and GPU. Not on TPU, whose generator memory `plan` budgets
  for one copy of the weights, nor for an abstract mesh (compiled, never run)."""
  platforms = _platforms(mesh)
  return bool(platforms) and platforms <= {"cpu", "gpu"}


def on_cpu(mesh: Mesh | None) -> bool:
  """Whether programs for `mesh` (None: the default devices) run on XLA:CPU."""
  return "cpu" in _platforms(mesh)


def _platforms(mesh: Mesh | None) -> set[str]:
  """The platforms of `mesh`'s devices (None: the default devices; none for an abstract
  mesh)."""
  if mesh is None:
    devices = jax.devices()
  else:
    devices = mesh.devices.flat if isinstance(mesh, Mesh) else ()
  return {d.platform for d in devices}


def append_row(buf: records.TokenBuffer, version: int, tokens, logprobs, forced, ends,
               stops: records.StopStrings | None, routing=None) -> tuple[str | None, int]:
  """Appends one row's valid steps of a chunk read back to its token record, and cuts it
  at the first stop string of the current turn (environment text never stops the policy).

  Returns (how the turn ended: EOS, LENGTH, STOP, or None while it goes on; the number of
  tokens kept of those appended).
  """
  num_old = len(buf.tokens)
  buf.extend(tokens, logprobs, forced, version)
  if routing is not None:
    buf.extend_routing(routing)
  reason = None
  if ends[-1] != RUNNING:
    reason = records.EOS if ends[-1] == END_EOS else records.LENGTH
  stop_at = None
  if stops:
    ts = buf.turn_start
    stop_at = stops.first_stop(buf.tokens[ts:], num_old - ts)
  if stop_at is not None:
    buf.truncate(buf.turn_start + stop_at + 1)
    reason = records.STOP
  return reason, len(buf.tokens) - num_old
