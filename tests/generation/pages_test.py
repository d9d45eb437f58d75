"""Page bookkeeping of the paged KV cache: sharing, growth, release, admission control."""

import numpy as np
import pytest

from jaxrl_scale.generation import pages


def test_a_prompt_group_shares_its_prompt_only_pages_and_copies_the_last():
  pool = pages.PagePool(page_size=4, pages_per_shard=32, shards=1, slots_per_shard=8,
                        max_len=40)
  # Prompt of 11 tokens: positions 0..9 go in at admission, 10 is the first decoded one.
  # Pages 0, 1 (positions 0..7) are prompt-only; page 2 (8..11) is written by decoding.
  pool.admit_group([1, 2, 5], prompt_len=11, first_positions=11 + 4)
  t = pool.table
  assert pool.held(1) == pool.held(2) == pool.held(5) == 4  # positions 0..15
  assert (t[1, :2] == t[2, :2]).all() and (t[1, :2] == t[5, :2]).all()
  assert len({t[1, 2], t[2, 2], t[5, 2]}) == 3  # own copy of the partial page
  assert len({t[1, 3], t[2, 3], t[5, 3]}) == 3
  assert pool.used_pages == 2 + 3 * 2 == pool.group_cost(11, 15, 3)
  assert (t[0] == pool.null).all()
  pool.check()
  # Releasing two of the three keeps the shared pages alive; the third frees them.
  pool.release(1)
  pool.release(2)
  assert pool.used_pages == 2 + 2
  pool.check()
  pool.release(5)
  assert pool.used_pages == 0
  pool.check()


def test_growth_admission_and_exhaustion():
  pool = pages.PagePool(page_size=4, pages_per_shard=6, shards=2, slots_per_shard=2,
                        max_len=64)
  assert pool.can_admit(0, prompt_len=5, first_positions=9, group=2)  # 1 + 2 * 2 = 5 <= 6
  assert not pool.can_admit(0, prompt_len=5, first_positions=9, group=3)  # 1 + 3 * 2 = 7
  pool.admit_group([0, 1], prompt_len=5, first_positions=9)
  assert pool.free_pages(0) == 1 and pool.free_pages(1) == 6  # shards are separate
  assert pool.grow(0, 12)  # still inside page 2
  assert pool.grow(0, 13)  # takes the last free page
  assert not pool.grow(1, 13)  # none left: nothing taken
  assert pool.held(1) == 3 and pool.free_pages(0) == 0
  pool.check()
  assert not pool.can_admit(0, prompt_len=1, first_positions=2, group=1)
  pool.admit_group([2, 3], prompt_len=5, first_positions=9)  # shard 1 has its own pages
  with pytest.raises(ValueError):
    pool.admit_group([2], prompt_len=5, first_positions=9)  # slot 2 still holds pages
  pool.release(0)
  assert pool.grow(1, 13)
  pool.check()
  assert pool.peak_pages == 6 + 5


def test_growth_stops_at_the_table_width():
  pool = pages.PagePool(page_size=8, pages_per_shard=16, shards=1, slots_per_shard=1,
                        max_len=20)
  pool.admit_group([0], prompt_len=3, first_positions=10)
  assert pool.grow(0, 100) and pool.held(0) == 3 == pool.width
  pool.check()


def test_random_workload_keeps_the_invariants():
  rng = np.random.default_rng(0)
  pool = pages.PagePool(page_size=4, pages_per_shard=40, shards=2, slots_per_shard=4,
                        max_len=64)
  live = {}
  for _ in range(500):
    slot = int(rng.integers(8))
    if slot in live:
      if rng.random() < 0.3:
        pool.release(slot)
        del live[slot]
      else:
        live[slot] += int(rng.integers(1, 9))
        if not pool.grow(slot, live[slot]):
          pool.release(slot)
          del live[slot]
    else:
      shard = pool.shard_of(slot)
      group = [s for s in range(shard * 4, shard * 4 + 4) if s not in live][:2]
      plen = int(rng.integers(1, 20))
      if slot in group and pool.can_admit(shard, plen, plen + 4, len(group)):
        pool.admit_group(group, plen, plen + 4)
        live.update({s: plen + 4 for s in group})
    pool.check()


def test_parked_pages_stay_held_and_move_to_another_slot():
  pool = pages.PagePool(page_size=4, pages_per_shard=12, shards=2, slots_per_shard=2,
                        max_len=32)
  pool.admit_group([0, 1], prompt_len=9, first_positions=14)  # 2 shared + 2 own each
  row = pool.table[1, :pool.held(1)].tolist()
  free = pool.free_pages(0)
  handle = pool.park(1)
  assert pool.held(1) == 0 and (pool.table[1] == pool.null).all()
  assert pool.free_pages(0) == free  # still held: nothing went back
  pool.check()
  pool.admit_group([1], prompt_len=3, first_positions=6)  # the slot takes another sequence
  with pytest.raises(ValueError, match="shard"):
    pool.unpark(handle, 2)  # slot 2 is on shard 1
  with pytest.raises(ValueError, match="holds"):
    pool.unpark(handle, 1)
  pool.release(0)
  pool.unpark(handle, 0)
  assert pool.table[0, :pool.held(0)].tolist() == row  # the same pages, in order
  pool.check()
  handle = pool.park(0)
  pool.release(1)
  pool.drop_parked(handle)
  assert pool.free_pages(0) == 12  # the shared prompt pages too, once their last holder went
  pool.check()
