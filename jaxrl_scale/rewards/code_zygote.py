"""The sandbox's fork server: one idle interpreter that forks a fresh child per program.

code_forkserver.py runs this file's text as `python -I -S -c <text> <bootstrap> <fd>`
(scrubbed environment, new session, cwd /); it is never imported by the package. It never
runs untrusted code itself: it reads requests from the control socket <fd> and forks. A
forked child becomes exactly what `python -I -S -c <bootstrap> key=value...` would be
(code_child.py: limits, uid switch, ready line, audit hook, program), without paying for
an interpreter start (~20 ms of CPU per program; a fork of this small process ~1 ms).

Requests (one SOCK_SEQPACKET message each, JSON, answered in order):
  {"op": "spawn", "cwd": DIR, "argv": [key=value...]} with fds [stdin, stdout, stderr]
      -> {"pid": PID} with a pidfd of the child (taken before it could be reaped, so the
         caller's pidfd and process-group id can never name a reused pid).
  {"op": "reap", "pid": PID} -> {"returncode": N} (negative: killed by signal -N). A
      child stays a zombie until reaped, so the caller may kill its group until then.
EOF on the socket (the parent exited or closed it) ends the server.

The child, in order: closes the control socket and every other inherited fd (a program
must never reach the server, which runs as the parent's user), starts a new session,
puts the given fds on 0, 1, 2, enters its directory, forgets the modules only the server
needed (so `import socket` is refused by the audit hook as in a fresh interpreter), and
runs the bootstrap as __main__; then it ends as an interpreter would (SystemExit's code,
a traceback and 1 on an uncaught exception, non-daemon threads joined, atexit functions
run, stdout and stderr flushed: 120 when that fails).

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

_SERVER_ONLY = frozenset(sys.modules) - _WARM
_BOOTSTRAP = compile(sys.argv[1], "<bootstrap>", "exec")
_SOCK = socket.socket(fileno=int(sys.argv[2]))
_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024


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


def _child(request, fds):
  code = 1
  try:
    _SOCK.close()
    os.setsid()
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
    os.closerange(3, _MAX_FD)
    os.chdir(request["cwd"])
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
      signal.raise_signal(signal.SIGINT)
  finally:
    os._exit(code)  # never back into the server's loop, whatever happened


def _serve():
  while True:
    try:
      message, fds, _, _ = socket.recv_fds(_SOCK, 1 << 20, 3)
    except OSError:
      return
    if not message:
      return
    request = json.loads(message)
    if request["op"] == "spawn":
      try:
        pid = os.fork()
      except OSError as e:
        for fd in fds:
          os.close(fd)
        _SOCK.send(json.dumps({"error": f"fork: {e}"}).encode())
        continue
      if pid == 0:
        _child(request, fds)
      for fd in fds:
        os.close(fd)
      pidfd = os.pidfd_open(pid)
      socket.send_fds(_SOCK, [json.dumps({"pid": pid}).encode()], [pidfd])
      os.close(pidfd)
    elif request["op"] == "reap":
      try:
        _, status = os.waitpid(request["pid"], 0)
        reply = {"returncode": os.waitstatus_to_exitcode(status)}
      except ChildProcessError as e:
        reply = {"error": f"reap: {e}"}
      _SOCK.send(json.dumps(reply).encode())
    else:
      for fd in fds:
        os.close(fd)
      _SOCK.send(json.dumps({"error": f"unknown op {request['op']!r}"}).encode())


_serve()
