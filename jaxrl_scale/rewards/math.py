r"""Final-answer extraction and answer equivalence for math responses.

Extraction (`extract_answer`), on the text after the last </think> (a response that opens
<think> and never closes it has no answer: it was still thinking):
  1. the last top-level \boxed{...} (or \fbox{...}), braces balanced, \{ \} ignored;
  2. else the text after the last "answer is" / "answer:" up to the end of the line or
     sentence (a $...$ right after it is taken whole);
  3. else the last number in the text ("-1,234.5", "50%", "3/4").
Every step is linear in the response length, so a megabyte response costs milliseconds; an
answer longer than MAX_ANSWER_CHARS is treated as no answer.

Equivalence (`compare`), after `normalize` on both sides:
  - values are exact: 0.5 == 1/2 == \frac{1}{2} == \dfrac12; 2\sqrt{2} == \sqrt{8};
    \frac{\sqrt{2}}{2} == 1/\sqrt{2}; a decimal approximation of an irrational answer is
    NOT equal to it (1.414 != \sqrt{2}, 3.14 != \pi).
  - thousands separators: 1,000 == 1000 (a comma followed by exactly three digits).
  - units and words are dropped: 5\text{ cm} == 5 cm == 5; \$5 == 5 dollars == 5;
    90^\circ == 90; "x = 5" compares its right-hand side.
  - percentages: X% equals X% and, against a bare number Y, matches when Y == X or
    Y == X/100. So "50%" matches "50", "50%" and "0.5", but "0.5%" does not match "50%".
  - sequences: "(1, 2)" and "[1, 2]" compare in order with the same brackets; a bare
    list "1, 2" compares as a multiset ("2, 1" matches).
  - a ground truth that is not a number of this grammar (e.g. "\text{(B)}", "x^2+1")
    is compared as a whitespace-insensitive string.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from fractions import Fraction

from jaxrl_scale.rewards import safe_eval

MAX_ANSWER_CHARS = safe_eval.MAX_CHARS
MAX_ELEMENTS = 32  # items in a tuple/list answer

CORRECT, WRONG, UNPARSEABLE = "correct", "wrong", "unparseable"

# One pass over every brace; a box opening is a token of its own so nesting is tracked.
_BOX_SCAN_RE = re.compile(
    r"(?P<box>\\(?:boxed|fbox)(?![A-Za-z])\s*\{)"
    r"|\\(?:boxed|fbox)(?![A-Za-z])\s+(?P<tok>[^\s${}\\]+)"
    r"|(?P<esc>\\[{}])|(?P<open>\{)|(?P<close>\})")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is\b|:)\s*:?", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)")
_NUMBER_RE = re.compile(
    r"(?<![\w./])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?![\d/]|\.\d))?%?", re.ASCII)
_BOUNDARY_RE = re.compile(r"[^0-9.,/%]")
_THOUSANDS_RE = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?!,?\d)", re.ASCII)
_TEXT_MACRO_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname|emph)"
    r"\s*\{([^{}]*)\}")
_WORD_RE = re.compile(r"(?!(?:pi|sqrt|frac|infty|i|e)\b)[A-Za-z]+\.?", re.ASCII)
_UNIT_POWER_RE = re.compile(r"\^\{?\d\}?", re.ASCII)
# Units written flush against a number ("5cm"); an arbitrary letter there is a variable.
_GLUED_UNITS = ("cm", "mm", "km", "m", "kg", "mg", "g", "ml", "mL", "L", "s", "ms", "min",
                "h", "hr", "hrs", "ft", "in", "mi", "mph", "lb", "lbs", "oz", "sq")
_GLUED_UNIT_RE = re.compile(r"(\d)(?:" + "|".join(sorted(_GLUED_UNITS, key=len, reverse=True))
                            + r")(?:\^\{?\d\}?)?$", re.ASCII)
_SIZING_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])")
_DELETE = ("\\$", "$", r"\(", r"\)", r"\[", r"\]", r"\displaystyle", r"\!", r"\,", r"\;",
           r"\:", r"\ ", "~", "^\\circ", "^{\\circ}", r"\circ", r"\degree", "°")


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The answer found in a response.

  Attributes:
    text: the answer as written, or None when there is none.
    method: "boxed", "answer_is", "last_number"; or, with text None, "none",
      "too_long" (the candidate exceeded MAX_ANSWER_CHARS) or "unfinished_think".
  """
  text: str | None
  method: str


def strip_think(text: str) -> str | None:
  """The text after the last </think>; None when <think> is never closed."""
  end = text.rfind("</think>")
  if end >= 0:
    return text[end + len("</think>"):]
  if "<think>" in text:
    return None
  return text


def find_last_boxed(text: str) -> str | None:
  r"""Content of the \boxed{...} that closes last; None if none.

  The box closing last is never inside another closed box (that one would close later),
  so it is the last top-level box; inside an unclosed box it is the last complete one.
  """
  open_depths: list[int] = []  # brace depth just outside each open box
  last: tuple[int, int] | None = None  # (content start, content end) of the latest closed box
  starts: list[int] = []
  depth = 0
  # Braces before the first box cannot matter (depths are compared relative to a box).
  first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
  if first < 0:
    return None
  for m in _BOX_SCAN_RE.finditer(text, first):
    kind = m.lastgroup
    if kind == "box":
      open_depths.append(depth)
      starts.append(m.end())
      depth += 1
    elif kind == "tok":
      last = m.span("tok")
    elif kind == "open":
      depth += 1
    elif kind == "close":
      depth -= 1
      if open_depths and depth == open_depths[-1]:
        open_depths.pop()
        last = (starts.pop(), m.start())
  if last is None:
    return None
  return text[last[0]:last[1]]


def _last_answer_is(text: str) -> re.Match | None:
  # Backwards with str.rfind (C speed) rather than a regex scan of a whole megabyte.
  end = len(text)
  while True:
    i = max(text.rfind(word, 0, end) for word in ("answer", "Answer", "ANSWER"))
    if i < 0:
      return None
    match = _ANSWER_IS_RE.match(text, i)
    if match is not None:
      return match
    end = i


def _after_answer_is(text: str) -> str | None:
  match = _last_answer_is(text)
  if match is None:
    return None
  rest = text[match.end():match.end() + 4 * MAX_ANSWER_CHARS].lstrip(" \t*")
  line = rest.split("\n", 1)[0].strip()
  for open_, close in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
    if line.startswith(open_):
      end = line.find(close, len(open_))
      if end >= 0:
        return line[len(open_):end]
  end = _SENTENCE_END_RE.search(line)
  if end is not None:
    line = line[:end.start()]
  line = line.strip().strip("*").strip()
  return line or None


def _last_number(text: str) -> str | None:
  # Scan only a tail window, doubled until it holds a match. The window starts at a
  # character no number contains (a space, a letter...): the regex then splits the tail
  # exactly as it would split the whole text ("1,234,567" is never read from its middle).
  window = 256
  while True:
    lo = max(0, len(text) - window)
    if lo > 0:
      boundary = _BOUNDARY_RE.search(text, lo)
      lo = boundary.start() if boundary is not None else -1
    match = None
    if lo >= 0:
      for match in _NUMBER_RE.finditer(text, lo):
        pass
    if match is not None or window >= len(text):
      break
    window *= 2
  if match is None:
    return None
  start = match.start()
  # A minus sign counts when it is not the binary minus of "5-3".
  if start > 0 and text[start - 1] == "-" and (start == 1 or not text[start - 2].isalnum()):
    start -= 1
  return text[start:match.end()]


def extract_answer(response: str) -> Extraction:
  """Finds the final answer in an untrusted response (see the module docstring)."""
  text = strip_think(response)
  if text is None:
    return Extraction(None, "unfinished_think")
  for method, find in (("boxed", find_last_boxed), ("answer_is", _after_answer_is),
                       ("last_number", _last_number)):
    answer = find(text)
    if answer is not None and answer.strip():  # \boxed{} with nothing in it is no answer
      answer = answer.strip()
      if len(answer) > MAX_ANSWER_CHARS:
        return Extraction(None, "too_long")
      return Extraction(answer, method)
  return Extraction(None, "none")


def _strip_words(s: str) -> str:
  """Drops unit words around a number: "5 cm", "$12 dollars", "approximately 3"."""
  tokens = s.split()
  kept = list(tokens)
  while kept:
    if _WORD_RE.fullmatch(kept[-1]):
      kept.pop()
    elif len(kept) > 1 and _UNIT_POWER_RE.fullmatch(kept[-1]) and _WORD_RE.fullmatch(kept[-2]):
      del kept[-2:]
    else:
      break
  while kept and _WORD_RE.fullmatch(kept[0]):
    kept.pop(0)
  if kept and any(c.isdigit() for c in "".join(kept)):
    kept[-1] = _GLUED_UNIT_RE.sub(r"\1", kept[-1])
    return " ".join(kept)
  return " ".join(tokens)


def normalize(answer: str) -> str:
  """Canonical text of an answer: delimiters, spacing, text macros, units, separators."""
  s = answer.strip()
  for _ in range(3):  # \text{\textbf{5}}: a few levels of nesting
    s = _TEXT_MACRO_RE.sub(r" \1 ", s)
  s = _SIZING_RE.sub("", s.replace(r"\%", "%").replace("{,}", ","))
  for token in _DELETE:
    s = s.replace(token, " " if token.startswith("\\") and token[1:2].isalpha() else "")
  s = re.sub(r"\bpercent\b", "%", s)
  if "=" in s:
    rhs = s.rsplit("=", 1)[1]
    if rhs.strip():
      s = rhs
  s = _strip_words(s)
  s = _THOUSANDS_RE.sub(lambda m: m.group().replace(",", ""), s)
  return s.strip().rstrip(".").strip()


@dataclasses.dataclass(frozen=True)
class _Scalar:
  value: safe_eval.Value
  percent: bool


@dataclasses.dataclass(frozen=True)
class _Sequence:
  brackets: str  # "()" / "[]" / "(]" ... ordered; "" for a bare, unordered list
  items: tuple[_Scalar, ...]


def _split_top_level(s: str) -> list[str]:
  parts, depth, start = [], 0, 0
  for i, c in enumerate(s):
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    elif c == "," and depth == 0:
      parts.append(s[start:i])
      start = i + 1
  parts.append(s[start:])
  return parts


def _parse_scalar(s: str) -> _Scalar:
  s = s.strip()
  percent = s.endswith("%")
  return _Scalar(safe_eval.evaluate(s[:-1] if percent else s), percent)


def _parse(s: str) -> _Scalar | _Sequence:
  """A normalized answer as a value or sequence (safe_eval.EvalError when not one)."""
  brackets = ""
  inner = s
  if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
    candidate = _split_top_level(s[1:-1])
    if len(candidate) > 1:
      brackets, inner = s[0] + s[-1], s[1:-1]
  parts = _split_top_level(inner)
  if len(parts) == 1:
    return _parse_scalar(s)
  if len(parts) > MAX_ELEMENTS:
    raise safe_eval.BoundsError(f"more than {MAX_ELEMENTS} elements")
  return _Sequence(brackets, tuple(_parse_scalar(p) for p in parts))


def _scalar_equal(a: _Scalar, b: _Scalar) -> bool:
  if a.percent == b.percent:
    return safe_eval.equal(a.value, b.value)
  pct, plain = (a, b) if a.percent else (b, a)
  return (safe_eval.equal(plain.value, pct.value)
          or safe_eval.equal(plain.value, safe_eval.multiply(pct.value, Fraction(1, 100))))


def _multiset_equal(xs: Sequence[_Scalar], ys: Sequence[_Scalar]) -> bool:
  if len(xs) != len(ys):
    return False
  remaining = list(ys)
  for x in xs:
    for i, y in enumerate(remaining):
      if _scalar_equal(x, y):
        del remaining[i]
        break
    else:
      return False
  return not remaining


def _loose(s: str) -> str:
  s = re.sub(r"\s+", "", s).replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
  s = s.replace(r"\left", "").replace(r"\right", "")
  if len(s) == 3 and s[0] == "(" and s[2] == ")" and s[1].isalpha():  # "(B)" is "B"
    s = s[1]
  return s


def compare(predicted: str, gold: str) -> str:
  """CORRECT, WRONG or UNPARSEABLE (the prediction is not a value of the grammar).

  Args:
    predicted: the extracted answer (untrusted, at most MAX_ANSWER_CHARS characters).
    gold: the ground-truth answer.
  """
  if len(predicted) > MAX_ANSWER_CHARS:
    return UNPARSEABLE
  p_text, g_text = normalize(predicted), normalize(gold)
  if p_text and p_text == g_text:
    return CORRECT
  try:
    g = _parse(g_text)
  except safe_eval.EvalError:
    return CORRECT if _loose(p_text) == _loose(g_text) else WRONG
  try:
    p = _parse(p_text)
  except safe_eval.EvalError:
    return UNPARSEABLE
  if isinstance(g, _Scalar) or isinstance(p, _Scalar):
    same = isinstance(g, _Scalar) and isinstance(p, _Scalar) and _scalar_equal(p, g)
  elif g.brackets or p.brackets:
    same = (g.brackets == p.brackets and len(g.items) == len(p.items)
            and all(_scalar_equal(x, y) for x, y in zip(p.items, g.items)))
  else:
    same = _multiset_equal(p.items, g.items)
  return CORRECT if same else WRONG


def is_equivalent(predicted: str, gold: str) -> bool:
  """Whether the extracted answer `predicted` equals `gold` (module docstring rules)."""
  return compare(predicted, gold) == CORRECT
