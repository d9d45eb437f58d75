import threading
import time

import pytest

from jaxrl_scale.pipeline import queue as queue_lib


def test_reservations_count_against_capacity():
  q = queue_lib.RolloutQueue(2)
  assert q.reserve(timeout=0) and q.reserve(timeout=0)
  assert not q.reserve(timeout=0.01)  # two places held by groups being scored
  q.fill("a")
  assert len(q) == 1 and q.pending == 1
  q.release()
  assert q.put("b", timeout=0)
  assert q.get(2) == ["a", "b"]


def test_get_orders_by_key_and_blocks_until_enough():
  q = queue_lib.RolloutQueue(4, order_key=lambda x: x)
  for x in (3, 1, 2):
    q.put(x)
  assert q.get(4, timeout=0.01) is None  # only 3 items: nothing is taken
  assert len(q) == 3
  threading.Timer(0.05, q.put, args=(0,)).start()
  assert q.get(4) == [0, 1, 2, 3]  # waits for the fourth, then sorts
  assert q.get_wait_s > 0


def test_take_waits_for_the_named_items_and_leaves_the_rest():
  q = queue_lib.RolloutQueue(8)
  for x in (5, 3, 4):
    q.put(x)
  assert q.take([3, 4, 6], key=lambda x: x, timeout=0.01) is None  # 6 missing: nothing taken
  assert len(q) == 3
  threading.Timer(0.05, q.put, args=(6,)).start()
  assert q.take([3, 4, 6], key=lambda x: x) == [3, 4, 6]  # in the order asked for
  assert q.snapshot() == [5]
  q.close()
  with pytest.raises(queue_lib.Closed):
    q.take([7], key=lambda x: x)


def test_full_queue_blocks_the_producer_until_a_get():
  q = queue_lib.RolloutQueue(1)
  q.put("a")
  done = threading.Event()

  def produce():
    q.put("b")
    done.set()

  threading.Thread(target=produce, daemon=True).start()
  assert not done.wait(0.05)
  assert q.get(1) == ["a"]
  assert done.wait(5)
  assert q.get(1) == ["b"]


def test_close_wakes_both_sides():
  q = queue_lib.RolloutQueue(1)
  q.put("a")
  results = {}

  def produce():
    results["put"] = q.put("b")

  t = threading.Thread(target=produce, daemon=True)
  t.start()
  time.sleep(0.02)
  q.close()
  t.join(5)
  assert results["put"] is False
  assert q.get(1) == ["a"]  # what was in stays readable
  with pytest.raises(queue_lib.Closed):
    q.get(1)


def test_misuse_raises():
  q = queue_lib.RolloutQueue(1)
  with pytest.raises(RuntimeError):
    q.fill("x")
  with pytest.raises(ValueError):
    q.get(2)
