"""Assertion tests ({"test_code", "entry_point"}): HumanEval, MBPP and KodCode shapes,
judged with the program and the tests in two processes (rewards/code_asserts.py)."""

import json
import time

import pytest

from jaxrl_scale.data import code_layouts
from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests
from jaxrl_scale.rewards import registry
from tests.rewards import code_leaks_test as leaks

LIMITS = code_sandbox.Limits(wall_s=1.0, total_wall_s=3.0)
HUMANEVAL_TEST = '''
METADATA = {"author": "jt"}

def check(candidate):
    assert candidate([1.0, 2.0, 3.0], 0.5) == False
    assert candidate([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True
    assert candidate((1.0, 1.05), 0.1) is True
'''
HUMANEVAL = json.dumps({"test_code": HUMANEVAL_TEST, "entry_point": "has_close_elements"})
GOOD = '''
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold
               for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''


def _judge(program, answer=HUMANEVAL, limits=LIMITS):
  return code.judge(f"Reasoning.\n```python\n{program}\n```", answer, limits=limits)


def test_canonical_solution_passes_and_wrong_ones_fail():
  assert _judge(GOOD).status == "pass"
  assert _judge(GOOD).passed == 1
  wrong = _judge("def has_close_elements(numbers, threshold):\n    return False\n")
  assert (wrong.status, wrong.passed, wrong.total) == ("wrong", 0, 1)
  assert "AssertionError" in wrong.detail


@pytest.mark.parametrize("name,program,status", [
    ("always_equal", "class E:\n  def __eq__(self, other):\n    return True\n"
     "def has_close_elements(n, t):\n  return E()\n", "runtime_error"),
    ("bool_subclass", "class B(int):\n  def __eq__(self, other):\n    return True\n"
     "def has_close_elements(n, t):\n  return B(1)\n", "runtime_error"),
    ("exits_early", "import sys\nprint('All tests passed')\nsys.exit(0)\n", "runtime_error"),
    ("raises", "def has_close_elements(n, t):\n  raise ValueError('no')\n", "runtime_error"),
    ("spins", "def has_close_elements(n, t):\n  while True:\n    pass\n", "timeout"),
    ("no_function", "x = 1\n", "runtime_error"),
    ("patches_builtins", "import builtins\nbuiltins.AssertionError = type('N', (), {})\n"
     "def has_close_elements(n, t):\n  return None\n", "wrong"),
])
def test_programs_that_game_assertions_do_not_pass(name, program, status):
  verdict = _judge(program)
  assert verdict.status == status, (name, verdict)


def test_expected_values_never_reach_the_programs_process():
  # In a one-process harness (HumanEval's own) the check's constants sit in the program's
  # memory, reachable by gc; here they live in the tests' process only.
  answer = json.dumps({"test_code": "def check(candidate):\n"
                                    "    assert candidate() == 'jaxrl-expected-' + '77'\n",
                       "entry_point": "f"})
  program = '''
import gc, os, re
def f():
    wanted = 'jaxrl-expected-'
    for obj in gc.get_objects():
        for value in getattr(getattr(obj, '__code__', None), 'co_consts', ()) or ():
            if isinstance(value, str) and value.startswith(wanted) and value != wanted:
                return value
        if isinstance(obj, (list, dict, tuple)):
            for value in (obj.values() if isinstance(obj, dict) else obj):
                found = isinstance(value, str) and re.search(wanted + '[0-9]+', value)
                if found:
                    return found.group(0)
    for name in os.listdir('.'):
        found = re.search(wanted.encode() + b'[0-9]+', open(name, 'rb').read())
        if found:
            return found.group(0).decode()
    return 'nothing found'
'''
  verdict = _judge(program, answer)
  assert verdict.status == "wrong", verdict


def test_plain_data_keeps_its_type():
  answer = json.dumps({"test_code": "def check(candidate):\n"
                                    "    assert candidate() == (1, [2.5, None], {3: b'x'})\n"
                                    "    assert type(candidate()[0]) is int\n",
                       "entry_point": "f"})
  assert _judge("def f():\n  return (1, [2.5, None], {3: b'x'})\n", answer).status == "pass"
  assert _judge("def f():\n  return [1, [2.5, None], {3: b'x'}]\n", answer).status == "wrong"
  assert _judge("def f():\n  return (True, [2.5, None], {3: b'x'})\n", answer).status == "wrong"


def test_mbpp_asserts_and_kodcode_tests():
  mbpp = code_layouts.normalize_asserts({
      "text": "Remove first and last occurrence of a character.",
      "code": "def remove_Occ(s, ch):\n  return s",
      "test_list": ["assert remove_Occ('hello','l') == 'heo'",
                    "assert remove_Occ('abcda','a') == 'bcd'"]})
  assert mbpp["entry_point"] == "remove_Occ"
  good = ("def remove_Occ(s, ch):\n  i = s.find(ch)\n  if i < 0:\n    return s\n"
          "  s = s[:i] + s[i + 1:]\n  j = s.rfind(ch)\n  return s[:j] + s[j + 1:]\n")
  assert _judge(good, json.dumps(mbpp)).status == "pass"
  assert _judge("def remove_Occ(s, ch):\n  return s.replace(ch, '', 1)\n",
                json.dumps(mbpp)).status == "wrong"
  kodcode = code_layouts.normalize_asserts({
      "test": "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n\n"
              "def test_negative():\n    assert add(-1, 1) == 0\n",
      "test_info": [{"function_name": "add"}]})
  assert kodcode["entry_point"] == "add"
  assert _judge("def add(a, b):\n  return a + b\n", json.dumps(kodcode)).status == "pass"
  assert _judge("def add(a, b):\n  return a - b\n", json.dumps(kodcode)).status == "wrong"


def test_humaneval_layout_keeps_the_prompts_helpers():
  # HumanEval/32's check calls poly(), defined in the prompt: the tests' process has it.
  record = {"task_id": "HumanEval/32", "entry_point": "find_zero",
            "prompt": "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
                      "def find_zero(xs):\n    \"\"\"Finds x with poly(xs, x) == 0.\"\"\"\n",
            "test": "def check(candidate):\n    xs = [-6, 11, -6, 1]\n"
                    "    assert abs(poly(xs, candidate(list(xs)))) < 1e-4\n"}
  answer = json.dumps(code_layouts.normalize_asserts(record))
  newton = ("def find_zero(xs):\n  x = 0.5\n  for _ in range(100):\n"
            "    f = sum(c * x ** i for i, c in enumerate(xs))\n"
            "    d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)\n"
            "    x -= f / d\n  return x\n")
  assert _judge(newton, answer).status == "pass"
  assert _judge("def find_zero(xs):\n  return 0.0\n", answer).status == "wrong"


def test_bad_assertion_answers_are_one_line_format_errors():
  for answer, message in ((json.dumps({"test_code": "assert f(", "entry_point": "f"}),
                           "does not compile"),
                          (json.dumps({"test_code": "assert f(1)", "entry_point": "1f"}),
                           "identifier entry_point"),
                          (json.dumps({"test_code": "", "entry_point": "f"}), "non-empty")):
    with pytest.raises(code_tests.TestFormatError, match=message):
      code_tests.parse_answer(answer)
  with pytest.raises(code_layouts.LayoutError, match="no assertion tests"):
    code_layouts.normalize_asserts({"prompt": "x"})


def test_the_registered_reward_takes_the_assertion_form():
  verdict = registry.get_reward("code")(f"```python\n{GOOD}\n```", HUMANEVAL)
  assert verdict.correct


def test_the_response_total_bounds_many_slow_calls():
  # Each call within the case limit, all of them past the response's total: a timeout,
  # on time (after it, the scorer would give up and the sample would be invalid, not -1).
  answer = json.dumps({"test_code": "def check(candidate):\n"
                                    "    for _ in range(20):\n        assert candidate() == 1\n",
                       "entry_point": "f"})
  limits = code_sandbox.Limits(wall_s=1.0, total_wall_s=2.0, cpu_s=1)
  start = time.monotonic()
  verdict = _judge("import time\ndef f():\n  time.sleep(0.4)\n  return 1\n", answer, limits)
  elapsed = time.monotonic() - start
  assert verdict.status == "timeout", verdict
  assert "total" in verdict.detail
  assert elapsed < limits.total_wall_s + 1.0, elapsed


@pytest.mark.parametrize("who", leaks.JUDGES)
def test_assertion_tests_under_a_non_root_judge(who):
  # (As root, "nobody" runs the judge as uid nobody: user namespaces instead of uids.)
  bad = ("class E:\n  def __eq__(self, other):\n    return True\n"
         "def has_close_elements(n, t):\n  return E()\n")
  jobs = [{"name": "good", "program": GOOD, "answer": HUMANEVAL},
          {"name": "gamed", "program": bad, "answer": HUMANEVAL}]
  results = leaks._judge(who, jobs, {})  # pylint: disable=protected-access
  assert results["good"].get("status") == "pass", results
  assert results["gamed"].get("status") == "runtime_error", results
