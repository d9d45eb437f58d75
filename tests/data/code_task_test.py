"""The built-in code task: deterministic, distinct, solvable, and its traps are real."""

import json

import pytest

from jaxrl_scale.data import code_task
from jaxrl_scale.data import tasks
from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import code
from jaxrl_scale.rewards import code_sandbox
from jaxrl_scale.rewards import code_tests

LIMITS = code_sandbox.Limits(wall_s=2.0, total_wall_s=4.0)


def test_deterministic_prefix_stable_and_distinct():
  records = tasks.generate("code", 300, seed=3)
  assert records == tasks.generate("code", 300, seed=3)
  assert records[:50] == tasks.generate("code", 50, seed=3)
  assert records != tasks.generate("code", 300, seed=4)
  assert len({r["prompt"] for r in records}) == 300
  assert len({r["id"] for r in records}) == 300
  for record in records:
    assert set(record) == set(tasks.RECORD_KEYS) and record["task"] == "code"
    spec = code_tests.parse_answer(record["answer"])
    assert spec.fn_name == "f" and len(spec.inputs) == 4
    assert min(args[0] for args in spec.inputs) < 0  # catches int(x/d) for floor(x/d)


def test_solutions_pass_and_traps_fail():
  by_template = {}
  for record in tasks.generate("code", 200, seed=0):
    notation = record["prompt"][len("f(x)="):-1]
    kind = ("square" if "^2" in notation else "mod" if "mod" in notation else
            "floor" if "floor" in notation else "abs" if "|" in notation else
            "max" if "max" in notation else "linear")
    by_template.setdefault(kind, record)
  assert set(by_template) == set(code_task.TEMPLATES)
  for record in by_template.values():
    assert code.judge(record["solution"], record["answer"], limits=LIMITS).status == "pass"
  # The notation copied literally into Python is wrong in exactly the trap templates.
  square, floor = by_template["square"], by_template["floor"]
  literal = square["solution"].replace("**", "^")
  assert code.judge(literal, square["answer"], limits=LIMITS).status == "wrong"
  d = floor["prompt"].split("/")[1].split(")")[0]
  truncating = f"```\nf=lambda x:int(x/{d})\n```"
  assert code.judge(truncating, floor["answer"], limits=LIMITS).status == "wrong"


def test_instruct_style_uses_stdin_tests():
  (record,) = tasks.generate("code", 1, seed=0, style="instruct")
  answer = json.loads(record["answer"])
  assert answer["fn_name"] is None and all(x.endswith("\n") for x in answer["inputs"])
  assert "```python" in record["prompt"]
  assert code.judge(record["solution"], record["answer"], limits=LIMITS).status == "pass"


def test_presets_and_errors():
  assert tasks.parse_task("code") == ("code", "fn", {})
  assert tasks.parse_task("code/io")[2] == {"style": "instruct"}
  assert tasks.reward_name("code") == "code"
  with pytest.raises(UserError, match="code.templates: must be a comma-separated subset"):
    tasks.generate("code", 1, templates="linear,cubic")
  with pytest.raises(UserError, match="code.num_tests: must be in"):
    tasks.generate("code", 1, num_tests=1)
  with pytest.raises(UserError, match="found only"):
    tasks.generate("code", 100, templates="square")
