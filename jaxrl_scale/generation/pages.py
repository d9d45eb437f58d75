"""The host side of the paged KV cache: which pages each slot's sequence holds.

The device holds, per data shard of the generator mesh, a pool of `pages_per_shard` pages of
`page_size` token positions each (every layer's keys and values for those positions), plus
one null page that is never handed out: unassigned table entries point at it, so a read
past a sequence's end stays inside the pool (and is masked), and a write aimed at it is
dropped by the device code. A slot's row of the page table lists its pages in position
order; slot s lives on shard s // slots_per_shard and only holds pages of that shard.

Pages are reference counted. The G completions of one prompt admitted together share the
pages that hold only prompt positions; the page the prompt's last position falls into is
written to by decoding, so each completion gets its own copy of it (copy on write, done by
the prefill itself: it writes that page once per completion). A page returns to the free
list when its last holder lets go.

Growth: before a decode chunk, every live sequence gets the pages its next `steps` positions
need (`grow`). When the shard has too few free pages, the caller preempts (`release`s a
running sequence and requeues its request, which later restarts from its prompt: with the
same seed and weights it regenerates the same tokens); admission waits while a shard lacks
the pages a new sequence needs for its prompt and its first chunk (`can_admit`).

Parking: an episode whose environment is working gives its slot to another sequence and
keeps its pages (`park`); when it continues, the pages go into whichever empty slot of
their shard is free then (`unpark`): the table row is the only thing that moves.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError


def cache_geometry(cfg: SamplerConfig, max_prompt_len: int | None) -> tuple[list[int], int]:
  """(prompt buckets in use, KV cache length per slot) for prompts up to `max_prompt_len`.

  The cache holds the largest bucket the prompts need plus `max_new_tokens`; `jaxrl-scale
  plan` sizes its programs with this too.
  """
  buckets = sorted(set(cfg.prompt_buckets))
  longest = max_prompt_len if max_prompt_len is not None else buckets[-1]
  if longest > buckets[-1]:
    raise UserError(f"config key 'sampler.prompt_buckets': prompts up to {longest} tokens "
                    f"need a bucket that long (largest is {buckets[-1]})")
  top = next(b for b in buckets if b >= longest)
  return [b for b in buckets if b <= top], top + cfg.max_new_tokens


def pool_geometry(cfg: SamplerConfig, num_slots: int, shards: int, max_len: int,
                  ) -> tuple[int, int]:
  """(page_size, pages per data shard) of a generator group's page pool.

  `sampler.kv_cache_tokens` = 0 gives every slot room for its full length; otherwise the
  pool holds that many positions over the group (rounded up to whole pages per shard), and
  must hold at least one full-length sequence per shard.
  """
  page = cfg.page_size
  per_seq = -(-max_len // page)
  if cfg.kv_cache_tokens == 0:
    return page, (num_slots // shards) * per_seq
  pages = -(-cfg.kv_cache_tokens // (page * shards))
  if pages < per_seq:
    raise UserError(f"config key 'sampler.kv_cache_tokens': {cfg.kv_cache_tokens} positions "
                    f"over {shards} data shards give {pages} pages of {page} per shard; one "
                    f"sequence of up to {max_len} positions needs {per_seq}")
  return page, pages


class PagePool:
  """Page bookkeeping for one generator group (all its data shards).

  Args:
    page_size: token positions per page.
    pages_per_shard: pages of the pool on each data shard (the null page not included).
    shards: data shards of the generator mesh.
    slots_per_shard: slots on each shard.
    max_len: positions a slot may ever hold (prompt bucket + max_new_tokens); sets the
      page table's width.
  """

  def __init__(self, page_size: int, pages_per_shard: int, shards: int, slots_per_shard: int,
               max_len: int):
    if page_size < 1 or pages_per_shard < 1:
      raise ValueError("page_size and pages_per_shard must be >= 1")
    self.page_size = page_size
    self.pages_per_shard = pages_per_shard
    self.shards = shards
    self.slots_per_shard = slots_per_shard
    self.width = -(-max_len // page_size)
    self.max_len = max_len
    # `view_pages` rounds to multiples of about an eighth of max_len, at least 64 positions.
    self._view_step = max(64, (1 << max(0, (max_len - 1).bit_length())) // 8)
    self.null = pages_per_shard  # the null page's index on every shard
    self.table = np.full((shards * slots_per_shard, self.width), self.null, np.int32)
    self._held = [0] * (shards * slots_per_shard)  # table entries in use per slot
    self._refs = np.zeros((shards, pages_per_shard), np.int32)
    self._free = [collections.deque(range(pages_per_shard)) for _ in range(shards)]
    self.peak_pages = 0
    self.version = 0  # bumped on every change of the table
    # Pages detached from their slot (`park`): handle -> (shard, pages in position order).
    self._parked: dict[int, tuple[int, np.ndarray]] = {}
    self._handles = 0

  # ----------------------------------------------------------------------------------------
  # Queries.

  def shard_of(self, slot: int) -> int:
    return slot // self.slots_per_shard

  def pages_for(self, positions: int) -> int:
    """Pages that hold positions [0, positions)."""
    return -(-positions // self.page_size)

  def view_pages(self, positions: int) -> int:
    """Pages a decode chunk reads per row to cover positions [0, positions), rounded up so
    that a few compiled counts serve every length."""
    step = self._view_step
    return min(self.width, self.pages_for(min(self.max_len, -(-positions // step) * step)))

  def free_pages(self, shard: int) -> int:
    return len(self._free[shard])

  @property
  def used_pages(self) -> int:
    return self.shards * self.pages_per_shard - sum(len(f) for f in self._free)

  def held(self, slot: int) -> int:
    """Table entries the slot holds (its positions [0, held * page_size) have pages)."""
    return self._held[slot]

  def group_cost(self, prompt_len: int, first_positions: int | Sequence[int],
                 group: int = 1) -> int:
    """Fresh pages G sequences of one prompt need to hold `first_positions` positions each
    (one number for all, or one per sequence): the prompt-only pages once, every later page
    once per sequence."""
    shared = (prompt_len - 1) // self.page_size  # pages before the one decoding writes into
    firsts = _per_slot(first_positions, group)
    return shared + sum(min(self.pages_for(f), self.width) - shared for f in firsts)

  def can_admit(self, shard: int, prompt_len: int, first_positions: int | Sequence[int],
                group: int = 1) -> bool:
    return self.group_cost(prompt_len, first_positions, group) <= self.free_pages(shard)

  # ----------------------------------------------------------------------------------------
  # Changes.

  def admit_group(self, slots: Sequence[int], prompt_len: int,
                  first_positions: int | Sequence[int]) -> None:
    """Gives the slots (all on one shard, all free) pages for positions [0,
    first_positions) (one number for all or one per slot), sharing the pages that hold only
    prompt positions.

    The prompt's positions [0, prompt_len - 1) go into the cache at admission (the last
    prompt token is fed by the first decode step, at position prompt_len - 1): the pages
    before the one holding position prompt_len - 1 are prompt-only and shared.
    """
    shard = self.shard_of(slots[0])
    if any(self.shard_of(s) != shard for s in slots):
      raise ValueError("a shared prompt's slots must be on one data shard")
    if any(self._held[s] for s in slots):
      raise ValueError("admit_group: a slot still holds pages")
    if not self.can_admit(shard, prompt_len, first_positions, len(slots)):
      raise RuntimeError("admit_group: not enough free pages (check can_admit first)")
    shared = min((prompt_len - 1) // self.page_size, self.width)
    pages = [self._take(shard) for _ in range(shared)]
    for slot, first in zip(slots, _per_slot(first_positions, len(slots))):
      for j, page in enumerate(pages):
        self._refs[shard, page] += 1
        self.table[slot, j] = page
      self._held[slot] = shared
      self._extend(slot, self.pages_for(first))
    for page in pages:  # _take counted one holder already
      self._refs[shard, page] -= 1
    self._note_peak()
    self.version += 1

  def grow(self, slot: int, positions: int) -> bool:
    """Pages for positions [0, positions); False (and nothing taken) when the shard lacks them."""
    need = min(self.pages_for(positions), self.width) - self._held[slot]
    if need <= 0:
      return True
    if need > self.free_pages(self.shard_of(slot)):
      return False
    self._extend(slot, self._held[slot] + need)
    self._note_peak()
    self.version += 1
    return True

  def release(self, slot: int) -> None:
    """Lets go of every page the slot holds; its table row points at the null page."""
    shard = self.shard_of(slot)
    for j in range(self._held[slot]):
      page = int(self.table[slot, j])
      self._refs[shard, page] -= 1
      if self._refs[shard, page] == 0:
        self._free[shard].append(page)
    self.table[slot, :] = self.null
    self._held[slot] = 0
    self.version += 1

  def park(self, slot: int) -> int:
    """Detaches the slot's pages from it, still held (an episode waiting for its
    environment keeps its cache while its slot takes another sequence); the slot is empty
    afterwards. Returns the handle that `unpark` or `drop_parked` takes."""
    self._handles += 1
    self._parked[self._handles] = (self.shard_of(slot),
                                   self.table[slot, :self._held[slot]].copy())
    self.table[slot, :] = self.null
    self._held[slot] = 0
    self.version += 1
    return self._handles

  def parked_shard(self, handle: int) -> int:
    return self._parked[handle][0]

  def unpark(self, handle: int, slot: int) -> None:
    """Puts parked pages into an empty slot of their shard, in their position order."""
    shard, pages = self._parked[handle]
    if self.shard_of(slot) != shard:
      raise ValueError(f"unpark: the pages are on shard {shard}, slot {slot} is not")
    if self._held[slot]:
      raise ValueError("unpark: the slot still holds pages")
    del self._parked[handle]
    self.table[slot, :len(pages)] = pages
    self._held[slot] = len(pages)
    self.version += 1

  def drop_parked(self, handle: int | None = None) -> None:
    """Lets go of parked pages (one handle, or all of them when None)."""
    for h in [handle] if handle is not None else list(self._parked):
      shard, pages = self._parked.pop(h)
      for page in pages:
        self._refs[shard, page] -= 1
        if self._refs[shard, page] == 0:
          self._free[shard].append(int(page))

  def check(self) -> None:
    """Asserts the invariants (tests): refcounts match the table, nothing leaked or shared
    that should not be."""
    refs = np.zeros_like(self._refs)
    for slot in range(self.table.shape[0]):
      shard = self.shard_of(slot)
      row = self.table[slot]
      assert (row[self._held[slot]:] == self.null).all()
      for page in row[:self._held[slot]]:
        refs[shard, page] += 1
    for shard, pages in self._parked.values():
      for page in pages:
        refs[shard, page] += 1
    assert (refs == self._refs).all(), "refcounts disagree with the page table"
    for shard in range(self.shards):
      free = set(self._free[shard])
      assert len(free) == len(self._free[shard]), "a page is on the free list twice"
      in_use = set(np.flatnonzero(refs[shard]).tolist())
      assert not free & in_use, "a page in use is on the free list"
      assert free | in_use == set(range(self.pages_per_shard)), "a page leaked"

  def _take(self, shard: int) -> int:
    page = self._free[shard].popleft()
    self._refs[shard, page] = 1
    return page

  def _extend(self, slot: int, entries: int) -> None:
    shard = self.shard_of(slot)
    for j in range(self._held[slot], min(entries, self.width)):
      self.table[slot, j] = self._take(shard)
    self._held[slot] = max(self._held[slot], min(entries, self.width))

  def _note_peak(self) -> None:
    self.peak_pages = max(self.peak_pages, self.used_pages)


def _per_slot(value: int | Sequence[int], n: int) -> list[int]:
  if isinstance(value, int):
    return [value] * n
  if len(value) != n:
    raise ValueError(f"{len(value)} first_positions for {n} slots")
  return [int(v) for v in value]
