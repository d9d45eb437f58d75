"""Builds the code verifier's labelled set: correct and subtly wrong programs, both formats.

  python benchmarks/rewards/code_labelled_set.py [--out tests/rewards/data/code_labelled.jsonl]

Every family is a small problem with a trusted reference function (which computes the
expected outputs), hand-picked test cases (edge cases that expose the mutants), one or
more correct programs and mutants, each with a hand-declared label: "pass", "wrong",
"runtime_error" or "timeout". Each program is written as a `solve` function and emitted
twice: as a function-call problem (fn_name "solve") and as a stdin/stdout program (the
family's reader and printer around the same `solve`). Stdin-only mutants (output format)
and no-code responses are added. Before writing, every label except "timeout" is checked
by calling the program's `solve` here, in this trusted process, on the cases in order (the
first case that raises is runtime_error, the first that differs is wrong): a label that
disagrees stops the build. The verifier under test (sandbox, harness, extraction,
comparison) is not used to make or check the labels.

Each program is also emitted a third time as an assertion problem ({"test_code",
"entry_point": "solve"}, HumanEval's `check(candidate)` of one assert per case), labelled
by running that check here, directly, as HumanEval's own harness does (program and check
in one namespace: an assert that fails is wrong, an exception raised in `solve` a runtime
error; timeouts keep their hand label). The verifier's agreement with that direct run is
what the assertion rows measure.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "rewards" / "data" / "code_labelled.jsonl"

# Readers / printers of the stdin format, by the family's argument shape.
LIST_IN = ("import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\n"
           "args = (list(map(int, data[1:1 + n])),)\n")
INT_IN = "import sys\nargs = (int(sys.stdin.readline()),)\n"
INTS_IN = "import sys\nargs = tuple(map(int, sys.stdin.read().split()))\n"
STR_IN = "import sys\nargs = (sys.stdin.readline().rstrip('\\n'),)\n"
LIST_X_IN = ("import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\n"
             "args = (list(map(int, data[1:1 + n])), int(data[1 + n]))\n")
PRINT = "print(solve(*args))\n"
PRINT_LIST = "print(' '.join(map(str, solve(*args))))\n"
PRINT_BOOL = "print('YES' if solve(*args) else 'NO')\n"


def _fmt_list(xs):
  return f"{len(xs)}\n{' '.join(map(str, xs))}\n"


def _median(xs):
  s = sorted(xs)
  n = len(s)
  return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _balanced(s):
  stack, pairs = [], {")": "(", "]": "[", "}": "{"}
  for c in s:
    if c in "([{":
      stack.append(c)
    elif c in pairs:
      if not stack or stack.pop() != pairs[c]:
        return False
  return not stack


def _compress(s):
  out, i = [], 0
  while i < len(s):
    j = i
    while j < len(s) and s[j] == s[i]:
      j += 1
    out.append(f"{s[i]}{j - i}")
    i = j
  return "".join(out)


def _collatz(n):
  steps = 0
  while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
  return steps


def _max_sub(xs):
  best, cur = xs[0], 0
  for x in xs:
    cur = max(x, cur + x)
    best = max(best, cur)
  return best


# name: (reference, cases, stdin reader, stdin printer, stdin formatter of args,
#        stdin formatter of the result, [correct solve], [(label, mutant solve)])
FAMILIES = {
    "sum_list": (
        sum, [([],), ([5],), ([1, 2, 3],), ([-7, 10**12, 3],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  return sum(xs)\n",
         "def solve(xs):\n  t = 0\n  for x in xs:\n    t += x\n  return t\n"],
        [("wrong", "def solve(xs):\n  return sum(xs[1:])\n"),
         ("runtime_error", "def solve(xs):\n  return xs[0] + sum(xs[1:])\n"),
         ("wrong", "def solve(xs):\n  return sum(x for x in xs if x > 0)\n"),
         ("timeout", "def solve(xs):\n  t = 0\n  i = 0\n  while i < len(xs):\n"
                     "    t += xs[i]\n  return t\n")]),
    "max_subarray": (
        _max_sub, [([1, -2, 3, 4],), ([-3, -1, -2],), ([5],), ([2, -1, 2, -1, 2],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  best, cur = xs[0], 0\n  for x in xs:\n    cur = max(x, cur + x)\n"
         "    best = max(best, cur)\n  return best\n"],
        [("wrong", "def solve(xs):\n  best = cur = 0\n  for x in xs:\n    cur = max(0, cur + x)"
                   "\n    best = max(best, cur)\n  return best\n"),
         ("wrong", "def solve(xs):\n  return max(xs)\n"),
         ("wrong", "def solve(xs):\n  return sum(x for x in xs if x > 0) or max(xs)\n")]),
    "is_prime": (
        lambda n: n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1)),
        [(2,), (1,), (17,), (25,), (49,), (97,)],
        INT_IN, PRINT_BOOL, lambda a: f"{a[0]}\n", lambda r: "YES" if r else "NO",
        ["def solve(n):\n  if n < 2:\n    return False\n  d = 2\n  while d * d <= n:\n"
         "    if n % d == 0:\n      return False\n    d += 1\n  return True\n"],
        [("wrong", "def solve(n):\n  return n > 1 and all(n % d for d in range(2, int(n ** 0.5)))"
                   "\n"),
         ("wrong", "def solve(n):\n  return all(n % d for d in range(2, n))\n"),
         ("wrong", "def solve(n):\n  return n % 2 == 1 or n == 2\n")]),
    "fib_mod": (
        lambda n: _fib(n), [(0,), (1,), (2,), (10,), (90,), (1000,)],
        INT_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(n):\n  a, b = 0, 1\n  for _ in range(n):\n    a, b = b, (a + b) % 1000000007"
         "\n  return a\n"],
        [("wrong", "def solve(n):\n  a, b = 0, 1\n  for _ in range(n - 1):\n"
                   "    a, b = b, (a + b) % 1000000007\n  return b\n"),
         ("wrong", "def solve(n):\n  a, b = 0, 1\n  for _ in range(n):\n    a, b = b, a + b\n"
                   "  return a\n"),
         ("runtime_error", "def solve(n):\n  if n < 2:\n    return n\n"
                           "  return (solve(n - 1) + solve(n - 2)) % 1000000007 if n < 30 "
                           "else [][n]\n")]),
    "gcd": (
        math.gcd, [(12, 18), (7, 13), (0, 5), (9, 0), (100, 75)],
        INTS_IN, PRINT, lambda a: f"{a[0]} {a[1]}\n", str,
        ["def solve(a, b):\n  while b:\n    a, b = b, a % b\n  return a\n",
         "import math\ndef solve(a, b):\n  return math.gcd(a, b)\n"],
        [("timeout", "def solve(a, b):\n  while a != b:\n    if a > b:\n      a -= b\n"
                     "    else:\n      b -= a\n  return a\n"),
         ("wrong", "def solve(a, b):\n  return min(a, b)\n"),
         ("runtime_error", "def solve(a, b):\n  return solve(b, a % b) if a % b else b\n")]),
    "reverse_words": (
        lambda s: " ".join(reversed(s.split())),
        [("hello world",), ("a",), ("  the sky   is blue ",), ("x y z",)],
        STR_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(s):\n  return ' '.join(reversed(s.split()))\n",
         "def solve(s):\n  return ' '.join(s.split()[::-1])\n"],
        [("wrong", "def solve(s):\n  return s[::-1]\n"),
         ("wrong", "def solve(s):\n  return ' '.join(w[::-1] for w in s.split())\n"),
         ("wrong", "def solve(s):\n  return ' '.join(sorted(s.split(), reverse=True))\n")]),
    "count_vowels": (
        lambda s: sum(c in "aeiouAEIOU" for c in s), [("hello",), ("AEIOU",), ("rhythm",),
                                                       ("Yay",), ("banana",)],
        STR_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(s):\n  return sum(c in 'aeiouAEIOU' for c in s)\n"],
        [("wrong", "def solve(s):\n  return sum(c in 'aeiou' for c in s)\n"),
         ("wrong", "def solve(s):\n  return sum(c in 'aeiouyAEIOUY' for c in s)\n"),
         ("wrong", "def solve(s):\n  return len(set(s.lower()) & set('aeiou'))\n")]),
    "lower_bound": (
        lambda xs, x: __import__("bisect").bisect_left(xs, x),
        [([1, 3, 3, 5], 3), ([1, 2], 0), ([1, 2], 9), ([], 4), ([2, 2, 2], 2)],
        LIST_X_IN, PRINT, lambda a: _fmt_list(a[0]) + f"{a[1]}\n", str,
        ["import bisect\ndef solve(xs, x):\n  return bisect.bisect_left(xs, x)\n",
         "def solve(xs, x):\n  lo, hi = 0, len(xs)\n  while lo < hi:\n    mid = (lo + hi) // 2\n"
         "    if xs[mid] < x:\n      lo = mid + 1\n    else:\n      hi = mid\n  return lo\n"],
        [("wrong", "import bisect\ndef solve(xs, x):\n  return bisect.bisect_right(xs, x)\n"),
         ("runtime_error", "def solve(xs, x):\n  return xs.index(x)\n"),
         ("timeout", "def solve(xs, x):\n  lo, hi = 0, len(xs)\n  while lo < hi:\n"
                     "    mid = (lo + hi) // 2\n    if xs[mid] < x:\n      lo = mid\n"
                     "    else:\n      hi = mid\n  return lo\n")]),
    "median": (
        _median, [([3, 1, 2],), ([4, 1, 3, 2],), ([5],), ([1, 2],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  s = sorted(xs)\n  n = len(s)\n"
         "  return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2\n"],
        [("wrong", "def solve(xs):\n  s = sorted(xs)\n  n = len(s)\n"
                   "  return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2\n"),
         ("wrong", "def solve(xs):\n  n = len(xs)\n"
                   "  return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n"),
         ("wrong", "def solve(xs):\n  return sorted(xs)[len(xs) // 2]\n")]),
    "balanced": (
        _balanced, [("([]{})",), ("([)]",), ("((",), ("",), ("}{",)],
        STR_IN, PRINT_BOOL, lambda a: f"{a[0]}\n", lambda r: "YES" if r else "NO",
        ["def solve(s):\n  stack, pairs = [], {')': '(', ']': '[', '}': '{'}\n  for c in s:\n"
         "    if c in '([{':\n      stack.append(c)\n    elif c in pairs:\n"
         "      if not stack or stack.pop() != pairs[c]:\n        return False\n"
         "  return not stack\n"],
        [("wrong", "def solve(s):\n  return all(s.count(a) == s.count(b) for a, b in "
                   "('()', '[]', '{}'))\n"),
         ("runtime_error", "def solve(s):\n  stack, pairs = [], {')': '(', ']': '[', '}': '{'}"
                           "\n  for c in s:\n    if c in '([{':\n      stack.append(c)\n"
                           "    elif stack.pop() != pairs[c]:\n      return False\n"
                           "  return not stack\n"),
         ("wrong", "def solve(s):\n  depth = 0\n  for c in s:\n    depth += 1 if c in '([{' "
                   "else -1\n    if depth < 0:\n      return False\n  return depth == 0\n")]),
    "factorial_mod": (
        lambda n: math.factorial(n) % 1000000007, [(0,), (1,), (5,), (20,), (500,)],
        INT_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(n):\n  r = 1\n  for i in range(2, n + 1):\n    r = r * i % 1000000007\n"
         "  return r\n"],
        [("wrong", "def solve(n):\n  r = 1\n  for i in range(1, n):\n    r = r * i % 1000000007"
                   "\n  return r\n"),
         ("wrong", "def solve(n):\n  r = 1\n  for i in range(2, n + 1):\n    r *= i\n"
                   "  return r % 1000000009\n"),
         ("runtime_error", "def solve(n):\n  return 1 if n == 0 else n * solve(n - 1) % "
                           "1000000007 if n < 100 else None + 1\n")]),
    "palindrome": (
        lambda s: [c.lower() for c in s if c.isalnum()] ==
        [c.lower() for c in s if c.isalnum()][::-1],
        [("racecar",), ("A man, a plan, a canal: Panama",), ("ab",), ("No 'x' in Nixon",)],
        STR_IN, PRINT_BOOL, lambda a: f"{a[0]}\n", lambda r: "YES" if r else "NO",
        ["def solve(s):\n  t = [c.lower() for c in s if c.isalnum()]\n  return t == t[::-1]\n"],
        [("wrong", "def solve(s):\n  return s == s[::-1]\n"),
         ("wrong", "def solve(s):\n  t = [c for c in s if c.isalnum()]\n  return t == t[::-1]\n"),
         ("wrong", "def solve(s):\n  t = s.lower().replace(' ', '')\n  return t == t[::-1]\n")]),
    "digit_sum": (
        lambda n: sum(int(c) for c in str(abs(n))), [(123,), (0,), (-45,), (9999,)],
        INT_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(n):\n  return sum(int(c) for c in str(abs(n)))\n",
         "def solve(n):\n  n = abs(n)\n  t = 0\n  while n:\n    t += n % 10\n    n //= 10\n"
         "  return t\n"],
        [("runtime_error", "def solve(n):\n  return sum(int(c) for c in str(n))\n"),
         ("timeout", "def solve(n):\n  t = 0\n  while n != 0:\n    t += n % 10\n    n //= 10\n"
                     "  return t\n"),
         ("wrong", "def solve(n):\n  return sum(int(c) for c in str(abs(n))[1:])\n")]),
    "leap_year": (
        lambda y: y % 4 == 0 and (y % 100 != 0 or y % 400 == 0),
        [(2024,), (1900,), (2000,), (2023,)],
        INT_IN, PRINT_BOOL, lambda a: f"{a[0]}\n", lambda r: "YES" if r else "NO",
        ["def solve(y):\n  return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)\n",
         "import calendar\ndef solve(y):\n  return calendar.isleap(y)\n"],
        [("wrong", "def solve(y):\n  return y % 4 == 0\n"),
         ("wrong", "def solve(y):\n  return y % 4 == 0 and y % 100 != 0\n"),
         ("wrong", "def solve(y):\n  return y % 400 == 0\n")]),
    "unique_count": (
        lambda xs: len(set(xs)), [([1, 1, 2],), ([],), ([3, 3, 3],), ([1, 2, 3],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  return len(set(xs))\n"],
        [("wrong", "def solve(xs):\n  return len(xs)\n"),
         ("wrong", "def solve(xs):\n  return sum(1 for i in range(1, len(xs)) if xs[i] != "
                   "xs[i - 1]) + 1\n"),
         ("runtime_error", "def solve(xs):\n  return len(set(xs)) if xs else max(xs)\n")]),
    "triangular": (
        lambda n: n * (n + 1) // 2, [(1,), (4,), (0,), (10**6,)],
        INT_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(n):\n  return n * (n + 1) // 2\n"],
        [("wrong", "def solve(n):\n  return n * (n - 1) // 2\n"),
         ("wrong", "def solve(n):\n  return sum(range(n))\n"),
         ("timeout", "def solve(n):\n  t = 0\n  for i in range(n + 1):\n    for j in range(i):"
                     "\n      t += 1\n  return t\n")]),
    "collatz": (
        _collatz, [(1,), (6,), (27,), (97,)],
        INT_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(n):\n  steps = 0\n  while n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1"
         "\n    steps += 1\n  return steps\n"],
        [("wrong", "def solve(n):\n  steps = 1\n  while n != 1:\n"
                   "    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\n  return steps\n"),
         ("timeout", "def solve(n):\n  steps = 0\n  while n != 0:\n"
                     "    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\n"
                     "  return steps\n"),
         ("wrong", "def solve(n):\n  steps = 0\n  while n > 2:\n"
                   "    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\n"
                   "  return steps\n")]),
    "compress": (
        _compress, [("aaabb",), ("a",), ("abc",), ("zzzzzzzzzzzz",), ("aabaa",)],
        STR_IN, PRINT, lambda a: f"{a[0]}\n", str,
        ["def solve(s):\n  out, i = [], 0\n  while i < len(s):\n    j = i\n"
         "    while j < len(s) and s[j] == s[i]:\n      j += 1\n"
         "    out.append(s[i] + str(j - i))\n    i = j\n  return ''.join(out)\n",
         "import itertools\ndef solve(s):\n"
         "  return ''.join(k + str(len(list(g))) for k, g in itertools.groupby(s))\n"],
        [("wrong", "def solve(s):\n  out, count = [], 1\n  for i in range(1, len(s)):\n"
                   "    if s[i] == s[i - 1]:\n      count += 1\n    else:\n"
                   "      out.append(s[i - 1] + str(count))\n      count = 1\n"
                   "  return ''.join(out)\n"),
         ("wrong", "def solve(s):\n  return ''.join(c + str(s.count(c)) for c in "
                   "dict.fromkeys(s))\n"),
         ("wrong", "def solve(s):\n  out, i = [], 0\n  while i < len(s):\n    j = i\n"
                   "    while j < len(s) and s[j] == s[i]:\n      j += 1\n"
                   "    out.append(s[i] + str(min(j - i, 9)))\n    i = j\n"
                   "  return ''.join(out)\n")]),
    "second_largest": (
        lambda xs: sorted(set(xs))[-2], [([3, 1, 2],), ([5, 5, 4],), ([1, 2],),
                                         ([-1, -1, -3, -2],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  return sorted(set(xs))[-2]\n"],
        [("wrong", "def solve(xs):\n  return sorted(xs)[-2]\n"),
         ("wrong", "def solve(xs):\n  best = second = 0\n  for x in xs:\n    if x > best:\n"
                   "      best, second = x, best\n    elif best > x > second:\n"
                   "      second = x\n  return second\n"),
         ("runtime_error", "def solve(xs):\n  s = sorted(set(xs))\n  return s[-2] if len(xs) "
                           "== 3 else s[len(s)]\n")]),
    "mean_2dp": (
        lambda xs: f"{sum(xs) / len(xs):.2f}", [([1, 2],), ([3],), ([1, 1, 2],), ([-1, 2],)],
        LIST_IN, PRINT, lambda a: _fmt_list(a[0]), str,
        ["def solve(xs):\n  return f'{sum(xs) / len(xs):.2f}'\n",
         "def solve(xs):\n  return '%.2f' % (sum(xs) / len(xs))\n"],
        [("wrong", "def solve(xs):\n  return f'{sum(xs) // len(xs):.2f}'\n"),
         ("wrong", "def solve(xs):\n  return f'{sum(xs) / (len(xs) + 1):.2f}'\n"),
         ("wrong", "def solve(xs):\n  return f'{sum(xs) / len(xs):.0f}'\n")]),
}


def _fib(n):
  a, b = 0, 1
  for _ in range(n):
    a, b = b, (a + b) % 1000000007
  return a


def _check_label(name, solve_src, label, ref, cases):
  """The label's claim, checked by calling `solve` here (trusted code, no sandbox)."""
  if label == "timeout":
    return
  namespace = {}
  exec(solve_src, namespace)  # noqa: S102  (our own hand-written programs)
  got_label = "pass"
  for args in cases:
    try:
      got = namespace["solve"](*[list(a) if isinstance(a, list) else a for a in args])
    except Exception:  # noqa: BLE001  (the mutant's runtime error is what we look for)
      got_label = "runtime_error"
      break
    want = ref(*args)
    if json.loads(json.dumps(got)) != json.loads(json.dumps(want)) or type(got) is not type(
        want):
      got_label = "wrong"
      break
  if got_label != label:
    raise SystemExit(f"{name}: labelled {label!r} but its solve() gives {got_label!r}:\n"
                     f"{solve_src}")


def _assert_test(ref, cases):
  lines = [f"    assert candidate(*{list(a)!r}) == {ref(*a)!r}" for a in cases]
  return "def check(candidate):\n" + "\n".join(lines) + "\n"


def _direct_check(solve_src, test_code, label):
  """The assertion problem's label: its check run directly on `solve` (trusted code)."""
  if label == "timeout":
    return label
  namespace, raised = {}, []
  exec(solve_src + "\n" + test_code, namespace)  # noqa: S102  (our own programs and checks)

  def candidate(*args):
    try:
      return namespace["solve"](*args)
    except Exception:
      raised.append(True)
      raise

  try:
    namespace["check"](candidate)
  except Exception:  # noqa: BLE001  (a failed check is the label we look for)
    return "runtime_error" if raised else "wrong"
  return "pass"


def _fence(program):
  return f"Let me reason about the problem first.\n\n```python\n{program}```\n"


def build() -> list[dict]:
  rows = []
  for name, (ref, cases, reader, printer, fmt_in, fmt_out, correct, mutants) in (
      FAMILIES.items()):
    programs = [("pass", p) for p in correct] + list(mutants)
    fn_answer = json.dumps({"fn_name": "solve", "inputs": [list(a) for a in cases],
                            "outputs": [ref(*a) for a in cases], "wrapped": False})
    io_answer = json.dumps({"fn_name": None, "inputs": [fmt_in(a) for a in cases],
                            "outputs": [fmt_out(ref(*a)) + "\n" for a in cases],
                            "wrapped": False})
    test_code = _assert_test(ref, cases)
    as_answer = json.dumps({"test_code": test_code, "entry_point": "solve"})
    for k, (label, solve) in enumerate(programs):
      _check_label(name, solve, label, ref, cases)
      rows.append({"id": f"{name}-as-{k}", "family": name, "format": "assert",
                   "label": _direct_check(solve, test_code, label),
                   "response": _fence(solve), "answer": as_answer})
      rows.append({"id": f"{name}-fn-{k}", "family": name, "format": "function",
                   "label": label, "response": _fence(solve), "answer": fn_answer})
      rows.append({"id": f"{name}-io-{k}", "family": name, "format": "stdin",
                   "label": label, "response": _fence(solve + reader + printer),
                   "answer": io_answer})
    # Output-format mutants of the stdin program (the function is right).
    solve = correct[0]
    rows.append({"id": f"{name}-io-fmt-debug", "family": name, "format": "stdin",
                 "label": "wrong", "answer": io_answer,
                 "response": _fence(solve + reader + "print('answer:', solve(*args))\n")})
    # Trailing spaces and blank lines are tolerated, as by LiveCodeBench's checker.
    rows.append({"id": f"{name}-io-fmt-trailing", "family": name, "format": "stdin",
                 "label": "pass", "answer": io_answer,
                 "response": _fence(solve + reader + printer[:-2] + ", end=' \\n\\n')\n")})
  sum_fn = next(r["answer"] for r in rows if r["id"] == "sum_list-fn-0")
  sum_io = next(r["answer"] for r in rows if r["id"] == "sum_list-io-0")
  no_code = [
      "The answer is sum(xs).",
      "```python\ndef solve(xs):\n  return sum(xs)\n",  # unclosed fence (truncated)
      "```cpp\nint solve(vector<int> xs) { return 0; }\n```",
      "<think>```python\ndef solve(xs):\n  return sum(xs)\n```</think>I give up.",
      "```python\n\n```",
  ]
  for k, response in enumerate(no_code):
    for fmt, answer in (("function", sum_fn), ("stdin", sum_io)):
      rows.append({"id": f"no_code-{fmt}-{k}", "family": "no_code", "format": fmt,
                   "label": "no_code", "response": response, "answer": answer})
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(OUT))
  args = parser.parse_args()
  rows = build()
  with open(args.out, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  labels = {}
  for row in rows:
    labels[row["label"]] = labels.get(row["label"], 0) + 1
  print(f"{len(rows)} programs -> {args.out}: {labels}")


if __name__ == "__main__":
  main()
