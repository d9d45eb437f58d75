"""Matrix expressions of an answer ("A + B", "2A", "AB" of written matrices), evaluated exactly.

Entries are computed values (answer_eval's bounded rationals or 160-bit complex numbers,
held in ("v", value) nodes), never growing expression trees, so a chain of products costs
only its arithmetic. answer_compare compares the resulting matrix entrywise.
"""

from __future__ import annotations

from fractions import Fraction

from jaxrl_scale.rewards import answer_eval as ev
from jaxrl_scale.rewards.answer_eval import EvalError


def _has_matrix(node: tuple) -> bool:
  stack = [node]
  while stack:
    n = stack.pop()
    if not isinstance(n, tuple) or not n:
      continue
    if n[0] == "mat":
      return True
    stack.extend(c for c in (n[1:] if isinstance(n[0], str) else n) if isinstance(c, tuple))
  return False


def matrix_value(node: tuple) -> tuple:
  """The ("mat", rows) that sums, differences, scalar and matrix products of constant
  matrices make, each entry a computed value (a "v" node); EvalError when shapes disagree
  or an entry has a variable or no value. Entries are numbers, never growing trees, so a
  chain of products costs only its arithmetic (bounded by answer_eval's MAX_BITS)."""
  kind = node[0]
  if kind == "mat":
    return ("mat", tuple(tuple(("v", ev.evaluate(x, {})) for x in row) for row in node[1]))
  if kind == "neg":
    return _scale(matrix_value(node[1]), Fraction(-1))
  if kind == "add":
    terms = [matrix_value(t) for t in node[1]]
    rows, cols = _shape(terms[0])
    if any(_shape(t) != (rows, cols) for t in terms):
      raise EvalError("matrices of different shapes added")
    return ("mat", tuple(tuple(("v", _sum(t[1][i][j][1] for t in terms)) for j in range(cols))
                         for i in range(rows)))
  if kind == "mul":
    out = None
    scalar = Fraction(1)
    for factor in node[1]:
      if _has_matrix(factor):
        m = matrix_value(factor)
        out = m if out is None else _matmul(out, m)
      else:
        scalar = ev._mul(scalar, ev.evaluate(factor, {}))  # noqa: SLF001
    if out is None:
      raise EvalError("no matrix")
    return _scale(out, scalar)
  raise EvalError(f"{kind} of a matrix")


def _shape(m: tuple) -> tuple[int, int]:
  return len(m[1]), len(m[1][0])


def _sum(values):
  out = Fraction(0)
  for v in values:
    out = ev._add(out, v)  # noqa: SLF001
  return out


def _scale(m: tuple, k) -> tuple:
  return ("mat", tuple(tuple(("v", ev._mul(k, x[1])) for x in row)  # noqa: SLF001
                       for row in m[1]))


def _matmul(a: tuple, b: tuple) -> tuple:
  (n, inner), (inner_b, p) = _shape(a), _shape(b)
  if inner != inner_b:
    raise EvalError("matrix product of mismatched shapes")
  return ("mat", tuple(tuple(
      ("v", _sum(ev._mul(a[1][i][k][1], b[1][k][j][1]) for k in range(inner)))  # noqa: SLF001
      for j in range(p)) for i in range(n)))
