"""Reward functions by name."""

import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.rewards import registry


def test_builtins_are_registered():
  names = registry.list_rewards()
  for name in ("math", "arithmetic", "countdown", "countdown_subset"):
    assert name in names
    assert callable(registry.get_reward(name))


def test_unknown_name_suggests_the_nearest():
  with pytest.raises(UserError, match=r"unknown reward 'maths'; did you mean 'math'"):
    registry.get_reward("maths")
  with pytest.raises(UserError, match="known: arithmetic"):
    registry.get_reward("zzzzzz")


def test_register_custom_reward():
  @registry.register_reward("test_registry_yes")
  def yes(response: str, answer: str) -> bool:
    return response.strip() == answer

  assert registry.get_reward("test_registry_yes") is yes
  registry.register_reward("test_registry_yes")(yes)  # the same function again is harmless
  with pytest.raises(ValueError, match="already registered"):
    registry.register_reward("test_registry_yes")(lambda r, a: True)
  with pytest.raises(ValueError):
    registry.register_reward("")


def test_verdict_validation():
  assert registry.as_verdict(True) == registry.Verdict(True, None, "correct")
  assert registry.as_verdict(False).reason == "wrong"
  with pytest.raises(TypeError):
    registry.as_verdict(1.0)
  with pytest.raises(ValueError, match="contradicts"):
    registry.Verdict(True, "1", "wrong")
  with pytest.raises(ValueError, match="reason"):
    registry.Verdict(False, "1", "nope")
