"""Runs one untrusted Python program in a separate, limited process.

Each run gets a fresh temporary directory (its only writable place, deleted afterwards),
a new session (so the whole process group is killed on timeout), a scrubbed environment
(PATH and a UTF-8 locale only), `python -I -S` (no site-packages, no PYTHON* variables),
and the limits of `Limits`, which the child's bootstrap (code_child.py) applies to itself
before the program starts: CPU seconds, address space, file size, open files, processes;
as root it also switches to uid nobody. The parent enforces the wall-clock limit and the
output cap, reading stdout and stderr incrementally, and kills the process group at either.
By default the child is forked from one idle `python -I -S` per interpreter (the fork
server, code_forkserver.py) rather than started afresh: an interpreter start is ~20 ms of
CPU, the demo's programs ~1 ms, and on two cores the starts took CPU from training.

Outcomes (`Run.status`): "ok" (exit 0), "runtime_error" (non-zero exit or a signal),
"timeout" (wall or CPU limit), "output_limit", "stopped" (the caller's `stop` saw a
failing case and ended the run early). A sandbox that did not come up (no ready line
from the bootstrap as the first bytes of its stdout) raises `SandboxError`: that is our
failure, never the program's, and the caller must not score it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import secrets
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import code_forkserver

_BOOTSTRAP = (pathlib.Path(__file__).with_name("code_child.py")).read_text(encoding="utf-8")
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_NOBODY = 65534
_SYSTEM_PYTHONS = ("/usr/bin/python3",)
_STARTUP_S = 10.0  # interpreter start and bootstrap, before the program's clocks start
_STDERR_KEEP = 2048  # bytes of stderr kept for the verdict's detail
STATUSES = ("ok", "runtime_error", "timeout", "output_limit", "stopped")


class SandboxError(RuntimeError):
  """The sandbox itself failed (could not start the child, or its bootstrap died)."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Limits of one sandboxed run.

  Attributes:
    wall_s: wall-clock seconds per test case (sleeping counts), from the end of the
      previous case (the first: from the bootstrap's readiness, after the interpreter
      started).
    total_wall_s: wall-clock seconds for all cases of one response; keep it below
      pipeline.reward_timeout_s, or the scorer gives up first and the sample is invalid.
    cpu_s: CPU seconds (whole seconds; the kernel's RLIMIT_CPU granularity).
    memory_mb: address space (RLIMIT_AS), interpreter included (~30 MB).
    output_bytes: stdout and stderr each; more kills the run ("output_limit").
    file_mb: largest file the program may write (RLIMIT_FSIZE).
    processes: RLIMIT_NPROC (as nobody; beyond the existing ones otherwise).
    open_files: RLIMIT_NOFILE.
    isolate_network: try a new network namespace (root or user namespaces); the audit
      hook refuses sockets either way.
    python: the interpreter that runs programs. As root the child switches to uid
      nobody only when nobody can read that interpreter's standard library (a pyenv
      under /root cannot be read; /usr/bin/python3 usually can). None: this one, or, as
      root when nobody cannot read it, /usr/bin/python3 of the same minor version if
      nobody can (`default_python`).
  """
  wall_s: float = 2.0
  total_wall_s: float = 4.0
  cpu_s: int = 1
  memory_mb: int = 512
  output_bytes: int = 1 << 22
  file_mb: int = 16
  processes: int = 32
  open_files: int = 64
  isolate_network: bool = False
  python: str | None = None
  fork_server: bool = True

  def __post_init__(self):
    for key in ("wall_s", "total_wall_s", "cpu_s", "memory_mb", "output_bytes", "file_mb",
                "processes", "open_files"):
      if not getattr(self, key) > 0:
        raise UserError(f"code limits: {key} must be > 0, got {getattr(self, key)}")
    if not float(self.cpu_s).is_integer():
      raise UserError(f"code limits: cpu_s must be whole seconds, got {self.cpu_s}")


@dataclasses.dataclass(frozen=True)
class Case:
  """How one test case ended.

  Attributes:
    status: one of STATUSES.
    output: its stdout (stdin mode) or the JSON of its result (function mode).
  """
  status: str
  output: bytes


@dataclasses.dataclass(frozen=True)
class Run:
  """What one sandboxed process did.

  Attributes:
    cases: per case that ended (in order); a case the process died in is not here.
    status: the process's end: one of STATUSES ("ok" = exit 0).
    returncode: the exit code (negative: killed by that signal).
    stdout: the unmarked stdout (single mode), at most the output cap.
    stderr: the first bytes of stderr (a traceback's start), decoded.
    wall_s: seconds from spawn to exit.
    network_isolated: whether the process had its own network namespace.
    as_nobody: whether the process ran as uid nobody (root parents only).
  """
  cases: list[Case]
  status: str
  returncode: int
  stdout: bytes
  stderr: str
  wall_s: float
  network_isolated: bool
  as_nobody: bool = False


@functools.lru_cache(maxsize=None)
def _nobody_can_import(python: str) -> bool:
  """Whether uid nobody can read `python`'s standard library (checked by mode bits)."""
  try:
    stdlib = subprocess.run([python, "-I", "-S", "-c", "import os; print(os.__file__)"],
                            capture_output=True, text=True, timeout=30, check=True,
                            env=dict(_ENV)).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return False
  path = os.path.dirname(os.path.realpath(stdlib))
  if not os.stat(path).st_mode & stat.S_IROTH:
    return False
  while True:
    if not os.stat(path).st_mode & stat.S_IXOTH:
      return False
    parent = os.path.dirname(path)
    if parent == path:
      return True
    path = parent


@functools.lru_cache(maxsize=None)
def default_python() -> str:
  """This interpreter, unless root must fall back to a system one to drop to nobody."""
  if os.geteuid() != 0 or _nobody_can_import(sys.executable):
    return sys.executable
  for candidate in _SYSTEM_PYTHONS:
    if os.path.exists(candidate) and _nobody_can_import(candidate):
      try:
        version = subprocess.run([candidate, "-I", "-S", "-c",
                                  "import sys; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30, check=True,
                                 env=dict(_ENV)).stdout.split()
      except (OSError, subprocess.SubprocessError):
        continue
      if version == [str(v) for v in sys.version_info[:2]]:
        return candidate
  return sys.executable


def run_python(source: str, limits: Limits, *, inputs: list[str] | None = None,
               fn_name: str | None = None, args: list[list] | None = None,
               single_stdin: str | None = None,
               stop: Callable[[list[Case]], bool] | None = None) -> Run:
  """Runs `source` in one sandboxed process: several cases, or once as a plain program.

  Exactly one of `inputs` (stdin cases), `args` with `fn_name` (function cases) or
  `single_stdin` (one plain run, real per-process semantics) is given. Every case gets
  `limits.wall_s` of wall clock from the end of the previous one and the output cap;
  the process gets `limits.cpu_s` of CPU per case. `stop(cases so far)`, asked after
  each case, ends the run early when it returns True (a failing case under all-or-nothing
  scoring).

  Returns:
    The Run. Raises SandboxError when the sandbox failed to come up.
  """
  with tempfile.TemporaryDirectory(prefix="jaxrl_code_") as home:
    nonce = secrets.token_hex(8)
    prog = os.path.join(home, "prog.py")
    _write(prog, source)
    stdin_path = os.path.join(home, "stdin.txt")
    _write(stdin_path, single_stdin or "")
    if fn_name is not None:
      mode, n = "function", len(args or [])
      cases = os.path.join(home, "cases.json")
      _write(cases, json.dumps(list(enumerate(args or []))))
    elif inputs is not None:
      mode, n, cases = "stdin", len(inputs), ""
      for i, text in enumerate(inputs):
        _write(os.path.join(home, f"in{i}.txt"), text)  # the child's case i reads in{i}.txt
    else:
      mode, n, cases = "single", 1, ""
    python = limits.python or default_python()
    as_nobody = os.geteuid() == 0 and _nobody_can_import(python)
    cfg = {"mode": mode, "program": prog, "uid": _NOBODY if as_nobody else "",
           "cases": cases, "num_cases": n,
           "cpu_s": int(limits.cpu_s) * max(n, 1), "memory_bytes": limits.memory_mb << 20,
           "file_bytes": limits.file_mb << 20, "processes": limits.processes,
           "open_files": limits.open_files, "isolate_network": int(limits.isolate_network),
           "fn_name": fn_name or "", "nonce": nonce}
    if as_nobody:
      os.chown(home, _NOBODY, _NOBODY)  # the child runs as nobody: its one writable place
    run = _spawn(python, cfg, home, stdin_path, limits, ("\n" + nonce + " ").encode(),
                 max(n, 1), stop)
    return dataclasses.replace(run, as_nobody=as_nobody)


def _write(path: str, text: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _split_cases(stdout: bytes, mark: bytes) -> tuple[list[Case], bytes]:
  """Outputs between marks -> Cases; the unmarked tail (a dying case's output) apart."""
  cases, pos = [], 0
  while True:
    at = stdout.find(mark, pos)
    if at < 0:
      return cases, stdout[pos:]
    end = stdout.find(b"\n", at + len(mark))
    if end < 0:
      return cases, stdout[pos:at]
    _, kind, payload = (stdout[at + len(mark):end].split(b" ", 2) + [b"", b""])[:3]
    output = payload if payload else stdout[pos:at]
    cases.append(Case("ok" if kind == b"ok" else "runtime_error", output))
    pos = end + 1


def _spawn(python: str, cfg: dict, home: str, stdin_path: str, limits: Limits, mark: bytes,
           n: int, stop: Callable[[list[Case]], bool] | None) -> Run:
  start = time.monotonic()
  argv = [f"{k}={v}" for k, v in cfg.items()]
  with open(stdin_path, "rb") as stdin_file:
    if limits.fork_server:
      child = _ForkedChild(python, home, argv, stdin_file.fileno())
    else:
      child = _PopenChild(python, home, argv, stdin_file)
  ready_line = (cfg["nonce"] + " ").encode()
  try:
    status, out, err, ready = _supervise(child, ready_line, limits, mark, n, stop)
  finally:
    code = child.finish()
  wall = time.monotonic() - start
  if not ready:  # (also when it timed out: a start that slow is an overloaded host)
    how = (f"no start within {_STARTUP_S:g}s" if status == "timeout"
           else f"exit {code} after {wall:.2f}s")
    raise SandboxError(f"the sandbox bootstrap failed ({how}): "
                       f"{err[:_STDERR_KEEP].decode('utf-8', 'replace').strip()[-300:]}")
  if status is None:
    cpu_signals = (-signal.SIGXCPU, -signal.SIGKILL)
    status = "ok" if code == 0 else "timeout" if code in cpu_signals else "runtime_error"
  cases, tail = _split_cases(bytes(out), mark)
  return Run(cases, status, code, tail, err[:_STDERR_KEEP].decode("utf-8", "replace"), wall,
             ready == b"N")


class _PopenChild:
  """A fresh `python -I -S -c <bootstrap>` per run (Limits.fork_server False)."""

  def __init__(self, python: str, home: str, argv: list[str], stdin_file):
    try:
      self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
          [python, "-I", "-S", "-c", _BOOTSTRAP] + argv, cwd=home, env=dict(_ENV),
          stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True, close_fds=True)
    except OSError as e:
      raise SandboxError(f"cannot start the sandbox: {e}") from None
    self.pid = self.proc.pid
    self.pidfd = os.pidfd_open(self.pid)
    self.stdout, self.stderr = self.proc.stdout.fileno(), self.proc.stderr.fileno()

  def finish(self) -> int:
    """Kills the group, reaps the child, closes its pipes: the returncode."""
    _kill_group(self.pid)
    self.proc.wait()
    self.proc.stdout.close()
    self.proc.stderr.close()
    os.close(self.pidfd)
    return self.proc.returncode


class _ForkedChild:
  """The same child forked by the interpreter's fork server (code_forkserver.py)."""

  def __init__(self, python: str, home: str, argv: list[str], stdin_fd: int):
    self.server = code_forkserver.get(python, _BOOTSTRAP, _ENV)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
      self.child = self.server.spawn(home, argv, (stdin_fd, out_w, err_w))
    except code_forkserver.ForkServerError as e:
      for fd in (out_r, err_r):
        os.close(fd)
      raise SandboxError(f"cannot start the sandbox: {e}") from None
    finally:
      os.close(out_w)  # the child holds the write ends: EOF once it (and its own) exit
      os.close(err_w)
    self.pid, self.pidfd = self.child.pid, self.child.pidfd
    self.stdout, self.stderr = out_r, err_r

  def finish(self) -> int:
    """Kills the group, has the server reap the child, closes the pipes: the returncode."""
    _kill_group(self.pid)
    try:
      return self.server.reap(self.child)
    except code_forkserver.ForkServerError as e:
      raise SandboxError(f"the sandbox's end was lost: {e}") from None
    finally:
      os.close(self.stdout)
      os.close(self.stderr)


def _supervise(child, ready_line: bytes, limits: Limits, mark: bytes, n: int,
               stop: Callable[[list[Case]], bool] | None):
  """Reads the pipes until the child exits; kills at a case's deadline or the output cap.

  Each case mark on stdout restarts the wall clock. The exit is seen through a pidfd,
  without reaping, so the caller kills the group while its id still belongs to the
  (zombie) leader and cannot be reused.
  """
  out, err, ready = bytearray(), bytearray(), b""
  cap = limits.output_bytes * n
  sel = selectors.DefaultSelector()
  sel.register(child.stdout, selectors.EVENT_READ, out)
  sel.register(child.stderr, selectors.EVENT_READ, err)
  sel.register(child.pidfd, selectors.EVENT_READ, "exit")
  # The clocks start when the bootstrap is ready: a slow start on a loaded host is not
  # the program's time (past _STARTUP_S it is the sandbox's failure).
  exited, marks = False, 0
  case_deadline = total_deadline = time.monotonic() + _STARTUP_S
  try:
    while True:
      remaining = min(case_deadline, total_deadline) - time.monotonic()
      if remaining <= 0:
        return "timeout", out, err, ready
      # After the exit, pipes still open belong to an escaped descendant: stop once quiet.
      events = sel.select(min(remaining, 0.05) if exited else remaining)
      if exited and not events:
        return None, out, err, ready
      for key, _ in events:
        if key.data == "exit":
          exited = True
          sel.unregister(child.pidfd)
          continue
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
          sel.unregister(key.fileobj)
          continue
        key.data.extend(chunk)
        if len(key.data) > cap:
          del key.data[cap:]
          return "output_limit", out, err, ready
        if key.data is not out:
          continue
        if not ready:
          if len(out) < len(ready_line) + 2:
            continue
          # The bootstrap's first line, "<nonce> R" (N: own network namespace), is written
          # before the program exists, so the program cannot forge it.
          if not out.startswith(ready_line) or out[len(ready_line) + 1:][:1] != b"\n":
            return None, out, err, ready
          ready = bytes(out[len(ready_line):len(ready_line) + 1])
          del out[:len(ready_line) + 2]
          case_deadline = time.monotonic() + limits.wall_s
          total_deadline = time.monotonic() + limits.total_wall_s
        seen = out.count(mark)
        if seen > marks:
          marks, case_deadline = seen, time.monotonic() + limits.wall_s
          if stop is not None and stop(_split_cases(bytes(out), mark)[0]):
            # The failing case wrote its traceback before its mark: take what stderr holds
            # now (its event may come after stdout's in this round), without waiting.
            _drain(child.stderr, err, _STDERR_KEEP)
            return "stopped", out, err, ready
      if exited and not sel.get_map():
        return None, out, err, ready
  finally:
    sel.close()


def _drain(fd: int, buf: bytearray, limit: int) -> None:
  """Appends what `fd` holds now (up to `limit` bytes in `buf`), never blocking."""
  with selectors.DefaultSelector() as sel:
    sel.register(fd, selectors.EVENT_READ)
    while len(buf) < limit and sel.select(0):
      chunk = os.read(fd, limit - len(buf))
      if not chunk:
        return
      buf.extend(chunk)


def _kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
