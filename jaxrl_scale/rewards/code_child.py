"""The sandboxed child's bootstrap: limits, then the untrusted program. Stdlib only.

code_sandbox.py runs this file's text as `python -I -S -c <text> key=value...` in a
fresh temporary directory, in a new session, with a scrubbed environment. It is never
imported by the package: it runs before any untrusted code, in the child only, so the
limits are set without a `preexec_fn` (unsafe in the threaded parent).

Order matters: the fork server's isolation (code_isolate.py) has already happened; limits
and the uid switch first (they cannot be undone afterwards), then the ready line
"<nonce> R" as the first bytes of stdout (the parent's proof that the sandbox came up:
without it, an infrastructure failure, not the program's fault), then the audit hook,
then the program. With -I -S the child sees neither the parent's environment
variables nor site-packages: programs get the standard library only.

Modes (every case ends with a mark "\\n<nonce> <index> <ok|error> <payload>\\n" on
fd 1, from which the parent splits the outputs and restarts its per-case wall clock):
  single    run prog.py once as __main__, stdin and stdout as the parent set them.
  stdin     for each (index, input file): input file on fd 0, a fresh sys.stdin, prog.py
            as __main__ in a fresh namespace; its stdout up to the mark is the output.
  function  exec prog.py once, find `fn_name` (a method of class Solution, else a
            top-level function), call it on each (index, args) of cases.json; the mark's
            payload is the JSON result. The program's own prints go nowhere.
  serve, check   assertion tests, in two processes (code_child_asserts.py).
The parent compares the outputs; this process never judges, so whatever the program
forges on fd 1 is at most an output of its own, and marks out of order are the program's
malformed output (code_sandbox._split_cases), never an error of the judge.
"""

import os
import resource
import sys

# key=value arguments: importing json here would cost more than the rest of the start.
CFG = dict(arg.split("=", 1) for arg in sys.argv[1:])
for _key in ("cpu_s", "memory_bytes", "file_bytes", "processes", "open_files", "num_cases",
             "own_userns", "audit_hook", "nproc_base"):
  CFG[_key] = int(CFG[_key])
CFG["uid"] = int(CFG["uid"]) if CFG["uid"] else None
os.write(2, b"")  # stderr must exist before anything can fail loudly


def _limit(name, value):
  resource.setrlimit(getattr(resource, name), (value, value))


_limit("RLIMIT_CPU", CFG["cpu_s"])  # SIGXCPU at the soft limit (soft == hard: then SIGKILL)
_limit("RLIMIT_AS", CFG["memory_bytes"])
_limit("RLIMIT_FSIZE", CFG["file_bytes"])
_limit("RLIMIT_NOFILE", CFG["open_files"])
_limit("RLIMIT_CORE", 0)
if CFG["uid"] is not None:
  # Root ignores RLIMIT_NPROC and may read and kill anything: run as the uid the parent
  # leased to this program alone (code_sandbox's pool), so its count is its own.
  os.setgroups([])
  os.setgid(CFG["uid"])
  os.setuid(CFG["uid"])
  _limit("RLIMIT_NPROC", CFG["processes"])
elif CFG["own_userns"]:
  # Root of a user namespace of its own: the kernel counts its processes there afresh.
  _limit("RLIMIT_NPROC", CFG["processes"])
elif os.geteuid() != 0:  # (root that cannot switch: only the audit hook limits forks)
  # RLIMIT_NPROC counts every process of the user: allow this many beyond those that
  # exist now (the parent counts all processes, a bound from above of the user's own;
  # Landlock keeps this process from reading /proc).
  _limit("RLIMIT_NPROC", CFG["nproc_base"] + CFG["processes"])

with open(CFG["program"], encoding="utf-8", errors="replace") as f:
  SOURCE = f.read()
os.write(1, f"{CFG['nonce']} R\n".encode())  # ready


def _hook(event, args, _refused=frozenset((
    "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
    "socket.sendto", "socket.sendmsg", "ctypes.dlopen", "ctypes.dlsym",
    "ctypes.call_function", "ctypes.cdata", "resource.setrlimit", "resource.prlimit",
    "os.setuid", "sys.remote_exec", "_posixsubprocess.fork_exec", "object.__delattr__")),
          _modules=frozenset((
              "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess",
              "multiprocessing", "_multiprocessing", "pty", "ssl", "_ssl", "asyncio",
              "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
              "_testmultiphase", "_testsinglephase", "_testbuffer")),
          _path_events=frozenset((
              "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
              "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
              "shutil.move", "shutil.copyfile", "sqlite3.connect")),
          _frozen=frozenset(("__code__", "__defaults__", "__kwdefaults__", "__globals__",
                             "__closure__", "__dict__", "__class__")),
          _write_flags=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
          _home=os.getcwd() + "/", _str=str, _bytes=bytes, _isinstance=isinstance,
          _any=any, _err=PermissionError):
  # Refuses, by raising, what a test program never needs. A second layer only: the
  # kernel's namespaces, uid, limits and seccomp filter (code_isolate.py) are the
  # boundary. Everything it reads is a default argument (replacing __defaults__ is an
  # audited event it refuses) or a constant: no global, no builtin, no module attribute
  # the program could rebind to switch it off.
  if event in _refused:
    raise _err(f"sandbox: {event} is not allowed")
  if event == "import":
    if args[0].partition(".")[0] in _modules:
      raise _err(f"sandbox: import {args[0]} is not allowed")
  elif event == "open":
    path, mode, flags = args
    if _isinstance(path, _bytes):
      path = path.decode("utf-8", "replace")
    if not _isinstance(path, _str):
      return  # an fd the process already holds
    parts = [p for p in path.split("/") if p not in ("", ".")]
    writes = (mode is not None and _any(c in mode for c in "wax+")) or (
        flags is not None and flags & _write_flags)
    if writes and (".." in parts or (path[:1] == "/" and not path.startswith(_home)
                                     and path != "/dev/null")):
      raise _err(f"sandbox: writing {path!r} is not allowed")
    if "proc" in parts and (".." in parts or parts[parts.index("proc") + 1:][:1] not in (
        ["self"], ["thread-self"])):
      raise _err(f"sandbox: reading {path!r} is not allowed")
  elif event in _path_events:
    for arg in args:
      if _isinstance(arg, _bytes):
        arg = arg.decode("utf-8", "replace")
      if _isinstance(arg, _str) and arg != ":memory:" and (
          ".." in arg.split("/") or (arg[:1] == "/" and not arg.startswith(_home))):
        raise _err(f"sandbox: {event} outside the sandbox directory")
  elif event == "object.__setattr__" and args[1] in _frozen:
    raise _err(f"sandbox: setting {args[1]} is not allowed")


if CFG["audit_hook"]:  # (off only in the tests of the kernel's layers alone)
  sys.addaudithook(_hook)
del _hook, _limit  # nothing left that the program should call
sys.argv = ["prog.py"]  # the program sees its own name only, not the mark's nonce


def _quit(code=None):
  raise SystemExit(code)


# -S skips site, which defines exit() and quit(); contest programs call them.
__builtins__.exit = __builtins__.quit = _quit

import io  # pylint: disable=g-import-not-at-top,wrong-import-position

_MARK = ("\n" + CFG["nonce"] + " ").encode()
_MODE = CFG["mode"]
_CODE = compile(SOURCE, "prog.py", "exec")
_STDOUT = sys.stdout


def _mark(index, kind, payload=""):
  """Ends case `index` on the real stdout: "\n<nonce> <index> <kind> <payload>\n"."""
  os.write(1, _MARK + f"{index} {kind} {payload}\n".encode())


def _print_exc():
  import traceback  # pylint: disable=g-import-not-at-top  (only on errors: it is slow to load)
  traceback.print_exc()


def _join_threads():
  # A program that runs main() on a thread (for a bigger stack) exits when it ends.
  threading = sys.modules.get("threading")
  if threading is not None:
    for thread in threading.enumerate():
      if thread is not threading.main_thread() and not thread.daemon:
        thread.join()


def _run_stdin_case(index, path):
  fd = os.open(path, os.O_RDONLY)
  os.dup2(fd, 0)
  os.close(fd)
  sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
  sys.stdout = _STDOUT
  kind = "ok"
  try:
    exec(_CODE, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    _join_threads()
  except SystemExit as e:
    kind = "ok" if e.code in (None, 0) else "error"
  except BaseException:  # pylint: disable=broad-except  (the program's error, reported)
    _print_exc()
    kind = "error"
  try:
    sys.stdout.flush()
  except BaseException:  # pylint: disable=broad-except  (a closed or replaced stdout)
    kind = "error"
  sys.stdout = _STDOUT
  _STDOUT.flush()
  _mark(index, kind)


def _run_function_cases(cases):
  import json as _json  # pylint: disable=g-import-not-at-top
  sys.stdout = io.StringIO()  # the program's prints go nowhere; only the marks reach fd 1
  namespace = {"__name__": "__main__", "__builtins__": __builtins__}
  exec(_CODE, namespace)  # noqa: S102  (sandboxed)
  solution = namespace.get("Solution")
  if isinstance(solution, type) and hasattr(solution, CFG["fn_name"]):
    fn = getattr(solution(), CFG["fn_name"])
  elif callable(namespace.get(CFG["fn_name"])):
    fn = namespace[CFG["fn_name"]]
  else:
    sys.stderr.write(f"no function {CFG['fn_name']!r}\n")
    sys.exit(3)
  for index, args in cases:
    try:
      result = fn(*args)
      payload = _json.dumps(result, default=repr)
      kind = "ok"
    except BaseException:  # pylint: disable=broad-except  (the program's error, reported)
      _print_exc()
      kind, payload = "error", ""
    sys.stdout.seek(0)
    sys.stdout.truncate()
    _mark(index, kind, payload)


if _MODE == "single":
  del CFG
  exec(_CODE, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
elif _MODE == "stdin":
  for _index in range(CFG["num_cases"]):
    _run_stdin_case(_index, f"in{_index}.txt")
elif _MODE == "function":
  import json  # pylint: disable=g-import-not-at-top
  with open(CFG["cases"], encoding="utf-8") as f:
    _run_function_cases(json.load(f))
# (the assertion-test modes, "serve" and "check": code_child_asserts.py, appended)
