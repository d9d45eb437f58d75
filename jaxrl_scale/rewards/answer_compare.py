"""Equivalence of two answer trees, by answer type.

  numbers, radicals, constants   exact rationals, else 48-digit values (answer_eval.close)
  expressions with variables     equal at 5 fixed generic positive points and, where both
                                 are real, at 2 negative ones; a non-equivalent expression
                                 that agrees at one point (or on a line) is rejected. The
                                 points are a fixed table, so verdicts are deterministic.
  equations                      a = b matches c = d when a - b = k (c - d) for one nonzero
                                 constant k; "x = 5" against a bare "5" compares 5 (an
                                 assignment), any other equation against a bare value is
                                 wrong (one side is never compared alone)
  inequalities, intervals        one-variable linear relations become sets of reals:
                                 "x > 2" == "(2, \\infty)", "-x >= -1" == "x <= 1";
                                 unions compare piece by piece, endpoints and openness
  sets, lists, tuples            sets and bare lists unordered, tuples/intervals in order;
                                 "1 \\pm \\sqrt{2}" is the set of both values
  named values                   "a = 3, b = 7" by name against the same names, else in
                                 the gold's order ("AB=4, CD=5" != "5, 4"); a repeated name
                                 starts the next solution ("p=5,q=2; p=7,q=2" is a set of
                                 pairs); names are x, a_3, f(x), AB, NO/BO, |AB|
  matrices                       same shape, entries equivalent; a one-row or one-column
                                 matrix also matches a tuple of its entries; sums and
                                 products of written matrices are computed first
                                 (answer_matrix)
  decimals                       against an exact value, a correct rounding within a
                                 relative tolerance (math.compare, answer_eval.close)
  percentages                    X% matches X% and, against a bare Y, Y == X or Y == X/100
  text, multiple choice          case- and space-insensitive words; "(B)" == "B"
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from jaxrl_scale.rewards import answer_eval as ev
from jaxrl_scale.rewards import answer_matrix
from jaxrl_scale.rewards.answer_eval import EvalError

_MAX_VARIANTS = 8  # expansions of "±"
_MAX_SYMBOLS = 12


def _point_table(seed: int, count: int, sign: int) -> list[list[Fraction]]:
  rng = random.Random(seed)
  return [[sign * Fraction(rng.randint(101, 997), rng.randint(37, 97))
           for _ in range(_MAX_SYMBOLS)] for _ in range(count)]


_POSITIVE_POINTS = _point_table(16, 5, 1)
_NEGATIVE_POINTS = _point_table(61, 2, -1)
_INEQUALITIES = {"<", "<=", ">", ">=", "!="}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!=", "=": "="}


def _walk(node: tuple):
  """Every node of a tree (children may be nodes, tuples of nodes, or matrix rows)."""
  stack = [node]
  while stack:
    n = stack.pop()
    if not isinstance(n, tuple) or not n:
      continue
    if isinstance(n[0], str):
      yield n
      stack.extend(c for c in n[1:] if isinstance(c, tuple))
    else:
      stack.extend(n)


def free_symbols(node: tuple) -> set[str]:
  """Symbols of an answer tree other than the constants e and i."""
  return {n[1] for n in _walk(node) if n[0] == "s" and n[1] not in ev.CONSTANTS}


def _has(node: tuple, kind: str) -> bool:
  return any(n[0] == kind for n in _walk(node))


def expand_pm(node: tuple) -> list[tuple]:
  """The variants of an expression with "±" (a ± b -> a + b, a - b), at most 8."""
  if not _has(node, "pm"):
    return [node]
  kind = node[0]
  if kind == "pm":
    out = []
    for a, b in product(expand_pm(node[1]), expand_pm(node[2])):
      out += [("add", (a, b)), ("add", (a, ("neg", b)))]
  elif kind in ("add", "mul"):
    out = [(kind, combo) for combo in product(*(expand_pm(c) for c in node[1]))]
  else:
    options = [expand_pm(c) if isinstance(c, tuple) else [c] for c in node[1:]]
    out = [(kind, *combo) for combo in product(*options)]
  if len(out) > _MAX_VARIANTS:
    raise EvalError("too many ± variants")
  return out


def _value(node: tuple):
  try:
    return ev.evaluate(node, {})
  except EvalError:
    return None


def _eval_at(node: tuple, env: dict):
  try:
    return ev.evaluate(node, env)
  except (EvalError, ZeroDivisionError, OverflowError, ValueError):
    return None


def expr_equal(a: tuple, b: tuple) -> bool:
  """Two expressions equal as functions of their symbols (module docstring)."""
  symbols = sorted(free_symbols(a) | free_symbols(b))
  if len(symbols) > _MAX_SYMBOLS:
    return False
  if not symbols:
    va, vb = _value(a), _value(b)
    return va is not None and vb is not None and ev.close(va, vb)
  agree = 0
  for point in _POSITIVE_POINTS:
    env = dict(zip(symbols, point))
    va, vb = _eval_at(a, env), _eval_at(b, env)
    if va is None or vb is None:
      if (va is None) != (vb is None):
        return False  # defined on one side only: different functions
      continue
    if not ev.close(va, vb):
      return False
    agree += 1
  if agree < 3:
    return False
  for point in _NEGATIVE_POINTS:  # |x| != x, though they agree at every positive point
    env = dict(zip(symbols, point))
    va, vb = _eval_at(a, env), _eval_at(b, env)
    if (va is not None and vb is not None and ev.is_real(va) and ev.is_real(vb)
        and not ev.close(va, vb)):
      return False
  return True


def _difference(rel_left: tuple, rel_right: tuple) -> tuple:
  return ("add", (rel_left, ("neg", rel_right)))


def proportional(f: tuple, g: tuple, positive: bool) -> bool:
  """f = k g for one constant k != 0 (k > 0 when `positive`), at generic points."""
  symbols = sorted(free_symbols(f) | free_symbols(g))
  if len(symbols) > _MAX_SYMBOLS:
    return False
  ratio = None
  agree = 0
  points = _POSITIVE_POINTS if symbols else [[]]
  for point in points:
    env = dict(zip(symbols, point))
    vf, vg = _eval_at(f, env), _eval_at(g, env)
    if vf is None or vg is None:
      continue
    zero_f, zero_g = ev.close(vf, Fraction(0)), ev.close(vg, Fraction(0))
    if zero_f or zero_g:
      if zero_f != zero_g:
        return False
      continue
    r = ev._mul(vf, ev._inv(vg))  # noqa: SLF001  the evaluator's bounded arithmetic
    if ratio is None:
      ratio = r
    elif not ev.close(r, ratio):
      return False
    agree += 1
  if ratio is None or agree < min(3, len(points)):
    return False
  return not positive or (ev.is_real(ratio) and ev.real_key(ratio) > 0)


# -- sets of real numbers --------------------------------------------------------------
# A set of reals is a sorted list of (lo, hi, lo_closed, hi_closed); a point is [a, a].

def _interval(lo, hi, lc: bool, rc: bool) -> list[tuple]:
  lc = lc and lo is not ev.NEG_INF
  rc = rc and hi is not ev.POS_INF
  if ev.less(lo, hi) or (ev.close(lo, hi) and lc and rc):
    return [(lo, hi, lc, rc)]
  return []


def _intersect(a: list[tuple], b: list[tuple]) -> list[tuple]:
  out = []
  for lo1, hi1, lc1, rc1 in a:
    for lo2, hi2, lc2, rc2 in b:
      if ev.close(lo1, lo2):
        lo, lc = lo1, lc1 and lc2
      elif ev.less(lo1, lo2):
        lo, lc = lo2, lc2
      else:
        lo, lc = lo1, lc1
      if ev.close(hi1, hi2):
        hi, rc = hi1, rc1 and rc2
      elif ev.less(hi1, hi2):
        hi, rc = hi1, rc1
      else:
        hi, rc = hi2, rc2
      out += _interval(lo, hi, lc, rc)
  return _normalize(out)


def _normalize(pieces: list[tuple]) -> list[tuple]:
  pieces = sorted(pieces, key=lambda p: (ev.real_key(p[0]), not p[2]))
  out: list[tuple] = []
  for lo, hi, lc, rc in pieces:
    if out:
      plo, phi, plc, prc = out[-1]
      touching = ev.close(lo, phi) and (lc or prc)
      if ev.less(lo, phi) or touching:
        if ev.close(hi, phi):
          out[-1] = (plo, phi, plc, prc or rc)
        elif ev.less(phi, hi):
          out[-1] = (plo, hi, plc, rc)
        continue
    out.append((lo, hi, lc, rc))
  return out


_REAL_LINE = [(ev.NEG_INF, ev.POS_INF, False, False)]


def _half_line(op: str, r) -> list[tuple]:
  if op == "<":
    return _interval(ev.NEG_INF, r, False, False)
  if op == "<=":
    return _interval(ev.NEG_INF, r, False, True)
  if op == ">":
    return _interval(r, ev.POS_INF, False, False)
  if op == ">=":
    return _interval(r, ev.POS_INF, True, False)
  if op == "=":
    return _interval(r, r, True, True)
  return _normalize(_interval(ev.NEG_INF, r, False, False) + _interval(r, ev.POS_INF, False,
                                                                          False))


def _linear_constraint(left: tuple, op: str, right: tuple, x: str) -> list[tuple] | None:
  """{x : left op right} when left - right is linear in x with a real slope."""
  f = _difference(left, right)
  values = {}
  for t in (Fraction(0), Fraction(1), Fraction(7, 3), Fraction(-5, 2)):
    v = _eval_at(f, {x: t})
    if v is None or not ev.is_real(v):
      return None
    values[t] = v
  c = values[Fraction(0)]
  m = ev._add(values[Fraction(1)], -c)  # noqa: SLF001
  for t in (Fraction(7, 3), Fraction(-5, 2)):
    if not ev.close(values[t], ev._add(c, ev._mul(m, t))):  # noqa: SLF001
      return None
  if ev.close(m, Fraction(0)):
    return None
  root = ev._mul(-c, ev._inv(m))  # noqa: SLF001
  if not isinstance(root, Fraction):
    root = ev.to_complex(root).real
    root = ev._MP.mpc(root)  # noqa: SLF001
  return _half_line(op if ev.real_key(m) > 0 else _FLIP[op], root)


def real_set(node: tuple) -> list[tuple] | None:
  """The set of reals an answer describes, or None when it is not one."""
  kind = node[0]
  try:
    if kind == "ival":
      return _interval(ev.endpoint(node[1]), ev.endpoint(node[2]), node[3], node[4])
    if kind == "tuple" and len(node[1]) == 2:
      return _interval(ev.endpoint(node[1][0]), ev.endpoint(node[1][1]), False, False)
    if kind == "set":
      return _normalize([p for item in node[1] for v in expand_pm(item)
                         for p in _interval(ev.endpoint(v), ev.endpoint(v), True, True)])
    if kind in ("union", "list"):
      parts = [real_set(p) for p in node[1]]
      if any(p is None for p in parts):
        return None
      return _normalize([piece for part in parts for piece in part])
    if kind == "rel":
      exprs, ops = node[1], node[2]
      if not set(ops) <= _INEQUALITIES | {"="} or set(ops) == {"="} and kind != "rel":
        return None
      symbols = set().union(*(free_symbols(e) for e in exprs))
      if len(symbols) != 1:
        return None
      (x,) = symbols
      out = _REAL_LINE
      for left, op, right in zip(exprs, ops, exprs[1:]):
        piece = _linear_constraint(left, op, right, x)
        if piece is None:
          return None
        out = _intersect(out, piece)
      return out
  except EvalError:
    return None
  return None


def real_sets_equal(a: list[tuple], b: list[tuple]) -> bool:
  if len(a) != len(b):
    return False
  return all(ev.close(p[0], q[0]) and ev.close(p[1], q[1]) and p[2] == q[2] and p[3] == q[3]
             for p, q in zip(a, b))


# -- dispatch ---------------------------------------------------------------------------

def _unwrap(node: tuple) -> tuple:
  while True:
    if node[0] == "list" and len(node[1]) == 1:
      node = node[1][0]
    elif node[0] == "rel" and node[2] == ("in",) and _is_target(node[1][0]):
      node = node[1][1]  # "x \in [0, 1)" is the interval
    elif node[0] in ("add", "mul", "neg") and _has(node, "mat"):
      try:  # "A + B", "2A", "AB" of written matrices: the matrix they make
        return answer_matrix.matrix_value(node)
      except EvalError:
        return node  # shapes that do not fit: compared as written, equal to no matrix
    else:
      return node


def _is_target(node: tuple) -> bool:
  """What an assignment assigns to: a name (x, a_3, f(x)), a product or ratio of names (AB,
  the segment; NO/BO), |AB|, or a tuple of names; never a number times a name ("2x = 4" is
  x = 2)."""
  if node[0] == "s":
    return node[1] not in ev.CONSTANTS
  if node[0] == "mul":  # AB, or a ratio of names NO/BO
    return all(f[0] in ("s", "mul") and _is_target(f)
               or f[0] == "inv" and f[1][0] in ("s", "mul") and _is_target(f[1])
               for f in node[1])
  if node[0] == "abs":  # |AB| names a length; |x| = 3 leaves x = -3 open, so it is no name
    return node[1][0] == "mul" and _is_target(node[1])
  return node[0] == "tuple" and all(_is_target(x) for x in node[1])


def solutions(node: tuple) -> tuple[tuple, list[tuple]] | None:
  """Of a list of named values ("a = 3, b = 7"; "p=5, q=2; p=7, q=2"): (names, one tuple
  of values per solution, in the names' order); a repeated name starts the next solution.
  None unless every item names one value and every solution names the same things."""
  if node[0] != "list" or len(node[1]) < 2:
    return None
  groups: list[dict] = [{}]
  for item in node[1]:
    value = assignment(item)
    if value is None:
      return None
    target = _target_of(item)
    if target[0] == "tuple":
      return None
    key = repr(target)
    if key in groups[-1]:
      groups.append({})
    groups[-1][key] = value
  names = tuple(groups[0])
  if any(set(g) != set(names) for g in groups):
    return None
  return names, [tuple(g[n] for n in names) for g in groups]


def _values_of(node: tuple) -> list[tuple]:
  """The ordered items of a bare answer: a tuple's or list's items, a lone value itself."""
  if node[0] in ("list", "tuple", "seq", "set"):
    return list(node[1])
  return [node]


def _named_equal(gold: tuple, pred: tuple, gs, ps) -> bool:
  """Named values: by name when both name the same things, else in the gold's order."""
  if gs is not None and ps is not None:
    (g_names, g_sols), (p_names, p_sols) = gs, ps
    if set(g_names) == set(p_names):  # "a_37 = 19, a_3 = 2" answers "a_3 = 2, a_37 = 19"
      order = [p_names.index(n) for n in g_names]
      p_sols = [tuple(sol[i] for i in order) for sol in p_sols]
  elif gs is not None:
    g_sols = gs[1]
    if len(g_sols) == 1:
      p_sols = [tuple(_values_of(pred))]
    else:  # several solutions: the prediction lists them as tuples
      p_sols = [tuple(_values_of(x)) for x in _values_of(pred)]
  else:
    p_sols = ps[1]
    if len(p_sols) == 1:
      if gold[0] != "tuple":  # a bare list gives no order: "3, 7" == "b = 7, a = 3"
        return _unordered_equal(_elements(gold), list(p_sols[0]))
      g_sols = [tuple(gold[1])]
    else:
      g_sols = [tuple(_values_of(x)) for x in _values_of(gold)]
  if len(g_sols) == 1 and len(p_sols) == 1:
    return _ordered_equal(g_sols[0], p_sols[0])
  return (all(any(_ordered_equal(g, p) for p in p_sols) for g in g_sols)
          and all(any(_ordered_equal(g, p) for g in g_sols) for p in p_sols))


def assignment(node: tuple) -> tuple | None:
  """The value of "x = 5" (or "x = 1 + 4 = 5", "5 = x", "(x, y) = (1, 2)"), else None."""
  if node[0] != "rel" or set(node[2]) != {"="}:
    return None
  first, last = node[1][0], node[1][-1]
  for target, value in ((first, last), (last, first)):
    if _is_target(target) and not free_symbols(target) & free_symbols(value):
      return value
  return None


def _is_relation(node: tuple) -> bool:
  return node[0] == "rel" and node[2] != ("in",)


def _is_inequality(node: tuple) -> bool:
  return node[0] == "rel" and bool(set(node[2]) & _INEQUALITIES)


def _text(node: tuple) -> str | None:
  if node[0] == "text":
    words = node[1]
  elif node[0] == "s":
    words = node[1]
  else:
    return None
  words = "".join(words.lower().split())
  if len(words) >= 3 and words[0] == "(" and words[-1] == ")":
    words = words[1:-1]
  return words


def _elements(node: tuple) -> list[tuple]:
  """Items of a collection, "±" expanded and assignments replaced by their values."""
  items = node[1] if node[0] in ("list", "set", "tuple", "seq") else (node,)
  out = []
  for item in items:
    value = assignment(item)
    out.extend(expand_pm(value if value is not None else item))
  return out


def _unordered_equal(xs: list[tuple], ys: list[tuple]) -> bool:
  """Every x matches some y and every y some x (set semantics)."""
  if not xs or not ys:
    return not xs and not ys
  return (all(any(equivalent(x, y) for y in ys) for x in xs)
          and all(any(equivalent(x, y) for x in xs) for y in ys))


def _ordered_equal(xs, ys) -> bool:
  return len(xs) == len(ys) and all(equivalent(x, y) for x, y in zip(xs, ys))


def _relations_equal(g: tuple, p: tuple) -> bool:
  g_ops, p_ops = g[2], p[2]
  g_exprs, p_exprs = g[1], p[1]
  if set(g_ops) == {"="} and set(p_ops) == {"="}:
    gv, pv = assignment(g), assignment(p)
    if gv is not None and pv is not None and _target_of(g) == _target_of(p):
      return equivalent(gv, pv)
    return proportional(_difference(g_exprs[0], g_exprs[-1]),
                        _difference(p_exprs[0], p_exprs[-1]), positive=False)
  if set(p_ops) <= {">", ">="}:  # write both with < and <=
    p_ops, p_exprs = tuple(_FLIP[o] for o in reversed(p_ops)), tuple(reversed(p_exprs))
  if set(g_ops) <= {">", ">="}:
    g_ops, g_exprs = tuple(_FLIP[o] for o in reversed(g_ops)), tuple(reversed(g_exprs))
  if g_ops != p_ops:
    return False
  if len(g_ops) == 1:
    return proportional(_difference(g_exprs[0], g_exprs[1]),
                        _difference(p_exprs[0], p_exprs[1]), positive=g_ops[0] != "!=")
  return all(expr_equal(a, b) for a, b in zip(g_exprs, p_exprs))


def _target_of(node: tuple) -> tuple:
  first, last = node[1][0], node[1][-1]
  return first if _is_target(first) else last


def _set_like(node: tuple) -> bool:
  if node[0] == "tuple" and len(node[1]) == 2:  # (0, \infty) is an interval
    return any(_has(x, "c") and ("c", "inf") in _walk(x) for x in node[1])
  return node[0] in ("ival", "union") or _is_inequality(node)


def _percent_equal(g: tuple, p: tuple) -> bool:
  if g[0] == "pct" and p[0] == "pct":
    return equivalent(g[1], p[1])
  pct, plain = (g[1], p) if g[0] == "pct" else (p[1], g)
  return (equivalent(pct, plain)
          or equivalent(("mul", (pct, ("n", Fraction(1, 100)))), plain))


def _vector(node: tuple) -> tuple | None:
  if node[0] == "mat":
    rows = node[1]
    if len(rows) == 1:
      return rows[0]
    if all(len(r) == 1 for r in rows):
      return tuple(r[0] for r in rows)
  return None


def equivalent(gold: tuple, pred: tuple) -> bool:
  """Whether the predicted answer tree means the gold one (module docstring)."""
  gold, pred = _unwrap(gold), _unwrap(pred)
  gk, pk = gold[0], pred[0]
  if "text" in (gk, pk):
    gt, pt = _text(gold), _text(pred)
    return gt is not None and gt == pt
  if "pct" in (gk, pk):
    return _percent_equal(gold, pred)
  g_rel, p_rel = _is_relation(gold), _is_relation(pred)
  equation = (g_rel and set(gold[2]) == {"="}) or (p_rel and set(pred[2]) == {"="})
  if g_rel != p_rel and equation:
    # An assignment compares its value ("x = 5" == "5"; a predicted "y = 2x + 3" answers a
    # gold "2x + 3"), but a gold equation whose value has variables ("y = 2x + 3") asks
    # for the equation; any other relation never equals a bare value.
    g_val = assignment(gold) if g_rel else gold
    p_val = assignment(pred) if p_rel else pred
    if p_rel and p_val is None and not free_symbols(pred) and set(pred[2]) == {"="}:
      p_val = pred[1][-1]  # a chain of equal constants "1/2 \$ = 10/9": its last side
    if g_val is None or p_val is None or (g_rel and free_symbols(g_val)):
      return False
    return equivalent(g_val, p_val)
  gs, ps = solutions(gold), solutions(pred)
  if gs is not None or ps is not None:
    return _named_equal(gold, pred, gs, ps)
  if _set_like(gold) or _set_like(pred):
    gs, ps = real_set(gold), real_set(pred)
    if gs is not None and ps is not None:
      return real_sets_equal(gs, ps)
    if g_rel and p_rel:
      return _relations_equal(gold, pred)
    return False
  if g_rel and p_rel:
    return _relations_equal(gold, pred)
  if g_rel or p_rel:
    return False
  if gk == "mat" or pk == "mat":
    if gk == pk:
      return (len(gold[1]) == len(pred[1])
              and all(_ordered_equal(a, b) for a, b in zip(gold[1], pred[1])))
    vec, other = (_vector(gold), pred) if gk == "mat" else (_vector(pred), gold)
    return vec is not None and other[0] == "tuple" and _ordered_equal(vec, other[1])
  collections = ("list", "set", "tuple", "seq")
  if gk in collections or pk in collections or _has(gold, "pm") or _has(pred, "pm"):
    if gk in ("tuple", "seq"):
      if pk not in (gk, "list"):
        return False
      return _ordered_equal(_elements(gold), _elements(pred))
    if gk == "set" and pk in ("tuple", "seq"):
      return False
    return _unordered_equal(_elements(gold), _elements(pred))
  if gk in ("ival", "union") or pk in ("ival", "union"):
    return False
  return expr_equal(gold, pred)


def has_value(node: tuple) -> bool:
  """False when the answer is a constant expression without a value (1/0, 0^0)."""
  node = _unwrap(node)
  if node[0] in ("add", "mul", "neg", "inv", "pow", "root", "f", "log", "abs", "fact",
                 "binom", "n", "c") and not free_symbols(node) and not _has(node, "pm"):
    if node == ("c", "inf"):
      return True
    return _value(node) is not None
  return True


_KINDS = {"n": "number", "pct": "percentage", "tuple": "tuple", "ival": "interval",
          "set": "set", "list": "list", "seq": "list", "mat": "matrix", "union": "union",
          "text": "text"}


def kind_of(node: tuple) -> str:
  """A human name of the answer's type ("number", "expression", "equation", ...)."""
  node = _unwrap(node)
  if node[0] == "rel":
    if set(node[2]) == {"="}:
      return "assignment" if assignment(node) is not None else "equation"
    return "inequality"
  if node[0] in _KINDS:
    return _KINDS[node[0]]
  if node[0] == "s" and not free_symbols(node):
    return "number"
  return "expression" if free_symbols(node) else "number"
