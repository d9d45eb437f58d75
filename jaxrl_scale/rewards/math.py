r"""Math answers: extraction (extract.py), typed parsing (answer_parse.py) and equivalence.

  found = extract_answer(response)          # Extraction(text, method)
  compare(found.text, gold)                 # CORRECT / WRONG / UNPARSEABLE
  describe(found.text)                      # ("interval", "[0, 7)") for diagnostics

`compare` parses both answers into typed trees with our own bounded parser (no eval, no
sympy parsing of model text) and compares them by type (answer_compare.py): numbers exact,
radicals and constants to 32 significant digits, expressions with variables at generic
points, equations up to a nonzero factor, inequalities and intervals as sets of reals, sets
unordered, tuples and intervals in order, matrices entrywise, percentages, text.
A gold answer outside the grammar is compared as a whitespace-insensitive string; a
prediction outside it (or a constant without a value such as 1/0) is UNPARSEABLE.
`normalize` is the older textual canonicalisation the "arithmetic" verifier uses.
"""

from __future__ import annotations

import re
from fractions import Fraction

from jaxrl_scale.rewards import answer_compare
from jaxrl_scale.rewards import answer_eval
from jaxrl_scale.rewards import answer_parse
from jaxrl_scale.rewards import answer_tokens
from jaxrl_scale.rewards.extract import (  # noqa: F401  re-exported: the module's public API
    MAX_ANSWER_CHARS,
    Extraction,
    extract_answer,
    find_last_boxed,
    strip_think,
)

CORRECT, WRONG, UNPARSEABLE = "correct", "wrong", "unparseable"
DEFAULT_REL_TOL = 1e-4  # a decimal against an exact value (compare)
_DECIMAL_COMMA_RE = re.compile(r"[$\s]*(-?\d+),(\d+)[$\s.]*", re.ASCII)
_DECIMAL_RE = re.compile(r"(?<![\d.])\d*\.(\d+)(?:[eE]([-+]?\d{1,3}))?", re.ASCII)
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
    # Spacing commands become a space: "10\,00" must not read as 1000 ("1\,000" still does).
    spacing = token.startswith("\\") and (token[1:2].isalpha() or token[1:2] in ",;: ")
    s = s.replace(token, " " if spacing or token == "~" else "")
  s = re.sub(r"\bpercent\b", "%", s)
  if "=" in s:
    rhs = s.rsplit("=", 1)[1]
    if rhs.strip():
      s = rhs
  s = _strip_words(s)
  s = _THOUSANDS_RE.sub(lambda m: m.group().replace(",", ""), s)
  s = answer_tokens.join_digit_groups(s)  # "3 000" (arithmetic's integers too)
  return s.strip().rstrip(".").strip()


def _loose(s: str) -> str:
  s = re.sub(r"\s+", "", s).replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
  s = s.replace(r"\left", "").replace(r"\right", "").replace("$", "").rstrip(".")
  if len(s) == 3 and s[0] == "(" and s[2] == ")" and s[1].isalpha():  # "(B)" is "B"
    s = s[1]
  return s.lower()


def parse(answer: str) -> tuple | None:
  """The typed tree of an answer, or None when it is outside the grammar."""
  try:
    return answer_parse.parse(answer)
  except answer_parse.ParseError:
    return None


def _parse_prediction(predicted: str, gold: tuple) -> tuple | None:
  tree = parse(predicted)
  units_dropped = None
  if "=" not in predicted and (tree is None or (
      answer_compare.free_symbols(tree) and not answer_compare.free_symbols(gold))):
    units_dropped = parse(normalize(predicted))  # "5 m", "5 meters squared"
  if units_dropped is not None and not answer_compare.free_symbols(units_dropped):
    return units_dropped
  return tree


def _decimal_comma(text: str) -> str | None:
  """ "2500,75" -> "2500.75" when the text is one number with a decimal comma, else None."""
  m = _DECIMAL_COMMA_RE.fullmatch(text)
  return None if m is None else f"{m.group(1)}.{m.group(2)}"


def _decimal_places(text: str) -> int | None:
  """Digits after the point of the most precise decimal literal in `text`; None if none."""
  places = None
  for m in _DECIMAL_RE.finditer(text):
    k = len(m.group(1)) - int(m.group(2) or 0)
    places = k if places is None else max(places, k)
  return places


def _reads_as_value(tree: tuple) -> bool:
  return answer_compare.kind_of(tree) in ("number", "expression", "percentage")


def compare(predicted: str, gold: str, rel_tol: float = DEFAULT_REL_TOL) -> str:
  """CORRECT, WRONG or UNPARSEABLE (the prediction is not an answer of the grammar).

  Args:
    predicted: the extracted answer (untrusted, at most MAX_ANSWER_CHARS characters).
    gold: the ground-truth answer.
    rel_tol: how far a decimal may be from an exact value it stands for, relative to it
      (answer_eval.close: it must also be a correct rounding at its own last digit); 0
      compares decimals exactly.
  """
  if len(predicted) > MAX_ANSWER_CHARS:
    return UNPARSEABLE
  gold = _unbox_gold(gold)
  g = parse(gold)
  if g is None:
    return CORRECT if _loose(normalize(predicted)) == _loose(normalize(gold)) else WRONG
  p = _parse_prediction(predicted, g)
  # A decimal comma is told from a list by the other side: "2500,75" against one number is
  # 2500.75; against a list or a pair it stays two items (math-verify reads bare numbers
  # the same way; "1,234" with a group of three is a thousands separator before this).
  if p is not None and p[0] == "list" and _reads_as_value(g):
    comma = _decimal_comma(predicted.strip())
    if comma is not None:
      predicted, p = comma, parse(comma)
  elif p is not None and g[0] == "list" and _reads_as_value(p):
    comma = _decimal_comma(gold.strip())
    if comma is not None:
      gold, g = comma, parse(comma)
  if p is None:
    return UNPARSEABLE
  if g[0] == "text" or p[0] == "text":  # words: "\text{Yes}" == "yes", "\textbf{(A)}" == "A"
    return CORRECT if _loose(normalize(predicted)) == _loose(normalize(gold)) else WRONG
  if not answer_compare.has_value(p):
    return UNPARSEABLE
  places_g, places_p = _decimal_places(gold), _decimal_places(predicted)
  try:
    if rel_tol > 0 and (places_g is None) != (places_p is None):
      # One side wrote decimals, the other an exact value: the decimal may round it.
      places = places_g if places_p is None else places_p
      with answer_eval.decimal_tolerance(rel_tol, Fraction(1, 2 * 10 ** max(places, 0))):
        same = answer_compare.equivalent(g, p)
    else:
      same = answer_compare.equivalent(g, p)
  except (answer_eval.EvalError, answer_parse.ParseError, RecursionError):
    same = False
  return CORRECT if same else WRONG


def compare_extraction(found: Extraction, gold: str,
                       rel_tol: float = DEFAULT_REL_TOL) -> tuple[str, str]:
  """(`compare` outcome, the answer text it judged) of an extracted answer.

  When the final box alone is not the gold and the response boxed one answer per part
  (found.parts: a part marker between the boxes), the parts in order are compared as one
  list answer, but only against a gold with exactly that many items.
  """
  outcome = compare(found.text, gold, rel_tol)
  if outcome == CORRECT or len(found.parts) < 2:
    return outcome, found.text
  g = parse(_unbox_gold(gold))
  if g is None or g[0] not in ("list", "tuple", "set") or len(g[1]) != len(found.parts):
    return outcome, found.text
  joined = ", ".join(found.parts)
  if len(joined) > MAX_ANSWER_CHARS or compare(joined, gold, rel_tol) != CORRECT:
    return outcome, found.text
  return CORRECT, joined


def _unbox_gold(gold: str) -> str:
  r"""A gold answer written with \boxed{...} is the content of its final boxes."""
  if "boxed" not in gold and "fbox" not in gold:
    return gold
  found = extract_answer(gold)
  return found.text if found.method == "boxed" else gold


def is_equivalent(predicted: str, gold: str) -> bool:
  """Whether the extracted answer `predicted` equals `gold` (module docstring rules)."""
  return compare(predicted, gold) == CORRECT


def describe(answer: str) -> tuple[str, str]:
  """(type, normalised form) of an answer, e.g. ("interval", "[0, 7)"), for diagnostics."""
  tree = parse(answer)
  if tree is None:
    return "text", _loose(normalize(answer))
  return answer_compare.kind_of(tree), render(tree)


_OPS = {"<=": "<=", ">=": ">=", "!=": "!=", "<": "<", ">": ">", "=": "=", "in": "in"}


def render(node: tuple) -> str:
  """Plain-text form of an answer tree; constants get their value appended."""
  text = _render(node)
  kind = node[0]
  if kind == "rel" and set(node[2]) - {"=", "in"}:
    pieces = answer_compare.real_set(node)
    if pieces is not None:
      return f"{text}, i.e. {_render_real_set(pieces)}"
  if kind not in ("n", "text", "rel", "list", "set", "tuple", "ival", "seq", "mat", "union",
                  "pct") and not answer_compare.free_symbols(node):
    try:
      value = answer_eval.evaluate(node, {})
      text += f" = {answer_eval.describe(value)}"
    except answer_eval.EvalError:
      text += " (no value)"
  return text


def _render_real_set(pieces: list[tuple]) -> str:
  if not pieces:
    return "{}"
  return " U ".join(
      f"{'[' if lc else '('}{answer_eval.describe(lo)}, {answer_eval.describe(hi)}"
      f"{']' if rc else ')'}" for lo, hi, lc, rc in pieces)


def _render(node: tuple) -> str:
  kind = node[0]
  if kind == "n":
    return str(node[1]) if node[1].denominator == 1 else f"({node[1]})"
  if kind in ("s", "c"):
    return {"inf": "oo"}.get(node[1], node[1])
  if kind == "add":
    out = _render(node[1][0])
    for t in node[1][1:]:
      out += f" - {_render(t[1])}" if t[0] == "neg" else f" + {_render(t)}"
    return f"({out})" if len(node[1]) > 1 else out
  if kind == "mul":
    return "*".join(_render(f) for f in node[1])
  if kind == "neg":
    return f"-{_render(node[1])}"
  if kind == "inv":
    return f"1/{_render(node[1])}"
  if kind == "pow":
    return f"{_render(node[1])}^{_render(node[2])}"
  if kind == "pm":
    return f"({_render(node[1])} ± {_render(node[2])})"
  if kind == "root":
    n = node[1]
    return (f"sqrt({_render(node[2])})" if n == ("n", Fraction(2))
            else f"root[{_render(n)}]({_render(node[2])})")
  if kind == "f":
    return f"{node[1]}({_render(node[2])})"
  if kind == "log":
    base = "" if node[1] is None else f"_{_render(node[1])}"
    return f"log{base}({_render(node[2])})"
  if kind == "abs":
    return f"|{_render(node[1])}|"
  if kind == "fact":
    return f"{_render(node[1])}!"
  if kind == "binom":
    return f"C({_render(node[1])}, {_render(node[2])})"
  if kind == "pct":
    return f"{_render(node[1])}%"
  if kind == "rel":
    out = _render(node[1][0])
    for op, x in zip(node[2], node[1][1:]):
      out += f" {_OPS[op]} {_render(x)}"
    return out
  if kind in ("tuple", "set", "list", "seq"):
    inner = ", ".join(_render(x) for x in node[1])
    return {"tuple": f"({inner})", "set": f"{{{inner}}}", "list": inner,
            "seq": f"[{inner}]"}[kind]
  if kind == "ival":
    return (f"{'[' if node[3] else '('}{_render(node[1])}, {_render(node[2])}"
            f"{']' if node[4] else ')'}")
  if kind == "union":
    return " U ".join(_render(x) for x in node[1])
  if kind == "mat":
    return "[" + "; ".join(", ".join(_render(x) for x in row) for row in node[1]) + "]"
  if kind == "text":
    return f'"{node[1]}"'
  return str(node)
