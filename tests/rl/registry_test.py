"""The name -> entry table behind every pluggable RL function."""

import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.rl import registry


def test_add_get_and_decorator():
  reg = registry.Registry("widget", "x.widget")
  reg.add("alpha", 1)

  @reg.decorator("beta")
  def beta():
    return 2

  assert reg.get("alpha") == 1 and reg.get("beta") is beta
  assert reg.names() == ["alpha", "beta"] and list(reg) == ["alpha", "beta"]
  assert "alpha" in reg and "gamma" not in reg


def test_unknown_name_is_one_line_user_error_with_suggestion():
  reg = registry.Registry("widget", "x.widget")
  reg.add("prompt_avg", 1)
  reg.add("token_avg", 2)
  with pytest.raises(UserError) as info:
    reg.get("promt_avg")
  msg = str(info.value)
  assert "\n" not in msg
  assert msg.startswith("x.widget: unknown widget 'promt_avg'; did you mean 'prompt_avg'")
  assert msg.endswith("known: prompt_avg, token_avg")
  with pytest.raises(UserError, match=r"unknown widget 'zzz'; known: prompt_avg, token_avg$"):
    reg.get("zzz")
  with pytest.raises(UserError):
    reg.get(None)


def test_duplicate_and_bad_names_are_programming_errors():
  reg = registry.Registry("widget", "x.widget")
  reg.add("a", 1)
  with pytest.raises(ValueError, match="already registered"):
    reg.add("a", 2)
  with pytest.raises(ValueError):
    reg.add("", 3)
