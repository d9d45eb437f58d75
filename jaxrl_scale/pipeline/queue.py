"""The host-side bounded buffer of scored groups between the generator and the trainer.

The generator side *reserves* a place when a group's last completion arrives, before its
rewards are computed on the scoring pool, and *fills* it when the rewards are in. So the
bound covers groups being scored as well as groups waiting, and a full queue stalls the
generator thread (backpressure) instead of piling work up in the scoring pool.

The trainer either takes named items (`take`: PipelineRL-k trains the groups in admission
order, each exactly when its turn comes) or the `n` first by a sort key (`get`). Sort keys
and item keys must be cheap: they are read under the lock.

Both sides record how long they waited, for the idle fractions the progress display and
the pipeline benchmark report. `close()` wakes every waiter; waits return None / False
from then on, which is how the run shuts the generator down on a signal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Closed(Exception):
  """The queue was closed while waiting."""


class RolloutQueue(Generic[T]):
  """Bounded, thread-safe, reservation-based buffer.

  Args:
    capacity: groups held or being scored at once.
    order_key: sort key for `get` (default: insertion order).
  """

  def __init__(self, capacity: int, order_key: Callable[[T], tuple] | None = None):
    if capacity < 1:
      raise ValueError(f"capacity must be >= 1, got {capacity}")
    self.capacity = capacity
    self._order_key = order_key
    self._items: list[T] = []
    self._reserved = 0
    self._closed = False
    self._cond = threading.Condition()
    self.put_wait_s = 0.0  # producer time blocked on a full queue
    self.get_wait_s = 0.0  # consumer time blocked on too few groups
    self.total_put = 0
    self.total_got = 0

  # ---- producer ----------------------------------------------------------------------------

  def reserve(self, timeout: float | None = None) -> bool:
    """Blocks until there is room, then holds one place. False if closed or timed out."""
    start = time.perf_counter()
    deadline = None if timeout is None else start + timeout
    with self._cond:
      try:
        while not self._closed and len(self._items) + self._reserved >= self.capacity:
          remaining = None if deadline is None else deadline - time.perf_counter()
          if remaining is not None and remaining <= 0:
            return False
          self._cond.wait(remaining)
        if self._closed:
          return False
        self._reserved += 1
        return True
      finally:
        self.put_wait_s += time.perf_counter() - start

  def fill(self, item: T) -> None:
    """Puts an item into a place taken by `reserve` (dropped silently once closed)."""
    with self._cond:
      if self._reserved < 1:
        raise RuntimeError("fill() without a reservation")
      self._reserved -= 1
      if not self._closed:
        self._items.append(item)
        self.total_put += 1
      self._cond.notify_all()

  def release(self) -> None:
    """Gives back a reservation that will not be filled (e.g. scoring failed)."""
    with self._cond:
      if self._reserved < 1:
        raise RuntimeError("release() without a reservation")
      self._reserved -= 1
      self._cond.notify_all()

  def put(self, item: T, timeout: float | None = None) -> bool:
    """reserve() then fill(); False if closed or timed out."""
    if not self.reserve(timeout):
      return False
    self.fill(item)
    return True

  # ---- consumer ----------------------------------------------------------------------------

  def get(self, n: int, timeout: float | None = None) -> list[T] | None:
    """Removes and returns `n` items, oldest first by `order_key`.

    Blocks until `n` are available. Returns None on timeout (nothing is removed).

    Raises:
      Closed: the queue was closed while waiting.
    """
    if n > self.capacity:
      raise ValueError(f"asked for {n} items from a queue of capacity {self.capacity}")
    start = time.perf_counter()
    with self._cond:
      try:
        if not self._wait_for(lambda: len(self._items) >= n, start, timeout):
          return None
        if self._order_key is not None:
          self._items.sort(key=self._order_key)
        out, self._items = self._items[:n], self._items[n:]
        self.total_got += n
        self._cond.notify_all()
        return out
      finally:
        self.get_wait_s += time.perf_counter() - start

  def take(self, keys: Sequence[Hashable], key: Callable[[T], Hashable],
           timeout: float | None = None) -> list[T] | None:
    """Removes and returns the items whose `key(item)` are `keys`, in that order.

    Blocks until all of them are in. Returns None on timeout (nothing is removed).

    Raises:
      Closed: the queue was closed while waiting.
    """
    if len(keys) > self.capacity:
      raise ValueError(f"asked for {len(keys)} items from a queue of capacity {self.capacity}")
    start = time.perf_counter()
    found: dict[Hashable, int] = {}

    def ready() -> bool:
      found.clear()
      found.update({key(item): i for i, item in enumerate(self._items)})
      return all(k in found for k in keys)

    with self._cond:
      try:
        if not self._wait_for(ready, start, timeout):
          return None
        out = [self._items[found[k]] for k in keys]
        taken = {found[k] for k in keys}
        self._items = [item for i, item in enumerate(self._items) if i not in taken]
        self.total_got += len(out)
        self._cond.notify_all()
        return out
      finally:
        self.get_wait_s += time.perf_counter() - start

  def _wait_for(self, ready: Callable[[], bool], start: float, timeout: float | None) -> bool:
    """Waits (holding the lock) until `ready()`; False on timeout.

    Raises:
      Closed: the queue was closed while waiting.
    """
    deadline = None if timeout is None else start + timeout
    while not ready():
      if self._closed:
        raise Closed("rollout queue closed")
      remaining = None if deadline is None else deadline - time.perf_counter()
      if remaining is not None and remaining <= 0:
        return False
      self._cond.wait(remaining)
    return True

  # ---- state -------------------------------------------------------------------------------

  def snapshot(self) -> Sequence[T]:
    """The items waiting now (a copy), for staleness statistics."""
    with self._cond:
      return list(self._items)

  def __len__(self) -> int:
    with self._cond:
      return len(self._items)

  @property
  def pending(self) -> int:
    """Places reserved but not yet filled (groups being scored)."""
    with self._cond:
      return self._reserved

  @property
  def closed(self) -> bool:
    return self._closed

  def close(self) -> None:
    """Wakes all waiters; later reserve() returns False and get() raises Closed."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
