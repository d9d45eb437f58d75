"""The parent's side of the sandbox's fork server (code_zygote.py): one per interpreter.

Starting `python -I -S` costs ~20 ms of CPU; the demo's programs run in ~1 ms. So each
interpreter path gets one idle server process, started on first use, that forks a child
per program; the child then runs the same bootstrap (code_child.py) a fresh interpreter
would, with the same limits, uid switch, session, directory and scrubbed environment.

  server = code_forkserver.get(python)
  child = server.spawn(cwd, argv, (stdin_fd, stdout_fd, stderr_fd))   # a Child
  ... poll child.pidfd, os.killpg(child.pid, SIGKILL) ...
  returncode = server.reap(child)

Calls from many threads share the server under a lock (each request takes about a fork).
A server that stops answering is replaced once per call; a second failure raises
code_sandbox's SandboxError through the caller (not the program's fault). The server ends
when this process closes its socket (exit, or `close_all`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import threading

_ZYGOTE = (pathlib.Path(__file__).with_name("code_zygote.py")).read_text(encoding="utf-8")
_REPLY_S = 30.0  # a fork or a reap of a killed child: far less even on a loaded host


class ForkServerError(RuntimeError):
  """The fork server could not start a child or report its end."""


@dataclasses.dataclass(frozen=True)
class Child:
  """A forked child: its pid (also its process-group id) and a pidfd readable at its exit."""
  pid: int
  pidfd: int


class ForkServer:
  """One running code_zygote.py for `python` (see the module docstring).

  Args:
    python: the interpreter.
    bootstrap: code_child.py's text, run by every child.
    env: the server's (and so every child's) whole environment.
  """

  def __init__(self, python: str, bootstrap: str, env: dict[str, str]):
    self.python, self._bootstrap, self._env = python, bootstrap, dict(env)
    self._lock = threading.Lock()
    self._sock: socket.socket | None = None
    self._proc: subprocess.Popen | None = None

  def _start(self) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
          [self.python, "-I", "-S", "-c", _ZYGOTE, self._bootstrap, str(theirs.fileno())],
          pass_fds=[theirs.fileno()], cwd="/", env=self._env, stdin=subprocess.DEVNULL,
          stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as e:
      ours.close()
      raise ForkServerError(f"cannot start the fork server: {e}") from None
    finally:
      theirs.close()
    ours.settimeout(_REPLY_S)
    self._sock = ours

  def _stop(self) -> None:
    if self._sock is not None:
      self._sock.close()
      self._sock = None
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._proc = None

  def _send(self, request: dict, fds: tuple[int, ...] = ()) -> None:
    if self._sock is None:
      self._start()
    message = json.dumps(request).encode()
    if fds:
      socket.send_fds(self._sock, [message], list(fds))
    else:
      self._sock.send(message)

  def _receive(self) -> tuple[dict, list[int]]:
    reply, got, _, _ = socket.recv_fds(self._sock, 1 << 16, 1)
    answer = json.loads(reply) if reply else {"error": "the fork server exited"}
    if "error" in answer:
      for fd in got:
        os.close(fd)
      raise ForkServerError(answer["error"])
    return answer, got

  def spawn(self, cwd: str, argv: list[str], fds: tuple[int, int, int]) -> Child:
    """Forks a child that runs the bootstrap with `argv` in `cwd` on stdin/out/err `fds`."""
    request = {"op": "spawn", "cwd": cwd, "argv": argv}
    with self._lock:
      try:
        try:
          self._send(request, fds)
        except OSError:  # a server that died since the last call: one fresh start
          self._stop()
          self._send(request, fds)
        # Once sent, never resent: a child may exist already (on these very pipes).
        answer, got = self._receive()
      except (OSError, ValueError, ForkServerError) as e:
        self._stop()
        raise ForkServerError(f"fork server ({self.python}): {e}") from None
    if len(got) != 1:
      for fd in got:
        os.close(fd)
      raise ForkServerError("the fork server sent no pidfd")
    return Child(int(answer["pid"]), got[0])

  def reap(self, child: Child) -> int:
    """Waits for the (killed or exited) child's end: its returncode (-N: signal N)."""
    try:
      with self._lock:
        try:
          self._send({"op": "reap", "pid": child.pid})
          answer, got = self._receive()
        except (OSError, ValueError, ForkServerError) as e:
          self._stop()  # its children were reparented and reaped: this end is lost
          raise ForkServerError(f"fork server ({self.python}): {e}") from None
      for fd in got:
        os.close(fd)
      return int(answer["returncode"])
    finally:
      os.close(child.pidfd)

  def close(self) -> None:
    with self._lock:
      self._stop()


_SERVERS: dict[tuple[str, str], ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def get(python: str, bootstrap: str, env: dict[str, str]) -> ForkServer:
  """The process's server for `python` (started on its first spawn)."""
  key = (python, json.dumps(env, sort_keys=True))
  with _SERVERS_LOCK:
    if key not in _SERVERS:
      _SERVERS[key] = ForkServer(python, bootstrap, env)
    return _SERVERS[key]


def _forget_after_fork() -> None:
  # A forked copy of this process must not share (or, at its exit, kill) the parent's
  # servers: it starts its own on first use.
  _SERVERS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def close_all() -> None:
  """Stops every server of this process."""
  with _SERVERS_LOCK:
    servers = list(_SERVERS.values())
    _SERVERS.clear()
  for server in servers:
    server.close()
