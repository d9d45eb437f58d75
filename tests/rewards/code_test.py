"""The code reward: program extraction, test layouts, comparison and verdicts."""

import math

import pytest

from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests
from jaxrl_scale.rewards import registry
from jaxrl_scale.rewards import scorer as scorer_lib

LIMITS = code_sandbox.Limits(wall_s=1.0, total_wall_s=3.0)
STDIN = code_tests.TestSpec(None, ["1 2\n", "3 4\n", "10 20\n"], ["3\n", "7", "30"]).to_json()
FUNC = code_tests.TestSpec("add", [[1, 2], [3, 4], [-5, 5]], [3, 7, 0]).to_json()


def _fence(program, tag="python"):
  return f"Let me think.\n```{tag}\n{program}```\nDone."


def _judge(program, answer, **kw):
  return code.judge(_fence(program), answer, limits=LIMITS, **kw)


# Extraction.


def test_extracts_the_last_python_block_after_the_reasoning():
  response = ("<think>```python\nprint('draft')\n```</think>\nFirst:\n```python\nprint(1)\n```"
              "\nBetter:\n```py\nprint(2)\n```\n```text\nnot code\n```")
  assert code.extract_program(response) == "print(2)\n"


def test_no_block_or_unclosed_fence_is_no_code():
  assert code.extract_program("print(1)") is None
  assert code.extract_program("```python\nprint(1)\n") is None
  assert code.extract_program("```cpp\nint main(){}\n```") is None
  assert code.extract_program("<think>```python\nprint(1)\n```</think> no code") is None
  # Cut off inside its reasoning: the draft there is no answer.
  assert code.extract_program("<think>First try:\n```python\nprint(1)\n```\nHmm") is None
  assert _judge("", STDIN).status == "no_code"


# The canonical tests.


@pytest.mark.parametrize("bad, message", [
    ("not json", "not valid JSON"),
    ("[]", "must be the canonical"),
    ('{"inputs": [], "outputs": []}', "no test cases"),
    ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
    ('{"inputs": [1], "outputs": ["1"]}', "need text inputs and outputs"),
    ('{"fn_name": "a b", "inputs": [[1]], "outputs": [1]}', "identifier fn_name"),
    ('{"fn_name": "f", "inputs": [1], "outputs": [1]}', "argument lists"),
])
def test_malformed_tests_raise_one_line_errors(bad, message):
  with pytest.raises(code_tests.TestFormatError, match=message):
    code_tests.parse_answer(bad)


# Comparison.


@pytest.mark.parametrize("got, want, equal", [
    ("3\n", "3", True),
    ("3  4 \n\n", "3 4\n", True),
    ("1\n2\n", "1 2", False),  # lines matter
    ("3.0000001", "3.0", True),
    ("3.01", "3.0", False),
    ("3.0", "3", False),  # an integer answer is exact
    ("03", "3", False),
    ("nan", "nan", True),
    ("inf", "1e308", False),
    ("", "0", False),
])
def test_stdout_comparison(got, want, equal):
  assert code_tests.stdout_equal(got, want) is equal


@pytest.mark.parametrize("got, want, wrapped, equal", [
    ("[0, 1]", [0, 1], False, True),
    ("[0, 1]", (0, 1), False, True),  # tuples are lists in JSON
    ("3", [3], True, True),  # APPS / TACO wrapping
    ("3", [3], False, False),
    ("[3]", [3], True, True),
    ("true", 1, False, False),  # bool is not int
    ("1.0000000001", 1.0, False, True),
    ("1.1", 1.0, False, False),
    ("2", 2.0, False, True),
    ("2.0", 2, False, False),
    ('{"a": 1}', {"a": 1}, False, True),
    ("not json", 1, False, False),
])
def test_result_comparison(got, want, wrapped, equal):
  assert code_tests.result_equal(got.encode(), want, wrapped) is equal


# Verdicts.


def test_stdin_verdicts():
  assert _judge("a, b = map(int, input().split())\nprint(a + b)\n", STDIN).status == "pass"
  wrong = _judge("a, b = map(int, input().split())\nprint(a + b if a < 5 else a * b)\n", STDIN)
  assert (wrong.status, wrong.passed, wrong.detail) == ("wrong", 2, "case 2: wrong")
  error = _judge("raise ValueError('boom')\n", STDIN)
  assert error.status == "runtime_error" and "ValueError: boom" in error.detail
  assert _judge("import time\ntime.sleep(30)\n", STDIN).status == "timeout"
  assert _judge("print(1/0 if False else\n", STDIN).status == "runtime_error"  # syntax


def test_stdin_program_styles_all_work():
  programs = [
      "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nsys.stdout.write(f'{a+b}')\n",
      "print(sum(map(int, open(0).read().split())))\n",
      "import sys\ninput = sys.stdin.readline\nprint(sum(map(int, input().split())))\n",
      ("def main():\n  print(sum(map(int, input().split())))\n"
       "if __name__ == '__main__':\n  main()\n"),
      ("import sys, threading\nsys.setrecursionlimit(10000)\nthreading.stack_size(1 << 26)\n"
       "def main():\n  print(sum(map(int, input().split())))\n"
       "threading.Thread(target=main).start()\n"),
      "import sys\nprint(sum(map(int, input().split())))\nsys.exit()\n",
      "import os\nprint(sum(map(int, input().split())), flush=True)\nos._exit(0)\n",
      "print(sum(map(int, input().split())))\nexit()\n",  # site's exit(), absent under -S
      "print(sum(map(int, input().split())))\nquit(0)\n",
      "import sys\nassert sys.argv == ['prog.py']\nprint(sum(map(int, input().split())))\n",
  ]
  for program in programs:
    verdict = _judge(program, STDIN)
    assert verdict.status == "pass", (program, verdict)


def test_state_does_not_leak_between_cases():
  # A module-level counter starts afresh for every case, as in separate processes.
  program = "count = globals().get('count', 0) + 1\na, b = map(int, input().split())\n" \
            "print(a + b if count == 1 else -1)\n"
  assert _judge(program, STDIN).status == "pass"


def test_nonzero_exit_after_right_output_is_a_runtime_error():
  program = "import sys\nprint(sum(map(int, input().split())))\nsys.exit(1)\n"
  assert _judge(program, STDIN).status == "runtime_error"


def test_function_verdicts():
  assert _judge("def add(a, b):\n  return a + b\n", FUNC).status == "pass"
  solution = "class Solution:\n  def add(self, a, b):\n    print('noise')\n    return a + b\n"
  assert _judge(solution, FUNC).status == "pass"
  wrong = _judge("def add(a, b):\n  return abs(a) + b\n", FUNC)
  assert (wrong.status, wrong.passed) == ("wrong", 2)
  missing = _judge("def plus(a, b):\n  return a + b\n", FUNC)
  assert missing.status == "runtime_error"
  assert _judge("def add(a, b):\n  while True: pass\n", FUNC).status == "timeout"
  assert _judge("def add(a, b):\n  return [a + b]\n", FUNC).status == "wrong"


def test_passed_fraction_runs_every_case():
  program = "a, b = map(int, input().split())\nprint(a + b if a != 3 else 0)\n"
  assert _judge(program, STDIN).passed == 1  # stops at the first failure
  verdict = _judge(program, STDIN, all_cases=True)
  assert (verdict.status, verdict.passed, verdict.total) == ("wrong", 2, 3)
  assert code.to_verdict(verdict, fraction=True).score == pytest.approx(2 / 3)


def test_registered_rewards_through_the_scorer():
  assert {"code", "code_fraction"} <= set(registry.list_rewards())
  good = _fence("a, b = map(int, input().split())\nprint(a + b)\n")
  partial = _fence("a, b = map(int, input().split())\nprint(a + b if a != 3 else 0)\n")
  with scorer_lib.Scorer("code", num_threads=2) as scorer:
    result = scorer.score([(good, STDIN), (partial, STDIN), ("no code", STDIN)])
  assert result.rewards == [1.0, -1.0, -1.0]
  assert result.counts["correct"] == 1 and result.counts["no_answer"] == 1
  with scorer_lib.Scorer("code_fraction", num_threads=2) as scorer:
    result = scorer.score([(good, STDIN), (partial, STDIN)])
  assert result.rewards == pytest.approx([1.0, -1.0 + 2 * 2 / 3])


def test_timeout_is_a_verdict_but_a_broken_sandbox_or_ground_truth_is_invalid():
  loop = _fence("while True:\n  pass\n")
  broken = code_sandbox.Limits(python="/nonexistent/python")

  def reward(response, answer):
    return code.to_verdict(code.judge(response, answer, limits=LIMITS))

  def broken_reward(response, answer):
    return code.to_verdict(code.judge(response, answer, limits=broken))

  with scorer_lib.Scorer(reward, num_threads=2) as scorer:
    result = scorer.score([(loop, STDIN), (loop, "not json")])
  assert result.rewards[0] == -1.0 and result.valid[0]
  assert math.isnan(result.rewards[1]) and not result.valid[1]
  assert isinstance(result.errors[1], code_tests.TestFormatError)
  with scorer_lib.Scorer(broken_reward, num_threads=1) as scorer:
    result = scorer.score([(loop, STDIN)])
  assert math.isnan(result.rewards[0]) and not result.valid[0]
  assert isinstance(result.errors[0], code_sandbox.SandboxError)


def test_bad_limits_are_one_line_errors():
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match="wall_s must be > 0"):
    code_sandbox.Limits(wall_s=0)
  with pytest.raises(UserError, match="cpu_s must be whole seconds"):
    code_sandbox.Limits(cpu_s=1.5)


def test_a_stopped_run_keeps_the_failing_cases_traceback():
  # The child writes a case's traceback to stderr, then its mark to stdout. When one poll
  # round reports stdout first, the stop must still read the stderr already written (the
  # verdict's detail names the error), not kill the child with it unread.
  import os  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  out_r, out_w = os.pipe()
  err_r, err_w = os.pipe()
  pidfd = os.pidfd_open(os.getpid())  # never readable: "the child" does not exit
  try:
    os.write(out_w, b"N0NCE R\n\nN0NCE 0 error \n")  # ready line, then case 0's mark
    os.write(err_w, b"Traceback (most recent call last):\nValueError: boom\n")
    child = types.SimpleNamespace(stdout=out_r, stderr=err_r, pidfd=pidfd)
    status, _, err, ready = code_sandbox._supervise(  # pylint: disable=protected-access
        child, b"N0NCE ", LIMITS, b"\nN0NCE ", 1, stop=lambda cases: True)
  finally:
    for fd in (out_r, out_w, err_r, err_w, pidfd):
      os.close(fd)
  assert (status, ready) == ("stopped", b"R")
  assert b"ValueError: boom" in err
