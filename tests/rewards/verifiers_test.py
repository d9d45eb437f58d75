"""Built-in verifiers, including the record contract shared with jaxrl_scale/data/tasks.py."""

import json

import pytest

from jaxrl_scale.data import tasks
from jaxrl_scale.rewards import registry
from jaxrl_scale.rewards import verifiers

CD = json.dumps({"numbers": [3, 5, 2], "target": 16})


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
@pytest.mark.parametrize("style", ["compact", "instruct"])
def test_builtin_task_solutions_score_correct(task, style):
  records = tasks.generate(task, 40, seed=3, style=style)
  reward = registry.get_reward(tasks.reward_name(task))
  for record in records:
    verdict = reward(record["solution"], record["answer"])
    assert verdict.correct, (record, verdict)


def test_builtin_arithmetic_wrong_answers_score_incorrect():
  for record in tasks.generate("arithmetic", 40, seed=4, style="instruct"):
    wrong = str(int(record["answer"]) + 1)
    assert not verifiers.arithmetic_reward(f"\\boxed{{{wrong}}}", record["answer"]).correct


@pytest.mark.parametrize("response,answer,reason", [
    ("46", "46", "correct"),
    ("12+34=46", "46", "correct"),
    (r"The answer is \boxed{-7}.", "-7", "correct"),
    (r"\boxed{1,234}", "1234", "correct"),
    ("So it is 3 000.", "3000", "correct"),  # a spaced thousands group, not "000"
    ("<think>45?</think> 46", "46", "correct"),
    ("45", "46", "wrong"),
    (r"\boxed{12+34}", "46", "unparseable"),  # restating the question earns nothing
    (r"\boxed{46.5}", "46", "unparseable"),
    ("no idea", "46", "no_answer"),
    ("<think>46", "46", "no_answer"),
])
def test_arithmetic(response, answer, reason):
  verdict = verifiers.arithmetic_reward(response, answer)
  assert verdict.reason == reason and verdict.correct == (reason == "correct")


@pytest.mark.parametrize("response,reason", [
    ("(3+5)*2", "correct"),
    ("(3+5)*2 = 16", "correct"),
    ("16 = 2*(5+3)", "correct"),
    ("So the expression is (3+5)*2.", "correct"),
    (r"\boxed{(3+5) \times 2}", "correct"),
    ("<answer>2*(3+5)</answer>", "correct"),
    (r"\boxed{\frac{(3+5)\cdot 2}{1}}", "wrong"),  # 1 is not one of the numbers
    ("(3+5)*2*1", "wrong"),
    ("3*5+2-1", "wrong"),
    ("(5+3)*2+0", "wrong"),
    ("8*2", "wrong"),  # 8 is not one of the numbers
    ("3+5+2", "wrong"),  # uses each number, wrong value
    ("(3+5)*2*2", "wrong"),  # 2 used twice
    ("2^4", "unparseable"),
    ("(3+5)/0*2", "unparseable"),
    ("", "no_answer"),
])
def test_countdown(response, reason):
  verdict = verifiers.countdown_reward(response, CD)
  assert verdict.reason == reason, verdict
  assert verdict.correct == (reason == "correct")


def test_countdown_subset_allows_unused_numbers():
  answer = json.dumps({"numbers": [3, 5, 2], "target": 8})
  assert not verifiers.countdown_reward("3+5", answer).correct
  assert verifiers.countdown_subset_reward("3+5", answer).correct
  assert not verifiers.countdown_subset_reward("3+5+0", answer).correct
  assert not verifiers.countdown_subset_reward("5+5-2", answer).correct  # 5 twice


def test_countdown_exact_rational_arithmetic():
  answer = json.dumps({"numbers": [1, 3, 4, 6], "target": 24})
  assert verifiers.countdown_reward("6/(1-3/4)", answer).correct  # needs exact 1/4


@pytest.mark.parametrize("fn,answer", [
    (verifiers.arithmetic_reward, "4.5"),
    (verifiers.arithmetic_reward, ""),
    (verifiers.countdown_reward, "16"),
    (verifiers.countdown_reward, '{"numbers": [1, 2]}'),
    (verifiers.countdown_reward, '{"numbers": [1, true], "target": 3}'),
    (verifiers.countdown_reward, '{"numbers": "12", "target": 3}'),
])
def test_malformed_ground_truth_raises(fn, answer):
  with pytest.raises(verifiers.AnswerFormatError):
    fn("1", answer)


def test_math_verdict_reports_extraction():
  verdict = verifiers.math_reward(r"Thus \boxed{\dfrac{3}{4}}", "0.75")
  assert verdict.correct and verdict.extracted == r"\dfrac{3}{4}" and "boxed" in verdict.detail
  verdict = verifiers.math_reward("The answer is 7.", "8")
  assert verdict.reason == "wrong" and verdict.extracted == "7"


@pytest.mark.parametrize("fn, response, answer, correct", [
    (verifiers.math_reward, "5 + 7 = 12", "12", False),
    (verifiers.math_reward, r"so \boxed{12}, checking 5 + 7 = 1", "12", True),
    (verifiers.arithmetic_reward, "5 + 7 = 12", "12", False),
    (verifiers.arithmetic_reward, "the answer is 12", "12", False),
    (verifiers.countdown_reward, "(3+5)*2", CD, False),  # a last line may be a fragment
    (verifiers.countdown_reward, "<answer>(3+5)*2</answer> let me verify: 3+", CD, True),
    (verifiers.countdown_reward, r"\boxed{(3+5)*2} let me verify: 3+", CD, True),
])
def test_truncated_responses_earn_nothing_from_a_fallback(fn, response, answer, correct):
  verdict = fn(response, answer, truncated=True)
  assert verdict.correct is correct
  if not correct:
    assert verdict.reason == registry.NO_ANSWER and "truncated" in verdict.detail
  assert fn(response, answer).correct  # complete, the same text is correct


@pytest.mark.parametrize("response,reason", [
    (r"So $\boxed{12}$.", "correct"),
    ("The answer is 12.", "no_answer"),  # "math" takes it; "math_boxed" takes only boxes
    (r"$\boxed{12}$. The final answer is 13.", "correct"),
])
def test_math_boxed_takes_only_boxes(response, reason):
  assert registry.get_reward("math_boxed")(response, "12").reason == reason
  assert verifiers.math_reward("The answer is 12.", "12").correct


def test_math_rel_tol_is_configurable():
  assert verifiers.math_reward(r"\boxed{0.142857142857}", r"\frac17").correct
  assert not verifiers.math_reward(r"\boxed{0.142857142857}", r"\frac17", rel_tol=0).correct
  assert not verifiers.math_reward(r"\boxed{0.1429}", r"\frac17").correct
  assert verifiers.math_reward(r"\boxed{0.1429}", r"\frac17", rel_tol=1e-3).correct


def test_boxes_per_part_answer_a_gold_of_that_many_items():
  parts = "(a) First $\\boxed{12}$.\n\n(b) Then $\\boxed{5}$."
  assert verifiers.math_reward(parts, "(12, 5)").correct
  assert not verifiers.math_reward(parts, "(12, 5, 7)").correct
  assert not verifiers.math_reward(parts.replace("{5}", "{6}"), "(12, 5)").correct
  # A replaced attempt is not a part: only the last box answers.
  assert not verifiers.math_reward(r"So $\boxed{1}$. Hmm, no: it is $\boxed{2}$.", "1, 2").correct
