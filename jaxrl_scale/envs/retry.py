"""The "retry" environment: the task's verifier judges each turn; a wrong answer gets
feedback and another attempt.

After each model turn the verifier (rewards/registry.py `get_reward`, the record's
answer) scores the turn's text. Correct, or no attempts left: the episode ends with the
verdict's reward. Wrong with attempts left: the feedback ("That is not correct; try
again.", and with `detail` the verdict's explanation, e.g. the failing test case) comes
back as a `role` message (default "user") and the policy tries again.

Reward rule: later attempts earn a discounted reward. A verdict with score s (1 for
correct, 0 for wrong, the fraction of tests for partial credit) on attempt k (0 first)
earns

  incorrect_reward + s * (correct_reward - incorrect_reward) * discount ** k

so a first-try solution earns correct_reward, a second-try one (discount 0.5, rewards
+-1) 0, and any solution more than a wrong answer: the policy learns to use the feedback
but is still paid most for needing none, which is what a single-turn evaluation measures.
discount=1 gives every attempt the full reward. A limit (turns, tokens) that stops the
episode before its attempts are spent ends it with the last verdict's reward. A verifier
that raises (a sandbox that failed to start: not the policy's doing) ends the episode
with reward NaN (no verdict), counted as verify_errors.
"""

from __future__ import annotations

import math
import time
from typing import Any

from jaxrl_scale.envs import base
from jaxrl_scale.envs import registry
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.rewards import registry as rewards

FEEDBACK = "That is not correct; try again."


class Retry(base.EpisodeBase):
  """One episode of the retry environment (see the module docstring and `retry`)."""

  def __init__(self, ctx: base.EnvContext, *, reward: str | None = None, attempts: int = 2,
               discount: float = 0.5, correct_reward: float = 1.0,
               incorrect_reward: float = -1.0, feedback: str = FEEDBACK,
               detail: bool = False, role: str = "user",
               template_kwargs: dict[str, Any] | None = None):
    super().__init__(ctx, template_kwargs)
    # The record's verifier name (the pipeline's records carry it), else its task's name.
    name = reward if reward is not None else str(ctx.record.get("reward")
                                                 or ctx.record.get("task", ""))
    self.verify = rewards.get_reward(name)
    self.truncated_kw = rewards.takes_truncated(self.verify)
    if "answer" not in ctx.record:
      raise UserError("environment 'retry': the record has no 'answer'")
    if attempts < 1 or not 0.0 <= discount <= 1.0:
      raise UserError(f"environment 'retry': attempts >= 1 and discount in [0, 1] "
                      f"(got {attempts}, {discount})")
    self.answer = ctx.record["answer"]
    self.attempts, self.discount = attempts, discount
    self.correct_reward, self.incorrect_reward = correct_reward, incorrect_reward
    self.feedback, self.detail, self.role = feedback, detail, role
    self.counts.update(verify_s=0.0, verify_errors=0.0)
    self.chat.check(role)

  def reward(self, verdict: rewards.Verdict, attempt: int) -> float:
    """The reward of `verdict` on attempt `attempt` (the module docstring's rule)."""
    score = 1.0 if verdict.correct else (verdict.score or 0.0)
    gain = (self.correct_reward - self.incorrect_reward) * score
    return self.incorrect_reward + gain * self.discount ** attempt

  def act(self, turn: records.Turn) -> records.EnvStep:
    text = self.text(turn)
    start = time.monotonic()
    try:
      kw = {"truncated": False} if self.truncated_kw else {}
      verdict = rewards.as_verdict(self.verify(text, self.answer, **kw))
    except Exception:  # noqa: BLE001 - not the policy's doing: no verdict
      self.counts["verify_errors"] += 1
      return self.end(math.nan, False)
    finally:
      self.counts["verify_s"] += time.monotonic() - start
    reward = self.reward(verdict, turn.index)
    if verdict.correct or turn.index + 1 >= self.attempts:
      return self.end(reward, verdict.correct)
    message = self.feedback
    if self.detail and verdict.detail:
      message = f"{message}\n{self.clip(verdict.detail)}"
    return self.reply(turn, [{"role": self.role, "content": message}], reward, False)


@registry.register_env("retry")
def retry(ctx: base.EnvContext, **options: Any) -> Retry:
  """The retry environment for math and code tasks.

  Args:
    ctx: the episode's context; its record has the answer.
    **options: reward (the verifier's name; default the record's 'reward', else its
      'task'), attempts
      (default 2), discount (0.5), correct_reward (1.0), incorrect_reward (-1.0),
      feedback (FEEDBACK), detail (False: add the verdict's explanation), role ("user"),
      template_kwargs.

  Returns:
    A new episode.
  """
  return Retry(ctx, **options)
