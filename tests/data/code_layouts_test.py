"""Test-case layouts of code datasets -> the canonical tests JSON."""

import json

import pytest

from jaxrl_scale.data import code_layouts
from jaxrl_scale.rewards import code_tests


def _canonical(fn_name, inputs, outputs, wrapped=False):
  return {"fn_name": fn_name, "inputs": inputs, "outputs": outputs, "wrapped": wrapped}


def test_taco_layout_stdin_and_call_based():
  spec = code_layouts.normalize(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
  assert spec == _canonical(None, ["1 2\n"], ["3\n"])
  spec = code_layouts.normalize({"inputs": [[1, 2], 5], "outputs": [[3], [5]],
                                 "fn_name": "add"})
  assert spec == _canonical("add", [[1, 2], [5]], [[3], [5]], wrapped=True)
  lines = code_layouts.normalize({"inputs": [["1 2", "3"]], "outputs": [["3", "3"]]})
  assert lines == _canonical(None, ["1 2\n3"], ["3\n3"])


def test_livecodebench_layout_functional_inputs_are_json_lines():
  tests = [{"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"}]
  spec = code_layouts.normalize(json.dumps(tests), fn_name="twoSum")
  assert spec == _canonical("twoSum", [[[2, 7, 11, 15], 9]], [[0, 1]])
  stdin = [{"input": "5\n", "output": "25\n", "testtype": "stdin"}]
  assert code_layouts.normalize(stdin) == _canonical(None, ["5\n"], ["25\n"])


def test_primeintellect_and_codeforces_layouts():
  tests = [{"type": "function_call", "fn_name": "f", "input": [1, 2], "output": [3]}]
  assert code_layouts.normalize(tests) == _canonical("f", [[1, 2]], [[3]], wrapped=True)
  tests = [{"type": "stdin_stdout", "input": "1\n", "output": "1\n"}]
  assert code_layouts.normalize(tests)["fn_name"] is None
  assert code_layouts.normalize([{"input": "1", "output": "2"}]) == _canonical(None, ["1"],
                                                                               ["2"])


def test_canonical_output_is_what_the_reward_reads():
  tests = [{"input": "[1, 2]\n3", "output": "6", "testtype": "functional"}]
  spec = code_tests.parse_answer(json.dumps(code_layouts.normalize(tests, fn_name="f")))
  assert spec == code_tests.TestSpec("f", [[[1, 2], 3]], [6])


@pytest.mark.parametrize("bad, message", [
    ("not json", "not valid JSON"),
    ("[]", "no test cases"),
    ('{"inputs": ["1"], "outputs": []}', "1 inputs but 0 outputs"),
    ('[{"input": "1"}]', "test 0 is not an object with input and output"),
    ('[{"input": "1", "output": "1", "testtype": "weird"}]', "unknown test type"),
    ('[{"input": "[1]", "output": "1", "testtype": "functional"}]', "one function name"),
    ('[{"input": "1", "output": "1"}, {"input": "[1]", "output": "1", "type": '
     '"function_call", "fn_name": "f"}]', "mix stdin and function-call"),
    ('[{"input": "{oops", "output": "1", "testtype": "functional"}]', "JSON per line"),
    ("42", "unknown tests layout"),
])
def test_malformed_layouts_raise_one_line_errors(bad, message):
  with pytest.raises(code_layouts.LayoutError, match=message):
    code_layouts.normalize(bad, fn_name=None)
