r"""Built-in verifiers: "math", "math_boxed", "arithmetic", "countdown" and "countdown_subset".

Ground-truth formats follow the record contract in jaxrl_scale/data/tasks.py:
  math        any answer string ("72", "\frac{3}{4}", "50\%", "(1, 2)").
  arithmetic  an integer in plain decimal ("46", "-7").
  countdown   json.dumps({"numbers": [3, 5, 2], "target": 16}).
A malformed ground truth is the dataset's fault, not the model's: it raises
`AnswerFormatError`, which the Scorer counts as an error (the sample gets no reward).

Each takes `truncated` (the response hit its token budget without ending): then only an
explicit, delimited final answer counts (a closed \boxed{}, or countdown's <answer> tag),
never a fallback such as the last number or the last line (extract.py says why).
"""

from __future__ import annotations

import collections
import json
import re

from jaxrl_scale.rewards import math as math_answers
from jaxrl_scale.rewards import registry
from jaxrl_scale.rewards import safe_eval

_INTEGER_RE = re.compile(r"[+-]?\d+", re.ASCII)
_DIGITS_RE = re.compile(r"\d+", re.ASCII)
# What a bare countdown expression line may contain (the prose before it is trimmed off).
_EXPRESSION_CHARS = frozenset("0123456789+-*/()[] \t×÷·")


class AnswerFormatError(ValueError):
  """The ground-truth answer does not have the format its verifier expects."""


def _no_answer(method: str) -> registry.Verdict:
  if method == "truncated":
    return registry.Verdict(False, None, registry.NO_ANSWER,
                            "truncated by the token budget, no explicit final answer")
  return registry.Verdict(False, None, registry.NO_ANSWER, f"no final answer found ({method})")


@registry.register_reward("math")
def math_reward(response: str, answer: str, *, truncated: bool = False,
                boxed_only: bool = False,
                rel_tol: float = math_answers.DEFAULT_REL_TOL) -> registry.Verdict:
  r"""Final answer (\boxed{}, "the answer is", last math, last number) equivalent to `answer`.

  Compared by type (math.py): numbers, radicals, expressions with variables, equations,
  inequalities and intervals, sets, tuples, matrices, percentages, text. `boxed_only`: only
  a closed box is an answer ("math_boxed"); `rel_tol`: how close a decimal must be to an
  exact value it stands for (math.compare; 0 compares decimals exactly).
  """
  found = math_answers.extract_answer(response, truncated, boxed_only)
  if found.text is None:
    return _no_answer(found.method)
  outcome, judged = math_answers.compare_extraction(found, answer, rel_tol)
  # The parsed forms (math_answers.describe) cost a second parse: `jaxrl-scale reward`
  # shows them; training only needs the verdict.
  method = found.method if judged == found.text else f"{found.method} parts"
  return registry.Verdict(outcome == registry.CORRECT, judged, outcome, f"from {method}")


@registry.register_reward("math_boxed")
def math_boxed_reward(response: str, answer: str, *, truncated: bool = False
                      ) -> registry.Verdict:
  """Like "math", but only a closed \\boxed{} is a final answer (no prose fallbacks)."""
  return math_reward(response, answer, truncated=truncated, boxed_only=True)


@registry.register_reward("arithmetic")
def arithmetic_reward(response: str, answer: str, *, truncated: bool = False
                      ) -> registry.Verdict:
  """The final answer is a plain integer equal to `answer` (no expressions: "12*3" for
  36 would let a model restate the question instead of computing it)."""
  gold_text = answer.strip()
  if not _INTEGER_RE.fullmatch(gold_text):
    raise AnswerFormatError(f"arithmetic answer must be an integer, got {answer!r}")
  found = math_answers.extract_answer(response, truncated)
  if found.text is None:
    return _no_answer(found.method)
  text = math_answers.normalize(found.text)
  if not _INTEGER_RE.fullmatch(text):
    return registry.Verdict(False, found.text, registry.UNPARSEABLE,
                            f"from {found.method}: {text!r} is not an integer")
  value, gold = int(text), int(gold_text)
  detail = f"from {found.method}: {value} vs {gold}"
  reason = registry.CORRECT if value == gold else registry.WRONG
  return registry.Verdict(value == gold, found.text, reason, detail)


def parse_countdown_answer(answer: str) -> tuple[list[int], int]:
  """'{"numbers": [3, 5, 2], "target": 16}' -> ([3, 5, 2], 16)."""
  try:
    obj = json.loads(answer)
    numbers, target = obj["numbers"], obj["target"]
  except (json.JSONDecodeError, TypeError, KeyError):
    raise AnswerFormatError('countdown answer must be JSON {"numbers": [...], "target": N}, '
                            f"got {answer!r}") from None
  ints = [*numbers, target] if isinstance(numbers, list) else [None]
  if not all(isinstance(x, int) and not isinstance(x, bool) for x in ints):
    raise AnswerFormatError(f"countdown numbers and target must be integers, got {answer!r}")
  return numbers, target


def _countdown_candidate(text: str) -> tuple[str | None, str]:
  """The expression text: last \\boxed{}, else last <answer> tag, else last non-empty line."""
  boxed = math_answers.find_last_boxed(text)
  if boxed is not None:
    return boxed, "boxed"
  start = text.rfind("<answer>")
  if start >= 0:
    end = text.find("</answer>", start)
    if end >= 0:
      return text[start + len("<answer>"):end], "answer_tag"
  stripped = text.strip()
  if not stripped:
    return None, "none"
  return stripped.rsplit("\n", 1)[-1], "last_line"


def _expression_part(candidate: str) -> str:
  """Of "(3+5)*2 = 16" or "16 = (3+5)*2", the side with the most numbers."""
  parts = candidate.replace("$", "").strip().rstrip(".").split("=")
  return max(parts, key=lambda p: len(_DIGITS_RE.findall(p))).strip()


def _trailing_expression(line: str) -> str:
  """The longest suffix made of expression characters ("So: (3+5)*2" -> "(3+5)*2").

  Only at a word boundary (a space or ':' before it), so "2^4" does not become "4".
  """
  i = len(line)
  while i > 0 and line[i - 1] in _EXPRESSION_CHARS:
    i -= 1
  if 0 < i < len(line) and not (line[i].isspace() or line[i - 1] == ":"):
    return ""
  return line[i:].strip()


def _countdown(response: str, answer: str, exact_use: bool,
               truncated: bool) -> registry.Verdict:
  numbers, target = parse_countdown_answer(answer)
  text = math_answers.strip_think(response)
  if text is None:
    return _no_answer("unfinished_think")
  candidate, method = _countdown_candidate(text)
  if candidate is None:
    return _no_answer(method)
  if truncated and method == "last_line":  # the cut's last line: a fragment of reasoning
    return _no_answer("truncated")
  if len(candidate) > safe_eval.MAX_CHARS:
    return _no_answer("too_long")
  expression = _expression_part(candidate)
  try:
    value, literals = safe_eval.evaluate_with_literals(expression, safe_eval.COUNTDOWN)
  except safe_eval.EvalError as e:
    trimmed = _trailing_expression(expression) if method == "last_line" else ""
    if not trimmed or trimmed == expression:
      return registry.Verdict(False, expression, registry.UNPARSEABLE, f"from {method}: {e}")
    expression = trimmed
    try:
      value, literals = safe_eval.evaluate_with_literals(expression, safe_eval.COUNTDOWN)
    except safe_eval.EvalError as e2:
      return registry.Verdict(False, expression, registry.UNPARSEABLE, f"from {method}: {e2}")
  used = collections.Counter(int(x) for x in literals)
  given = collections.Counter(numbers)
  ok_numbers = used == given if exact_use else not used - given
  if not ok_numbers:
    rule = "each exactly once" if exact_use else "each at most once"
    return registry.Verdict(False, expression, registry.WRONG,
                            f"uses {sorted(used.elements())}, allowed {sorted(numbers)} ({rule})")
  if value != target:
    return registry.Verdict(False, expression, registry.WRONG,
                            f"evaluates to {value}, target {target}")
  return registry.Verdict(True, expression, registry.CORRECT, f"from {method}: = {target}")


@registry.register_reward("countdown")
def countdown_reward(response: str, answer: str, *, truncated: bool = False
                     ) -> registry.Verdict:
  """An expression over the numbers, each used exactly once, equal to the target.

  "Exactly once" is what the built-in countdown prompts ask for (jaxrl_scale/data/tasks.py)
  and what TinyZero's countdown verifier checks; "countdown_subset" allows leaving numbers out.
  """
  return _countdown(response, answer, exact_use=True, truncated=truncated)


@registry.register_reward("countdown_subset")
def countdown_subset_reward(response: str, answer: str, *, truncated: bool = False
                            ) -> registry.Verdict:
  """Like "countdown", but each number may be used at most once (a subset suffices)."""
  return _countdown(response, answer, exact_use=False, truncated=truncated)
