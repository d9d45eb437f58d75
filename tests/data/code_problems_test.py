"""Code problems from local files, in the DeepCoder / LiveCodeBench / TACO layouts."""

import base64
import json
import pathlib
import pickle
import re
import zlib

import pytest

from jaxrl_scale.data import code_problems
from jaxrl_scale.data import sources
from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox

LIMITS = code_sandbox.Limits(wall_s=2.0, total_wall_s=4.0)
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"

DEEPCODER_LCB = {
    "problem": "Read two integers and print their sum.",
    "tests": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
                         {"input": "5 7\n", "output": "12\n", "testtype": "stdin"}]),
    "metadata": json.dumps({}),
}
DEEPCODER_TACO = {
    "problem": "Write add(a, b).",
    "tests": json.dumps({"inputs": [[1, 2], [3, 4]], "outputs": [[3], [7]], "fn_name": "add"}),
    "solutions": [ "def add(a, b):\n    return a + b"],
}
DEEPCODER_PRIME = {
    "problem": "Write add(a, b).",
    "tests": json.dumps([{"type": "function_call", "fn_name": "add", "input": [1, 2],
                          "output": [3]}]),
}


def _lcb_private(cases):
  return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LIVECODEBENCH = {
    "question_id": "lcb-1", "question_title": "Two sum",
    "question_content": "Return the indices of the two numbers adding up to target.",
    "starter_code": "class Solution:\n    def twoSum(self, nums, target):\n        ",
    "public_test_cases": json.dumps([{"input": "[2,7,11,15]\n9", "output": "[0, 1]",
                                      "testtype": "functional"}]),
    "private_test_cases": _lcb_private([{"input": "[3,2,4]\n6", "output": "[1, 2]",
                                         "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "twoSum"}),
}
TWO_SUM = ("class Solution:\n  def twoSum(self, nums, target):\n"
           "    seen = {}\n    for i, x in enumerate(nums):\n"
           "      if target - x in seen:\n        return [seen[target - x], i]\n"
           "      seen[x] = i\n")


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_layouts_become_records_the_reward_judges(tmp_path):
  path = _write(tmp_path / "code.jsonl",
                [DEEPCODER_LCB, DEEPCODER_TACO, DEEPCODER_PRIME, LIVECODEBENCH])
  lcb, taco, prime, live = code_problems.read_local(path)
  assert lcb["task"] == "code" and lcb["prompt"].endswith(code_problems.INSTRUCTION)
  assert code.judge(f"```python\n{ADD}```", lcb["answer"], limits=LIMITS).status == "pass"
  adder = "```python\ndef add(a, b):\n  return a + b\n```"
  assert code.judge(adder, taco["answer"], limits=LIMITS).status == "pass"
  assert code.judge(adder, prime["answer"], limits=LIMITS).status == "pass"
  assert taco["solution"] == "```python\ndef add(a, b):\n    return a + b\n```"
  assert live["id"] == "lcb-1" and "def twoSum" in live["prompt"]
  assert len(json.loads(live["answer"])["inputs"]) == 2  # public + decoded private
  verdict = code.judge(f"```python\n{TWO_SUM}```", live["answer"], limits=LIMITS)
  assert verdict.status == "pass" and verdict.total == 2


def test_parquet_reads_the_same(tmp_path):
  pq = pytest.importorskip("pyarrow.parquet")
  pa = pytest.importorskip("pyarrow")
  path = tmp_path / "code.parquet"
  pq.write_table(pa.Table.from_pylist([DEEPCODER_LCB]), str(path))
  jsonl = _write(tmp_path / "code.jsonl", [DEEPCODER_LCB])
  assert code_problems.read_local(str(path)) == code_problems.read_local(jsonl)


def test_a_pickle_with_code_is_refused(tmp_path):
  class Evil:
    def __reduce__(self):
      return (print, ("pwned",))
  row = dict(LIVECODEBENCH, private_test_cases=base64.b64encode(
      zlib.compress(pickle.dumps(Evil()))).decode())
  path = _write(tmp_path / "evil.jsonl", [row])
  with pytest.raises(UserError, match="neither JSON nor LiveCodeBench's compressed form"):
    code_problems.read_local(path)


@pytest.mark.parametrize("row, message", [
    ({"tests": "[]"}, "row 1: no problem text"),
    ({"problem": "x"}, "row 1: no tests"),
    ({"problem": "x", "tests": "[{\"input\": 1}]"}, "field 'tests': test 0 is not an object"),
    ({"problem": "x", "tests": "{oops"}, "field 'tests':"),
])
def test_bad_rows_are_one_line_errors(tmp_path, row, message):
  path = _write(tmp_path / "bad.jsonl", [row])
  with pytest.raises(UserError, match=message):
    code_problems.read_local(path)


def test_repeated_ids_and_wrong_task(tmp_path):
  path = _write(tmp_path / "dup.jsonl", [LIVECODEBENCH, LIVECODEBENCH])
  with pytest.raises(UserError, match="row 2 repeats id 'lcb-1' of row 1"):
    code_problems.read_local(path)
  with pytest.raises(UserError, match="not a code task"):
    code_problems.read_local(path, task="math")


class _Cfg:
  def __init__(self, source, task="code", data_dir=None):
    self.source, self.task, self.data_dir = source, task, data_dir
    self.prompt_field, self.answer_field, self.id_field = "prompt", "answer", None
    self.answer_format, self.solution_field = "raw", None
    self.num_train, self.num_validation, self.seed = 30, 5, 0


def test_load_records_reads_code_files_and_the_builtin_task(tmp_path):
  path = _write(tmp_path / "code.jsonl", [DEEPCODER_LCB, LIVECODEBENCH])
  records, origin = sources.load_records(_Cfg(path, task="code_fraction"))
  assert origin == path and [r["task"] for r in records] == ["code_fraction"] * 2
  records, _ = sources.load_records(_Cfg("code/io"))
  assert len(records) == 35 and records[0]["task"] == "code"


def test_tfds_builders_match_the_direct_reads(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  path = _write(tmp_path / "code.jsonl", [DEEPCODER_LCB, LIVECODEBENCH])
  data_dir = str(tmp_path / "tfds")
  direct, _ = sources.load_records(_Cfg(path))
  prepared, _ = sources.load_records(_Cfg(path, data_dir=data_dir))
  assert sorted(direct, key=str) == sorted(prepared[:], key=str)
  direct, _ = sources.load_records(_Cfg("code/easy"))
  prepared, _ = sources.load_records(_Cfg("code/easy", data_dir=data_dir))
  assert sorted(direct, key=str) == sorted(prepared[:], key=str)


def test_a_builtin_task_without_a_tfds_builder_is_a_one_line_error(tmp_path):
  with pytest.raises(UserError, match="data.data_dir: the built-in task 'multiply' has no TFDS"):
    sources.load_records(_Cfg("multiply/d3x1", task="multiply", data_dir=str(tmp_path)))


def test_the_records_docs_data_md_shows_are_read_and_judged(tmp_path):
  # docs/data.md opens with a code task's own records: they must stay what the reader takes.
  page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
  opening = "\n".join(page.splitlines()[:40])
  block = re.search(r"```text\n(.*?)```", opening, re.S).group(1)
  (tmp_path / "problems.jsonl").write_text(block)
  stdio, call = code_problems.read_local(str(tmp_path / "problems.jsonl"))
  assert code.judge(f"```python\n{ADD}```", stdio["answer"], limits=LIMITS).status == "pass"
  adder = "```python\ndef add(a, b):\n  return a + b\n```"
  assert code.judge(adder, call["answer"], limits=LIMITS).status == "pass"
  assert code.judge(adder.replace("+", "-"), call["answer"], limits=LIMITS).status == "wrong"
