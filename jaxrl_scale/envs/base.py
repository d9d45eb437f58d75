"""What every environment shares: the episode's limits, its context and its counters.

An environment's episode subclasses `EpisodeBase` and implements `act(turn)`; the base
class counts turns and tokens, applies the limits when the environment wants to go on
(`reply`), renders its messages as a chat-template delta (chat.py) and turns anything
unexpected into the end of the episode, so `step` never raises.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_scale.envs import chat
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)

# Why an episode ended at a limit; summary() counts each as limit_<name> (0 or 1).
LIMIT_NAMES = ("turns", "tokens", "tool_s")


@dataclasses.dataclass(frozen=True)
class Limits:
  """Limits of one episode. Reaching one ends the episode cleanly (`EnvStep(done=True)`,
  the reward as the environment gives it at that point); `summary()` says which.

  Attributes:
    max_turns: model turns per episode (1: the single-turn case).
    max_tokens: tokens after the prompt, model and environment alike (what the
      sampler's max_new_tokens counts). Environment tokens that would leave no room for
      one more model token end the episode instead of being appended. None: only the
      sampler's budget (which truncates the episode instead of ending it cleanly).
    tool_call_s: wall-clock seconds one tool call may run.
    tool_episode_s: tool seconds per episode, summed over its calls; a call gets at most
      what is left, and none is made once it is spent.
    tool_output_chars: longer environment text (a tool's output) keeps its head and a
      note of how much was cut.
  """
  max_turns: int = 4
  max_tokens: int | None = None
  tool_call_s: float = 2.0
  tool_episode_s: float = 10.0
  tool_output_chars: int = 1024

  def __post_init__(self):
    for key in ("max_turns", "tool_call_s", "tool_episode_s", "tool_output_chars"):
      if not getattr(self, key) > 0:
        raise UserError(f"env limits: {key} must be > 0, got {getattr(self, key)}")
    if self.max_tokens is not None and self.max_tokens < 2:
      raise UserError(f"env limits: max_tokens must be >= 2 or None, got {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class EnvContext:
  """What an environment factory builds an episode from.

  Attributes:
    record: the task record (data/tasks.py: task, answer, ...; the prompt is already
      tokenized). Environments read what they need from it.
    prompt_tokens: the prompt's ids as the sampler gets them (chat template applied).
    tokenizer: the policy's tokenizer (models/tokenizer.py).
    limits: the episode's limits.
  """
  record: Mapping[str, Any]
  prompt_tokens: Sequence[int]
  tokenizer: tokenizer_lib.Tokenizer
  limits: Limits = Limits()


class EpisodeBase:
  """Bookkeeping of one episode (records.Episode); subclasses implement `act`.

  Args:
    ctx: the episode's context.
    template_kwargs: extra chat-template variables (e.g. enable_thinking=False).
  """

  def __init__(self, ctx: EnvContext, template_kwargs: Mapping[str, Any] | None = None):
    self.ctx = ctx
    self.limits = ctx.limits
    self.chat = chat.ChatDelta(ctx.tokenizer, template_kwargs=template_kwargs)
    self.used = 0  # tokens after the prompt so far (model and environment)
    self.counts: dict[str, float] = {
        "turns": 0.0, "env_tokens": 0.0, "tool_calls": 0.0, "tool_errors": 0.0,
        "tool_timeouts": 0.0, "tool_s": 0.0, "env_errors": 0.0,
        **{f"limit_{name}": 0.0 for name in LIMIT_NAMES}}

  def act(self, turn: records.Turn) -> records.EnvStep:
    """The environment's answer to one model turn (`reply` or `end`)."""
    raise NotImplementedError

  def step(self, turn: records.Turn) -> records.EnvStep:
    """records.Episode.step: counts the turn, then `act`. Never raises: anything
    unexpected ends the episode with reward NaN (no verdict), counted as env_errors."""
    self.counts["turns"] += 1
    self.used += len(turn.tokens)
    try:
      return self.act(turn)
    except Exception as e:  # noqa: BLE001 - the episode ends invalid, the run goes on
      log.warning("environment %s failed (episode ends, no verdict): %s: %s",
                  type(self).__name__, type(e).__name__, e)
      self.counts["env_errors"] += 1
      return records.EnvStep(done=True, reward=math.nan, correct=False)

  def summary(self) -> dict[str, float]:
    """records.Episode.summary: the counters so far."""
    return dict(self.counts)

  def text(self, turn: records.Turn) -> str:
    """The turn's text as verifiers and tool-call parsers see it (no special tokens)."""
    return self.ctx.tokenizer.decode(turn.tokens.tolist(), skip_special_tokens=True)

  def turns_left(self, turn: records.Turn) -> int:
    return self.limits.max_turns - (turn.index + 1)

  def end(self, reward: float | None = None, correct: bool | None = None, *,
          limit: str | None = None) -> records.EnvStep:
    """The end of the episode (reward None: the task's verifier scores the last turn)."""
    if limit is not None:
      self.counts[f"limit_{limit}"] = 1.0
    return records.EnvStep(done=True, reward=reward, correct=correct)

  def reply(self, turn: records.Turn, messages: Sequence[Mapping[str, Any]],
            reward: float | None = None, correct: bool | None = None) -> records.EnvStep:
    """Appends `messages` (rendered as a delta after `turn`, special-token strings in
    their content broken: `chat.ChatDelta.plain`) and lets the policy go on, unless a
    limit says no: then the episode ends with `reward` and `correct`."""
    if self.turns_left(turn) <= 0:
      return self.end(reward, correct, limit="turns")
    messages = [{**m, "content": self.chat.plain(m["content"])} for m in messages]
    ids = self.chat.delta(turn.tokens, messages)
    cap = self.limits.max_tokens
    if cap is not None and self.used + len(ids) + 1 > cap:
      return self.end(reward, correct, limit="tokens")
    self.used += len(ids)
    self.counts["env_tokens"] += len(ids)
    return records.EnvStep(tokens=ids)

  def clip(self, text: str, *, tail: bool = False) -> str:
    """`text` cut to Limits.tool_output_chars (`clip_text`)."""
    return clip_text(text, self.limits.tool_output_chars, tail=tail)


def clip_text(text: str, n: int, *, tail: bool = False) -> str:
  """`text` cut to `n` characters, its head (or with `tail` its end) and a note of how
  much was cut."""
  if len(text) <= n:
    return text
  note = f"[... {len(text) - n} more characters cut]"
  return f"{note}\n{text[-n:]}" if tail else f"{text[:n]}\n{note}"
