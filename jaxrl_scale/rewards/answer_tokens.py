r"""Tokens of a final-answer string (LaTeX or plain), and the parser's bounds.

Model output reaches this module: it only splits text into (kind, text) tokens with regular
expressions and fixed tables (LaTeX commands, functions, Greek letters, units, filler
words); nothing is evaluated. `answer_parse` builds the typed tree from these tokens.
"""

from __future__ import annotations

import re

MAX_CHARS = 1000
MAX_DEPTH = 48
MAX_NODES = 2000
MAX_ELEMENTS = 32
MAX_DIGITS = 400  # digits in one number literal (about 1330 bits)


class ParseError(ValueError):
  """The text is not an answer of the grammar (or exceeds a bound)."""


_UNICODE = str.maketrans({
    "×": "*", "÷": "/", "−": "-", "·": "*", "π": r"\pi ", "√": r"\sqrt ", "∞": r"\infty ",
    "≤": r"\le ", "≥": r"\ge ", "≠": r"\ne ", "∪": r"\cup ", "±": r"\pm ", "°": " ",
    "€": " ", "£": " ", "²": "^2", "³": "^3", "≈": r"\approx ", "∈": r"\in "})

_TEXT_CMDS = ("text", "textbf", "textit", "textrm", "textnormal", "textsf", "mbox", "mathrm",
              "mathbf", "mathit", "mathsf", "operatorname", "emph", "boldsymbol", "mathbb")
_MATH_FONTS = {"mathrm", "mathbf", "mathit", "mathsf", "operatorname", "boldsymbol", "mathbb"}
# "\quad" takes no letters after it: "\quadx_2" (a gold written without a space) is a space
# then x_2; no other command starts with "quad".
_TOKEN_RE = re.compile(
    r"(?P<ws>\s+|\\[,;:! >]|\$|\\\$|~|\\(?:left|right)\s*\.|\\q?quad"
    r"|\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|biggl|biggr|displaystyle|textstyle"
    r"|circ|degree|limits)(?![A-Za-z])|\^\s*\{?\s*\\circ\s*\}?)"
    r"|(?P<text>\\(?:" + "|".join(_TEXT_CMDS) + r")\s*\{(?P<tx>[^{}]*)\})"
    r"|(?P<begin>\\begin\s*\{(?P<env>[A-Za-z]+\*?)\}(?:\s*\{[lcr|\s]*\})?)"
    r"|(?P<end>\\end\s*\{[A-Za-z]+\*?\})"
    r"|(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![\d.]))?)"
    r"|(?P<rel><=|>=|!=|=<|=>|[<>=]|\\(?:leq?|geq?|leqslant|geqslant|neq?|lt|gt|approx"
    r"|simeq|equiv|in)(?![A-Za-z]))"
    r"|(?P<set>\\[{}]|\\[lr]brace(?![A-Za-z]))"
    r"|(?P<row>\\\\|\\cr(?![A-Za-z]))"
    r"|(?P<cmd>\\[A-Za-z]+)"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<op>\*\*|[-+*/^(){}\[\],;|!&_'%])",
    re.ASCII)

_FUNCS = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh",
          "cosh", "tanh", "exp", "ln", "log", "lg"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
          "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau",
          "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta",
          "Lambda", "Xi", "Sigma", "Phi", "Psi", "Omega"}
_UNITS = {"cm", "mm", "km", "m", "kg", "mg", "g", "ml", "l", "s", "ms", "sec", "secs", "second",
          "min", "mins", "minute", "h", "hr", "hrs", "hour", "day", "week", "month", "year",
          "ft", "feet", "foot", "in", "inch", "inches", "mi", "mile", "yard", "yd", "meter",
          "metre", "mph", "lb", "lbs", "pound", "oz", "ounce", "gram", "kilogram", "liter",
          "litre", "dollar", "cent", "euro", "unit", "square", "sq", "cubic", "degree", "deg",
          "radian", "rad", "point", "people", "person", "student", "apple", "way", "time",
          "integer", "number", "page", "box", "ball", "coin", "book", "step", "triangle",
          "marble", "child", "children", "men", "women", "games", "game", "candy", "candies"}
_PERCENT_WORDS = {"percent", "pct", "percentage"}
_FILLER = {"approximately", "about", "exactly", "only", "just", "is", "are", "the", "a", "an",
           "of", "total", "answer", "final", "value", "equals", "so", "thus", "therefore"}
_THOUSANDS_RE = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?![,\d])", re.ASCII)  # not "0,111"
# Digit groups joined by a separator that never separates list items: ",\!", "{,}", a thin
# or non-breaking space ("\,", "\!", "\ ", "~", U+2009, U+202F, U+00A0) or one plain space.
# "12{,}345", "45,\! 678", "2\,000" and "3 000 000" are one number at any bracket depth;
# "32, 349" stays two items (a comma and a space separate a list).
_SPACED_THOUSANDS_RE = re.compile(
    r"(?<![\d.,])[1-9]\d{0,2}(?:(?:,\\!\s?|\{,\}|\\[,! ]|~|[ \u2009\u202f\u00a0])\d{3})+(?![\d,])"
    r"(?!\\!|\{,\}|\\,\d)")
_GROUP_SEPARATOR_RE = re.compile(r",\\!\s?|\{,\}|\\[,! ]|[~ \u2009\u202f\u00a0]")
_FRAC = (r"\frac", r"\dfrac", r"\tfrac", r"\cfrac")
_MATRIX_ENVS = {"pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix", "array"}
_CLOSERS = {"(": (")", "]"), "[": (")", "]")}


def _singular(word: str) -> str:
  w = word.lower()
  if w.endswith("es") and w[:-2] in _UNITS:
    return w[:-2]
  return w[:-1] if w.endswith("s") and w[:-1] in _UNITS else w


def _thousands_outside_brackets(s: str) -> str:
  """Drops "," in 1,234,567 only at bracket depth 0: inside "(2,100)" a comma separates."""
  out, last = [], 0
  for m in _THOUSANDS_RE.finditer(s):
    prefix = s[:m.start()]
    depth = sum(prefix.count(c) for c in "([{") - sum(prefix.count(c) for c in ")]}")
    if depth == 0:
      out.append(s[last:m.start()])
      out.append(m.group().replace(",", ""))
      last = m.end()
  out.append(s[last:])
  return "".join(out)


def join_digit_groups(s: str) -> str:
  """ "12{,}345", "45,\\! 678", "2\\,000", "3 000 000" -> one number each (see the regex)."""
  return _SPACED_THOUSANDS_RE.sub(lambda m: _GROUP_SEPARATOR_RE.sub("", m.group()), s)


def tokenize(text: str) -> list[tuple[str, str]]:
  """Token list of kinds num, sym, const, func, cmd, op, rel, sep, text, set, row, begin, end."""
  if len(text) > MAX_CHARS:
    raise ParseError(f"answer longer than {MAX_CHARS} characters")
  s = join_digit_groups(text).translate(_UNICODE).replace("{,}", ",").replace(r"\!", "").replace(r"\%", "%")
  if _THOUSANDS_RE.search(s):
    s = _thousands_outside_brackets(s)
  tokens: list[tuple[str, str]] = []
  pos = 0
  while pos < len(s):
    m = _TOKEN_RE.match(s, pos)
    if m is None:
      raise ParseError(f"unexpected character {s[pos]!r}")
    pos = m.end()
    kind, value = m.lastgroup, m.group()
    if kind == "ws":
      continue
    if kind == "text":
      kind, value = "text", " ".join(m.group("tx").split())
      command = m.group().split("{", 1)[0].strip()[1:]
      words = value.split()
      if not words:
        continue
      if value.lower() in ("and", "or", ","):
        tokens.append(("sep", value.lower()))
        continue
      if command in _MATH_FONTS and len(words) == 1 and words[0].isalpha():  # \mathbf{v}
        _word(tokens, words[0], allow_units=True)
        continue
      tokens.append(("text", value))
      continue
    if kind == "begin":
      tokens.append(("begin", m.group("env")))
    elif kind == "num":
      if len(value) > MAX_DIGITS:
        raise ParseError(f"number longer than {MAX_DIGITS} digits")
      tokens.append(("num", value))
    elif kind == "rel":
      tokens.append(("rel", _REL_NAMES.get(value, value)))
    elif kind == "set":
      tokens.append(("set", "{" if value in (r"\{", r"\lbrace") else "}"))
    elif kind == "cmd":
      _command(tokens, value[1:])
    elif kind == "word":
      _word(tokens, value, allow_units=True)
    elif kind == "op" and value == "**":
      tokens.append(("op", "^"))
    else:
      tokens.append((kind, value))
  return tokens


_REL_NAMES = {"<=": "<=", "=<": "<=", ">=": ">=", "=>": ">=", "!=": "!=", r"\le": "<=",
              r"\leq": "<=", r"\leqslant": "<=", r"\ge": ">=", r"\geq": ">=",
              r"\geqslant": ">=", r"\ne": "!=", r"\neq": "!=", r"\lt": "<", r"\gt": ">",
              r"\approx": "~", r"\simeq": "~", r"\equiv": "=", r"\in": "in"}
_CMD_TOKENS = {"cdot": ("op", "*"), "times": ("op", "*"), "ast": ("op", "*"),
               "div": ("op", "/"), "pm": ("op", "±"), "mp": ("op", "±"), "cup": ("op", "U"),
               "pi": ("const", "pi"), "infty": ("const", "inf"), "infin": ("const", "inf"),
               "mid": ("op", "|"), "vert": ("op", "|"), "lvert": ("op", "|"),
               "rvert": ("op", "|"), "emptyset": ("empty", ""), "varnothing": ("empty", ""),
               "lbrack": ("op", "["), "rbrack": ("op", "]"), "colon": ("op", ":"),
               "%": ("op", "%")}


def _command(tokens: list[tuple[str, str]], name: str) -> None:
  if name in _CMD_TOKENS:
    tokens.append(_CMD_TOKENS[name])
  elif name in _FUNCS:
    tokens.append(("func", name))
  elif name in _GREEK:
    tokens.append(("sym", name))
  elif "\\" + name in _FRAC:
    tokens.append(("cmd", "frac"))
  elif name in ("sqrt", "binom", "dbinom", "tbinom", "exp"):
    tokens.append(("cmd", "binom" if name.endswith("binom") else name))
  else:
    raise ParseError(f"unsupported command \\{name}")


def _word(tokens: list[tuple[str, str]], word: str, allow_units: bool) -> None:
  """A run of ASCII letters: a function, constant, separator, unit, or single-letter symbols."""
  low = word.lower()
  if low in _FUNCS or low == "sqrt":
    tokens.append(("func", low) if low != "sqrt" else ("cmd", "sqrt"))
  elif low == "pi":
    tokens.append(("const", "pi"))
  elif low in ("inf", "infty", "infinity"):
    tokens.append(("const", "inf"))
  elif low in ("and", "or"):
    tokens.append(("sep", low))
  elif low in _PERCENT_WORDS:
    tokens.append(("op", "%"))
  elif word in _GREEK:
    tokens.append(("sym", word))
  elif len(word) == 1:
    tokens.append(("sym", word))
  elif allow_units and (_singular(word) in _UNITS or low in _FILLER):
    tokens.append(("text", word))
  elif len(word) <= 3:  # "xy", "abc": products of single-letter symbols
    tokens.extend(("sym", c) for c in word)
  else:
    tokens.append(("text", word))
