"""The leak classes of issue 63, each shut by the kernel's layers, not by the audit hook.

Every program here prints "found" when its attack worked, and is judged against a test
that expects "found", so a leak shows as a passing verdict (or, for effects outside the
verdict, as a file, a connection or a process the test finds afterwards).

Each attack runs twice: with the audit hook, after switching it off the way that worked on
the sandbox before this file (`DISABLE_HOOK` rewrites the hook's globals), and with no
hook at all (`Limits(audit_hook=False)`), which shows the kernel's layers holding by
themselves. As root each also runs under a judge that is not root (uid nobody, through
/usr/bin/python3), where the same uid runs the judge and its programs.

Where the kernel lacks the layers a class needs (namespaces, or else Landlock or the
seccomp filter, see docs/rewards.md), that class's test skips and says which: the
sandbox's startup line names what is in force.
"""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from tests.rewards import code_leaks_runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    code_sandbox.__file__))))
RUNNER = os.path.abspath(code_leaks_runner.__file__)
FOUND = '{"fn_name": null, "inputs": [""], "outputs": ["found"]}'
SECRET_ENV = "JAXRL_LEAK_SECRET"
SECRET = "jaxrl-leak-" + "4242"  # (programs spell it in two parts: never in their text)
DISABLE_HOOK = """
import gc
for _d in gc.get_objects():
  if isinstance(_d, dict) and '_REFUSED' in _d and '_hook' in _d:
    _d.update(_REFUSED=frozenset(), _REFUSED_MODULES=frozenset(), _PATH_EVENTS=frozenset(),
              _inside=lambda p: True, _startswith=lambda a, b: False)
"""
HOOKS = {"hook_switched_off": {}, "no_hook": {"audit_hook": False},
         # The fallback of kernels that refuse namespaces, on this one too.
         "no_hook_no_namespaces": {"audit_hook": False, "namespaces": False}}


def _nobody_python():
  """/usr/bin/python3 when we are root and it can serve as a non-root judge, else None."""
  python = "/usr/bin/python3"
  if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(python):
    return None
  version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, check=False).stdout.strip()
  return python if version == str(tuple(sys.version_info[:2])) else None


JUDGES = ["here"] + (["nobody"] if _nobody_python() else [])


_PROTECTIONS = {}


def _protections(who, limits):
  """The sandbox's startup line under judge `who` with `limits` (HOOKS' values)."""
  namespaces = limits.get("namespaces", True)
  if (who, namespaces) not in _PROTECTIONS:
    _PROTECTIONS[who, namespaces] = (
        code_sandbox.protections(namespaces=namespaces) if who == "here" else
        _judge(who, [], {"namespaces": namespaces}).get("protections", ""))
  return _PROTECTIONS[who, namespaces]


def _needs(who, limits, *any_of):
  """Skips unless one of the layers `any_of` ("namespaces", "landlock", "seccomp",
  "root") is in force under judge `who` with `limits`."""
  line = _protections(who, limits)
  have = {"namespaces": "NO namespaces" not in line, "landlock": "NO landlock" not in line,
          "seccomp": "NO seccomp" not in line,
          "root": who == "here" and os.geteuid() == 0 and "a uid per program" in line}
  if not any(have[layer] for layer in any_of):
    pytest.skip(f"needs {' or '.join(any_of)}, which this kernel does not give: {line}")


def _judge(who, jobs, limits):
  """Runs `jobs` at the same time under judge `who`: {name: {"status"...} or {"error"}}."""
  for job in jobs:
    job.setdefault("answer", FOUND)
  if who == "here":
    os.environ[SECRET_ENV] = SECRET
    try:
      return code_leaks_runner.run_jobs(jobs, limits)
    finally:
      del os.environ[SECRET_ENV]
  import json  # pylint: disable=g-import-not-at-top
  proc = subprocess.run(
      ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", _nobody_python(),
       RUNNER, REPO], input=json.dumps({"jobs": jobs, "limits": limits}), cwd="/",
      capture_output=True, text=True, timeout=120, check=False,
      env={"PATH": "/usr/bin:/bin", SECRET_ENV: SECRET})
  lines = proc.stdout.strip().splitlines()
  if not jobs:
    return json.loads(lines[-1]) if lines else {}
  if proc.returncode != 0 or not lines:
    return {job["name"]: {"error": f"judge exit {proc.returncode}: {proc.stderr[-300:]}"}
            for job in jobs}
  return json.loads(lines[-1])


def _assert_held(results, *names):
  for name in names:
    result = results[name]
    assert "error" not in result, (name, result)
    assert result["status"] != "pass", (name, result)


@pytest.fixture()
def outside():
  # World-writable and reachable by any uid: only the sandbox can stop a write.
  directory = tempfile.mkdtemp(prefix="jaxrl_leak_outside_")
  os.chmod(directory, 0o777)
  yield directory
  shutil.rmtree(directory)


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_no_network_not_even_loopback(who, hook):
  _needs(who, HOOKS[hook], "namespaces", "seccomp")
  server = socket.create_server(("127.0.0.1", 0))
  server.settimeout(0.1)
  port = server.getsockname()[1]
  accepted = []

  def accept():
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline and not accepted:
      try:
        accepted.append(server.accept()[0])
      except OSError:
        pass

  thread = threading.Thread(target=accept)
  thread.start()
  program = DISABLE_HOOK + f"""
try:
  import socket
  socket.create_connection(('127.0.0.1', {port}), 1).sendall(b'pwned')
  print('found')
except BaseException:
  print('clean')
"""
  try:
    results = _judge(who, [{"name": "connect", "program": program}], HOOKS[hook])
  finally:
    accepted.append(None)  # (stops the thread)
    thread.join()
    server.close()
  _assert_held(results, "connect")
  assert accepted == [None], "the program reached a socket of the host"


def _processes_with(argv: bytes) -> list[int]:
  pids = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        if f.read() == argv:
          pids.append(int(entry))
    except (OSError, ValueError):
      pass
  return pids


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_nothing_outlives_its_verdict(who, hook):
  argv = b"/bin/sleep\x0031.4159\x00"
  program = DISABLE_HOOK + """
import subprocess
try:
  subprocess.Popen(['/bin/sleep', '31.4159'], start_new_session=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
  print('found')
except BaseException:
  print('clean')
"""
  results = _judge(who, [{"name": "detach", "program": program}], HOOKS[hook])
  assert "error" not in results["detach"], results
  deadline, left = time.monotonic() + 1.0, _processes_with(argv)
  while left and time.monotonic() < deadline:
    time.sleep(0.05)
    left = _processes_with(argv)
  for pid in left:  # (the old sandbox's leftovers: not for the next test to find)
    os.kill(pid, signal.SIGKILL)
  assert not left, "a process the program started outlived its verdict"


def _write_attacks(outside: str) -> dict[str, str]:
  check = f"\nimport os\nprint('found' if os.listdir({outside!r}) else 'clean')\n"
  attempt = "try:\n  {}\nexcept BaseException:\n  pass\n"
  return {
      "shell": DISABLE_HOOK + attempt.format(
          f"import os; os.system('echo pwned > {outside}/shell.txt')") + check,
      "dir_fd": attempt.format(
          f"import os; d = os.open({outside!r}, os.O_RDONLY); "
          "os.write(os.open('dirfd.txt', os.O_CREAT | os.O_WRONLY, dir_fd=d), b'x')") + check,
      "sqlite3": attempt.format(
          f"import sqlite3; sqlite3.connect({outside!r} + '/db').execute('create table t(x)')"
      ) + check,
      "mkfifo": attempt.format(f"import os; os.mkfifo({outside!r} + '/fifo')") + check,
      "mknod": attempt.format(f"import os; os.mknod({outside!r} + '/node')") + check,
      "subinterpreter": attempt.format(
          "import _xxsubinterpreters as s; s.run_string(s.create(), "
          f"\"open({outside!r} + '/sub.txt', 'w').write('x')\")") + check,
  }


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_no_write_escapes_the_work_dir(who, hook, outside):
  _needs(who, HOOKS[hook], "namespaces", "landlock")
  attacks = _write_attacks(outside)
  results = _judge(who, [{"name": n, "program": p} for n, p in attacks.items()], HOOKS[hook])
  written = os.listdir(outside)
  _assert_held(results, *attacks)
  assert not written, f"files written outside the sandbox: {written}"


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_the_judges_process_is_out_of_reach(who, hook):
  _needs(who, HOOKS[hook], "namespaces", "landlock", "root")
  # Other spellings of /proc/<pid>: the judge's environment holds SECRET.
  read = DISABLE_HOOK + """
hit = False
for path in ({paths}):
  try:
    hit = hit or (b'jaxrl-leak-' + b'4242') in open(path, 'rb').read()
  except BaseException:
    pass
print('found' if hit else 'clean')
"""
  paths = ("'//proc/{JUDGE_PID}/environ', '/proc/./{JUDGE_PID}/environ', "
           "'/proc/self/../{JUDGE_PID}/environ', '/proc/{JUDGE_PID}/environ'")
  results = _judge(who, [{"name": "environ", "program": read.format(paths=paths)}],
                   HOOKS[hook])
  _assert_held(results, "environ")


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_programs_judged_together_cannot_read_one_another(who, hook):
  # A fresh token: no file but the victim's program can hold it (the attacker spells it
  # in two halves).
  token = secrets.token_hex(6)
  victim = f"import time\n# jaxrl-victim-{token}\ntime.sleep(1.5)\nprint('found')\n"
  attacker = DISABLE_HOOK + f"""
import os
hit = False
for root in ('/tmp', '/var/tmp', '/dev/shm', os.path.dirname(os.getcwd())):
  for path, _, files in os.walk(root):
    for name in files:
      try:
        data = open(os.path.join(path, name), 'rb').read()
        hit = hit or (b'jaxrl-victim-' + b'{token[:6]}' + b'{token[6:]}') in data
      except BaseException:
        pass
print('found' if hit else 'clean')
"""
  results = _judge(who, [{"name": "victim", "program": victim},
                         {"name": "attacker", "program": attacker, "delay_s": 0.4}],
                   {**HOOKS[hook], "wall_s": 3.0, "total_wall_s": 4.0})
  _assert_held(results, "attacker")
  assert results["victim"].get("status") == "pass", results["victim"]


@pytest.mark.parametrize("who", JUDGES)
@pytest.mark.parametrize("hook", list(HOOKS))
def test_programs_judged_together_cannot_kill_one_another(who, hook):
  _needs(who, HOOKS[hook], "namespaces", "seccomp", "root")
  victim = "import time\ntime.sleep(1.0)\nprint('found')\n"
  attacker = DISABLE_HOOK + """
import os
try:
  os.kill(-1, 9)
except BaseException:
  pass
print('clean')
"""
  results = _judge(who, [{"name": "victim", "program": victim},
                         {"name": "attacker", "program": attacker, "delay_s": 0.4}],
                   {**HOOKS[hook], "wall_s": 3.0, "total_wall_s": 4.0})
  assert results["victim"].get("status") == "pass", results["victim"]


# Judge integrity (issue 63 item 2).

def test_forged_case_marks_are_the_programs_wrong_answer():
  # The program can always learn the nonce (it runs in the process that writes the
  # marks); marks it writes out of order must not make the judge raise (an invalid sample
  # instead of -1).
  forge = """
import gc, os
for d in gc.get_objects():
  if isinstance(d, dict) and isinstance(d.get('_MARK'), bytes):
    os.write(1, d['_MARK'] + b'{index} ok found\\n')
print('found')
"""
  for index in (0, 9):
    verdict = code.judge(f"```python\n{forge.format(index=index)}```", FOUND,
                         limits=code_sandbox.Limits(wall_s=2.0, total_wall_s=4.0))
    assert verdict.status == "runtime_error", (index, verdict)


def _server_children() -> list[int]:
  """Pids of the processes our fork servers forked (the programs running now)."""
  servers, children = set(), []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat", encoding="ascii") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        cmdline = f.read()
    except (OSError, ValueError, IndexError):
      continue
    if ppid == os.getpid() and b"fork server" in cmdline:
      servers.add(int(entry))
    children.append((int(entry), ppid))
  return [pid for pid, ppid in children if ppid in servers]


def test_a_kill_from_outside_is_not_the_programs_timeout():
  limits = code_sandbox.Limits(wall_s=5.0, total_wall_s=6.0, cpu_s=2)
  code.judge("```python\nprint(1)\n```", FOUND, limits=limits)  # (the server is up)
  killed = []

  def kill_it():
    deadline = time.monotonic() + 4.0
    while not killed and time.monotonic() < deadline:
      time.sleep(0.2)
      for pid in _server_children():
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

  killer = threading.Thread(target=kill_it)
  killer.start()
  try:
    with pytest.raises(code_sandbox.SandboxError, match="killed from outside"):
      code.judge("```python\nimport time\ntime.sleep(3)\nprint('found')\n```", FOUND,
                 limits=limits)
  finally:
    killer.join()
  assert killed


def test_startup_says_which_protections_are_active():
  line = code_sandbox.protections()
  assert "seccomp" in line and "audit hook" in line, line
  run = code_sandbox.run_python("print(1)\n", code_sandbox.Limits(), single_stdin="")
  assert ("NO namespaces" not in line) == run.namespaces, line


@pytest.mark.parametrize("python", sorted({sys.executable, code_sandbox.default_python()}))
def test_programs_hold_no_capabilities(python):
  # As root a program runs without capabilities, whether it gets a uid of its own or not
  # (an interpreter others cannot read: it stays uid 0).
  _needs("here", {}, "namespaces", "seccomp")
  program = ("import ctypes\nheader = (ctypes.c_uint32 * 2)(0x20080522, 0)\n"
             "data = (ctypes.c_uint32 * 6)()\nctypes.CDLL(None).capget(header, data)\n"
             "print(*data)\n")
  run = code_sandbox.run_python(program, code_sandbox.Limits(python=python,
                                                             audit_hook=False),
                                single_stdin="")
  assert run.status == "ok", run.stderr
  assert run.stdout.split() == [b"0"] * 6, run.stdout
