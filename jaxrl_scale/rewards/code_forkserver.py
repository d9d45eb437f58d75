"""The parent's side of the sandbox's fork server (code_zygote.py): one per interpreter.

Starting `python -I -S` costs ~20 ms of CPU; the demo's programs run in ~1 ms. So each
interpreter path gets one idle server process, started on first use, that forks a child
per program; the child then runs the same bootstrap (code_child.py) a fresh interpreter
would, with the same limits, uid switch, session, directory and scrubbed environment,
inside namespaces of its own where the kernel allows them (code_isolate.py;
`server.namespaces` says whether it does, `server.why_not` why not).

  server = code_forkserver.get(python, bootstrap, env, work_root)
  child = server.spawn(cwd, argv, (stdin_fd, stdout_fd, stderr_fd))   # a Child
  ... poll child.pidfd, signal.pidfd_send_signal(child.pidfd, SIGKILL) ...
  returncode, cpu_s = server.reap(child)

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
_ISOLATE = (pathlib.Path(__file__).with_name("code_isolate.py")).read_text(encoding="utf-8")
_REPLY_S = 30.0  # a fork or a reap of a killed child: far less even on a loaded host


class ForkServerError(RuntimeError):
  """The fork server could not start a child or report its end."""


@dataclasses.dataclass(frozen=True)
class Child:
  """A forked child: its pid, a pidfd readable at its exit, and (in namespaces) the pid of
  the helper A that forked it."""
  pid: int
  pidfd: int
  helper: int | None = None


class ForkServer:
  """One running code_zygote.py for `python` (see the module docstring).

  Args:
    python: the interpreter.
    bootstrap: code_child.py's text, run by every child.
    env: the server's (and so every child's) whole environment.
    work_root: the directory that holds the programs' work dirs (the isolation probe's).
    namespaces: try namespaces (False: the fallback, as where the kernel refuses them).

  Attributes (set once the server has started):
    namespaces: children run in namespaces of their own (code_isolate.py).
    why_not: why they do not (the probe's error), or None.
    seccomp: children run under code_isolate's seccomp filter.
    landlock: children run under code_isolate's Landlock rules.
  """

  def __init__(self, python: str, bootstrap: str, env: dict[str, str], work_root: str,
               namespaces: bool = True):
    self.python, self._bootstrap, self._env = python, bootstrap, dict(env)
    self._work_root, self._try_namespaces = work_root, namespaces
    self._lock = threading.Lock()
    self._sock: socket.socket | None = None
    self._proc: subprocess.Popen | None = None
    self.namespaces: bool | None = None
    self.why_not: str | None = None
    self.seccomp: bool | None = None
    self.landlock: bool | None = None

  def _start(self) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
          [self.python, "-I", "-S", "-c", _ZYGOTE, self._bootstrap, str(theirs.fileno()),
           _ISOLATE, self._work_root, str(int(self._try_namespaces))],
          pass_fds=[theirs.fileno()], cwd="/", env=self._env, stdin=subprocess.DEVNULL,
          stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as e:
      ours.close()
      raise ForkServerError(f"cannot start the fork server: {e}") from None
    finally:
      theirs.close()
    ours.settimeout(_REPLY_S)
    self._sock = ours
    hello, got = self._receive()  # the isolation probe's result, sent unasked
    for fd in got:
      os.close(fd)
    self.namespaces, self.why_not = bool(hello["namespaces"]), hello["why"]
    self.seccomp, self.landlock = bool(hello["seccomp"]), bool(hello["landlock"])

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

  def ensure_started(self) -> None:
    """Starts the server (and its isolation probe) now, when it is not running."""
    with self._lock:
      if self._sock is None:
        try:
          self._start()
        except (OSError, ValueError, ForkServerError) as e:
          self._stop()
          raise ForkServerError(f"fork server ({self.python}): {e}") from None

  def spawn(self, cwd: str, argv: list[str], fds: tuple[int, int, int]) -> Child:
    """Forks a child that runs the bootstrap with `argv` in `cwd` on stdin/out/err `fds`."""
    request = {"op": "spawn", "cwd": cwd, "argv": argv}
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      with self._lock:
        try:
          if self._sock is None:
            self._start()
          extra = (theirs.fileno(),) if self.namespaces else ()
          try:
            self._send(request, fds + extra)
          except OSError:  # a server that died since the last call: one fresh start
            self._stop()
            self._start()
            extra = (theirs.fileno(),) if self.namespaces else ()
            self._send(request, fds + extra)
          # Once sent, never resent: a child may exist already (on these very pipes).
          answer, got = self._receive()
        except (OSError, ValueError, ForkServerError) as e:
          self._stop()
          raise ForkServerError(f"fork server ({self.python}): {e}") from None
      theirs.close()
      if "helper" in answer:  # A reports B, the program, on our end of the socketpair
        ours.settimeout(_REPLY_S)
        try:
          message, got, _, _ = socket.recv_fds(ours, 1 << 12, 1)
        except OSError as e:
          raise ForkServerError(f"no word from the namespaces' helper: {e}") from None
        kind, _, value = message.decode("utf-8", "replace").partition(" ")
        if kind != "pid" or len(got) != 1:
          for fd in got:
            os.close(fd)
          self.reap(Child(-1, -1, int(answer["helper"])), helper_only=True)
          raise ForkServerError(f"namespaces: {value or 'the helper died'}")
        return Child(int(value), got[0], int(answer["helper"]))
      if len(got) != 1:
        for fd in got:
          os.close(fd)
        raise ForkServerError("the fork server sent no pidfd")
      return Child(int(answer["pid"]), got[0])
    finally:
      ours.close()
      theirs.close()

  def reap(self, child: Child, helper_only: bool = False) -> tuple[int, float]:
    """Waits for the (killed or exited) child's end: its returncode (-N: signal N) and the
    CPU seconds it used. `helper_only`: B never started; reap its A alone."""
    try:
      with self._lock:
        try:
          self._send({"op": "reap", "pid": None if helper_only else child.pid,
                      "helper": child.helper})
          answer, got = self._receive()
        except (OSError, ValueError, ForkServerError) as e:
          self._stop()  # its children were reparented and reaped: this end is lost
          raise ForkServerError(f"fork server ({self.python}): {e}") from None
      for fd in got:
        os.close(fd)
      return int(answer["returncode"]), float(answer["cpu_s"])
    finally:
      if child.pidfd >= 0:
        os.close(child.pidfd)

  def close(self) -> None:
    with self._lock:
      self._stop()


_SERVERS: dict[tuple[str, str], ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def get(python: str, bootstrap: str, env: dict[str, str], work_root: str,
        namespaces: bool = True) -> ForkServer:
  """The process's server for `python` (started on its first spawn)."""
  key = (python, json.dumps(env, sort_keys=True), work_root, namespaces)
  with _SERVERS_LOCK:
    if key not in _SERVERS:
      _SERVERS[key] = ForkServer(python, bootstrap, env, work_root, namespaces)
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
