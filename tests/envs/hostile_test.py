"""A hostile tool program is inert: its effect does not reach this (the parent) process,
and the episode goes on with the error counted (tests/rewards/code_hostile_test.py
covers the sandbox's own list; these go through the python_tool episode)."""

import os
import shutil
import socket
import tempfile
import time

import numpy as np
import pytest

from jaxrl_scale.envs import base, registry
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

TOK = tokenizer_lib.ByteTokenizer()
LIMITS = base.Limits(max_turns=8, tool_call_s=1.0, tool_episode_s=20.0)
SECRET = "jaxrl-envs-hostile-secret-8e2d"
BOUND_S = 10.0  # a hostile call ends at its 1 s limit; this only catches hangs


@pytest.fixture(scope="module")
def outside():
  # World-writable and world-readable, so only the sandbox (not file modes) stops a
  # program writing the canary or reading the secret file.
  directory = tempfile.mkdtemp(prefix="jaxrl_envs_outside_")
  os.chmod(directory, 0o777)
  secret = os.path.join(directory, "secret.txt")
  with open(secret, "w") as f:
    f.write(SECRET)
  os.chmod(secret, 0o644)
  yield directory
  shutil.rmtree(directory)


def _play(program, index=0, episode=None):
  """One tool call in an episode: (step, episode, decoded tool message, seconds)."""
  episode = episode or registry.episode_maker("python_tool", {}, [TOK.BOS], TOK, LIMITS)()
  ids = TOK.encode(f"<python>{program}</python>")
  start = time.monotonic()
  step = episode.step(records.Turn(np.asarray(ids, np.int32), records.STOP, index))
  seconds = time.monotonic() - start
  assert seconds < BOUND_S and not step.done  # the episode goes on
  return step, episode, TOK.decode(step.tokens), seconds


def _counts(episode):
  s = episode.summary()
  return s["tool_calls"], s["tool_errors"], s["tool_timeouts"]


def test_writing_outside_its_directory_fails(outside):
  canary = os.path.join(outside, "canary.txt")
  for i, program in enumerate((f"open({canary!r}, 'w').write('pwned')",
                               f"open('../../..' + {canary!r}, 'w').write('pwned')")):
    _, episode, text, _ = _play(program)
    assert _counts(episode) == (1, 1, 0), text
    assert not os.path.exists(canary), f"program {i} wrote outside the sandbox"


def test_environment_variables_and_files_of_the_parent_stay_hidden(outside, monkeypatch):
  monkeypatch.setenv("JAXRL_ENVS_SECRET", SECRET)
  _, episode, text, _ = _play("import os\nprint(dict(os.environ))")
  assert "PATH" in text and SECRET not in text and _counts(episode) == (1, 0, 0)
  for program in (f"print(open({os.path.join(outside, 'secret.txt')!r}).read())",
                  "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())"):
    _, episode, text, _ = _play(program)
    assert SECRET not in text and _counts(episode) == (1, 1, 0), text


def test_the_home_directory_is_not_the_parents():
  home = os.path.expanduser("~")
  mine = sorted(os.listdir(home))
  _, episode, text, _ = _play("import os\nprint(sorted(os.listdir(os.path.expanduser('~'))))")
  # Either there is no such directory in the sandbox's view, or it is not ours.
  assert _counts(episode)[1] == 1 or (mine and str(mine) not in text), text


def test_a_fork_bomb_ends_at_the_limit_and_the_tool_still_works():
  step, episode, text, _ = _play("import os\nwhile True:\n  os.fork()")
  calls, errors, timeouts = _counts(episode)
  assert calls == 1 and errors + timeouts == 1, text
  _, _, text, _ = _play("print(6 * 7)", index=1, episode=episode)
  assert text == "\n\nTool: 42\n\nAssistant:"


def test_sleeping_past_the_limit_times_out():
  _, episode, text, seconds = _play("import time\ntime.sleep(60)\nprint('woke')")
  assert _counts(episode) == (1, 0, 1) and "woke" not in text and seconds < 3.0


def test_a_network_socket_reaches_nothing():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.setblocking(False)
  port = server.getsockname()[1]
  try:
    _, episode, text, _ = _play(
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), 1)\n"
        "s.sendall(b'pwned')\nprint('connected')")
    assert "connected" not in text and _counts(episode) == (1, 1, 0), text
    with pytest.raises(BlockingIOError):
      server.accept()  # no connection ever arrived at the parent's socket
  finally:
    server.close()
