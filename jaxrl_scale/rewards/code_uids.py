"""Uids for sandboxed programs (as root): leased one per running program, host-wide.

  pool = code_uids.UidPool(range(65100, 65500))
  uid = pool.lease()      # blocks while every uid is in use, here or in another process
  ...                     # the program runs as `uid`
  code_uids.kill_uid(uid) # (without namespaces) what it left behind
  pool.release(uid)
"""

from __future__ import annotations

import fcntl
import os
import signal
import tempfile
import threading


class UidError(RuntimeError):
  """No uid can be leased safely here (the sandbox's failure, not the program's)."""


class UidPool:
  """Uids leased to running programs, one each (root only), across every process of the
  host: a lease also holds an flock on <tmp>/jaxrl_code_uids/<uid> (root's, 0700), so two
  judges (pytest -n 2, two runs on one host) never give one uid to two programs, and the
  leftovers killed by uid at a program's end (without namespaces) are its own."""

  def __init__(self, uids: range):
    self._free, self._cond = list(reversed(uids)), threading.Condition()
    self._locks: dict[int, int] = {}
    self._dir: str | None = None

  def _lock_dir(self) -> str:
    if self._dir is None:
      path = os.path.join(tempfile.gettempdir(), "jaxrl_code_uids")
      os.makedirs(path, mode=0o700, exist_ok=True)
      if os.stat(path).st_uid != 0:  # (anyone else's could hold every lock)
        raise UidError(f"{path} is not root's: cannot lease uids")
      self._dir = path
    return self._dir

  def lease(self) -> int:
    with self._cond:
      while True:
        for uid in reversed(self._free):
          fd = os.open(os.path.join(self._lock_dir(), str(uid)),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
          try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          except BlockingIOError:  # (another process's program has it)
            os.close(fd)
            continue
          self._free.remove(uid)
          self._locks[uid] = fd
          return uid
        self._cond.wait(0.05)  # (every uid in use, here or elsewhere: wait for one)

  def release(self, uid: int) -> None:
    with self._cond:
      os.close(self._locks.pop(uid))  # (closing releases the flock)
      self._free.append(uid)
      self._cond.notify()


def kill_uid(uid: int) -> None:
  """SIGKILL to every process of `uid` (root, without namespaces: a program's leftovers)."""
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        if os.stat(f"/proc/{entry}").st_uid == uid:
          os.kill(int(entry), signal.SIGKILL)
      except (FileNotFoundError, ProcessLookupError):
        pass
