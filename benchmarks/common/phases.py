"""Wall time of a bench's phases, logged as each ends (`Phases`)."""

from __future__ import annotations

import time


class Phases:
  """Wall seconds of the bench's phases, from main's start (imports and JAX's start count
  toward the first): where a device run's time goes beside the timed decode. Each phase is
  logged as it ends (`log`), so a run killed at its time limit still shows how far it got."""

  def __init__(self, log=None):
    self.seconds: dict[str, float] = {}
    self.log = log
    self._last = self._start = time.perf_counter()

  def lap(self, name: str) -> None:
    now = time.perf_counter()
    self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 2)
    self._last = now
    if self.log is not None:
      self.log(f"[time] {name}: {self.seconds[name]:.1f} s")

  def line(self) -> str:
    total = time.perf_counter() - self._start
    parts = ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items())
    return f"[time] {total:.1f} s in all: {parts} (s)"
