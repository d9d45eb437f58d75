"""Preemption: SIGTERM / SIGINT at any moment end a run with its state saved, in bounded time.

A preemptible VM gets SIGTERM and about 30 s before it is killed. `StopRequest` turns the
signal into a flag that every long wait of a run checks, and what each phase saves lets a
resumed run continue as if nothing had happened:

  phase when signalled    what happens                                    a resume then
  SFT warm start          the SFT step in flight ends; the warm start's   continues the SFT
                          state (params, optimizer, step) is saved        at the next step
  an eval (step 0 too)    abandoned at the next decode chunk, or at once  redoes that eval (same
                          while its samples are scored; the checkpoint    params and seeds: the
                          of its step keeps the step's row pending        same numbers)
  waiting for rollouts,   the wait or generation ends at the next decode  regenerates the groups
  a generation, the       chunk, a sync round's scoring at once;          not trained on, once
  scoring of a round      checkpoint at the last trained step
  a train step            it finishes (a dispatched program cannot be     as above
                          stopped), then as above

What remains after a signal is at most one decode chunk or train step plus the checkpoint
write. The signal also arms a watchdog: if the run has not ended `grace_s` seconds later
(checkpoint.preempt_grace_seconds) it prints where the main thread is and exits with
status 1, before the VM's own kill; every checkpoint already on disk stays intact (orbax
renames a step's directory only once it is complete).

Python runs a signal handler in the main thread between bytecodes, so while the main thread
is inside a compile or waits on the device the handler cannot run. The C-level handler
also writes the signal number to a wakeup socket (`signal.set_wakeup_fd`) that a watcher
thread reads, so the flag is set, the generator interrupted and the watchdog armed at once
whatever the main thread is doing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
WATCHDOG_EXIT = 1


class Interrupted(Exception):
  """A stop was requested while the run waited or generated; the caller saves and stops."""


class StopRequest:
  """SIGTERM / SIGINT as a flag, with callbacks and a deadline (see the module docstring).

  Args:
    grace_s: seconds from the first signal to a forced exit (0: no deadline).
    stream: where the watchdog writes its message.
  """

  def __init__(self, grace_s: float = 30.0, stream: Any = None):
    self.grace_s = grace_s
    self.stream = stream
    self.signum: int | None = None
    self._event = threading.Event()
    self._done = threading.Event()  # the run ended (the watchdog stands down)
    # Held while the callbacks run (re-entrant: a callback may ask again), so that a second
    # request, e.g. the main thread's handler racing the watcher thread for one signal,
    # returns only once every callback has run.
    self._lock = threading.RLock()
    self._callbacks: list[Callable[[int], None]] = []
    self._installed = False
    self._sigints = 0

  def is_set(self) -> bool:
    return self._event.is_set()

  def check(self) -> None:
    """Raises Interrupted once a stop was requested."""
    if self._event.is_set():
      raise Interrupted()

  def subscribe(self, callback: Callable[[int], None]) -> None:
    """Calls `callback(signum)` on the stop request (now, if it already came). It may run
    in a watcher thread: it must only set flags or print."""
    with self._lock:
      self._callbacks.append(callback)
      signum = self.signum
    if signum is not None:
      callback(signum)

  def request(self, signum: int = signal.SIGTERM) -> None:
    """What a signal does; idempotent, callable from any thread (tests call it directly).

    Returns once every subscribed callback has run, whichever call ran them: one signal
    reaches both the main thread's handler and the watcher thread, and the loop's eval must
    not start before the generator was told to stop. A callback that blocks (a print to a
    full pipe) holds the other caller too; the watchdog, started first, still ends the run.
    """
    with self._lock:
      if self.signum is not None:
        return
      self.signum = signum
      self._event.set()
      if self.grace_s > 0 and self._installed:
        threading.Thread(target=self._watchdog, name="preempt-watchdog", daemon=True).start()
      for callback in list(self._callbacks):
        callback(signum)

  def _watchdog(self) -> None:
    if self._done.wait(self.grace_s):
      return
    stream = self.stream or sys.stderr
    name = signal.Signals(self.signum).name
    print(f"jaxrl-scale: no clean exit within checkpoint.preempt_grace_seconds="
          f"{self.grace_s:g} of {name}; exiting now (the checkpoints on disk are intact). "
          "Where each thread was:", file=stream, flush=True)
    with contextlib.suppress(Exception):
      faulthandler.dump_traceback(file=stream, all_threads=True)
    os._exit(WATCHDOG_EXIT)  # pylint: disable=protected-access  # no unwinding: it is stuck

  def _handle(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT:
      self._sigints += 1
      if self._sigints > 1:
        raise KeyboardInterrupt  # a second Ctrl-C: stop now, unsaved
    self.request(signum)

  def _watch(self, sock: socket.socket) -> None:
    while True:
      try:
        data = sock.recv(64)
      except OSError:
        return
      if not data:
        return  # closed on uninstall
      for signum in data:
        if signum in _SIGNALS:
          self.request(signum)

  @contextlib.contextmanager
  def installed(self) -> Iterator[StopRequest]:
    """Handles SIGTERM / SIGINT in this block (main thread only; elsewhere, and when an
    enclosing block already installed this request, it changes nothing)."""
    if self._installed or threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS}
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=self._watch, args=(reader,), name="preempt-signals",
                               daemon=True)
    watcher.start()
    self._installed = True
    self._done.clear()
    try:
      yield self
    finally:
      self._installed = False
      self._done.set()
      signal.set_wakeup_fd(old_fd)
      for sig, handler in previous.items():
        signal.signal(sig, handler)
      writer.close()
      with contextlib.suppress(OSError):
        reader.shutdown(socket.SHUT_RDWR)
      watcher.join(timeout=5)
      reader.close()


def map_until_stopped(fn: Callable[[Any], Any], items: Any,
                      pool: concurrent.futures.Executor | None,
                      stop: StopRequest | None, poll_s: float = 0.1) -> list[Any]:
  """`[fn(x) for x in items]`, on `pool` when given, that raises Interrupted within `poll_s`
  of a stop request instead of waiting for the rest.

  Scoring a batch of code answers (each a sandboxed program with a time limit) can outlast
  a preemption's grace period; the calls already running finish in their threads and their
  results are dropped, the ones not started are cancelled. Without `stop` it is a plain map.
  """
  items = list(items)
  if stop is None:
    return list(pool.map(fn, items)) if pool is not None else [fn(x) for x in items]
  if pool is None:
    out = []
    for x in items:
      stop.check()
      out.append(fn(x))
    return out
  futures = [pool.submit(fn, x) for x in items]
  try:
    pending = set(futures)
    while pending:
      stop.check()
      done, pending = concurrent.futures.wait(
          pending, timeout=poll_s, return_when=concurrent.futures.FIRST_EXCEPTION)
      for f in done:
        f.result()  # a call that raised: raise it now, not after the rest
  except BaseException:
    for f in futures:
      f.cancel()
    raise
  return [f.result() for f in futures]


class Interruptible:
  """A Sampler whose `generate` stops at the next decode chunk once `stop` is set, raising
  Interrupted (the Sampler frees an abandoned run's slots when it next runs). Everything
  else is the Sampler's.

  Args:
    sampler: an `engine.Sampler` (driven from the caller's thread: sync modes, evals, the
      warm start's dev checks).
    stop: the run's stop request.
  """

  def __init__(self, sampler: Any, stop: StopRequest):
    self.sampler = sampler
    self.stop = stop

  def generate(self, requests: Any, on_chunk: Callable[[Any, int], None] | None = None,
               on_progress: Callable[[int, int], None] | None = None) -> list[Any]:
    self.stop.check()

    def chunk(sampler: Any, index: int) -> None:
      if on_chunk is not None:
        on_chunk(sampler, index)
      self.stop.check()

    return self.sampler.generate(requests, on_chunk=chunk, on_progress=on_progress)

  def __getattr__(self, name: str) -> Any:
    return getattr(self.sampler, name)
