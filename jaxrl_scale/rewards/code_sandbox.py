"""Runs one untrusted Python program in a separate, isolated, limited process.

Each program is forked from one idle `python -I -S` per interpreter (the fork server,
code_forkserver.py: an interpreter start is ~20 ms of CPU, the demo's programs ~1 ms) and,
where the kernel allows it (root, or unprivileged user namespaces), runs as pid 1 of
namespaces of its own (code_isolate.py): its own pid namespace (it sees and signals no
other process; when it ends, everything it started dies), a new root holding only the
system directories and the interpreter, read-only, an empty /tmp and its work dir as the
one writable place (no dataset, no other program's files), a network namespace with
nothing in it, its own ipc namespace, no capabilities, no_new_privs. As root it also runs
under a uid leased to it alone from a pool (`UID_POOL`), so concurrent programs share no
uid. Then the limits of `Limits` (code_child.py: CPU, address space, file size, open
files, processes), a scrubbed environment, and the audit hook as a second layer. Where
the kernel refuses namespaces, root still gives each program its own uid (and kills what
that uid left behind); a non-root parent without namespaces runs one program at a time.
`protections()` names the layers in force (printed once, to stderr, at first use).

The parent enforces the wall-clock limit and the output cap, reading stdout and stderr
incrementally, and kills the program at either.

Outcomes (`Run.status`): "ok" (exit 0), "runtime_error" (non-zero exit, a signal, or case
marks out of order: the program's malformed output), "timeout" (wall or CPU limit),
"output_limit", "stopped" (the caller's `stop` saw a failing case and ended the run
early). A sandbox that did not come up (no ready line from the bootstrap as the first
bytes of its stdout), or a program killed by a signal that neither we nor its CPU limit
sent (someone else's kill), raises `SandboxError`: that is not the program's doing, and
the caller must not score it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import code_forkserver
from jaxrl_scale.rewards import code_uids

_BOOTSTRAP = "\n".join(pathlib.Path(__file__).with_name(name).read_text(encoding="utf-8")
                       for name in ("code_child.py", "code_child_asserts.py"))
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
# Uids leased one per running program (as root): Debian's reserved 65000-65533 range,
# below nobody, inside any container's usual 0-65535 map.
UID_POOL = range(65100, 65500)
_SYSTEM_PYTHONS = ("/usr/bin/python3",)
STARTUP_S = 10.0  # interpreter start and bootstrap, before the program's clocks start
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
    processes: RLIMIT_NPROC (per program: its own uid or user namespace; beyond the
      user's existing processes otherwise).
    open_files: RLIMIT_NOFILE.
    python: the interpreter that runs programs. As root the child switches to its
      leased uid only when any user can read that interpreter's standard library (a
      pyenv under /root cannot be read; /usr/bin/python3 usually can). None: this one,
      or, as root when others cannot read it, /usr/bin/python3 of the same minor version
      if they can (`default_python`).
    audit_hook: install the audit hook (the second layer). Only tests turn it off, to
      check that the kernel's layers hold by themselves.
    namespaces: use namespaces where the kernel allows them. Only tests turn them off,
      to check the fallback of kernels that refuse them.
  """
  wall_s: float = 2.0
  total_wall_s: float = 4.0
  cpu_s: int = 1
  memory_mb: int = 512
  output_bytes: int = 1 << 22
  file_mb: int = 16
  processes: int = 32
  open_files: int = 64
  python: str | None = None
  audit_hook: bool = True
  namespaces: bool = True

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
    namespaces: whether the process ran in namespaces of its own (code_isolate.py).
    uid: the uid it ran as when root leased it one, else None (ours).
    malformed: its case marks were out of order (then `cases` is empty and the status
      "runtime_error"): the program wrote marks of its own.
  """
  cases: list[Case]
  status: str
  returncode: int
  stdout: bytes
  stderr: str
  wall_s: float
  namespaces: bool = False
  uid: int | None = None
  malformed: bool = False


@functools.lru_cache(maxsize=None)
def _others_can_import(python: str) -> bool:
  """Whether any uid can read `python`'s standard library (checked by mode bits)."""
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
  """This interpreter, unless root must fall back to a system one to drop its uid."""
  if os.geteuid() != 0 or _others_can_import(sys.executable):
    return sys.executable
  for candidate in _SYSTEM_PYTHONS:
    if os.path.exists(candidate) and _others_can_import(candidate):
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


_UIDS = code_uids.UidPool(UID_POOL)
_SERIAL = threading.Lock()  # one program at a time where nothing else separates them
_WORK_ROOT: list[str] = []
_TOLD: set[str] = set()
_STATE_LOCK = threading.Lock()


def _work_root() -> str:
  """This process's directory of work dirs: -wx--x--x, listable by no program (nor by
  a user namespace's root, which owns it), each work dir in it an unguessable name."""
  with _STATE_LOCK:
    if not _WORK_ROOT:
      root = tempfile.mkdtemp(prefix="jaxrl_code_")
      os.chmod(root, 0o311)
      _WORK_ROOT.append(root)
      atexit.register(_remove_work_root, root, os.getpid())
    return _WORK_ROOT[0]


def _remove_work_root(root: str, owner: int) -> None:
  if os.getpid() != owner:  # (a forked copy's exit: the root is still its parent's)
    return
  try:
    os.chmod(root, 0o700)
  except OSError:
    return
  shutil.rmtree(root, ignore_errors=True)


# A forked copy of this process makes its own (its own fork server builds its root there).
os.register_at_fork(after_in_child=_WORK_ROOT.clear)


def _work_dir() -> str:
  home = os.path.join(_work_root(), secrets.token_hex(16))
  os.mkdir(home, 0o700)
  return home


def _server(python: str, namespaces: bool = True) -> code_forkserver.ForkServer:
  server = code_forkserver.get(python, _BOOTSTRAP, _ENV, _work_root(), namespaces)
  try:
    server.ensure_started()
  except code_forkserver.ForkServerError as e:
    raise SandboxError(f"cannot start the sandbox: {e}") from None
  with _STATE_LOCK:
    if (python, namespaces) not in _TOLD:
      _TOLD.add((python, namespaces))
      print(f"code sandbox ({python}): {_describe_protections(server, python)}",
            file=sys.stderr, flush=True)
  return server


def _leases_uid(python: str) -> bool:
  return os.geteuid() == 0 and _others_can_import(python)


def _describe_protections(server: code_forkserver.ForkServer, python: str) -> str:
  layers = []
  if server.namespaces:
    layers.append("own pid and ipc namespaces"
                  + ("" if os.geteuid() == 0 else " and user namespace")
                  + ", an empty network namespace")
    layers.append("read-only system view without /proc, a work dir no other program"
                  " reaches, no capabilities")
  layers.append("seccomp filter" if server.seccomp else "NO seccomp filter")
  layers.append("landlock (writes in the work dir only, reads of the system only)"
                if server.landlock else "NO landlock")
  if _leases_uid(python):
    layers.append(f"a uid per program ({UID_POOL.start}-{UID_POOL.stop - 1})")
  layers.append("rlimits, scrubbed environment, audit hook")
  line = "; ".join(layers)
  if not server.namespaces:
    line += f". NO namespaces ({server.why_not})"
    if not _leases_uid(python):
      line += ": programs share our uid, so they run one at a time"
  return line


def protections(python: str | None = None, namespaces: bool = True) -> str:
  """One line naming the layers in force for `python` (starts its fork server)."""
  python = python or default_python()
  return _describe_protections(_server(python, namespaces), python)


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
    The Run. Raises SandboxError when the sandbox failed to come up, or the program was
    killed from outside.
  """
  python = limits.python or default_python()
  with slots(python, 1, limits.namespaces) as ((server, uid, home),):
    return _run_in(home, server, source, limits, uid, inputs=inputs, fn_name=fn_name,
                   args=args, single_stdin=single_stdin, stop=stop)


@contextlib.contextmanager
def slots(python: str, n: int, namespaces: bool = True):
  """`n` places to run programs at the same time: [(server, uid or None, work dir)].

  A leased uid each (root), a fresh work dir each (owned by that uid); without
  namespaces and without uids, one holder of slots at a time (`_SERIAL`). On exit the
  work dirs are removed and, without namespaces, what the uids left behind is killed.
  """
  server = _server(python, namespaces)
  try:
    uids = [_UIDS.lease() if _leases_uid(python) else None for _ in range(n)]
  except code_uids.UidError as e:
    raise SandboxError(str(e)) from None
  serial = _SERIAL if not server.namespaces and uids[0] is None else None
  homes = []
  try:
    if serial is not None:
      serial.acquire()  # pylint: disable=consider-using-with
    for uid in uids:
      homes.append(_work_dir())
      if uid is not None:
        os.chown(homes[-1], uid, uid)  # its one writable place; 0700: no other program's
    yield [(server, uid, home) for uid, home in zip(uids, homes)]
  finally:
    for home in homes:
      shutil.rmtree(home, ignore_errors=True)
    for uid in uids:
      if uid is not None:
        if not server.namespaces:
          code_uids.kill_uid(uid)  # its leftovers (with namespaces, its pid 1's end did)
        _UIDS.release(uid)
    if serial is not None:
      serial.release()


def config(server: code_forkserver.ForkServer, limits: Limits, uid: int | None, *,
           mode: str, program: str, num_cases: int, cpu_s: int, cases: str = "",
           fn_name: str = "", nonce: str) -> dict:
  """The bootstrap's key=value configuration (code_child.py)."""
  return {"mode": mode, "program": program, "uid": "" if uid is None else uid,
          "own_userns": int(bool(server.namespaces) and os.geteuid() != 0),
          "nproc_base": len(os.listdir("/proc")) if not server.namespaces and uid is None
                        else 0,
          "cases": cases, "num_cases": num_cases, "cpu_s": int(cpu_s),
          "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_mb << 20,
          "processes": limits.processes, "open_files": limits.open_files,
          "audit_hook": int(limits.audit_hook), "fn_name": fn_name, "nonce": nonce}


def _run_in(home: str, server: code_forkserver.ForkServer, source: str, limits: Limits,
            uid: int | None, *, inputs, fn_name, args, single_stdin, stop) -> Run:
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
  cfg = config(server, limits, uid, mode=mode, program=prog, num_cases=n,
               cpu_s=int(limits.cpu_s) * max(n, 1), cases=cases, fn_name=fn_name or "",
               nonce=nonce)
  run = _spawn(server, cfg, home, stdin_path, limits, ("\n" + nonce + " ").encode(),
               max(n, 1), stop)
  return dataclasses.replace(run, namespaces=bool(server.namespaces), uid=uid)


def _write(path: str, text: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _split_cases(stdout: bytes, mark: bytes, n: int) -> tuple[list[Case], bytes, bool]:
  """Outputs between marks -> Cases; the unmarked tail (a dying case's output) apart.

  The program runs in the process that writes the marks, so it can learn the nonce and
  write marks of its own. Only marks for cases 0, 1, ... in order, at most `n`, each
  "ok" or "error", are well formed: the third value is False at the first that is not
  (the program's malformed output; which earlier mark was forged cannot be told, so the
  caller voids them all).
  """
  cases, pos = [], 0
  while True:
    at = stdout.find(mark, pos)
    if at < 0:
      return cases, stdout[pos:], True
    end = stdout.find(b"\n", at + len(mark))
    if end < 0:
      return cases, stdout[pos:at], True
    index, kind, payload = (stdout[at + len(mark):end].split(b" ", 2) + [b"", b""])[:3]
    if index != str(len(cases)).encode() or len(cases) >= n or kind not in (b"ok", b"error"):
      return cases, b"", False
    output = payload if payload else stdout[pos:at]
    cases.append(Case("ok" if kind == b"ok" else "runtime_error", output))
    pos = end + 1


def _spawn(server: code_forkserver.ForkServer, cfg: dict, home: str, stdin_path: str,
           limits: Limits, mark: bytes, n: int,
           stop: Callable[[list[Case]], bool] | None) -> Run:
  start = time.monotonic()
  argv = [f"{k}={v}" for k, v in cfg.items()]
  with open(stdin_path, "rb") as stdin_file:
    child = ForkedChild(server, home, argv, stdin_file.fileno())
  ready_line = (cfg["nonce"] + " ").encode()
  try:
    status, out, err, ready = _supervise(child, ready_line, limits, mark, n, stop)
  finally:
    code, cpu_s = child.finish()
  wall = time.monotonic() - start
  if not ready:  # (also when it timed out: a start that slow is an overloaded host)
    how = (f"no start within {STARTUP_S:g}s" if status == "timeout"
           else f"exit {code} after {wall:.2f}s")
    raise SandboxError(f"the sandbox bootstrap failed ({how}): "
                       f"{err[:_STDERR_KEEP].decode('utf-8', 'replace').strip()[-300:]}")
  if status is None and code in (-signal.SIGXCPU, -signal.SIGKILL):
    # We did not kill it (status would say why). The kernel does at the CPU limit; any
    # other such end is someone else's kill, not the program's timeout.
    if cpu_s < cfg["cpu_s"] * 0.95:
      raise SandboxError(f"the program was killed from outside (signal {-code}) after "
                         f"{wall:.2f}s wall, {cpu_s:.2f}s CPU: not its doing")
    status = "timeout"
  if status is None:
    status = "ok" if code == 0 else "runtime_error"
  cases, tail, well_formed = _split_cases(bytes(out), mark, n)
  stderr = err[:_STDERR_KEEP].decode("utf-8", "replace")
  if not well_formed:
    cases, status = [], "runtime_error"
    stderr += "\nsandbox: case marks out of order (the program wrote marks of its own)"
  return Run(cases, status, code, tail, stderr, wall, malformed=not well_formed)


class ForkedChild:
  """The program's process, forked by the interpreter's fork server (code_forkserver.py)."""

  def __init__(self, server: code_forkserver.ForkServer, home: str, argv: list[str],
               stdin_fd: int):
    self.server = server
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

  def kill(self) -> None:
    """SIGKILL to the program (in namespaces: with it, everything it started)."""
    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
    try:
      os.killpg(self.pid, signal.SIGKILL)  # (without namespaces: its process group)
    except (ProcessLookupError, PermissionError):
      pass

  def finish(self) -> tuple[int, float]:
    """Kills, has the server reap the child, closes the pipes: returncode, CPU seconds."""
    self.kill()
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
  # the program's time (past STARTUP_S it is the sandbox's failure).
  exited, marks = False, 0
  case_deadline = total_deadline = time.monotonic() + STARTUP_S
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
          # The bootstrap's first line, "<nonce> R", is written
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
          cases, _, well_formed = _split_cases(bytes(out), mark, n)
          if stop is not None and well_formed and cases and stop(cases):
            # The failing case wrote its traceback before its mark: take what stderr holds
            # now (its event may come after stdout's in this round), without waiting.
            drain(child.stderr, err, _STDERR_KEEP)
            return "stopped", out, err, ready
      if exited and not sel.get_map():
        return None, out, err, ready
  finally:
    sel.close()


def drain(fd: int, buf: bytearray, limit: int) -> None:
  """Appends what `fd` holds now (up to `limit` bytes in `buf`), never blocking."""
  with selectors.DefaultSelector() as sel:
    sel.register(fd, selectors.EVENT_READ)
    while len(buf) < limit and sel.select(0):
      chunk = os.read(fd, limit - len(buf))
      if not chunk:
        return
      buf.extend(chunk)
