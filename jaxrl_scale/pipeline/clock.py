"""The RL run's compute axis: accelerator-hours of generation and training, nothing else.

    compute_hours = devices of both roles x (RL loop wall time - eval - checkpoint - compile)

The paper's x-axis (sec. 2) is the accelerator time the RL run spends generating and
training; validation runs, checkpoint writes and XLA compiles are overheads whose size
depends on how often one evaluates or saves and on whether a compile cache was warm, not
on the recipe. So the clock runs only inside the training loop (set-up, the SFT warm
start and the step-0 eval happen before it starts), `excluded("eval")` / `excluded(
"checkpoint")` blocks are not counted, and compile time reported by JAX
(`jax.monitoring`: tracing, lowering, backend compile, from any thread) outside those
blocks is subtracted. Both roles count for the whole remaining wall time, busy or idle
(a generator waiting for the trainer still holds its accelerators).

Across a resume the clock continues from the checkpoint's hours: time after the last
checkpoint of a killed run is lost with its steps, and the restarted process's set-up and
recompiles are not counted, so the compute of step s does not depend on restarts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from jax import monitoring

# Durations JAX records for the phases of a compile (jax._src.dispatch).
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
EXCLUDED = ("eval", "checkpoint", "compile")


class RLClock:
  """Accelerator-hours of generation and training (see the module docstring).

  Args:
    num_devices: accelerators of both roles.
    start_hours: hours already spent (a resumed run's checkpoint).
  """

  def __init__(self, num_devices: int, start_hours: float = 0.0):
    self.num_devices = num_devices
    self._base = start_hours
    self._lock = threading.Lock()
    self._t0: float | None = None  # None: not running
    self._excluded_depth = 0
    self._excluded_since = 0.0  # start of the outermost excluded block running now
    self._last = start_hours  # hours never go back (a compile is subtracted when it ends)
    self.excluded_s = dict.fromkeys(EXCLUDED, 0.0)  # totals since start()

  def start(self) -> RLClock:
    """Starts counting now and listens for compile times until `stop()`."""
    with self._lock:
      if self._t0 is None:
        self._t0 = time.monotonic()
        self.excluded_s = dict.fromkeys(EXCLUDED, 0.0)
        monitoring.register_event_duration_secs_listener(self._on_duration)
    return self

  def stop(self) -> None:
    """Freezes the hours (safe to call twice)."""
    with self._lock:
      if self._t0 is None:
        return
      self._base = self._hours_locked()
      self._t0 = None
      self.excluded_s = dict.fromkeys(EXCLUDED, 0.0)
    monitoring.unregister_event_duration_listener(self._on_duration)

  def _on_duration(self, event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in COMPILE_EVENTS:
      with self._lock:
        if self._excluded_depth == 0:  # inside eval / checkpoint it is excluded already
          self.excluded_s["compile"] += duration

  @contextlib.contextmanager
  def excluded(self, kind: str) -> Iterator[None]:
    """Wall time inside the block is not compute; it adds to `excluded_s[kind]`."""
    if kind not in EXCLUDED:
      raise ValueError(f"unknown excluded time {kind!r}; one of {EXCLUDED}")
    with self._lock:
      outer = self._excluded_depth == 0
      if outer:
        self._excluded_since = time.monotonic()
      self._excluded_depth += 1
    try:
      yield
    finally:
      with self._lock:
        self._excluded_depth -= 1
        if outer:  # a nested block is inside the outer one's time already
          self.excluded_s[kind] += time.monotonic() - self._excluded_since

  def _hours_locked(self) -> float:
    if self._t0 is None:
      return self._base
    now = self._excluded_since if self._excluded_depth else time.monotonic()
    seconds = now - self._t0 - sum(self.excluded_s.values())
    self._last = max(self._last, self._base + self.num_devices * max(0.0, seconds) / 3600.0)
    return self._last

  @property
  def hours(self) -> float:
    with self._lock:
      return self._hours_locked()
