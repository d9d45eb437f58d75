"""The sandbox's fork server: one idle interpreter that forks a fresh child per program.

code_forkserver.py runs this file's text as `python -I -S -c <text> <bootstrap> <fd>
<isolation> <work root> <namespaces: 0|1>` (scrubbed environment, new session, cwd /);
it is never imported by the package. It never runs
untrusted code itself: it reads requests from the control socket <fd> and forks. A forked
child becomes exactly what `python -I -S -c <bootstrap> key=value...` would be
(code_child.py: limits, uid switch, ready line, audit hook, program), without paying for
an interpreter start (~20 ms of CPU per program; a fork of this small process ~1 ms).

Isolation (code_isolate.py, whose text is <isolation>): at its start the server tries the
whole sequence once in a throwaway child. When it works ("namespaces"), each spawn forks
A, which enters new namespaces and forks B, the program, as pid 1 of its own pid
namespace inside a new root; A exits at once and B, reparented to this server (a child
subreaper), is what the caller watches and kills. When it does not, the child is the
program itself, with limits and (as root) its own uid only.

Messages (one SOCK_SEQPACKET message each, JSON, answered in order):
  first, unasked: {"namespaces": bool, "why": reason or null, "root": bool,
                   "seccomp": bool, "landlock": bool}
  {"op": "spawn", "cwd": DIR, "argv": [key=value...]} with fds [stdin, stdout, stderr]
      -> {"pid": PID} with a pidfd of the child (taken before it could be reaped, so the
         caller's pidfd and process-group id can never name a reused pid).
      In namespaces, the fds are [stdin, stdout, stderr, report] and the answer is
      {"helper": A's pid}; A sends "pid <B>" with a pidfd of B (or "error <why>") on the
      report socket, so the server's serial work stays one fork.
  {"op": "reap", "pid": PID, "helper": A's pid or absent} -> {"returncode": N, "cpu_s": S}
      (N negative: killed by signal -N; S: the CPU seconds it used). A child stays a
      zombie until reaped, so the caller may kill it until then.
EOF on the socket (the parent exited or closed it) ends the server.

The child, in order: closes the control socket and every other inherited fd (a program
must never reach the server, which runs as the parent's user), starts a new session,
puts the given fds on 0, 1, 2, enters its directory (and its namespaces), forgets the
modules only the server needed (so `import socket` is refused by the audit hook as in a
fresh interpreter), and runs the bootstrap as __main__; then it ends as an interpreter
would (SystemExit's code, a traceback and 1 on an uncaught exception, non-daemon threads
joined, atexit functions run, stdout and stderr flushed: 120 when that fails).

What differs from a fresh interpreter: the hash seed is the server's (set and dict
iteration orders repeat across children), and json, io and traceback are already
imported. `random` and `secrets` are not imported here, so each child seeds its own.
"""

import builtins
import json
import os
import signal
import sys
import traceback  # noqa: F401  (warm for the children: imported on every runtime error)

_WARM = frozenset(sys.modules)
import socket  # noqa: E402  pylint: disable=wrong-import-position

_ISO = {"__name__": "code_isolate"}
exec(compile(sys.argv[3], "<isolation>", "exec"), _ISO)  # noqa: S102  (ours; imports ctypes)
_SERVER_ONLY = frozenset(sys.modules) - _WARM
_BOOTSTRAP = compile(sys.argv[1], "<bootstrap>", "exec")
_SOCK = socket.socket(fileno=int(sys.argv[2]))
_WORK_ROOT, _TRY_NAMESPACES = sys.argv[4], sys.argv[5] == "1"
_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024
_ROOT = os.geteuid() == 0
# The interpreter's own files (a pyenv under /root, a conda under /home) besides /usr.
_PREFIXES = sorted({os.path.realpath(sys.base_prefix)})
_PR_SET_CHILD_SUBREAPER = 36
_SOCKET, _REPORT_SOCKET = socket, socket.socket
_HELPERS = set()  # pids of the As not reaped yet


def _exit_code(e):
  if e.code is None:
    return 0
  if isinstance(e.code, int):
    return e.code
  try:  # as the interpreter does: a non-integer code is printed, exit 1
    sys.stderr.write(f"{e.code}\n")
  except BaseException:  # pylint: disable=broad-except
    pass
  return 1


def _finish(code):
  """Ends the child as Py_FinalizeEx would, without returning to the server's loop."""
  # (-SIGINT stays: the caller raises it once the rest is done.)
  threading = sys.modules.get("threading")
  try:
    if threading is not None:
      threading._shutdown()  # pylint: disable=protected-access  (joins non-daemon threads)
  except BaseException:  # pylint: disable=broad-except
    pass
  atexit = sys.modules.get("atexit")
  try:
    if atexit is not None:
      atexit._run_exitfuncs()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    pass
  try:
    if sys.stdout is not None:
      sys.stdout.flush()
  except BaseException as e:  # pylint: disable=broad-except
    code = 120  # as CPython when stdout cannot be flushed at exit, with its message
    try:
      sys.stderr.write(f"Exception ignored in: {sys.stdout!r}\n{type(e).__name__}: {e}\n")
    except BaseException:  # pylint: disable=broad-except
      pass
  try:
    if sys.stderr is not None:
      sys.stderr.flush()
  except BaseException:  # pylint: disable=broad-except
    pass
  return code


def _child(request, fds, report=None, isolated=False):
  """The forked child: the program itself (`isolated`: as pid 1 of its namespaces, root
  only), or A (`report` set) that forks it as B."""
  code = 1
  try:
    _SOCK.close()
    os.setsid()
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
    keep = sorted({report, *_ISO["PROC_FD"]} - {None}) + [_MAX_FD]
    os.closerange(3, keep[0])
    for low, high in zip(keep, keep[1:]):
      os.closerange(low + 1, high)
    os.chdir(request["cwd"])
    if report is not None:
      _enter_namespaces(request, report)
    elif isolated:
      _enter(request["cwd"], request)
    else:
      # No pid namespace: only the filter keeps it from signalling the judge (with our
      # uid) or itself (a SIGKILL of its own would pass for a kill from outside).
      _ISO["confine"](request["cwd"], _PREFIXES, True,
                      os.geteuid() == 0 and not _leases_uid(request))
    _ISO.clear()  # (the server's ctypes handles: nothing a program should reach)
    for name in _SERVER_ONLY:
      sys.modules.pop(name, None)
    sys.argv = ["-c"] + request["argv"]
    try:
      exec(_BOOTSTRAP, {"__name__": "__main__", "__builtins__": builtins})  # noqa: S102
      code = 0
    except SystemExit as e:
      code = _exit_code(e)
    except KeyboardInterrupt:  # the interpreter ends by SIGINT then
      traceback.print_exc()
      code = -signal.SIGINT
    except BaseException:  # pylint: disable=broad-except  (the program's, as an interpreter)
      traceback.print_exc()
      code = 1
    code = _finish(code)
    if code == -signal.SIGINT:
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      try:
        signal.raise_signal(signal.SIGINT)
      except OSError:  # (refused by the seccomp filter without namespaces)
        pass
      code = 128 + signal.SIGINT  # (still here: pid 1 of a namespace ignores its own kill)
  finally:
    os._exit(code)  # never back into the server's loop, whatever happened


def _enter_namespaces(request, report):
  """A: new namespaces, fork B (their pid 1), send B's pid and a pidfd of it to the caller
  over `report`, exit; B returns, isolated. (All of it off the server's serial path.)"""
  try:
    _ISO["unshare_namespaces"](not _ROOT)
    pid = os.fork()
  except BaseException as e:  # pylint: disable=broad-except
    _SOCKET.send_fds(_REPORT_SOCKET(fileno=report), [f"error {e}".encode()[:500]], [])
    os._exit(1)
  if pid:
    try:
      _SOCKET.send_fds(_REPORT_SOCKET(fileno=report), [f"pid {pid}".encode()],
                       [os.pidfd_open(pid)])
    finally:
      os._exit(0)
  os.close(report)
  for fd in _ISO["PROC_FD"]:
    os.close(fd)
  _enter(request["cwd"], request)


def _leases_uid(request):
  """Whether the bootstrap will switch to a uid of the program's own (uid=N in argv)."""
  return any(arg.startswith("uid=") and arg != "uid=" for arg in request["argv"])


def _enter(home, request):
  try:
    _ISO["enter"](home, _PREFIXES, not _ROOT or not _leases_uid(request))
  except BaseException as e:  # pylint: disable=broad-except  (ours: no ready line follows)
    os.write(2, f"sandbox isolation failed: {e}\n".encode())
    os._exit(125)


def _fork_isolated():
  """As root: the child as pid 1 of new pid and ipc namespaces in one fork; the server
  itself steps back into its own afterwards (setns), ready for the next."""
  _ISO["_check"](_ISO["_LIBC"].unshare(_ISO["CLONE_NEWPID"] | _ISO["CLONE_NEWIPC"]),
                 "unshare")
  pid = None
  try:
    pid = os.fork()
    return pid
  finally:
    if pid != 0:  # the server (the child, pid 0 here, is pid 1 of its namespaces)
      for fd, kind in _OWN_NAMESPACES:
        _ISO["_check"](_ISO["_LIBC"].setns(fd, kind), "setns")


_TRACKED = set()  # programs forked and not reaped yet (without namespaces)


def _kill_orphans(reaping):
  """Without namespaces: kills and reaps our children that are no program of ours (what
  programs left behind, reparented to us), once `reaping`, a program, has ended."""
  _TRACKED.discard(reaping)
  for _ in range(8):  # (a killed orphan's own children come to us in turn)
    try:
      with open(f"/proc/self/task/{os.getpid()}/children", encoding="ascii") as f:
        orphans = [int(pid) for pid in f.read().split()
                   if int(pid) not in _TRACKED and int(pid) != reaping]
    except OSError:
      return
    if not orphans:
      return
    for pid in orphans:
      try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
      except OSError:
        pass


def _serve():
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(_SOCK, 1 << 20, 4)
    except OSError:
      return
    if not message:
      return
    request = json.loads(message)
    if request["op"] == "spawn":
      # Namespaces: fds are [stdin, stdout, stderr, report]; A answers on report.
      try:
        pid = _fork_isolated() if NAMESPACES and _ROOT else os.fork()
      except OSError as e:
        _SOCK.send(json.dumps({"error": f"fork: {e}"}).encode())
        pid = None
      if pid == 0:
        _child(request, fds[:3], fds[3] if NAMESPACES and not _ROOT else None,
               NAMESPACES and _ROOT)
      for fd in fds:
        os.close(fd)
      if pid is None:
        continue
      if NAMESPACES and not _ROOT:
        _HELPERS.add(pid)
        _SOCK.send(json.dumps({"helper": pid}).encode())
        continue
      _TRACKED.add(pid)
      pidfd = os.pidfd_open(pid)
      socket.send_fds(_SOCK, [json.dumps({"pid": pid}).encode()], [pidfd])
      os.close(pidfd)
    elif request["op"] == "reap":
      if not NAMESPACES and SUBREAPER:
        _kill_orphans(request["pid"])
      helper = request.get("helper")
      if helper in _HELPERS:  # (gone at once: B is ours once its A has exited)
        os.waitpid(helper, 0)
        _HELPERS.discard(helper)
      for other in list(_HELPERS):  # (As whose B never started)
        if os.waitpid(other, os.WNOHANG)[0]:
          _HELPERS.discard(other)
      try:
        if request["pid"] is None:  # (the helper only: its B never started)
          raise ChildProcessError("no program to reap")
        _, status, usage = os.wait4(request["pid"], 0)
        reply = {"returncode": os.waitstatus_to_exitcode(status),
                 "cpu_s": usage.ru_utime + usage.ru_stime}
      except ChildProcessError as e:
        reply = {"error": f"reap: {e}"}
      _SOCK.send(json.dumps(reply).encode())
    else:
      for fd in fds:
        os.close(fd)
      _SOCK.send(json.dumps({"error": f"unknown op {request['op']!r}"}).encode())


_ISO["probe_landlock"](_WORK_ROOT, _PREFIXES)  # (first: the probe below applies it too)
WHY = (_ISO["probe"](_WORK_ROOT, _PREFIXES, not _ROOT) if _TRY_NAMESPACES
       else "turned off by Limits.namespaces")
# A child subreaper: B, orphaned by A, is ours to reap (so never a reused pid); without
# namespaces, what a program detached comes to us, to be killed at its reap.
SUBREAPER = _ISO["_LIBC"].prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
NAMESPACES = WHY is None and SUBREAPER
WHY = WHY or (None if SUBREAPER else "no child subreaper")
if NAMESPACES:  # (the probe built it in a throwaway child: now for real)
  # As root, the server's own pid and ipc namespaces, to step back into after each fork
  # (_fork_isolated); opened first, as the new root has no /proc.
  _OWN_NAMESPACES = [(os.open(f"/proc/self/ns/{name}", os.O_RDONLY), _ISO[kind])
                     for name, kind in (("pid", "CLONE_NEWPID"), ("ipc", "CLONE_NEWIPC"))
                     if _ROOT]
  try:
    _ISO["build_root"](_WORK_ROOT, _PREFIXES, not _ROOT)
  except OSError as e:  # (the probe's throwaway child managed it: not expected)
    NAMESPACES, WHY = False, f"building the root: {e}"
_SOCK.send(json.dumps({"namespaces": NAMESPACES, "why": WHY, "root": _ROOT,
                       "seccomp": _ISO["probe_seccomp"](),
                       "landlock": _ISO["LANDLOCK"][0]}).encode())
_serve()
