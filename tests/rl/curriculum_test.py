"""No-Positive-Resampling: retirement rule, permanence, serialisation round trip."""

import json

import numpy as np
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import curriculum


def test_retires_at_threshold_after_min_samples():
  npr = curriculum.NoPositiveResampling(threshold=0.9, min_samples=8)
  # Prompt "a": 4/4 correct, but only 4 attempts: kept. Prompt 7: 3/4.
  assert npr.update(["a", 7], [[1, 1, 1, 1], [1, 1, 1, -1]]) == []
  assert npr.should_keep("a") and npr.should_keep(7)
  # Another group: "a" 7/8 = 0.875 < 0.9, kept; 7 at 7/8 too.
  assert npr.update(["a", 7], [[1, 1, 1, -1], [1, 1, 1, 1]]) == []
  # "a" reaches 11/12 = 0.917 >= 0.9 and retires; 7 reaches 10/12 and stays.
  assert npr.update(["a", 7], [[1, 1, 1, 1], [1, 1, -1, 1]]) == ["a"]
  assert not npr.should_keep("a") and npr.should_keep(7) and npr.should_keep("never seen")
  assert npr.filter(["a", 7, "b"]) == [7, "b"]
  assert npr.pass_rate("a") == pytest.approx(11 / 12)
  assert npr.pass_rate("b") is None


def test_exact_threshold_retires_and_nan_slots_are_not_counted():
  npr = curriculum.NoPositiveResampling(threshold=0.75, min_samples=4)
  assert npr.update([1], [[1, 1, 1, -1, np.nan]]) == ["1"]  # 3/4 = 0.75 >= 0.75
  assert npr.pass_rate(1) == 0.75


def test_retirement_is_permanent():
  npr = curriculum.NoPositiveResampling(threshold=0.9, min_samples=2)
  npr.update(["x"], [[1, 1]])
  assert not npr.should_keep("x")
  # Late in-flight rollouts of a retired prompt lower its rate but do not revive it.
  assert npr.update(["x"], [[-1, -1, -1, -1]]) == []
  assert npr.pass_rate("x") == pytest.approx(2 / 6)
  assert not npr.should_keep("x")
  assert npr.update(["x"], [[1] * 40]) == []  # 42/46 passes again: reported only once


def test_one_completion_per_prompt_and_zero_one_rewards():
  npr = curriculum.NoPositiveResampling(threshold=0.9, min_samples=2)
  npr.update([5, 6], [1.0, 0.0])
  npr.update([5, 6], [1.0, 1.0])
  assert not npr.should_keep(5) and npr.should_keep(6)


def test_stats():
  npr = curriculum.NoPositiveResampling(threshold=0.9, min_samples=2)
  assert npr.stats()["num_tracked"] == 0.0 and npr.stats()["frac_retired"] == 0.0
  npr.update([1, 2, 3, 4], [[1, 1], [1, -1], [-1, -1], [1, 1]])
  assert npr.stats() == {"num_tracked": 4.0, "num_retired": 2.0, "frac_retired": 0.5,
                         "history_pass_rate": 5 / 8}


def test_state_dict_json_round_trip():
  npr = curriculum.NoPositiveResampling(threshold=0.8, min_samples=3, success_threshold=0.5)
  npr.update([1, "b", 3], [[1, 1, 1], [1, 0, 1], [0.6, 0.4, 0.6]])
  text = json.dumps(npr.state_dict())
  back = curriculum.NoPositiveResampling.from_state_dict(json.loads(text))
  assert back.state_dict() == npr.state_dict()
  assert (back.threshold, back.min_samples, back.success_threshold) == (0.8, 3, 0.5)
  for pid in (1, "b", 3, "new"):
    assert back.should_keep(pid) == npr.should_keep(pid)
  assert not back.should_keep(1)  # int ids survive JSON's string keys
  # The restored object keeps counting from where it left off.
  back.update(["b"], [[1, 1, 1, 1, 1, 1, 1]])
  assert back.pass_rate("b") == pytest.approx(9 / 10) and not back.should_keep("b")


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s.update(version=2), "key 'version': expected 1, got 2"),
    (lambda s: s.pop("history"), "missing key 'history'"),
    (lambda s: s["history"].update(a=[3, 2]), r"key 'history.a': expected \[successes, attempts\]"),
    (lambda s: s["history"].update(a="x"), r"key 'history.a'"),
    (lambda s: s.update(retired="a"), "key 'retired': expected a list"),
    (lambda s: s.update(threshold=1.5),
     r"ckpt/curriculum.json: rl.npr_threshold: must be in \(0, 1\]"),
])
def test_malformed_state_is_a_user_error(mutate, match):
  npr = curriculum.NoPositiveResampling(min_samples=1)
  npr.update(["a"], [[1]])
  state = json.loads(json.dumps(npr.state_dict()))
  mutate(state)
  with pytest.raises(UserError, match=match):
    curriculum.NoPositiveResampling.from_state_dict(state, source="ckpt/curriculum.json")


def test_bad_arguments():
  with pytest.raises(UserError, match="rl.npr_min_samples"):
    curriculum.NoPositiveResampling(min_samples=0)
  npr = curriculum.NoPositiveResampling()
  with pytest.raises(ValueError, match="do not match 2 prompt ids"):
    npr.update([1, 2], [[1, 1, 1]])
