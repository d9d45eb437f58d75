"""The sandbox's fork server: a forked child behaves as a fresh interpreter, and cheaply.

The reference is the same interpreter started afresh on the program's file
(`python -I prog.py`, outside any sandbox): the forked child must end the same way.
"""

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_forkserver
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests

LIMITS = FORKED = code_sandbox.Limits(wall_s=2.0, total_wall_s=4.0)
FUNC = code_tests.TestSpec("f", [[-3], [0], [7]], [-5, 1, 15]).to_json()

# Programs whose end an interpreter defines: exit codes, tracebacks, threads, atexit, the
# flush of stdout at exit (120 when it fails), output left in the buffer.
ENDINGS = {
    "exit_3": "import sys\nprint('a')\nsys.exit(3)\n",
    "exit_message": "import sys\nsys.exit('bad input')\n",
    "exit_none": "print('x')\nexit()\n",
    "uncaught": "print('before')\nraise ValueError('boom')\n",
    "os_exit_after_flush": "import os\nprint(5, flush=True)\nos._exit(0)\n",
    "os_exit_unflushed": "import os\nprint(5)\nos._exit(7)\n",
    "no_newline": "import sys\nsys.stdout.write('tail')\n",
    "thread_after_main": ("import threading, time\n"
                          "def late():\n  time.sleep(0.2)\n  print('late')\n"
                          "threading.Thread(target=late).start()\nprint('main')\n"),
    "atexit": "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')\n",
    "closed_stdout_at_exit": "import os\nprint('lost')\nos.close(1)\n",
    "stdin_echo": "import sys\nprint(sys.stdin.read().upper())\n",
    "argv_and_name": "import sys\nprint(sys.argv, __name__)\n",
    "syntax_error": "print(1 +\n",
    "recursion": "def f(n):\n  return f(n + 1)\nf(0)\n",
    "keyboard_interrupt": "raise KeyboardInterrupt\n",
}


def _run(program, limits, stdin="some input\n"):
  return code_sandbox.run_python(program, limits, single_stdin=stdin)


def _fresh(program, stdin="some input\n"):
  """(returncode, stdout, stderr) of a fresh interpreter on prog.py."""
  with tempfile.TemporaryDirectory() as home:
    with open(os.path.join(home, "prog.py"), "w", encoding="utf-8") as f:
      f.write(program)
    proc = subprocess.run([code_sandbox.default_python(), "-I", "prog.py"], cwd=home,
                          input=stdin.encode(), capture_output=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
  return proc.returncode, proc.stdout, proc.stderr.decode()


def _server():
  return code_sandbox._server(code_sandbox.default_python())  # pylint: disable=protected-access


def _last_line(text):
  lines = [line for line in text.strip().splitlines() if line.strip()]
  return lines[-1] if lines else ""


@pytest.mark.parametrize("name", list(ENDINGS))
def test_forked_child_ends_as_a_fresh_interpreter(name):
  (code_, stdout, stderr), forked = _fresh(ENDINGS[name]), _run(ENDINGS[name], FORKED)
  if code_ < 0:  # a sandboxed program cannot kill itself with a signal (pid 1 of its
    code_ = 128 - code_  # namespace, or signals refused by seccomp): the shell's code
  assert (forked.returncode, forked.stdout) == (code_, stdout), name
  assert forked.status == ("ok" if code_ == 0 else "runtime_error"), name
  assert _last_line(forked.stderr) == _last_line(stderr), name


@pytest.mark.parametrize("limits", [FORKED], ids=["forked"])
def test_child_holds_only_its_three_descriptors(limits):
  # The fork server's control socket (or any other fd of it) would let a program ask for
  # children of its own, outside its limits.
  program = ("import os\ndef is_open(fd):\n  try:\n    os.fstat(fd)\n    return True\n"
             "  except OSError:\n    return False\n"
             "print(*[fd for fd in range(1024) if is_open(fd)])\n")
  run = _run(program, limits)
  assert run.status == "ok", run.stderr
  assert run.stdout.split() == [b"0", b"1", b"2"], run.stdout


@pytest.mark.parametrize("limits", [FORKED], ids=["forked"])
@pytest.mark.parametrize("module", ["socket", "_socket"])
def test_server_modules_are_refused_as_in_a_fresh_interpreter(limits, module):
  run = _run(f"import {module}\n", limits)
  assert run.status == "runtime_error"
  assert f"import {module} is not allowed" in run.stderr, run.stderr


def test_each_child_seeds_its_own_random():
  program = "import random\nprint(random.getrandbits(64))\n"
  draws = {_run(program, FORKED).stdout for _ in range(3)}
  assert len(draws) == 3, draws


def test_server_that_died_is_replaced():
  run = _run("print(1)\n", FORKED)
  assert run.status == "ok"
  server = _server()
  os.kill(server._proc.pid, signal.SIGKILL)  # pylint: disable=protected-access
  server._proc.wait()  # pylint: disable=protected-access
  run = _run("print(2)\n", FORKED)
  assert (run.status, run.stdout) == ("ok", b"2\n")


def test_program_cannot_kill_the_server():
  run = _run("import os\nos.kill(os.getppid(), 9)\n", FORKED)
  assert run.status == "runtime_error"
  assert _run("print(3)\n", FORKED).stdout == b"3\n"


def test_function_verdicts():
  programs = {"f=lambda x:2*x+1": ("pass", 3), "f=lambda x:x^2": ("wrong", 0),
              "def f(x):\n  return 2*x+1": ("pass", 3), "f=lambda x:1/0": ("runtime_error", 0),
              "import time\nf=lambda x:time.sleep(9)": ("timeout", 0),
              "f=3": ("runtime_error", 0)}
  for program, want in programs.items():
    got = code.judge(f"```\n{program}\n```", FUNC, limits=FORKED)
    assert (got.status, got.passed) == want, (program, got)


def test_one_server_process_forks_every_child():
  # No interpreter start per program: every child's parent is the same idle server (in
  # namespaces it has none it could name: its parent is outside its pid namespace).
  server = _server()
  parents = {_run("import os\nprint(os.getppid())\n", FORKED).stdout for _ in range(3)}
  want = 0 if server.namespaces else server._proc.pid  # pylint: disable=protected-access
  assert parents == {f"{want}\n".encode()}
  pid = server._proc.pid  # pylint: disable=protected-access
  for _ in range(3):
    _run("print(1)\n", FORKED)
  assert server._proc.pid == pid and server._proc.poll() is None  # pylint: disable=protected-access


def test_sys_executable_is_the_interpreter_that_serves():
  # The server is keyed by interpreter: Limits.python picks the one that runs programs.
  run = _run("import sys\nprint(sys.executable)\n",
             dataclasses.replace(FORKED, python=sys.executable))
  assert run.status == "ok"
  assert os.path.realpath(run.stdout.decode().strip()) == os.path.realpath(sys.executable)


def test_a_forked_copy_of_the_parent_starts_its_own_server():
  # The copy must neither share the parent's server socket nor kill the server at its exit.
  assert _run("print(1)\n", FORKED).status == "ok"
  server = _server()
  before = server._proc.pid  # pylint: disable=protected-access
  pid = os.fork()
  ok = False
  if pid == 0:
    try:
      ok = _run("print(2)\n", FORKED).stdout == b"2\n"
      mine = _server()._proc.pid  # pylint: disable=protected-access
      ok = ok and mine != before  # a server of its own
      code_forkserver.close_all()
    finally:
      os._exit(0 if ok else 1)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0
  assert _run("print(3)\n", FORKED).stdout == b"3\n"
  assert server._proc.pid == before  # pylint: disable=protected-access
  assert server._proc.poll() is None  # pylint: disable=protected-access


def test_a_forked_copy_leaves_the_parents_work_dirs_alone():
  # Its exit runs the atexit function that removes the parent's work root (registered
  # before the fork): the function must see it is not the owner; the copy makes its own.
  assert _run("print(1)\n", FORKED).status == "ok"
  root, parent = code_sandbox._work_root(), os.getpid()  # pylint: disable=protected-access
  pid = os.fork()
  if pid == 0:
    ok = False
    try:
      ok = _run("print(2)\n", FORKED).stdout == b"2\n"
      ok = ok and code_sandbox._work_root() != root  # pylint: disable=protected-access
      code_sandbox._remove_work_root(root, parent)  # pylint: disable=protected-access
      code_forkserver.close_all()
    finally:
      os._exit(0 if ok else 1)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0
  assert os.path.isdir(root)
  assert _run("print(3)\n", FORKED).stdout == b"3\n"
