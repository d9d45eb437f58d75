"""The built-in multiply task: worked steps that are right, answers the arithmetic verifier
accepts from the solution, determinism, presets and one-line errors."""

import re

import pytest

from jaxrl_scale.data import multiply_task
from jaxrl_scale.data import records
from jaxrl_scale.data import tasks
from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import registry


def test_record_contract_and_reward():
  recs = tasks.generate("multiply", 20, 3)
  for r in recs:
    assert tuple(r) == tasks.RECORD_KEYS and all(isinstance(v, str) and v for v in r.values())
    assert r["task"] == "multiply" and tasks.reward_name(r["task"]) == "arithmetic"
  assert len({r["id"] for r in recs}) == len({r["prompt"] for r in recs}) == 20


def test_compact_steps_are_the_schoolbook_method():
  assert multiply_task.multiply(0) == []
  work = multiply_task.steps(347, 56)
  assert work == [("*", 347, 6, 2082), ("*", 347, 50, 17350), ("+", 2082, 17350, 19432)]
  assert multiply_task.steps(12, 7) == [("*", 12, 7, 84)]
  assert [v for op, _, _, v in multiply_task.steps(123, 405)] == [615, 0, 615, 49200, 49815]
  for r in tasks.multiply(200, 1, digits=3, multiplier_digits=2):
    a, b = map(int, re.fullmatch(r"(\d{3})\*(\d{2})=", r["prompt"]).groups())
    assert r["answer"] == str(a * b)
    for step in r["solution"].split(";"):  # every step's arithmetic is right
      x, op, y, v = re.fullmatch(r"(\d+)([*+])(\d+)=(\d+)", step).groups()
      assert int(v) == (int(x) * int(y) if op == "*" else int(x) + int(y))
    assert r["solution"].endswith(f"={a * b}") and len(r["solution"].split(";")) == 3


@pytest.mark.parametrize("style", ["compact", "instruct"])
def test_the_verifier_accepts_each_solution_and_rejects_a_wrong_digit(style):
  reward = registry.get_reward(tasks.reward_name("multiply"))
  for r in tasks.multiply(30, 2, digits=3, multiplier_digits=3, style=style):
    assert reward(r["solution"], r["answer"]).correct
    wrong = str(int(r["answer"]) + 1)
    assert not reward(r["solution"].replace(r["answer"], wrong), r["answer"]).correct
  if style == "instruct":
    assert r["prompt"].startswith("Compute ") and "\\boxed{}" in r["prompt"]
    assert records.last_boxed(r["solution"]) == r["answer"]


def test_deterministic_prefix_stable_and_seed_dependent():
  a = tasks.multiply(50, 7)
  assert a == tasks.multiply(50, 7) and a[:20] == tasks.multiply(20, 7)
  assert a != tasks.multiply(50, 8)


def test_presets():
  assert tasks.parse_task("multiply") == ("multiply", "d3x2",
                                          {"digits": 3, "multiplier_digits": 2})
  assert tasks.parse_task("multiply/d3x3")[2]["multiplier_digits"] == 3
  assert tasks.parse_task("multiply/d3x1")[2]["multiplier_digits"] == 1


@pytest.mark.parametrize("call,match", [
    (lambda: tasks.multiply(101, 0, digits=1, multiplier_digits=1),
     r"multiply.n: 101 distinct .* only 100 exist"),
    (lambda: tasks.multiply(5, 0, digits=0), r"multiply.digits"),
    (lambda: tasks.multiply(5, 0, multiplier_digits=7), r"multiply.multiplier_digits"),
    (lambda: tasks.multiply(5, 0, style="fancy"), r"multiply.style"),
    (lambda: tasks.generate("multiply", 3, digitz=3), r"multiply: .*digitz"),
    (lambda: tasks.parse_task("multiply/d9x9"), r"no preset 'd9x9'"),
])
def test_user_errors(call, match):
  with pytest.raises(UserError, match=match):
    call()
