"""Reward functions by name, so a config (or a research fork) picks or adds a verifier.

A reward function takes the untrusted model response and the record's ground-truth
answer and returns a `Verdict` (a bare bool is accepted too). It must not raise on any
response; if it does anyway, the `Scorer` counts an error and the sample gets no reward
(it is invalid: left out of its group's advantages, never scored as wrong) instead of
crashing the run.

  @registry.register_reward("yes_no")
  def yes_no(response: str, answer: str) -> bool:
    return response.strip().lower() == answer

A function that also takes a keyword `truncated` is told when the response hit its token
budget without ending, so it can refuse fallback answers from an unfinished text (the
built-ins accept only an explicit final answer then); one without it is called as above.

Built-in names: "math", "arithmetic", "countdown", "countdown_subset"
(jaxrl_scale/rewards/verifiers.py); "code", "code_fraction" (jaxrl_scale/rewards/code.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from collections.abc import Callable

from jaxrl_scale.errors import UserError

# Why a verdict is what it is; the Scorer counts each reason.
CORRECT = "correct"
WRONG = "wrong"  # an answer was found and parsed, and it is not the ground truth
NO_ANSWER = "no_answer"  # nothing that looks like a final answer
UNPARSEABLE = "unparseable"  # an answer was found but is not a value / expression we read
REASONS = (CORRECT, WRONG, NO_ANSWER, UNPARSEABLE)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What a verifier concluded about one response.

  Attributes:
    correct: whether the response earns the "correct" reward.
    extracted: the final answer as found in the response (None when there is none).
    reason: one of REASONS.
    detail: a short human-readable explanation (extraction method, what differed).
    score: optional partial credit in [0, 1] (e.g. the fraction of code tests passed);
      the Scorer then rewards incorrect + score * (correct - incorrect). None: all or
      nothing by `correct`.
  """
  correct: bool
  extracted: str | None
  reason: str
  detail: str = ""
  score: float | None = None

  def __post_init__(self):
    if self.reason not in REASONS:
      raise ValueError(f"Verdict.reason must be one of {REASONS}, got {self.reason!r}")
    if self.correct != (self.reason == CORRECT):
      raise ValueError(f"Verdict.correct={self.correct} contradicts reason={self.reason!r}")
    if self.score is not None and not 0.0 <= self.score <= 1.0:
      raise ValueError(f"Verdict.score must be in [0, 1], got {self.score}")


RewardFn = Callable[[str, str], "Verdict | bool"]

_REWARDS: dict[str, RewardFn] = {}
_BUILTINS_MODULE = "jaxrl_scale.rewards.verifiers"
_MORE_BUILTINS = ("jaxrl_scale.rewards.code",)  # "code", "code_fraction"


def _load_builtins() -> None:
  # Imported on first lookup, not at module import, because verifiers.py registers
  # itself through this module.
  importlib.import_module(_BUILTINS_MODULE)
  for module in _MORE_BUILTINS:
    importlib.import_module(module)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
  """Decorator registering `fn(response, answer) -> Verdict | bool` under `name`.

  Args:
    name: the name configs use; re-registering a name raises ValueError.

  Returns:
    The decorator, which returns the function unchanged.
  """
  if not name or not isinstance(name, str):
    raise ValueError(f"reward name must be a non-empty string, got {name!r}")

  def decorator(fn: RewardFn) -> RewardFn:
    if name in _REWARDS and _REWARDS[name] is not fn:
      raise ValueError(f"reward {name!r} is already registered")
    _REWARDS[name] = fn
    return fn

  return decorator


def get_reward(name: str) -> RewardFn:
  """The reward function registered as `name` (UserError naming the nearest names)."""
  _load_builtins()
  if name not in _REWARDS:
    near = difflib.get_close_matches(name, _REWARDS, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    raise UserError(f"unknown reward {name!r}{hint} (known: {', '.join(sorted(_REWARDS))})")
  return _REWARDS[name]


def list_rewards() -> list[str]:
  """All registered reward names, sorted."""
  _load_builtins()
  return sorted(_REWARDS)


def as_verdict(out: Verdict | bool) -> Verdict:
  """A reward function's return value as a Verdict (TypeError for anything else)."""
  if isinstance(out, Verdict):
    return out
  if isinstance(out, bool):
    return Verdict(out, None, CORRECT if out else WRONG)
  raise TypeError(f"a reward function must return a Verdict or bool, got {type(out).__name__}")


def takes_truncated(fn: RewardFn) -> bool:
  """Whether `fn` accepts the keyword `truncated` (see the module docstring)."""
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):  # some builtins and C callables have no signature
    return False
  param = params.get("truncated")
  if param is not None:
    return param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
  return any(p.kind == p.VAR_KEYWORD for p in params.values())
