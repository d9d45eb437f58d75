r"""A bounded parser from a final-answer string (LaTeX or plain) to a typed tree.

Model output reaches this module, so nothing here evaluates text as code: a tokenizer and a
recursive-descent parser build plain tuples. `answer_eval` computes with them and
`answer_compare` decides equivalence. Bounds: MAX_CHARS of input, MAX_DEPTH of nesting,
MAX_NODES tree nodes, MAX_ELEMENTS items per list/set/tuple/matrix.

Nodes (tuples, first item the kind):
  expressions  ("n", Fraction) ("s", name) ("c", "pi"|"e"|"i"|"inf"); f(x), g(3) (f, g, h,
               F, G, H before "(") are one symbol named after the argument
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

from fractions import Fraction

from jaxrl_scale.rewards.answer_tokens import (  # noqa: F401 (MAX_CHARS: the input bound)
    _CLOSERS, _MATRIX_ENVS, _UNITS, MAX_CHARS, MAX_DEPTH, MAX_DIGITS, MAX_ELEMENTS, MAX_NODES,
    ParseError, _singular, tokenize)


# Letters read as function names before "(": "g(x) = 2" names g(x) (not g times x). p, q
# and r stay variables: "p(1-p)" is a product.
_FUNCTION_NAMES = frozenset("fghFGH")


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
    r"""3\frac{1}{2} and "3 1/2" are 7/2 (a whole number then a proper fraction of literals).

    Two number tokens in a row were written apart ("3 1/2", "3\ 1/2"): nothing else reads
    them, so the plain-text mixed number is unambiguous; "3 \cdot 1/2" stays a product.
    """
    negative = whole[0] == "neg"
    if negative:
      whole = whole[1]
    if not (whole[0] == "n" and whole[1].denominator == 1 and self.int_literal(-1)):
      return None
    start = self.pos
    if self.peek() == ("cmd", "frac"):
      self.next()
      num, den = self.group(), self.group()
    elif (self.int_literal(0) and self.peek(1) == ("op", "/") and self.int_literal(2)
          and self.peek(3) != ("op", "^")):
      num = self.node("n", Fraction(int(self.next()[1])))
      self.next()
      den = self.node("n", Fraction(int(self.next()[1])))
    else:
      return None
    if (num[0] == den[0] == "n" and num[1].denominator == den[1].denominator == 1
        and 0 < num[1] < den[1] and not self.starts_implicit()):
      value = whole[1] + num[1] / den[1]
      return self.node("n", -value if negative else value)
    self.pos = start
    return None

  def int_literal(self, offset: int) -> bool:
    """Whether the token at `offset` (-1: the one just read) is a plain integer literal."""
    kind, value = self.peek(offset) if self.pos + offset >= 0 else ("", "")
    return kind == "num" and value.isdigit()

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
      if value in _FUNCTION_NAMES and self.peek() == ("op", "("):
        applied = self.application(value)
        if applied is not None:
          return applied
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

  def application(self, name: str) -> tuple | None:
    """f(x), g(3): one opaque symbol named after its argument (a name, not f times x)."""
    start = self.pos
    self.next()
    try:
      arg = self.expr()
      self.expect("op", ")")
    except ParseError:
      self.pos = start
      return None
    return self.node("s", f"{name}({arg!r})")

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
