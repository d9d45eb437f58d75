"""Limits end episodes cleanly and are counted; the retry reward rule; the registry;
step never raises."""

import math
import time

import numpy as np
import pytest

from jaxrl_scale.envs import base, registry
from jaxrl_scale.envs import retry as retry_lib
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

TOK = tokenizer_lib.ByteTokenizer()
PROMPT = TOK.apply_chat_template("12+34=", tokenize=True)
RECORD = {"task": "arithmetic", "answer": "46"}


def _turn(text, index, reason=records.EOS):
  ids = TOK.encode(text) + ([TOK.EOS] if reason == records.EOS else [])
  return records.Turn(np.asarray(ids, np.int32), reason, index)


def _episode(name, limits=None, record=RECORD, **options):
  return registry.episode_maker(name, record, PROMPT, TOK, limits, **options)()


def _call(program):
  return f"Let me run it.<python>{program}</python>"


def test_registry_names_and_near_misses():
  assert {"python_tool", "retry"} <= set(registry.list_envs())
  with pytest.raises(UserError, match=r"unknown environment 'retyr'; did you mean 'retry'"):
    registry.get_env("retyr")
  with pytest.raises(UserError, match="environment 'retry'.*attemps"):
    registry.episode_maker("retry", RECORD, PROMPT, TOK, attemps=3)
  with pytest.raises(UserError, match="unknown reward"):
    registry.episode_maker("retry", {"task": "multiply", "answer": "4"}, PROMPT, TOK)
  with pytest.raises(ValueError, match="already registered"):
    registry.register_env("retry")(lambda ctx: None)
  with pytest.raises(UserError, match="max_turns"):
    base.Limits(max_turns=0)


def test_max_turns_ends_the_episode_and_is_counted():
  ep = _episode("python_tool", base.Limits(max_turns=2))
  assert not ep.step(_turn(_call("print(1)"), 0, records.STOP)).done
  end = ep.step(_turn(_call("print(2)"), 1, records.STOP))  # a call, but no turn left
  assert end.done and end.reward is None
  s = ep.summary()
  assert s["limit_turns"] == 1 and s["tool_calls"] == 1 and s["turns"] == 2


@pytest.mark.parametrize("room", [0, -1])
def test_environment_tokens_respect_max_tokens(room):
  probe = _episode("retry")
  first = _turn("45", 0)
  feedback = probe.step(first).tokens
  # Exactly room for the feedback and one more model token, or one token short.
  cap = len(first.tokens) + len(feedback) + 1 + room
  ep = _episode("retry", base.Limits(max_tokens=cap))
  step = ep.step(first)
  if room == 0:
    assert list(step.tokens) == list(feedback) and ep.summary()["limit_tokens"] == 0
  else:
    assert step.done and step.reward == -1.0 and step.correct is False
    assert ep.summary()["limit_tokens"] == 1 and ep.summary()["env_tokens"] == 0


def test_a_tool_call_past_its_time_limit_times_out_and_the_episode_goes_on():
  ep = _episode("python_tool", base.Limits(tool_call_s=0.5, tool_episode_s=5.0))
  start = time.monotonic()
  step = ep.step(_turn(_call("import time\ntime.sleep(30)\nprint('late')"), 0, records.STOP))
  assert time.monotonic() - start < 5.0
  assert not step.done and "timed out" in TOK.decode(step.tokens)
  assert "late" not in TOK.decode(step.tokens)
  s = ep.summary()
  assert s["tool_timeouts"] == 1 and s["tool_errors"] == 0 and 0.4 < s["tool_s"] < 5.0


def test_the_episodes_tool_time_is_spent_then_the_episode_ends():
  ep = _episode("python_tool", base.Limits(tool_call_s=0.5, tool_episode_s=0.8))
  sleep = _call("import time\ntime.sleep(30)")
  assert not ep.step(_turn(sleep, 0, records.STOP)).done  # 0.5 s
  assert not ep.step(_turn(sleep, 1, records.STOP)).done  # the 0.3 s left
  end = ep.step(_turn(sleep, 2, records.STOP))
  assert end.done and end.reward is None
  s = ep.summary()
  assert s["limit_tool_s"] == 1 and s["tool_calls"] == 2 and s["tool_timeouts"] == 2
  assert s["tool_s"] < 0.8 + 1.0  # the second call got only what was left


def test_long_tool_output_is_cut_and_an_error_is_counted():
  ep = _episode("python_tool", base.Limits(tool_output_chars=100))
  text = TOK.decode(ep.step(_turn(_call("print('x' * 5000)"), 0, records.STOP)).tokens)
  assert "x" * 100 in text and "x" * 101 not in text and "4900 more characters cut" in text
  flood = TOK.decode(ep.step(_turn(_call("print('y' * 10**6)"), 1, records.STOP)).tokens)
  assert "output cut" in flood and ep.summary()["tool_errors"] == 0  # killed at the cap
  err = TOK.decode(ep.step(_turn(_call("1 / 0"), 2, records.STOP)).tokens)
  assert err.rstrip().endswith("ZeroDivisionError: division by zero\n\nAssistant:")
  assert "more characters cut" in err and "bootstrap" not in err
  assert ep.summary()["tool_errors"] == 1


def test_a_turn_without_a_tool_call_is_the_answer():
  ep = _episode("python_tool")
  end = ep.step(_turn("The answer is 46.", 0))
  assert end.done and end.reward is None and ep.summary()["tool_calls"] == 0


@pytest.mark.parametrize("discount,second", [(0.5, 0.0), (1.0, 1.0), (0.25, -0.5)])
def test_retry_reward_rule(discount, second):
  ep = _episode("retry", discount=discount)
  assert ep.step(_turn("46", 0)) == records.EnvStep(done=True, reward=1.0, correct=True)
  ep = _episode("retry", discount=discount)
  feedback = ep.step(_turn("45", 0))
  assert TOK.decode(feedback.tokens) == f"\n\nUser: {retry_lib.FEEDBACK}\n\nAssistant:"
  assert ep.step(_turn("46", 1)) == records.EnvStep(done=True, reward=second, correct=True)


def test_retry_ends_with_the_last_verdict_when_attempts_run_out():
  ep = _episode("retry", attempts=3, feedback="No.", detail=True)
  assert "No.\n" in TOK.decode(ep.step(_turn("45", 0)).tokens)  # with the verdict's detail
  assert not ep.step(_turn("44", 1)).done
  assert ep.step(_turn("43", 2)) == records.EnvStep(done=True, reward=-1.0, correct=False)
  assert ep.summary()["turns"] == 3


def test_partial_credit_is_discounted_above_the_incorrect_reward():
  ep = _episode("retry", attempts=2)
  verdict = retry_lib.rewards.Verdict(False, "x", "wrong", score=0.5)
  assert ep.reward(verdict, 0) == 0.0 and ep.reward(verdict, 1) == -0.5


def test_step_never_raises():
  from jaxrl_scale.rewards import registry as rewards

  @rewards.register_reward("envs_test_raises")
  def raises(response, answer):
    raise RuntimeError("verifier broke")

  ep = _episode("retry", reward="envs_test_raises")
  end = ep.step(_turn("46", 0))
  assert end.done and math.isnan(end.reward) and ep.summary()["verify_errors"] == 1

  class Broken(base.EpisodeBase):
    def act(self, turn):
      raise KeyError("bug")

  ep = Broken(base.EnvContext(RECORD, PROMPT, TOK))
  end = ep.step(_turn("46", 0))
  assert end.done and math.isnan(end.reward) and ep.summary()["env_errors"] == 1
  # Bytes that are not UTF-8, specials, an unclosed call: all plain turns.
  garbage = records.Turn(np.asarray([255, 254, TOK.BOS, *TOK.encode("<python>"), 0]), "eos", 0)
  assert _episode("python_tool").step(garbage).done
  assert not _episode("retry").step(garbage).done  # wrong: feedback, a second attempt
