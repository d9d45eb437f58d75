r"""The built-in code task: translate a small integer function into Python that passes tests.

Problems are drawn from templates written in math notation, so the policy must translate
rather than copy, and the classic subtle errors fail the tests: x^2 is not x^2 in Python
(that is XOR), floor(x/3) is not int(x/3) for negative x (the tests always hold one).

  template   prompt (compact)      a correct program (compact)
  linear     f(x)=3x+1:            ```\nf=lambda x:3*x+1\n```
  square     f(x)=x^2-4:           ```\nf=lambda x:x**2-4\n```
  mod        f(x)=x mod 5:         ```\nf=lambda x:x%5\n```
  floor      f(x)=floor(x/3):      ```\nf=lambda x:x//3\n```
  abs        f(x)=|x-4|:           ```\nf=lambda x:abs(x-4)\n```
  max        f(x)=max(x,-4):       ```\nf=lambda x:max(x,-4)\n```

Constants lie in [-30, 30] (factors in [2, 20], moduli and divisors in [2, 30]): about
1,400 distinct problems.

Styles: "compact" (function-call tests of `f`, a few dozen bytes per answer, for the CPU
demo's byte-level policy) and "instruct" (a stdin/stdout program, a prompt that reads
naturally for a chat model). The answer is the canonical tests JSON of
jaxrl_scale/data/code_layouts.py; records follow the contract of jaxrl_scale.data.tasks,
with task "code".
"""

from __future__ import annotations

import json

from jaxrl_scale.data import task_common

TEMPLATES = ("linear", "square", "mod", "floor", "abs", "max")


def _signed(b: int) -> str:
  return f"+{b}" if b >= 0 else f"-{-b}"


def _offset(stream: task_common.Stream) -> int:
  """A non-zero integer in [-30, 30]."""
  b = stream.integer(1, 30)
  return b if stream.below(2) else -b


def _draw(stream: task_common.Stream, template: str) -> tuple[str, str, object]:
  """(math notation, Python expression of x, evaluator) for one drawn problem."""
  if template == "linear":
    a, b = stream.integer(2, 20), _offset(stream)
    return f"{a}x{_signed(b)}", f"{a}*x{_signed(b)}", lambda x: a * x + b
  if template == "square":
    b = _offset(stream)
    return f"x^2{_signed(b)}", f"x**2{_signed(b)}", lambda x: x * x + b
  if template == "mod":
    m = stream.integer(2, 30)
    return f"x mod {m}", f"x%{m}", lambda x: x % m
  if template == "floor":
    d = stream.integer(2, 30)
    return f"floor(x/{d})", f"x//{d}", lambda x: x // d
  if template == "abs":
    b = _offset(stream)
    return f"|x{_signed(-b)}|", f"abs(x{_signed(-b)})", lambda x: abs(x - b)
  b = stream.integer(-30, 30)
  return f"max(x,{b})", f"max(x,{b})", lambda x: max(x, b)


def code(n: int, seed: int = 0, *, templates: str = ",".join(TEMPLATES),
         style: str = "compact", num_tests: int = 4) -> list[dict[str, str]]:
  """`n` distinct code problems with `num_tests` test cases each (one with negative x).

  Args:
    n: number of records.
    seed: selects the set; the first k records of a set do not depend on n.
    templates: comma-separated subset of TEMPLATES.
    style: "compact" (function-call tests) or "instruct" (stdin/stdout tests).
    num_tests: test cases per problem (2..16).

  Returns:
    Records in the contract of jaxrl_scale.data.tasks.
  """
  task_common.check_common("code", n, seed, style)
  check = task_common.check
  chosen = tuple(t.strip() for t in templates.split(",") if t.strip())
  check(bool(chosen) and set(chosen) <= set(TEMPLATES), "code", "templates",
        f"must be a comma-separated subset of {TEMPLATES}, got {templates!r}")
  check(2 <= num_tests <= 16, "code", "num_tests", f"must be in [2, 16], got {num_tests}")
  params = {"templates": ",".join(chosen), "style": style, "num_tests": num_tests}
  fingerprint = task_common.fingerprint("code", params, seed)
  stream = task_common.Stream(f"code:{fingerprint}")
  seen: set[str] = set()
  records, attempts = [], 0
  while len(records) < n:
    attempts += 1
    if attempts > 50 * n + 5_000:
      check(False, "code", "n", f"found only {len(records)} of {n} distinct "
            f"problems with templates={params['templates']!r}")
    notation, expression, fn = _draw(stream, chosen[stream.below(len(chosen))])
    if notation in seen:
      continue
    seen.add(notation)
    xs = [-stream.integer(1, 20)]
    while len(xs) < num_tests:
      x = stream.integer(-20, 20)
      if x not in xs:
        xs.append(x)
    if style == "compact":
      prompt = f"f(x)={notation}:"
      solution = f"```\nf=lambda x:{expression}\n```"
      answer = {"fn_name": "f", "inputs": [[x] for x in xs], "outputs": [fn(x) for x in xs],
                "wrapped": False}
    else:
      prompt = (f"Write a Python program that reads one integer x from standard input and "
                f"prints f(x) = {notation}. Return it in one ```python code block.")
      solution = f"```python\nx = int(input())\nprint({expression})\n```"
      answer = {"fn_name": None, "inputs": [f"{x}\n" for x in xs],
                "outputs": [f"{fn(x)}\n" for x in xs], "wrapped": False}
    records.append({"id": f"code-{fingerprint}-{len(records):06d}", "task": "code",
                    "prompt": prompt, "answer": json.dumps(answer), "solution": solution})
  return records
