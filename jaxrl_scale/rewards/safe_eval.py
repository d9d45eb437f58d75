r"""Exact evaluation of untrusted arithmetic and a small LaTeX subset, without eval.

Model output reaches this module, so nothing here hands text to `eval`, `exec`,
`sympy.sympify` or `parse_expr`: a recursive-descent parser reads the tokens and builds
values with constructors only. Rational values are `fractions.Fraction`; a value that
involves \sqrt of a non-square or \pi is a sympy expression built from `sympy.Rational`,
`sympy.pi`, `sympy.root`, `+`, `*` and `**` on those objects.

Every way an input could make the work blow up is bounded before the work is done:
the text length (`MAX_CHARS`), the nesting depth (`MAX_DEPTH`), the size of every rational
(`MAX_BITS` for numerator and denominator) and, before any power is computed, the size of
its result (so 9**9**9**9 and 10^10^10 fail fast with `BoundsError`). A bounded input
therefore finishes in milliseconds; the scorer's per-call deadline is only a backstop.

Grammar (precedence low to high; `^` and `**` are right-associative, `-2^2` is -4):

  expr   := term (('+' | '-') term)*
  term   := unary (('*' | '/' | \times | \cdot | \div) unary | implicit)*
  unary  := ('+' | '-') unary | power
  power  := atom (('^' | '**') exponent)?
  atom   := NUMBER | '(' expr ')' | '[' expr ']' | '{' expr '}'
          | \frac group group | \sqrt ('[' expr ']')? group | \pi
  group  := '{' expr '}' | one digit | atom           (so \frac12 is 1/2, \sqrt2 is sqrt 2)

`implicit` multiplication (2\pi, 3\sqrt{2}, 2(3+4)) applies before '(', '{', \frac,
\sqrt and \pi, never between two numbers ("1 000" is an error, not 1000 or 0).
"""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction
from typing import Any, Union

MAX_CHARS = 1000  # an answer longer than this is not a final answer
MAX_DEPTH = 64  # ~5 Python frames per level: far below the interpreter's recursion limit
MAX_BITS = 4096  # numerator/denominator size of any value (~1233 decimal digits)
MAX_ROOT = 64  # largest n in \sqrt[n]{} and largest exponent denominator
# Largest radicand (bits) of a root that is not exact: sympy trial-factors it to pull
# out square factors, which takes seconds on 4096-bit numbers; no real answer needs it.
MAX_RADICAND_BITS = 256

# A sympy expression when the value is irrational; annotated loosely because sympy is
# imported lazily (countdown and arithmetic never need it).
Value = Union[Fraction, Any]


class EvalError(ValueError):
  """The text is not a valid, bounded expression of the grammar."""


class ParseError(EvalError):
  """Syntax outside the grammar (unknown command, unbalanced bracket, stray token)."""


class BoundsError(EvalError):
  """The text is too long, too deep, or a value would exceed MAX_BITS."""


@dataclasses.dataclass(frozen=True)
class Grammar:
  r"""Which parts of the grammar an input may use.

  Attributes:
    decimals: allow "1.5" (otherwise only integer literals).
    powers: allow ^ and **.
    roots: allow \sqrt.
    constants: allow \pi.
  """
  decimals: bool = True
  powers: bool = True
  roots: bool = True
  constants: bool = True


MATH = Grammar()
# Countdown: integers, + - * / and parentheses (LaTeX \times, \div, \frac are spellings of those).
COUNTDOWN = Grammar(decimals=False, powers=False, roots=False, constants=False)

_UNICODE = str.maketrans(
    {"×": "*", "÷": "/", "−": "-", "·": "*", "π": r"\pi ", "√": r"\sqrt "})
# re.ASCII: \d must not match other scripts' digits, which int() would happily accept.
_TOKEN_RE = re.compile(
    r"(?P<ws>\s+|\\[,;:! ]|\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![A-Za-z]))"
    r"|(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"|(?P<cmd>\\[A-Za-z]+)"
    r"|(?P<op>\*\*|[-+*/^(){}\[\]])",
    re.ASCII)
_CMD_OPS = {r"\times": "*", r"\cdot": "*", r"\ast": "*", r"\div": "/"}
_FRAC = (r"\frac", r"\dfrac", r"\tfrac", r"\cfrac")
_CLOSE = {"(": ")", "[": "]", "{": "}"}
_IMPLICIT_STARTS = ("(", "{", r"\sqrt", r"\pi") + _FRAC


def _tokenize(text: str) -> list[tuple[str, str]]:
  if len(text) > MAX_CHARS:
    raise BoundsError(f"expression longer than {MAX_CHARS} characters")
  text = text.translate(_UNICODE)
  tokens, pos = [], 0
  while pos < len(text):
    m = _TOKEN_RE.match(text, pos)
    if m is None:
      raise ParseError(f"unexpected character {text[pos]!r}")
    pos = m.end()
    kind = m.lastgroup
    if kind == "ws":
      continue
    value = m.group()
    if kind == "cmd" and value in _CMD_OPS:
      kind, value = "op", _CMD_OPS[value]
    elif kind == "op" and value == "**":
      value = "^"
    tokens.append((kind, value))
  return tokens


def _bits(x: Fraction) -> int:
  return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: Fraction) -> Fraction:
  if _bits(x) > MAX_BITS:
    raise BoundsError(f"value exceeds {MAX_BITS} bits")
  return x


def _sympy():
  import sympy  # lazily: only irrational values need it
  return sympy


def _to_sym(x: Value):
  if isinstance(x, Fraction):
    return _sympy().Rational(x.numerator, x.denominator)
  return x


def _from_sym(x: Any) -> Value:
  """Back to Fraction when sympy simplified to a rational (sqrt(4) -> 2)."""
  sympy = _sympy()
  if isinstance(x, sympy.Rational):
    return _checked(Fraction(int(x.p), int(x.q)))
  if x.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
    raise EvalError("undefined value")
  if _sym_bits(x) > MAX_BITS:
    raise BoundsError(f"value exceeds {MAX_BITS} bits")
  return x


def _sym_bits(x: Any) -> int:
  """Largest numerator/denominator among the rationals inside a sympy expression."""
  sympy = _sympy()
  sizes = [max(int(r.p).bit_length(), int(r.q).bit_length()) for r in x.atoms(sympy.Rational)]
  return max(sizes, default=1)


def _magnitude(x: Value) -> float:
  """|x| as a float, for bounding the size of powers (inf when huge)."""
  try:
    if isinstance(x, Fraction):
      return abs(float(x))
    return abs(complex(x.evalf(20)))
  except (OverflowError, TypeError, ValueError):
    return math.inf


def _add(a: Value, b: Value) -> Value:
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return _checked(a + b)
  return _from_sym(_to_sym(a) + _to_sym(b))


def _mul(a: Value, b: Value) -> Value:
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return _checked(a * b)
  return _from_sym(_to_sym(a) * _to_sym(b))


def multiply(a: Value, b: Value) -> Value:
  """a * b with the same bounds as the parser applies."""
  return _mul(a, b)


def _div(a: Value, b: Value) -> Value:
  if isinstance(b, Fraction):
    if b == 0:
      raise EvalError("division by zero")
    return _mul(a, 1 / b)
  if b == 0 or b.is_zero:
    raise EvalError("division by zero")
  return _from_sym(_to_sym(a) / b)


def _exact_root(x: int, n: int) -> int | None:
  sympy = _sympy()
  r, exact = sympy.integer_nthroot(x, n)
  return int(r) if exact else None


def _root(x: Value, n: int) -> Value:
  """The real n-th root (negative x with odd n gives the negative real root)."""
  if not 1 <= n <= MAX_ROOT:
    raise BoundsError(f"root index {n} outside [1, {MAX_ROOT}]")
  if isinstance(x, Fraction):
    if x >= 0:
      num, den = _exact_root(x.numerator, n), _exact_root(x.denominator, n)
      if num is not None and den is not None:
        return Fraction(num, den)
    elif n % 2 == 1:
      return -_root(-x, n)
  _check_radicand(x)
  if not isinstance(x, Fraction) and n % 2 == 1 and x.is_extended_negative:
    return _from_sym(-_sympy().root(-x, n))
  return _from_sym(_sympy().root(_to_sym(x), n))


def _check_radicand(x: Value) -> None:
  bits = _bits(x) if isinstance(x, Fraction) else _sym_bits(x)
  if bits > MAX_RADICAND_BITS:
    raise BoundsError(f"inexact root of a number above {MAX_RADICAND_BITS} bits")


def _pow(base: Value, exp: Value) -> Value:
  """base ** exp, refused before computing when the result would exceed MAX_BITS."""
  if isinstance(exp, Fraction) and isinstance(base, Fraction):
    if base in (0, 1):
      if base == 0 and exp <= 0:
        raise EvalError("0 to a non-positive power")
      return base
    if base == -1 and exp.denominator == 1:
      return Fraction(-1) if exp.numerator % 2 else Fraction(1)
    if exp.denominator > MAX_ROOT:
      raise BoundsError(f"exponent denominator above {MAX_ROOT}")
    # |base|^e has at most e * bits(base) <= 2 e (bits(base) - 1) bits: refuse early, and
    # let _checked catch the at-most-twofold overshoot after a cheap computation.
    if (_bits(base) - 1) * abs(exp) > MAX_BITS:
      raise BoundsError(f"power would exceed {MAX_BITS} bits")
    rooted = _root(base, exp.denominator) if exp.denominator > 1 else base
    if isinstance(rooted, Fraction):
      return _checked(rooted ** exp.numerator)
    return _from_sym(rooted ** exp.numerator)
  # Irrational base or exponent: bound by the exponent's magnitude before sympy sees it.
  base_bits = _bits(base) if isinstance(base, Fraction) else _sym_bits(base)
  if max(base_bits, 2) * _magnitude(exp) > MAX_BITS:
    raise BoundsError(f"power would exceed {MAX_BITS} bits")
  if isinstance(exp, Fraction) and exp.denominator > MAX_ROOT:
    raise BoundsError(f"exponent denominator above {MAX_ROOT}")
  if not isinstance(exp, Fraction) or exp.denominator > 1:
    _check_radicand(base)
  return _from_sym(_to_sym(base) ** _to_sym(exp))


class _Parser:
  """Recursive descent over tokens; evaluates as it parses."""

  def __init__(self, tokens: list[tuple[str, str]], grammar: Grammar):
    self._tokens = tokens
    self._pos = 0
    self._depth = 0
    self._grammar = grammar
    self.literals: list[Fraction] = []

  def parse(self) -> Value:
    if not self._tokens:
      raise ParseError("empty expression")
    value = self._expr()
    if self._pos != len(self._tokens):
      raise ParseError(f"unexpected {self._tokens[self._pos][1]!r}")
    return value

  def _peek(self) -> str | None:
    return self._tokens[self._pos][1] if self._pos < len(self._tokens) else None

  def _next(self) -> tuple[str, str]:
    if self._pos >= len(self._tokens):
      raise ParseError("unexpected end of expression")
    token = self._tokens[self._pos]
    self._pos += 1
    return token

  def _expect(self, value: str) -> None:
    kind, got = self._next()
    if got != value:
      raise ParseError(f"expected {value!r}, got {got!r}")

  def _enter(self) -> None:
    self._depth += 1
    if self._depth > MAX_DEPTH:
      raise BoundsError(f"nesting deeper than {MAX_DEPTH}")

  def _expr(self) -> Value:
    self._enter()
    value = self._term()
    while self._peek() in ("+", "-"):
      op = self._next()[1]
      rhs = self._term()
      value = _add(value, rhs if op == "+" else -rhs)
    self._depth -= 1
    return value

  def _term(self) -> Value:
    value = self._unary()
    while True:
      token = self._peek()
      if token in ("*", "/"):
        self._next()
        rhs = self._unary()
        value = _mul(value, rhs) if token == "*" else _div(value, rhs)
      elif token in _IMPLICIT_STARTS:
        value = _mul(value, self._power())
      else:
        return value

  def _unary(self) -> Value:
    if self._peek() in ("+", "-"):
      op = self._next()[1]
      self._enter()
      value = self._unary()
      self._depth -= 1
      return -value if op == "-" else value
    return self._power()

  def _power(self) -> Value:
    base = self._atom()
    if self._peek() != "^":
      return base
    if not self._grammar.powers:
      raise ParseError("powers are not allowed here")
    self._next()
    self._enter()
    exp = self._group() if self._peek() == "{" else self._unary()
    self._depth -= 1
    return _pow(base, exp)

  def _number(self, text: str) -> Fraction:
    whole, _, frac = text.partition(".")
    if frac and not self._grammar.decimals:
      raise ParseError(f"decimal {text!r} not allowed here")
    value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    self.literals.append(value)
    return _checked(value)

  def _atom(self) -> Value:
    kind, token = self._next()
    if kind == "num":
      return self._number(token)
    if token in _CLOSE:
      value = self._expr()
      self._expect(_CLOSE[token])
      return value
    if token in _FRAC:
      num = self._group()
      den = self._group()
      return _div(num, den)
    if token == r"\sqrt":
      if not self._grammar.roots:
        raise ParseError(r"\sqrt is not allowed here")
      index = 2
      if self._peek() == "[":
        self._next()
        n = self._expr()
        self._expect("]")
        if not isinstance(n, Fraction) or n.denominator != 1:
          raise ParseError("root index must be an integer")
        index = int(n)
      return _root(self._group(), index)
    if token == r"\pi":
      if not self._grammar.constants:
        raise ParseError(r"\pi is not allowed here")
      return _sympy().pi
    raise ParseError(f"unexpected {token!r}")

  def _group(self) -> Value:
    """A LaTeX macro argument: {expr}, a single digit, or one atom."""
    self._enter()
    kind, token = self._tokens[self._pos] if self._pos < len(self._tokens) else ("", "")
    if token == "{":
      self._next()
      value = self._expr()
      self._expect("}")
    elif kind == "num" and len(token) > 1:
      # \frac12: TeX takes one character as the argument; the rest stays in the stream.
      self._tokens[self._pos] = ("num", token[1:])
      value = self._number(token[0])
    else:
      value = self._atom()
    self._depth -= 1
    return value


def evaluate_with_literals(text: str, grammar: Grammar = MATH) -> tuple[Value, list[Fraction]]:
  """Evaluates `text` and returns the value and every number literal, in order.

  Args:
    text: untrusted expression text (at most MAX_CHARS characters).
    grammar: which constructs are allowed.

  Returns:
    (value, literals): a Fraction when rational, else a sympy expression; the literals
    let a countdown verifier check which numbers were used.

  Raises:
    EvalError: ParseError or BoundsError; never anything from evaluating code.
  """
  parser = _Parser(_tokenize(text), grammar)
  try:
    value = parser.parse()
  except EvalError:
    raise
  except RecursionError:  # belt and braces: MAX_DEPTH should make this unreachable
    raise BoundsError("nesting too deep") from None
  except Exception as e:  # noqa: BLE001  sympy on a degenerate value: a bad answer, not a bug
    raise EvalError(f"cannot evaluate: {type(e).__name__}") from None
  return value, parser.literals


def evaluate(text: str, grammar: Grammar = MATH) -> Value:
  """The exact value of `text` (see `evaluate_with_literals`)."""
  return evaluate_with_literals(text, grammar)[0]


def equal(a: Value, b: Value) -> bool:
  """Exact equality for rationals; for irrationals, symbolic then 60-digit numeric.

  The numeric test (relative difference below 1e-40) absorbs rounding when two
  spellings of one irrational number do not simplify to the same sympy expression; so
  irrationals that agree to 40 significant digits count as equal. A decimal
  approximation such as 1.41421356 is a different number and is not equal to \\sqrt{2}.
  """
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return a == b
  import mpmath  # comes with sympy
  try:
    a_sym, b_sym = _to_sym(a), _to_sym(b)
    diff = a_sym - b_sym
    if diff == 0:
      return True
    # Relative, in mpmath (values up to 2**MAX_BITS overflow a double); an absolute floor
    # would make all tiny values equal. The difference is evaluated as one expression so
    # sympy's adaptive precision sees the cancellation.
    with mpmath.workdps(_DIGITS):
      scale = max(abs(_to_mpmath(a_sym)), abs(_to_mpmath(b_sym)))
      return bool(abs(_to_mpmath(diff)) <= scale * mpmath.mpf(10) ** -40)
  except Exception:  # noqa: BLE001  a value sympy cannot evaluate equals nothing
    return False


_DIGITS = 60


def _to_mpmath(x: Any):
  """A sympy number as an mpmath complex at the current precision."""
  import mpmath
  sympy = _sympy()
  parts = []
  for part in sympy.N(x, _DIGITS).as_real_imag():
    if isinstance(part, sympy.Float):
      parts.append(mpmath.mpf(part))
    elif isinstance(part, sympy.Rational):
      parts.append(mpmath.mpf(int(part.p)) / int(part.q))
    else:
      raise EvalError("not a number")
  return mpmath.mpc(*parts)
