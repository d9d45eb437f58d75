"""The Sampler: continuous batching over a fixed set of slots, on the generator mesh.

    sampler = engine.Sampler(model, cfg.sampler, mesh=slices.generator, tokenizer=tok)
    for completion in sampler.stream(requests):   # or sampler.generate(list_of_requests)
      ...
    sampler.update_params(new_params, version=7)   # from any thread, at any time

KV cache: paged (generation/pages.py). Each generator group holds a pool of pages of
`sampler.page_size` positions per data shard; a slot's sequence holds the pages its
positions so far need, taken as it grows and given back when it ends, so memory follows the
live tokens rather than slots x the longest possible completion. `sampler.kv_cache_tokens`
sizes the pool (0: every slot at its full length).

Host loop, one iteration per decode chunk:
  1. swap in params posted by `update_params` once they are computed (only here, between
     chunks, so every chunk runs with one policy version; slots keep their KV cache across
     the swap). Until then the live slots decode on with the weights they have (double
     buffer: the trainer's next step and the generator overlap); with nothing live the
     loop waits for them. With `sampler.weight_buffers` 1 the loop stops here instead
     while the poster deletes the live weights and places the new ones (one copy of the
     weights, never two; generation/weights.py);
  2. admit requests into free slots while their data shard has free pages for the prompt
     and the first chunk (a request waits, never fails, when the pool is full; preempted
     requests go first). One prefill job per prompt-length bucket; each distinct prompt is
     computed once, and the G completions of an RL prompt admitted together on one shard
     share its prompt-only pages (each gets its own copy of the page decoding writes
     into). Never while a posted update is still pending, so a new sequence starts on the
     newest weights. Then every queued prefill job runs its next piece: the whole prompt,
     or with `sampler.prefill_chunk` = c the next c positions, attending to the earlier
     pieces through the pages (chunked prefill mixed with decode: a long prompt is
     prefilled c positions per iteration while the live sequences keep decoding, and the
     prefill's activations never exceed c positions per row). A row decodes from the
     chunk after the piece that completes its prompt; a weight swap between pieces keeps
     what earlier pieces wrote, as it keeps decoded tokens' keys;
  3. give every live sequence the pages its next chunk writes; where a shard has too few,
     preempt its most recently admitted sequences: their pages go back and their requests
     restart from the prompt later (same seed: with the same weights, the same tokens;
     Stats.preemptions counts them). Reserving every sequence's whole budget at admission
     would give back the memory paging saves. A sequence whose prompt is still going in
     piece by piece is not live and needs no pages until it decodes;
  4. dispatch the next jitted chunk of N decode steps (on CPU, with few live rows, over a
     smaller bucket of the slots: `sampler.decode_row_buckets`);
  5. read back the chunk dispatched before it, hand out finished sequences and free their
     pages. An episode whose turn ended leaves its slot with its pages held (parked) while
     its environment works; answered, it continues in a free slot before new requests
     are admitted (generation/episodes.py). Parked pages are the first to go when a
     live sequence lacks pages (the episode then prefills its history again).
Step 5 lags step 4 by one chunk, so the device always has queued work while the host reads
results, matches stop strings and admits prompts. The price is that a slot freed by EOS in
chunk k is refilled from chunk k+2 on, and a sequence stopped by a stop string (matched on
the host) runs one chunk too long on the device; its extra tokens are dropped (and its
writes too, once its pages are given back). A slot whose sequence must reach its token
budget within the dispatched chunks is known to be free without reading anything back:
its pages go back and it is refilled for the very next chunk (the device runs programs in
order, so the old sequence's last writes land before the new owner's).

Compiled programs: one prefill per (piece length: the prompt bucket or prefill_chunk,
power-of-two admission count, distinct prompts rounded to 1, 2, 3, 4, 6, 8, 12, ...,
positions before the piece); one decode chunk per sampling mode and, off
TPU, pages read per row (a few counts, each about an eighth of the longest; on TPU the
ragged kernel reads each row's own length) and row bucket. Weights over the mesh's 'tp'
axis, slots and the page pool over 'data'.

A Sampler runs one generate/stream at a time; update_params is the only method meant to
be called from other threads.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import decode, episodes, prefill, records, sampling, weights
from jaxrl_scale.generation import layout as layout_lib
from jaxrl_scale.generation import pages as pages_lib
from jaxrl_scale.models import paged_attention, transformer
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.parallel import transfer

# Re-exported so callers need one import: engine.Sampler(...).generate([engine.Request(...)]).
Request = records.Request
Completion = records.Completion
Stats = records.Stats

_END = object()  # sentinel: the request iterator is exhausted


class Sampler(weights.WeightSwap, episodes.EpisodeSlots):
  """Generates completions with a KV cache, continuous batching and in-flight weight swaps.

  Args:
    model: the policy (an nnx Transformer); its params are copied onto `mesh`.
    cfg: the sampler config section. `cfg.num_slots` counts the whole job's concurrent
      sequences; this Sampler holds `cfg.num_slots / generator_groups` of them.
    mesh: generator mesh with axes ('data', 'tp'); None uses one device.
    generator_groups: generator meshes of the job, each with its own Sampler (one per
      host, `parallel.mesh.Slices.generator_groups`).
    tokenizer: needed for stop strings, forced interruption and `Completion.text`.
    eos_ids: ids that end a sequence; default the tokenizer's, else the model config's.
    seed: base seed; a request without its own seed derives one from this, its prompt_id
      and its sample_index.
    max_prompt_len: longest prompt to accept; sizes the KV cache (bucketed up).
    cache_dtype: KV cache dtype; default the model's activation dtype.
    version: policy version of the initial params.
    think_end_id: token that ends thinking on its own and so cancels a pending forced
      interruption; default the tokenizer's "</think>" when it is a single token.
    pipeline_depth: chunks in flight before the host reads one back (0 = synchronous).
      Default: 0 on CPU, where the host's work between chunks runs on the cores the chunk
      needs and a chunk in flight only delays refilling the slots a finished sequence frees
      (mixed-length batches: 1.11-1.24x the tokens/s of depth 1, benchmarks/peers), else 1.
    record_routing: an MoE model's routing records: every Completion carries the experts
      each of its positions went to (`Completion.routing`, for routing replay in the
      trainer). Costs L_sparse * K bytes per position on the host (uint8 up to 256
      experts; qwen3_30b_a3b: 48 * 8 = 384) and the same read back from the device;
      ignored (no cost) for a dense model.
    env_workers: threads that run environment steps of multi-turn episodes
      (generation/episodes.py), off the decode loop.
  """

  def __init__(self, model: transformer.Transformer, cfg: SamplerConfig, *,
               mesh: Mesh | None = None, tokenizer: Any = None,
               eos_ids: Sequence[int] | None = None, seed: int = 0,
               max_prompt_len: int | None = None, cache_dtype: str | None = None,
               version: int = 0, think_end_id: int | None = None,
               pipeline_depth: int | None = None,
               generator_groups: int = 1, record_routing: bool = False,
               env_workers: int = 8):
    self.cfg = cfg
    self.record_routing = bool(record_routing) and any(model.cfg.moe_layers())
    self.model_cfg = model.cfg
    self.tokenizer = tokenizer
    self.seed = seed
    self.mesh = mesh if mesh is not None else mesh_lib.single_device_mesh(
        axes=mesh_lib.GENERATOR_AXES)
    self.pipeline_depth = (pipeline_depth if pipeline_depth is not None
                           else 0 if decode.on_cpu(self.mesh) else 1)
    graphdef, params = nnx.split(model)
    lay = layout_lib.layout(model.cfg, params, cfg, self.mesh,
                            generator_groups=generator_groups, max_prompt_len=max_prompt_len,
                            cache_dtype=cache_dtype)
    data = lay.data
    self.num_slots = lay.num_slots

    if eos_ids is None:
      eos_ids = tokenizer.eos_ids if tokenizer is not None else model.cfg.eos_token_ids
    self.eos_ids = tuple(int(i) for i in eos_ids)

    self.buckets, self.max_len = lay.buckets, lay.max_len

    self._decode_text, self._stops, self.phrase_tokens, think_end = records.text_rules(
        cfg, tokenizer, think_end_id)
    self._think_end = think_end
    self._env = episodes.EnvCalls(env_workers)
    self._answered: list[records.TokenBuffer] = []  # continued episodes waiting for a slot
    self._parked_eps: list[records.TokenBuffer] = []  # out of a slot with their pages, in order
    self._blocked: set[int] = set()  # shards where an answered episode waits for pages
    self._resume_fn: Callable | None = None

    # Device placement: params over 'tp', slots over 'data', small per-call inputs replicated.
    self._graphdef = graphdef
    self._param_shardings = lay.param_shardings
    # A copy, never the model's own buffers: a trainer on the same devices replaces those
    # every step, and holding them would keep its old masters allocated.
    self._params = transfer.reshard(params, self._param_shardings, lay.params, copy=True)
    self._param_leaves, self._param_treedef = jax.tree.flatten(self._params)
    # On CPU and GPU every layer's weights are also held as arrays of their own, cut once
    # per weight swap rather than every decode chunk or step (`decode.layers_program`).
    self._split_layers = (decode.layers_program(graphdef, self._param_treedef)
                          if lay.layer_copies else None)
    self._layer_leaves = self._layers_of(self._param_leaves)
    self._param_paths = layout_lib.paths_and_leaves(self._params)[0]
    self._param_dtypes = jax.tree.map(lambda x: x.dtype, self._params)
    self.version = version
    self._init_swap(cfg.weight_buffers)

    self._state_shardings = lay.state_shardings
    self._consts = jax.device_put(
        decode.constants(self.eos_ids, self.phrase_tokens, think_end),
        NamedSharding(self.mesh, PartitionSpec()))

    page_size, pages = lay.page_size, lay.pages
    self._pool = pages_lib.PagePool(page_size, pages, data, self.num_slots // data, self.max_len)
    self._table_sharding = decode.table_sharding(self.mesh)
    # The TPU kernel reads each row's own length, so one decode program serves all lengths.
    self._ragged = paged_attention.paged_impl(self.mesh, model.cfg.head_dim) == "ragged"
    self._table: tuple[int, jax.Array] | None = None  # (pool version, device copy)
    mcfg, n_slots = model.cfg, self.num_slots
    self._init_fn = jax.jit(
        lambda: decode.empty_state(mcfg, n_slots, data, pages, page_size, cache_dtype),
        out_shardings=self._state_shardings)
    self._deactivate_fn = jax.jit(
        lambda state, keep_S: dataclasses.replace(state, active_S=state.active_S & keep_S),
        donate_argnums=(0,))
    self._waiting: collections.deque = collections.deque()  # pulled, not yet admitted
    self._admissions = 0
    self._admit_fns: dict[int, Callable] = {}  # by piece start (chunked prefill)
    self._jobs: list[prefill.PrefillJob] = []  # prefills with pieces still to run
    self._decode_fns: dict[tuple[bool, bool, int, int | None], Callable] = {}
    self._row_buckets = decode.row_buckets(cfg.decode_row_buckets, self.num_slots, self.mesh,
                                           sharded_slots=data > 1)
    self._state = self._init_fn()
    self._running = False
    self.stats = Stats()

  # --------------------------------------------------------------------------------------
  # Generation.

  def generate(self, requests: Iterable[records.Request] | Sequence[Sequence[int]],
               on_chunk: Callable[[Sampler, int], None] | None = None,
               on_progress: Callable[[int, int], None] | None = None,
               ) -> list[records.Completion]:
    """Completions for all `requests`, in request order.

    Plain token lists are accepted as requests with prompt_id = their index.
    `on_progress(done, total)` is called after each chunk and each finished completion
    (completions done so far, of all requests).
    """
    reqs = [r if isinstance(r, records.Request) else records.Request(list(r), prompt_id=i)
            for i, r in enumerate(requests)]
    index = {id(r): i for i, r in enumerate(reqs)}
    out: list[records.Completion | None] = [None] * len(reqs)
    done = 0

    def chunk_and_progress(sampler: Sampler, i: int) -> None:
      if on_chunk is not None:
        on_chunk(sampler, i)
      on_progress(done, len(reqs))

    for req, completion in self._run(iter(reqs), on_chunk if on_progress is None
                                     else chunk_and_progress):
      out[index[id(req)]] = completion
      done += 1
      if on_progress is not None:
        on_progress(done, len(reqs))
    return out  # type: ignore[return-value]

  def stream(self, requests: Iterable[records.Request],
             on_chunk: Callable[[Sampler, int], None] | None = None,
             ) -> Iterator[records.Completion]:
    """Yields completions as they finish; pulls requests lazily as slots free up.

    Args:
      requests: any iterable (e.g. a generator fed by the data pipeline). It may yield
        None when it has nothing to admit right now: the live slots keep decoding and it
        is asked again at the next chunk boundary (right away when nothing is live, so
        it should block rather than yield None then). Blocking while sequences are live
        would stall them all until it returns.
      on_chunk: called on the host after each chunk is read back, with the sampler and the
        chunk's index (used by tests to post weight updates at known points).
    """
    for _, completion in self._run(iter(requests), on_chunk):
      yield completion

  def reset_stats(self) -> None:
    self.stats = Stats()

  @property
  def asleep(self) -> bool:
    """Whether `sleep` has freed the sampler's device memory (the next run rebuilds it)."""
    return self._state is None

  def sleep(self) -> None:
    """Frees the sampler's device memory between runs: the page pool and slot state, the
    per-layer weight copies and the live weights (vLLM's sleep mode, which verl uses for
    colocated training). Colocated roles call it after generating, so that the train step
    has the chip; the trainer's next `update_params` brings new weights, and the next
    `generate` / `stream` rebuilds an empty pool (no recompile: same shapes). A run that
    starts with no weights posted since is an error. Only between runs, never during one.
    """
    if self._running:
      raise RuntimeError("Sampler.sleep during generate/stream: the slots are in use")
    self._sleep_weights()  # waits for every program that reads them (they return the state)
    for x in jax.tree.leaves(self._state):
      x.delete()
    self._state = None
    self._table = None

  def _wake(self) -> None:
    """Rebuilds what `sleep` freed before a run: the newest posted weights must exist."""
    if self._state is not None:
      return
    self._wake_weights()
    self._state = self._init_fn()

  def _new_buffer(self, req: records.Request) -> records.TokenBuffer:
    return records.new_buffer(req, self.cfg, longest_prompt=self.buckets[-1],
                              vocab=self.model_cfg.vocab_size, base_seed=self.seed,
                              record_routing=self.record_routing)

  def _admit(self, placed: list[tuple[int, records.TokenBuffer]]) -> None:
    """Gives newly placed sequences their pages (the completions of one prompt on one shard
    share its prompt pages) and queues their prefill, one job per prompt-length bucket."""
    by_prompt: dict[tuple, list[tuple[int, records.TokenBuffer]]] = collections.defaultdict(list)
    for slot, buf in placed:
      by_prompt[(self._pool.shard_of(slot), tuple(buf.request.prompt_tokens))].append(
          (slot, buf))
    for (_, prompt), rows in by_prompt.items():
      self._pool.admit_group([slot for slot, _ in rows], len(prompt),
                             [self._positions_after_chunk(buf) for _, buf in rows])
    groups: dict[int, list[tuple[int, records.TokenBuffer]]] = collections.defaultdict(list)
    for slot, buf in placed:
      n = len(buf.request.prompt_tokens)
      groups[next(b for b in self.buckets if b >= n)].append((slot, buf))
    for bucket, rows in sorted(groups.items()):
      self._jobs.append(prefill.PrefillJob(rows, min(bucket, self.cfg.prefill_chunk or bucket)))
      self.stats.admissions += 1

  def _prefill_pieces(self) -> None:
    """Dispatches the next piece of every queued prefill job (the whole prompt without
    chunked prefill). Rows whose prompt a piece completes decode from the next chunk on."""
    for job in list(self._jobs):
      start = job.start
      adm, rows, u, n = prefill.next_piece(job, self.cfg, self.num_slots)
      if start not in self._admit_fns:
        self._admit_fns[start] = decode.admit_program(
            self._graphdef, self._param_treedef, self._state_shardings, start,
            self.record_routing)
      out = self._admit_fns[start](self._param_leaves, self._state, adm, self._device_table())
      if self.record_routing:
        # Kept on the device until the sequence finishes (`TokenBuffer.routing_record`).
        self._state, routing_uTLK = out
        for (_, buf), source in zip(rows, adm.source_n):
          buf.prompt_routing.append((routing_uTLK, int(source), start))
      else:
        self._state = out
      for (_, buf), done in zip(rows, adm.activate_n):
        buf.prefilled = bool(done)
      if job.done:
        self._jobs.remove(job)
      self.stats.prefill_pieces += 1
      self.stats.prefill_tokens += u * job.piece
      self.stats.unshared_prefill_tokens += n * job.piece

  def _decode_fn(self, truncate: bool, all_greedy: bool, view_pages: int,
                 rows: np.ndarray | None) -> Callable:
    key = (truncate, all_greedy, view_pages, None if rows is None else len(rows))
    if key not in self._decode_fns:
      self._decode_fns[key] = decode.decode_program(
          self._graphdef, self._param_treedef, self._state_shardings, self.cfg.decode_chunk,
          truncate, all_greedy, view_pages, self.record_routing, key[3])
    return self._decode_fns[key]

  def _device_table(self) -> jax.Array:
    """The page table on the generator mesh, re-sent only after it changed."""
    if self._table is None or self._table[0] != self._pool.version:
      self._table = (self._pool.version,
                     jax.device_put(self._pool.table.copy(), self._table_sharding))
    return self._table[1]

  def _positions_after_chunk(self, buf: records.TokenBuffer) -> int:
    """Positions [0, n) the sequence has written once its next chunk has run."""
    return (len(buf.request.prompt_tokens) - 1
            + min(buf.steps_dispatched + self.cfg.decode_chunk, buf.limit))

  def _view_pages(self, live: list[records.TokenBuffer]) -> int:
    """Pages the next chunk reads per row (all on TPU: its kernel reads each row's length)."""
    need = max(self._positions_after_chunk(b) for b in live)
    return self._pool.width if self._ragged else self._pool.view_pages(need)

  def _run(self, requests: Iterator[records.Request], on_chunk,
           ) -> Iterator[tuple[records.Request, records.Completion]]:
    if self._running:
      raise RuntimeError("Sampler.generate/stream is already running: the slots are in use")
    self._wake()
    self._running = True
    self._loop_running(True)
    pool = self._pool
    for slot in range(self.num_slots):  # whatever an interrupted run left behind
      pool.release(slot)
    pool.drop_parked()
    self._answered.clear()
    self._parked_eps.clear()
    self._blocked.clear()
    self._waiting.clear()
    self._jobs.clear()
    self._env.clear()
    owners: list[records.TokenBuffer | None] = [None] * self.num_slots
    admitted_at = [0] * self.num_slots  # admission order, for choosing whom to preempt
    inflight: collections.deque = collections.deque()
    exhausted = False
    chunk_index = 0
    start = time.perf_counter()
    try:
      while True:
        running = any(o is not None and not o.surely_done for o in owners)
        self._apply_pending(wait=not running)
        # A sequence that has surely hit its token budget on the device gives its pages
        # back now, before its last chunk is read back: anything dispatched later (an
        # admission reusing the pages) runs after that chunk on the device.
        for slot, buf in enumerate(owners):
          if buf is not None and buf.surely_done and pool.held(slot):
            pool.release(slot)
        # A request admitted now starts on the newest posted weights: while they are still
        # being computed the live slots decode on, and free slots wait for them.
        # Episodes whose environment answered end here or continue from their cache.
        yield from self._env_answers(owners, admitted_at)
        admit = (self._waiting or not exhausted) and not self.update_pending
        placed = []
        if admit:
          placed, ended = self._place(requests, owners, admitted_at)
          exhausted |= ended
        if placed:
          self._admit(placed)
        if self._jobs:
          self._prefill_pieces()
        live_slots = [s for s, o in enumerate(owners)
                      if o is not None and o.prefilled and not o.surely_done]
        self._grow(live_slots, owners, admitted_at)
        live_slots = [s for s in live_slots if owners[s] is not None]  # less the preempted
        live = [owners[s] for s in live_slots]
        if live:
          truncate, all_greedy = sampling.chunk_modes(self.cfg, live)
          rows = decode.row_index(self._row_buckets, live_slots)  # None: every slot
          self._state, out = self._decode_fn(truncate, all_greedy, self._view_pages(live), rows)(
              self._param_leaves, self._layer_leaves, self._state, self._consts,
              self._device_table(), *(() if rows is None else (rows,)))
          self.stats.row_chunks += rows is not None
          inflight.append((out, self.version, [(o, o.turn) if o is not None else None
                                               for o in owners]))
          for buf in live:
            buf.steps_dispatched += self.cfg.decode_chunk
          self.stats.chunks += 1
          self.stats.mixed_chunks += bool(self._jobs)
          self.stats.slot_steps += self.num_slots * self.cfg.decode_chunk
        elif not inflight and not self._jobs:
          if self._answered:  # every slot is free now: they continue next iteration
            continue
          if self._env:  # only environments are working: wait for one to answer
            self._env.wait(0.05)
            continue
          if exhausted and not self._waiting:
            break
          continue  # nothing live and nothing admitted: ask the iterator again
        while inflight and (len(inflight) > self.pipeline_depth or not live):
          out, version, snapshot = inflight.popleft()
          yield from self._read_chunk(out, version, snapshot, owners)
          if on_chunk is not None:
            on_chunk(self, chunk_index)
          chunk_index += 1
    finally:
      self._env.clear()  # an abandoned run's environment answers are never read
      self._running = False
      self._loop_running(False)
      self.stats.seconds += time.perf_counter() - start

  def _place(self, requests: Iterator[records.Request],
             owners: list[records.TokenBuffer | None], admitted_at: list[int],
             ) -> tuple[list[tuple[int, records.TokenBuffer]], bool]:
    """Puts waiting requests (preempted ones first), then new ones, into free slots while
    their shard has the pages for their prompt and first chunk.

    Returns (placed (slot, buffer) pairs, whether the request iterator is exhausted).
    """
    pool = self._pool
    budget = [pool.free_pages(d) for d in range(pool.shards)]
    charged: set = set()  # (shard, prompt) groups whose shared prompt pages are paid for
    placed: list[tuple[int, records.TokenBuffer]] = []
    for slot in range(self.num_slots):
      if owners[slot] is not None and not owners[slot].surely_done:
        continue
      shard = pool.shard_of(slot)
      if shard in self._blocked:  # a continued episode goes first there
        continue
      if self._waiting:
        req = self._waiting.popleft()
      else:
        req = next(requests, _END)
        if req is _END:
          return placed, True
        if req is None:  # nothing to admit right now: keep decoding, ask next chunk
          break
      buf = self._new_buffer(req)
      key = (shard, tuple(req.prompt_tokens))
      prompt_pages = (len(req.prompt_tokens) - 1) // pool.page_size
      cost = pool.pages_for(self._positions_after_chunk(buf)) - prompt_pages
      cost += prompt_pages if key not in charged else 0
      # Nothing decodes on the shard: parked caches give way rather than leave it idle.
      idle = not any(o is not None and not o.surely_done and pool.shard_of(s) == shard
                     for s, o in enumerate(owners))
      while cost > budget[shard] and idle:
        free = pool.free_pages(shard)
        if not self._evict(shard):
          break
        budget[shard] += pool.free_pages(shard) - free
      if cost > budget[shard]:
        self._waiting.appendleft(req)  # the pool is full: it waits for pages
        break
      budget[shard] -= cost
      charged.add(key)
      owners[slot] = buf
      self._admissions += 1
      admitted_at[slot] = buf.order = self._admissions
      buf.slot = slot
      placed.append((slot, buf))
    return placed, False

  def _grow(self, live_slots: list[int], owners: list[records.TokenBuffer | None],
            admitted_at: list[int]) -> None:
    """Gives every live sequence the pages its next chunk writes; where a shard has too
    few, drops parked episodes' pages (`_evict`), then preempts its most recently
    admitted sequences (they restart later)."""
    pool = self._pool
    keep = np.ones((self.num_slots,), bool)
    for slot in live_slots:
      buf = owners[slot]
      if buf is None:  # preempted in this loop
        continue
      need = self._positions_after_chunk(buf)
      while not pool.grow(slot, need):
        shard = pool.shard_of(slot)
        if self._evict(shard):  # a parked cache goes before a live sequence's work
          continue
        victim = max((s for s in live_slots if owners[s] is not None
                      and pool.shard_of(s) == shard), key=lambda s: admitted_at[s])
        self._preempt(victim, owners)
        keep[victim] = False
        if victim == slot:
          break
    if not keep.all():
      self._state = self._deactivate_fn(self._state, keep)

  def _preempt(self, slot: int, owners: list[records.TokenBuffer | None]) -> None:
    buf = owners[slot]
    self._pool.release(slot)
    buf.done = True  # chunks still in flight skip it
    self._env.drop(buf)
    self.stats.tokens -= buf.env.count(False)
    self.stats.preemptions += 1
    owners[slot] = None
    self._waiting.appendleft(buf.request)

  def _read_chunk(self, out: decode.ChunkOutput, version: int,
                  snapshot: list[tuple[records.TokenBuffer, int] | None],
                  owners: list[records.TokenBuffer | None],
                  ) -> Iterator[tuple[records.Request, records.Completion]]:
    host = jax.device_get(out)
    valid_SN = np.asarray(host.valid_NS).T
    tokens_SN = np.asarray(host.tokens_NS).T
    logprobs_SN = np.asarray(host.logprobs_NS).T
    forced_SN = np.asarray(host.forced_NS).T
    end_SN = np.asarray(host.end_NS).T
    routing_SNLK = (None if host.routing_NSLK is None
                    else np.swapaxes(np.asarray(host.routing_NSLK), 0, 1))
    ended: list[int] = []
    for slot, entry in enumerate(snapshot):
      if entry is None:
        continue
      buf, turn = entry
      if buf.done or buf.awaiting_env or buf.turn != turn:  # a turn the chunk is not of
        continue
      steps = np.flatnonzero(valid_SN[slot])
      if steps.size == 0:
        continue
      reason, kept = decode.append_row(
          buf, version, tokens_SN[slot, steps], logprobs_SN[slot, steps],
          forced_SN[slot, steps], end_SN[slot, steps], self._stops,
          None if routing_SNLK is None else routing_SNLK[slot, steps])
      self.stats.tokens += kept
      if reason is None:
        continue
      self.stats.turns += 1
      holds = owners[slot] is buf and self._pool.held(slot) > 0
      if buf.episode is not None and reason != records.LENGTH and holds:
        # The turn ends; the episode leaves the slot to the next sequence and keeps its
        # pages, and goes on in a free slot once its environment answers.
        buf.last_reason = reason
        self._env.submit(buf, reason, self.stats)
        buf.prefilled = False
        buf.steps_dispatched = len(buf.tokens)
        buf.parked = self._pool.park(slot)
        self._parked_eps.append(buf)
        owners[slot] = None
        ended.append(slot)
        continue
      if buf.episode is not None and reason != records.LENGTH:
        reason = records.LENGTH  # its pages went back before the turn ended: truncated
      yield from self._finish(slot, buf, reason, owners)
    if ended:  # a row stopped by a stop string still decodes on the device
      keep = np.ones((self.num_slots,), bool)
      keep[ended] = False
      self._state = self._deactivate_fn(self._state, keep)

  def _finish(self, slot: int, buf: records.TokenBuffer, reason: str,
              owners: list[records.TokenBuffer | None],
              ) -> Iterator[tuple[records.Request, records.Completion]]:
    if owners[slot] is buf:
      owners[slot] = None
      self._pool.release(slot)
    self.stats.sequences += 1
    yield buf.request, buf.finish(reason, self._decode_text)

