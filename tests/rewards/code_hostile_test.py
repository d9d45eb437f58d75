"""Hostile programs are inert: each ends within its limits, does not pass, and harms nothing.

All of them are scored in one batch by a Scorer with several worker threads, together
with correct programs that must still pass (the other workers survive); the test process
is the "training process" that must survive. Limits are small so the batch takes seconds.
"""

import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests
from jaxrl_scale.rewards import scorer as scorer_lib

LIMITS = code_sandbox.Limits(wall_s=1.0, total_wall_s=2.0, cpu_s=1, memory_mb=256,
                             output_bytes=1 << 20)
SYSTEM_PYTHON = "/usr/bin/python3"
# As root the child switches to a leased uid only with an interpreter others can read (a
# pyenv under /root cannot be); test both paths where both exist.
INTERPRETERS = [sys.executable]
if (os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)
    and code_sandbox._others_can_import(SYSTEM_PYTHON)  # pylint: disable=protected-access
    and not code_sandbox._others_can_import(sys.executable)):  # pylint: disable=protected-access
  INTERPRETERS.append(SYSTEM_PYTHON)
BOUND_S = 15.0  # generous: a hostile run ends at its 1-2 s limits; this only catches hangs
TESTS = code_tests.TestSpec(None, ["2 3\n", "10 20\n"], ["5", "30"]).to_json()
GOOD = "a, b = map(int, input().split())\nprint(a + b)\n"
SECRET = "jaxrl-hostile-secret-5f1c"


def _fence(program: str) -> str:
  return f"Reasoning first.\n```python\n{textwrap.dedent(program)}```\n"


def _hostile(outside: str) -> dict[str, str]:
  return {
      "fork_bomb": "import os\nwhile True:\n  os.fork()\n",
      "fork_bomb_subprocess": ("import subprocess, sys\nwhile True:\n"
                               "  subprocess.Popen([sys.executable, '-c', 'pass'])\n"),
      "fork_bomb_spawn": "import os\nwhile True:\n  os.posix_spawn('/bin/sh', ['sh'], {})\n",
      "thread_bomb": ("import threading, time\nwhile True:\n"
                      "  threading.Thread(target=time.sleep, args=(100,)).start()\n"),
      "infinite_loop": "while True:\n  pass\n",
      "sigxcpu_ignored": ("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                          "while True:\n  pass\n"),
      "memory_bomb": "blocks = []\nwhile True:\n  blocks.append(bytearray(1 << 24))\n",
      "memory_bomb_one": "x = bytearray(1 << 40)\n",
      "gigabyte_stdout": "import sys\nchunk = 'x' * (1 << 16)\nfor _ in range(1 << 14):\n"
                         "  sys.stdout.write(chunk)\n",
      "gigabyte_stderr": "import os\nchunk = b'x' * (1 << 16)\nfor _ in range(1 << 14):\n"
                         "  os.write(2, chunk)\n",
      "socket_connect": ("import socket\ns = socket.create_connection(('1.1.1.1', 80), 1)\n"
                         "print(5)\n"),
      "raw_socket_module": "import _socket\ns = _socket.socket()\ns.connect(('1.1.1.1', 80))\n",
      "write_outside": f"open({outside!r}, 'w').write('pwned')\n",
      "write_outside_os_open": (f"import os\nfd = os.open({outside!r}, os.O_WRONLY | os.O_CREAT)"
                                "\nos.write(fd, b'pwned')\n"),
      "write_via_dotdot": f"open('../../..' + {outside!r}, 'w').write('pwned')\n",
      "read_parent_environ": ("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())"
                              "\n"),
      "print_own_environ": f"import os\nassert {SECRET!r} in str(os.environ)\nprint(5)\n",
      "kill_parent_group": "import os, signal\nos.killpg(os.getpgid(os.getppid()), 9)\n",
      "kill_parent": "import os\nos.kill(os.getppid(), 9)\n",
      "ctypes_segfault": "import ctypes\nctypes.string_at(0)\n",
      "real_segfault": "import faulthandler\nfaulthandler._sigsegv()\n",
      "sleep_past_limit": "import time\ntime.sleep(100)\nprint(5)\n",
      "close_stdout_spin": "import os\nos.close(1)\nos.close(2)\nwhile True:\n  pass\n",
      "close_stdout_sleep": "import os, time\nos.close(1)\ntime.sleep(100)\n",
      "exit_zero_no_output": "import sys\nsys.exit(0)\n",
      "raise_limits": ("import resource\n"
                       "resource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\n"
                       "while True:\n  pass\n"),
      "rewrite_hook_code": ("import gc\nfor f in gc.get_objects():\n"
                            "  if getattr(f, '__name__', '') == '_hook':\n"
                            "    f.__code__ = (lambda e, a: None).__code__\n"
                            "import socket\n"),
  }


@pytest.fixture(scope="module")
def outside():
  # World-writable and reachable by nobody (pytest's tmp_path is under a 0700 directory),
  # so only the sandbox, not file permissions, can stop the write.
  directory = tempfile.mkdtemp(prefix="jaxrl_outside_")
  os.chmod(directory, 0o777)
  yield os.path.join(directory, "canary.txt")
  shutil.rmtree(directory)


@pytest.fixture(scope="module", params=INTERPRETERS,
                ids=lambda p: "this_python" if p == sys.executable else p)
def scored(outside, request):
  limits = dataclasses.replace(LIMITS, python=request.param)
  os.environ["JAXRL_HOSTILE_SECRET"] = SECRET
  programs = _hostile(outside)
  names = list(programs) + ["good_1", "good_2"]
  responses = [_fence(programs[n]) for n in programs] + [_fence(GOOD)] * 2
  timings = {}

  def reward(response, answer):
    start = time.monotonic()
    verdict = code.judge(response, answer, limits=limits)
    timings[response] = time.monotonic() - start
    return code.to_verdict(verdict)

  with scorer_lib.Scorer(reward, timeout_s=60.0, num_threads=8) as scorer:
    start = time.monotonic()
    result = scorer.score([(r, TESTS) for r in responses])
    batch_s = time.monotonic() - start
  del os.environ["JAXRL_HOSTILE_SECRET"]
  return dict(zip(names, zip(result.verdicts, result.rewards, result.errors))), {
      n: timings.get(r) for n, r in zip(names, responses)}, batch_s


@pytest.mark.parametrize("name", list(_hostile("/x")))
def test_hostile_program_is_inert(scored, outside, name):
  results, timings, _ = scored
  verdict, reward, error = results[name]
  assert error is None, f"{name}: the reward raised {error!r}"
  assert verdict is not None and not verdict.correct, f"{name}: {verdict}"
  assert reward == -1.0
  assert timings[name] < BOUND_S, f"{name} took {timings[name]:.1f}s"
  assert not os.path.exists(outside), f"{name}: a file appeared outside the sandbox"


def test_statuses_of_hostile_programs(scored):
  results, _, _ = scored
  status = {n: v.detail.split(":")[0] for n, (v, _, _) in results.items() if v is not None}
  for name in ("infinite_loop", "sleep_past_limit", "close_stdout_spin", "close_stdout_sleep",
               "sigxcpu_ignored"):
    assert status[name] == "timeout", (name, results[name][0].detail)
  for name in ("fork_bomb", "socket_connect", "write_outside", "read_parent_environ",
               "ctypes_segfault", "kill_parent", "raise_limits", "rewrite_hook_code",
               "thread_bomb"):
    assert status[name] == "runtime_error", (name, results[name][0].detail)
  # raise(SIGSEGV): as pid 1 of its own pid namespace a program cannot signal itself to
  # death (it continues, prints nothing: wrong); without namespaces it dies of it.
  assert status["real_segfault"] in ("runtime_error", "wrong")
  assert status["gigabyte_stdout"] == "wrong"
  # MemoryError, or the wall clock while a loaded host zero-fills 256 MB: never passing.
  assert status["memory_bomb"] in ("runtime_error", "timeout")


def test_other_workers_survive(scored):
  results, _, _ = scored
  for name in ("good_1", "good_2"):
    verdict, reward, _ = results[name]
    assert verdict.correct and reward == 1.0, verdict


def test_environment_is_scrubbed():
  os.environ["JAXRL_HOSTILE_SECRET"] = SECRET
  try:
    run = code_sandbox.run_python("import os\nprint(dict(os.environ))\n", LIMITS,
                                  single_stdin="")
  finally:
    del os.environ["JAXRL_HOSTILE_SECRET"]
  assert run.status == "ok"
  assert SECRET.encode() not in run.stdout
  assert b"PATH" in run.stdout


def test_temporary_directory_is_removed_and_writable():
  program = ("import os\nopen('scratch.txt', 'w').write('ok')\n"
             "print(os.getcwd(), open('scratch.txt').read())\n")
  run = code_sandbox.run_python(program, LIMITS, single_stdin="")
  assert run.status == "ok", run.stderr
  home, content = run.stdout.decode().split()
  assert content == "ok"
  assert not os.path.exists(home)


def test_killing_the_parent_group_spares_the_parent():
  # The judge runs in a child "training process": were the kill to land, it would die
  # before printing, instead of this test process.
  script = textwrap.dedent(f"""
      from jaxrl_scale.rewards import code, code_sandbox
      limits = code_sandbox.Limits(wall_s=1.0, total_wall_s=2.0)
      for program in ("import os\\nos.killpg(os.getpgid(os.getppid()), 9)\\n",
                      "import os, signal\\nos.kill(os.getppid(), signal.SIGTERM)\\n",
                      "import os\\nos.killpg(0, 9)\\n"):
        v = code.judge("```python\\n" + program + "```", {TESTS!r}, limits=limits)
        print(v.status)
      print("alive")
  """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split() == ["runtime_error", "runtime_error", "runtime_error", "alive"]


def test_parallel_batches_survive_a_crashing_neighbour():
  # Independent runs in parallel threads: the segfaulting ones do not disturb the others.
  crash = "import os\nos.abort()\n"
  programs = [GOOD, crash] * 4  # (ends by a fault even as pid 1)
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    verdicts = list(pool.map(lambda p: code.judge(_fence(p), TESTS, limits=LIMITS), programs))
  assert [v.status for v in verdicts] == ["pass", "runtime_error"] * 4


def test_root_leases_a_uid_by_default_where_it_can():
  run = code_sandbox.run_python("import os\nprint(os.getuid())\n", LIMITS, single_stdin="")
  if os.geteuid() != 0:
    assert run.uid is None
  elif (code_sandbox.default_python() == SYSTEM_PYTHON
        or code_sandbox._others_can_import(sys.executable)):  # pylint: disable=protected-access
    assert run.uid in code_sandbox.UID_POOL and run.stdout.split() == [str(run.uid).encode()]
