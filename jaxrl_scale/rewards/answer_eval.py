"""Values of answer-tree expressions: exact rationals when possible, else 160-bit complex.

`evaluate(node, env)` computes an expression tree from `answer_parse` with the symbols bound
in `env`. Rational operations stay exact (`fractions.Fraction`); a root that is not exact, a
trigonometric or logarithmic function, pi or e move the value to a complex number of a
private mpmath context (160 bits, about 48 digits), so threads never share a precision
setting. Every result is bounded before it is computed: rationals and magnitudes stay under
MAX_BITS, so "9^9^9^9", "(10^100)!" or "\\sin(10^{10^{10}})" fail in microseconds with
EvalError instead of running for hours.

`close(a, b)`: exact equality for two rationals; otherwise a relative difference below
1e-32 (an absolute one below 1e-40 near zero). So two spellings of one irrational number are
equal. Inside `with decimal_tolerance(rel, half_ulp):` (answer_compare uses it when only one
side was written with decimals) a decimal also equals an exact value it is a rounding of:
|a - b| <= half_ulp (the written decimal is correct to its last digit) and
|a - b| <= rel * max(|a|, |b|). So 0.142857142857 == 1/7 and 1.4142 == sqrt 2, while
1.414 != sqrt 2 (relative 1.5e-4) and 0.1428 != 1/7 (not a rounding of it). The setting is
a context variable: each thread (and each verdict) has its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from fractions import Fraction
from typing import Any, Union

from mpmath.ctx_mp import MPContext

MAX_BITS = 4096  # numerator / denominator / magnitude of any value
MAX_ROOT = 64
MAX_FACTORIAL = 300

_MP = MPContext()
_MP.prec = 160
_REL_TOL = _MP.mpf(10) ** -32
_ABS_TOL = _MP.mpf(10) ** -40

Value = Union[Fraction, Any]  # Fraction or an mpc of _MP
# (rel, half_ulp) while a decimal is compared with an exact value; None: exact comparison.
_DECIMAL_TOLERANCE: contextvars.ContextVar = contextvars.ContextVar("decimal_tolerance",
                                                                   default=None)


@contextlib.contextmanager
def decimal_tolerance(rel: float, half_ulp: Fraction):
  """Within the block, `close` accepts a decimal rounding of a value (module docstring)."""
  token = _DECIMAL_TOLERANCE.set((_MP.mpf(rel), _MP.mpf(half_ulp.numerator)
                                  / half_ulp.denominator))
  try:
    yield
  finally:
    _DECIMAL_TOLERANCE.reset(token)


class EvalError(ValueError):
  """The expression has no bounded value here (division by zero, too large, infinite)."""


class _Infinity:
  """+inf or -inf: only an interval endpoint, never an operand."""

  def __init__(self, sign: int):
    self.sign = sign

  def __repr__(self) -> str:
    return "oo" if self.sign > 0 else "-oo"


POS_INF, NEG_INF = _Infinity(1), _Infinity(-1)
CONSTANTS = {"e", "i"}  # single-letter symbols read as Euler's number and the imaginary unit


def _bits(x: Fraction) -> int:
  return max(x.numerator.bit_length(), x.denominator.bit_length())


def _exact(x: Fraction) -> Fraction:
  if _bits(x) > MAX_BITS:
    raise EvalError(f"value exceeds {MAX_BITS} bits")
  return x


def _num(x: Any):
  """A checked mpc: finite and of magnitude within 2**±MAX_BITS (zero allowed)."""
  z = _MP.mpc(x)
  if not _MP.isfinite(z):
    raise EvalError("not a finite value")
  if z != 0 and abs(_MP.mag(z)) > MAX_BITS:
    raise EvalError(f"magnitude beyond 2^{MAX_BITS}")
  return z


def _mp(x: Value):
  if isinstance(x, Fraction):
    return _MP.mpc(_MP.mpf(x.numerator) / x.denominator)
  return x


def to_complex(x: Value):
  """The value as an mpc (for ordering and printing)."""
  return _mp(x)


def _add(a: Value, b: Value) -> Value:
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return _exact(a + b)
  return _num(_mp(a) + _mp(b))


def _mul(a: Value, b: Value) -> Value:
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return _exact(a * b)
  return _num(_mp(a) * _mp(b))


def _inv(a: Value) -> Value:
  if isinstance(a, Fraction):
    if a == 0:
      raise EvalError("division by zero")
    return 1 / a
  if abs(a) <= _ABS_TOL:
    raise EvalError("division by zero")
  return _num(1 / a)


def _int_root(x: int, n: int) -> int | None:
  """The exact integer n-th root of x >= 0, or None (numbers near 1000 bits go numeric)."""
  if x < 0 or x.bit_length() >= 1000:
    return None
  r = math.isqrt(x) if n == 2 else round(x ** (1.0 / n))
  for c in (r - 1, r, r + 1):
    if c >= 0 and c ** n == x:
      return c
  return None


def _root(x: Value, n: int) -> Value:
  if not 1 <= n <= MAX_ROOT:
    raise EvalError(f"root index outside [1, {MAX_ROOT}]")
  if isinstance(x, Fraction):
    if x < 0 and n % 2 == 1:
      return -_root(-x, n)
    if x >= 0:
      num, den = _int_root(x.numerator, n), _int_root(x.denominator, n)
      if num is not None and den is not None:
        return Fraction(num, den)
  z = _mp(x)
  if n % 2 == 1 and z.imag == 0 and z.real < 0:  # the real odd root of a negative number
    return _num(-_MP.root(-z.real, n))
  return _num(_MP.root(z, n))


def _pow(base: Value, exp: Value) -> Value:
  if isinstance(base, Fraction) and isinstance(exp, Fraction):
    if base == 0:
      if exp <= 0:
        raise EvalError("0 to a non-positive power")
      return Fraction(0)
    if base == 1 or exp == 0:
      return Fraction(1)
    if base == -1 and exp.denominator == 1:
      return Fraction(-1 if exp.numerator % 2 else 1)
    if (_bits(base) - 1) * abs(exp) > MAX_BITS and abs(exp) > 1:
      raise EvalError(f"power would exceed {MAX_BITS} bits")
    if exp.denominator > MAX_ROOT:
      raise EvalError("exponent denominator too large")
    rooted = _root(base, exp.denominator) if exp.denominator > 1 else base
    if isinstance(rooted, Fraction):
      out = rooted ** abs(exp.numerator)
      return _exact(out if exp.numerator > 0 else 1 / out)
    return _pow(rooted, Fraction(exp.numerator))
  b, e = _mp(base), _mp(exp)
  if b == 0:
    if e.real <= 0:
      raise EvalError("0 to a non-positive power")
    return Fraction(0)
  # |b^e| = exp(Re(e log b)): bound it before mpmath computes it.
  log_mag = (e * _MP.log(b)).real / _MP.ln2
  if abs(log_mag) > MAX_BITS:
    raise EvalError(f"power beyond 2^{MAX_BITS}")
  return _num(_MP.power(b, e))


_FUNCS = {
    "sin": lambda z: _MP.sin(z), "cos": lambda z: _MP.cos(z), "tan": lambda z: _MP.tan(z),
    "sec": lambda z: 1 / _MP.cos(z), "csc": lambda z: 1 / _MP.sin(z),
    "cot": lambda z: 1 / _MP.tan(z), "arcsin": lambda z: _MP.asin(z),
    "arccos": lambda z: _MP.acos(z), "arctan": lambda z: _MP.atan(z),
    "sinh": lambda z: _MP.sinh(z), "cosh": lambda z: _MP.cosh(z),
    "tanh": lambda z: _MP.tanh(z),
}


def _function(name: str, x: Value) -> Value:
  z = _mp(x)
  if abs(z) > 2 ** 64:  # argument reduction of a huge angle needs huge precision
    raise EvalError("function argument too large")
  try:
    return _num(_FUNCS[name](z))
  except ZeroDivisionError:
    raise EvalError(f"{name} undefined here") from None


def _log(base: Value | None, x: Value) -> Value:
  z = _mp(x)
  if z == 0:
    raise EvalError("log of zero")
  out = _MP.log(z)
  if base is not None:
    b = _mp(base)
    if b == 0 or _MP.almosteq(b, 1):
      raise EvalError("bad log base")
    out = out / _MP.log(b)
  return _num(out)


def _integer(x: Value, what: str) -> int:
  if not isinstance(x, Fraction) or x.denominator != 1:
    raise EvalError(f"{what} of a non-integer")
  return int(x)


def evaluate(node: tuple, env: dict[str, Value]) -> Value:
  """The value of an expression node with symbols from `env` (EvalError when none)."""
  kind = node[0]
  if kind in ("n", "v"):  # "v": a computed value (answer_compare's matrix products)
    return node[1]
  if kind == "s":
    name = node[1]
    if name in env:
      return env[name]
    if name == "e":
      return _num(_MP.e)
    if name == "i":
      return _MP.mpc(0, 1)
    raise EvalError(f"unbound symbol {name}")
  if kind == "c":
    if node[1] == "pi":
      return _num(_MP.pi)
    raise EvalError("infinity is not a number")
  if kind == "add":
    out: Value = Fraction(0)
    for term in node[1]:
      out = _add(out, evaluate(term, env))
    return out
  if kind == "mul":
    out = Fraction(1)
    for factor in node[1]:
      out = _mul(out, evaluate(factor, env))
    return out
  if kind == "neg":
    return -evaluate(node[1], env)
  if kind == "inv":
    return _inv(evaluate(node[1], env))
  if kind == "pow":
    return _pow(evaluate(node[1], env), evaluate(node[2], env))
  if kind == "root":
    return _root(evaluate(node[2], env), _integer(evaluate(node[1], env), "root index"))
  if kind == "f":
    return _function(node[1], evaluate(node[2], env))
  if kind == "log":
    base = evaluate(node[1], env) if node[1] is not None else None
    return _log(base, evaluate(node[2], env))
  if kind == "abs":
    x = evaluate(node[1], env)
    return abs(x) if isinstance(x, Fraction) else _num(abs(x))
  if kind == "fact":
    n = _integer(evaluate(node[1], env), "factorial")
    if not 0 <= n <= MAX_FACTORIAL:
      raise EvalError(f"factorial outside [0, {MAX_FACTORIAL}]")
    return Fraction(math.factorial(n))
  if kind == "binom":
    n = _integer(evaluate(node[1], env), "binomial")
    k = _integer(evaluate(node[2], env), "binomial")
    if not 0 <= n <= 4 * MAX_FACTORIAL:
      raise EvalError("binomial out of range")
    return Fraction(math.comb(n, k) if 0 <= k else 0)
  raise EvalError(f"{kind} is not a number")


def endpoint(node: tuple, env: dict[str, Value] | None = None):
  """An interval endpoint: a value, or POS_INF / NEG_INF for +-infinity."""
  sign = 1
  while node[0] == "neg":
    sign, node = -sign, node[1]
  if node[0] == "add" and len(node[1]) == 1:
    node = node[1][0]
  if node == ("c", "inf"):
    return POS_INF if sign > 0 else NEG_INF
  value = evaluate(node, env or {})
  return value if sign > 0 else -value


def close(a: Value, b: Value) -> bool:
  """Equality up to rounding of the irrational parts (module docstring)."""
  if isinstance(a, _Infinity) or isinstance(b, _Infinity):
    return isinstance(a, _Infinity) and isinstance(b, _Infinity) and a.sign == b.sign
  if isinstance(a, Fraction) and isinstance(b, Fraction) and a == b:
    return True
  tolerance = _DECIMAL_TOLERANCE.get()
  if isinstance(a, Fraction) and isinstance(b, Fraction) and tolerance is None:
    return False
  za, zb = _mp(a), _mp(b)
  diff = abs(za - zb)
  scale = max(abs(za), abs(zb))
  if diff <= _ABS_TOL or diff <= _REL_TOL * scale:
    return True
  if tolerance is None:
    return False
  rel, half_ulp = tolerance
  return bool(diff <= half_ulp and diff <= rel * scale)


def is_real(x: Value) -> bool:
  if isinstance(x, (Fraction, _Infinity)):
    return True
  return abs(x.imag) <= _ABS_TOL + _REL_TOL * abs(x.real)


def real_key(x: Value) -> float:
  """A float for ordering real values (infinities at the ends)."""
  if isinstance(x, _Infinity):
    return math.inf * x.sign
  if isinstance(x, Fraction):
    return float(x) if _bits(x) < 1000 else (math.inf if x > 0 else -math.inf)
  return float(x.real)


def less(a: Value, b: Value) -> bool:
  """a < b for real values (exact for rationals)."""
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return a < b
  if isinstance(a, _Infinity) or isinstance(b, _Infinity):
    return real_key(a) < real_key(b)
  return not close(a, b) and _mp(a).real < _mp(b).real


def describe(x: Value) -> str:
  """Short text of a value for diagnostics."""
  if isinstance(x, Fraction):
    return str(x)
  if isinstance(x, _Infinity):
    return repr(x)
  z = _mp(x)
  if is_real(z):
    return _MP.nstr(z.real, 12)
  return _MP.nstr(z, 12)
