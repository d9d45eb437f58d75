"""The sandbox's fork server: a forked child behaves as a fresh interpreter, and cheaply.

Every program runs under both backends (`Limits.fork_server` True and False); where a
fresh `python -I -S` is the reference, the forked child must end the same way.
"""

import dataclasses
import os
import signal
import sys

import pytest

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_forkserver
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests

LIMITS = code_sandbox.Limits(wall_s=2.0, total_wall_s=4.0)
FORKED = dataclasses.replace(LIMITS, fork_server=True)
FRESH = dataclasses.replace(LIMITS, fork_server=False)
FUNC = code_tests.TestSpec("f", [[-3], [0], [7]], [-8, 1, 15]).to_json()

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


def _last_line(text):
  lines = [line for line in text.strip().splitlines() if line.strip()]
  return lines[-1] if lines else ""


@pytest.mark.parametrize("name", list(ENDINGS))
def test_forked_child_ends_as_a_fresh_interpreter(name):
  fresh, forked = _run(ENDINGS[name], FRESH), _run(ENDINGS[name], FORKED)
  assert (forked.status, forked.returncode, forked.stdout) == (
      fresh.status, fresh.returncode, fresh.stdout), name
  assert _last_line(forked.stderr) == _last_line(fresh.stderr), name


@pytest.mark.parametrize("limits", [FORKED, FRESH], ids=["forked", "fresh"])
def test_child_holds_only_its_three_descriptors(limits):
  # The fork server's control socket (or any other fd of it) would let a program ask for
  # children of its own, outside its limits.
  run = _run("import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n",
             limits)
  assert run.status == "ok", run.stderr
  fds = eval(run.stdout)  # noqa: S307  (a list of ints printed by our own program)
  assert fds[:3] == [0, 1, 2] and len(fds) <= 4, fds  # (+ listdir's own fd)


@pytest.mark.parametrize("limits", [FORKED, FRESH], ids=["forked", "fresh"])
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
  server = code_forkserver.get(code_sandbox.default_python(), code_sandbox._BOOTSTRAP,  # pylint: disable=protected-access
                               code_sandbox._ENV)  # pylint: disable=protected-access
  os.kill(server._proc.pid, signal.SIGKILL)  # pylint: disable=protected-access
  server._proc.wait()  # pylint: disable=protected-access
  run = _run("print(2)\n", FORKED)
  assert (run.status, run.stdout) == ("ok", b"2\n")


def test_program_cannot_kill_the_server():
  run = _run("import os\nos.kill(os.getppid(), 9)\n", FORKED)
  assert run.status == "runtime_error"
  assert _run("print(3)\n", FORKED).stdout == b"3\n"


def test_verdicts_agree_between_backends():
  programs = ["f=lambda x:2*x+1", "f=lambda x:x^2", "def f(x):\n  return 2*x+1",
              "f=lambda x:1/0", "import time\nf=lambda x:time.sleep(9)", "f=3"]
  for program in programs:
    response = f"```\n{program}\n```"
    got = [code.judge(response, FUNC, limits=limits) for limits in (FORKED, FRESH)]
    assert got[0].status == got[1].status and got[0].passed == got[1].passed, (program, got)


def test_one_server_process_forks_every_child():
  # No interpreter start per program: every child's parent is the same idle server.
  parents = {_run("import os\nprint(os.getppid())\n", FORKED).stdout for _ in range(3)}
  server = code_forkserver.get(code_sandbox.default_python(), code_sandbox._BOOTSTRAP,  # pylint: disable=protected-access
                               code_sandbox._ENV)  # pylint: disable=protected-access
  assert parents == {f"{server._proc.pid}\n".encode()}  # pylint: disable=protected-access
  assert _run("import os\nprint(os.getppid())\n", FRESH).stdout == f"{os.getpid()}\n".encode()


def test_sys_executable_is_the_interpreter_that_serves():
  # The server is keyed by interpreter: Limits.python picks the one that runs programs.
  run = _run("import sys\nprint(sys.executable)\n",
             dataclasses.replace(FORKED, python=sys.executable))
  assert run.status == "ok"
  assert os.path.realpath(run.stdout.decode().strip()) == os.path.realpath(sys.executable)


def test_a_forked_copy_of_the_parent_starts_its_own_server():
  # The copy must neither share the parent's server socket nor kill the server at its exit.
  assert _run("print(1)\n", FORKED).status == "ok"
  server = code_forkserver.get(code_sandbox.default_python(), code_sandbox._BOOTSTRAP,  # pylint: disable=protected-access
                               code_sandbox._ENV)  # pylint: disable=protected-access
  before = server._proc.pid  # pylint: disable=protected-access
  pid = os.fork()
  if pid == 0:
    try:
      parent = _run("import os\nprint(os.getppid())\n", FORKED).stdout.strip()
      ok = parent.isdigit() and int(parent) != before  # a server of its own
      code_forkserver.close_all()
    finally:
      os._exit(0 if ok else 1)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0
  assert _run("print(3)\n", FORKED).stdout == b"3\n"
  assert server._proc.pid == before and server._proc.poll() is None  # pylint: disable=protected-access
