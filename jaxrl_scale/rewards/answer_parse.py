r"""A bounded parser from a final-answer string (LaTeX or plain) to a typed tree.

Model output reaches this module, so nothing here evaluates text as code: a tokenizer and a
recursive-descent parser build plain tuples. `answer_eval` computes with them and
`answer_compare` decides equivalence. Bounds: MAX_CHARS of input, MAX_DEPTH of nesting,
MAX_NODES tree nodes, MAX_ELEMENTS items per list/set/tuple/matrix.

Nodes (tuples, first item the kind):
  expressions  ("n", Fraction) ("s", name) ("c", "pi"|"e"|"i"|"inf")
               ("add", terms) ("mul", factors) ("neg", x) ("inv", x) ("pow", base, exp)
               ("pm", x, y) (x ± y) ("f", name, x) ("log", base | None, x) ("root", n, x)
               ("abs", x) ("fact", x) ("binom", n, k)
  answers      ("pct", x) a percentage; ("rel", exprs, ops) a chain "a < b <= c"
               ("tuple", items) "(a, b)" (also read as an open interval when compared to one)
               ("ival", lo, hi, lo_closed, hi_closed) "[a, b)", "[a, b]"
               ("set", items) "\{a, b\}"; ("list", items) bare "a, b" (unordered)
               ("seq", items) "[a, b, c]"; ("mat", rows); ("union", parts); ("text", words)
Relation ops are "=", "<", "<=", ">", ">=", "!=", "in"; "\approx" reads as "=" unless an
"=" precedes it ("x = 1/3 \approx 0.33" is "x = 1/3").
"""

from __future__ import annotations

import re
from fractions import Fraction

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
_TOKEN_RE = re.compile(
    r"(?P<ws>\s+|\\[,;:! >]|\$|\\\$|~|\\(?:left|right)\s*\.|\\q?quad(?![A-Za-z])"
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
_THOUSANDS_RE = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![,\d])", re.ASCII)
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


def tokenize(text: str) -> list[tuple[str, str]]:
  """Token list of kinds num, sym, const, func, cmd, op, rel, sep, text, set, row, begin, end."""
  if len(text) > MAX_CHARS:
    raise ParseError(f"answer longer than {MAX_CHARS} characters")
  s = text.translate(_UNICODE).replace("{,}", ",").replace(r"\!", "").replace(r"\%", "%")
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


class _Parser:
  """Recursive descent over the tokens of one answer."""

  def __init__(self, tokens: list[tuple[str, str]]):
    self.tokens = tokens
    self.pos = 0
    self.depth = 0
    self.nodes = 0

  # -- helpers ---------------------------------------------------------------------------
  def peek(self, offset: int = 0) -> tuple[str, str]:
    i = self.pos + offset
    return self.tokens[i] if i < len(self.tokens) else ("eof", "")

  def next(self) -> tuple[str, str]:
    token = self.peek()
    if token[0] == "eof":
      raise ParseError("unexpected end of answer")
    self.pos += 1
    return token

  def expect(self, kind: str, value: str) -> None:
    token = self.next()
    if token != (kind, value):
      raise ParseError(f"expected {value!r}, got {token[1]!r}")

  def node(self, *parts) -> tuple:
    self.nodes += 1
    if self.nodes > MAX_NODES:
      raise ParseError(f"more than {MAX_NODES} nodes")
    return parts

  def enter(self) -> None:
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise ParseError(f"nesting deeper than {MAX_DEPTH}")

  def leave(self) -> None:
    self.depth -= 1

  # -- answer level ----------------------------------------------------------------------
  def answer(self) -> tuple:
    items = self.items(("eof",))
    if self.peek()[0] != "eof":
      raise ParseError(f"unexpected {self.peek()[1]!r}")
    return items[0] if len(items) == 1 else self.node("list", tuple(items))

  def skip_text(self) -> list[str]:
    words = []
    while self.peek()[0] == "text":
      words.append(self.next()[1])
    return words

  def at_item_end(self, closers: tuple) -> bool:
    kind, value = self.peek()
    return (kind in ("eof", "row", "end") or (kind, value) == ("op", "&")
            or (kind, value) in closers)

  def at_separator(self) -> bool:
    kind, value = self.peek()
    return kind == "sep" or (kind, value) in (("op", ","), ("op", ";"))

  def items(self, closers: tuple) -> list[tuple]:
    """Items separated by , ; "and" "or"; stops before a closer."""
    items = []
    while True:
      while self.at_separator():  # leading or doubled separators ("x=1, or x=2")
        self.next()
      if self.at_item_end(closers) and items:
        break
      items.append(self.item(closers))
      if len(items) > MAX_ELEMENTS:
        raise ParseError(f"more than {MAX_ELEMENTS} elements")
      if not self.at_separator():
        break
    return items

  def item(self, closers: tuple) -> tuple:
    lead = self.skip_text()
    if lead and (self.at_item_end(closers) or self.at_separator()):
      return self.node("text", " ".join(lead).lower())
    if self.peek()[0] == "empty":
      self.next()
      return self.node("set", ())
    first = self.relation(closers)
    parts = [first]
    while self.peek() == ("op", "U"):
      self.next()
      parts.append(self.relation(closers))
    if len(parts) > 1 and parts[0][0] == "rel" and parts[0][2][-1] == "in":
      # "x \in A \cup B": the membership takes the whole union
      exprs, ops = parts[0][1], parts[0][2]
      union = self.node("union", (exprs[-1], *parts[1:]))
      node = self.node("rel", (*exprs[:-1], union), ops)
    else:
      node = parts[0] if len(parts) == 1 else self.node("union", tuple(parts))
    trailing = self.skip_text()
    if trailing and not (self.at_item_end(closers) or self.at_separator()):
      raise ParseError(f"unexpected text {' '.join(trailing)!r}")
    if trailing and self.peek() == ("op", "^"):  # "cm^2" after \text{cm}
      self.next()
      self.atom()
    return node

  def relation(self, closers: tuple) -> tuple:
    exprs = [self.value(closers)]
    ops = []
    while self.peek()[0] == "rel":
      ops.append(self.next()[1])
      self.skip_text()
      exprs.append(self.value(closers))
      if len(ops) > MAX_ELEMENTS:
        raise ParseError("relation chain too long")
    if not ops:
      return exprs[0]
    if "~" in ops:  # "x = 1/3 \approx 0.33" keeps what is before the approximation
      cut = ops.index("~")
      if "=" in ops[:cut]:
        exprs, ops = exprs[:cut + 1], ops[:cut]
      else:
        ops = ["=" if op == "~" else op for op in ops]
    return self.node("rel", tuple(exprs), tuple(ops))

  def value(self, closers: tuple) -> tuple:
    """An expression with an optional % and trailing unit words."""
    x = self.expr()
    self.skip_units()
    if self.peek() == ("op", "%"):
      self.next()
      self.skip_units()
      x = self.node("pct", x)
    return x

  def skip_units(self) -> None:
    while self.peek()[0] == "text" and _singular(self.peek()[1].split()[0]) in _UNITS:
      self.next()
      if self.peek() == ("op", "^") and self.peek(1)[0] == "num":
        self.pos += 2

  # -- expressions -----------------------------------------------------------------------
  def expr(self) -> tuple:
    self.enter()
    terms = [self.term()]
    while True:
      kind, value = self.peek()
      if (kind, value) == ("op", "+"):
        self.next()
        terms.append(self.term())
      elif (kind, value) == ("op", "-"):
        self.next()
        terms.append(self.node("neg", self.term()))
      elif (kind, value) == ("op", "±"):
        self.next()
        rest = self.expr()
        left = terms[0] if len(terms) == 1 else self.node("add", tuple(terms))
        self.leave()
        return self.node("pm", left, rest)
      else:
        break
      if len(terms) > MAX_NODES:
        raise ParseError("too many terms")
    self.leave()
    return terms[0] if len(terms) == 1 else self.node("add", tuple(terms))

  def term(self) -> tuple:
    factors = [self.unary()]
    mixed = self.mixed_number(factors[0])
    if mixed is not None:
      return mixed
    while True:
      kind, value = self.peek()
      if (kind, value) == ("op", "*"):
        self.next()
        factors.append(self.unary())
      elif (kind, value) == ("op", "/"):
        self.next()
        factors.append(self.node("inv", self.unary()))
      elif self.starts_implicit():
        factors.append(self.postfix(allow_implicit=False))
      else:
        break
    return factors[0] if len(factors) == 1 else self.node("mul", tuple(factors))

  def mixed_number(self, whole: tuple) -> tuple | None:
    """3\frac{1}{2} is 7/2 (a whole number then a proper fraction of literals), not 3/2."""
    negative = whole[0] == "neg"
    if negative:
      whole = whole[1]
    if not (whole[0] == "n" and whole[1].denominator == 1 and self.peek() == ("cmd", "frac")):
      return None
    start = self.pos
    self.next()
    num, den = self.group(), self.group()
    if (num[0] == den[0] == "n" and num[1].denominator == den[1].denominator == 1
        and 0 < num[1] < den[1] and not self.starts_implicit()):
      value = whole[1] + num[1] / den[1]
      return self.node("n", -value if negative else value)
    self.pos = start
    return None

  def starts_implicit(self) -> bool:
    kind, value = self.peek()
    if kind in ("sym", "const", "func", "begin"):
      return True
    if kind == "cmd":
      return True
    return (kind, value) in (("op", "("), ("op", "{"))

  def unary(self) -> tuple:
    kind, value = self.peek()
    if (kind, value) in (("op", "-"), ("op", "+"), ("op", "±")):
      self.next()
      self.enter()
      x = self.unary()
      self.leave()
      if value == "±":
        return self.node("pm", self.node("n", Fraction(0)), x)
      return self.node("neg", x) if value == "-" else x
    return self.postfix(allow_implicit=True)

  def postfix(self, allow_implicit: bool) -> tuple:
    x = self.atom()
    while True:
      kind, value = self.peek()
      if (kind, value) == ("op", "^"):
        self.next()
        self.enter()
        exp = self.group() if self.peek() == ("op", "{") else self.unary_atom()
        self.leave()
        x = self.node("pow", x, exp)
      elif (kind, value) == ("op", "!"):
        self.next()
        x = self.node("fact", x)
      elif (kind, value) == ("op", "'"):
        raise ParseError("primes are not supported")
      else:
        return x

  def unary_atom(self) -> tuple:
    if self.peek() in (("op", "-"), ("op", "+")):
      sign = self.next()[1]
      x = self.postfix(allow_implicit=False)
      return self.node("neg", x) if sign == "-" else x
    return self.atom()

  def group(self) -> tuple:
    """A macro argument: {expr}, one digit of a number, or one atom."""
    self.enter()
    kind, value = self.peek()
    if (kind, value) == ("op", "{"):
      self.next()
      x = self.expr()
      self.expect("op", "}")
    elif kind == "num" and len(value) > 1 and value[0].isdigit():
      self.tokens[self.pos] = ("num", value[1:])  # \frac12: TeX takes one character
      x = self.node("n", Fraction(int(value[0])))
    else:
      x = self.atom()
    self.leave()
    return x

  def number(self, text: str) -> tuple:
    mantissa, _, exponent = text.lower().partition("e")
    whole, _, frac = mantissa.partition(".")
    value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    if exponent:
      e = int(exponent)
      if abs(e) > MAX_DIGITS:
        raise ParseError("exponent out of range")
      value *= Fraction(10) ** e
    return self.node("n", value)

  def atom(self) -> tuple:
    self.enter()
    try:
      return self._atom()
    finally:
      self.leave()

  def _atom(self) -> tuple:
    kind, value = self.next()
    if kind == "num":
      if self.peek() == ("op", "_"):  # 204_5: a numeral in base 5
        self.next()
        base = self.group()
        return self.node("n", Fraction(_from_base(value, base)))
      return self.number(value)
    if kind == "sym":
      if self.peek() == ("op", "_"):
        self.next()
        sub = self.next()
        if sub == ("op", "{"):
          parts = []
          while self.peek() != ("op", "}"):
            parts.append(self.next()[1])
            if len(parts) > 8:
              raise ParseError("subscript too long")
          self.next()
          sub = ("", "".join(parts))
        return self.node("s", f"{value}_{sub[1]}")
      return self.node("s", value)
    if kind == "const":
      if value == "pi" or value == "inf":
        return self.node("c", value)
    if kind == "func":
      return self.function(value)
    if kind == "cmd":
      if value == "frac":
        num = self.group()
        den = self.group()
        return self.node("mul", (num, self.node("inv", den)))
      if value == "sqrt":
        index = None
        if self.peek() == ("op", "["):
          self.next()
          index = self.expr()
          self.expect("op", "]")
        return self.node("root", index or self.node("n", Fraction(2)), self.group())
      if value == "binom":
        return self.node("binom", self.group(), self.group())
    if kind == "begin":
      return self.matrix(value)
    if kind == "set" and value == "{":
      items = self.items((("set", "}"),))
      self.expect("set", "}")
      return self.node("set", tuple(items))
    if (kind, value) == ("op", "|"):
      x = self.expr()
      self.expect("op", "|")
      return self.node("abs", x)
    if (kind, value) == ("op", "{"):
      if self.peek() == ("op", "}"):
        raise ParseError("empty group")
      items = self.items((("op", "}"),))
      self.expect("op", "}")
      return items[0] if len(items) == 1 else self.node("set", tuple(items))
    if (kind, value) in (("op", "("), ("op", "[")):
      return self.bracketed(value)
    raise ParseError(f"unexpected {value!r}")

  def bracketed(self, opener: str) -> tuple:
    items = self.items((("op", ")"), ("op", "]")))
    kind, closer = self.next()
    if closer not in _CLOSERS[opener]:
      raise ParseError(f"{opener!r} closed by {closer!r}")
    pair = opener + closer
    if len(items) == 1:
      if pair in ("()", "[]") and items[0][0] not in ("rel",):
        return items[0]
      raise ParseError(f"{pair} around one item")
    if pair == "()":
      return self.node("tuple", tuple(items))
    if len(items) == 2:
      return self.node("ival", items[0], items[1], opener == "[", closer == "]")
    if pair == "[]":
      return self.node("seq", tuple(items))
    raise ParseError(f"{pair} around {len(items)} items")

  def function(self, name: str) -> tuple:
    power = None
    base = None
    if name == "log" and self.peek() == ("op", "_"):
      self.next()
      base = self.group()
    if self.peek() == ("op", "^"):  # \sin^2 x
      self.next()
      power = self.group() if self.peek() == ("op", "{") else self.atom()
    if self.peek() in (("op", "("), ("op", "{")):
      arg = self.atom()
    else:  # \sin 2x, \sin b \cos a: implicit factors up to the next function
      factors = [self.postfix(allow_implicit=False)]
      while self.peek()[0] in ("sym", "const", "num") and self.peek()[0] != "func":
        factors.append(self.postfix(allow_implicit=False))
      arg = factors[0] if len(factors) == 1 else self.node("mul", tuple(factors))
    if name in ("log", "lg", "ln"):
      out = self.node("log", base if name == "log" else (
          self.node("n", Fraction(10)) if name == "lg" else None), arg)
    elif name == "exp":
      out = self.node("pow", self.node("c", "e"), arg)
    else:
      out = self.node("f", name, arg)
    return self.node("pow", out, power) if power is not None else out

  def matrix(self, env: str) -> tuple:
    if env not in _MATRIX_ENVS:
      raise ParseError(f"unsupported environment {env}")
    rows, row = [], []
    while True:
      row.append(self.expr())
      kind, value = self.next()
      if (kind, value) == ("op", "&"):
        continue
      rows.append(tuple(row))
      row = []
      if len(rows) > MAX_ELEMENTS:
        raise ParseError("matrix too large")
      if kind == "row":
        if self.peek()[0] == "end":
          self.next()
          break
        continue
      if kind == "end":
        break
      raise ParseError(f"unexpected {value!r} in a matrix")
    if len({len(r) for r in rows}) != 1:
      raise ParseError("ragged matrix")
    return self.node("mat", tuple(rows))


def _from_base(digits: str, base_node: tuple) -> int:
  if base_node[0] != "n" or base_node[1].denominator != 1 or not 2 <= base_node[1] <= 36:
    raise ParseError("bad numeral base")
  try:
    return int(digits, int(base_node[1]))
  except ValueError:
    raise ParseError(f"{digits} is not a base-{base_node[1]} numeral") from None


def parse(text: str) -> tuple:
  """The answer tree of `text` (ParseError when it is not one)."""
  tokens = tokenize(text)
  if not tokens:
    raise ParseError("empty answer")
  try:
    return _Parser(tokens).answer()
  except RecursionError:  # MAX_DEPTH should make this unreachable
    raise ParseError("nesting too deep") from None
