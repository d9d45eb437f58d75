r"""Built-in task "multiply": long multiplication with worked steps, scored by the arithmetic
verifier (the last integer of the response equals the product).

Harder than the CPU demo's 2-digit addition in the way RL needs: a policy samples several
steps and one wrong digit anywhere fails the answer, so a warm start that learnt the
procedure passes only part of the time and reward separates its samples; and the problem
space is large (900 x 90 = 81,000 problems for 3 x 2 digits), so a held-out split measures
the procedure, not memorised answers (countdown/n3 has about 2,900 problems in all: a warm
start from scratch learns its training problems and stalls near 0.1 on held-out ones).

The solution is the schoolbook method, one partial product per digit of the multiplier
(least significant first, shifted by its place), each added to the running sum at once:

  compact   prompt "347*56="
            solution "347*6=2082;347*50=17350;2082+17350=19432"
  instruct  prompt "Compute 347 * 56 step by step. Put the final answer in \boxed{}."
            solution "347 * 6 = 2082. 347 * 50 = 17350. 2082 + 17350 = 19432.
                      The answer is \boxed{19432}."

Two more styles share the compact prompt and drop the worked steps, for the CPU tool demo
(configs/cpu_tool.yaml), where the multiplier has 4 digits and no tiny policy can do it in
its head:

  tool      solution "<python>print(347*5612)</python>1947364": a call of the Python tool
            (envs/python_tool.py), then the answer read from its output; with `env.name:
            python_tool` the SFT warm start plays these turns through the environment
            (pipeline/environment.py `trace_examples`), so the output is the tool's own
  answer    solution "1947364": the product alone (the same task without a tool)

A multiplier of one digit has a single step; the answer (the record's `answer`) is the
product in plain decimal. Records follow the contract of jaxrl_scale/data/tasks.py.
"""

from __future__ import annotations

from jaxrl_scale.data import task_common

STYLES = (*task_common.STYLES, "tool", "answer")


def _operand_range(digits: int) -> tuple[int, int]:
  return (0, 9) if digits == 1 else (10 ** (digits - 1), 10 ** digits - 1)


def steps(a: int, b: int) -> list[tuple[str, int, int, int]]:
  """The worked steps of a * b: (op, left, right, value) for each partial product ("*")
  and each addition to the running sum ("+"), in order; the last value is a * b."""
  out, total, place = [], None, 1
  for digit in reversed(str(b)):
    shifted = int(digit) * place
    partial = a * shifted
    out.append(("*", a, shifted, partial))
    if total is not None:
      out.append(("+", total, partial, total + partial))
      total += partial
    else:
      total = partial
    place *= 10
  return out


def _render(work: list[tuple[str, int, int, int]], style: str, a: int, b: int) -> str:
  if style == "tool":
    return f"<python>print({a}*{b})</python>{a * b}"
  if style == "answer":
    return str(a * b)
  if style == "compact":
    return ";".join(f"{x}{op}{y}={v}" for op, x, y, v in work)
  body = " ".join(f"{x} {op} {y} = {v}." for op, x, y, v in work)
  return f"{body} The answer is \\boxed{{{work[-1][3]}}}."


def multiply(n: int, seed: int = 0, *, digits: int = 3, multiplier_digits: int = 2,
             style: str = "compact") -> list[dict[str, str]]:
  """`n` distinct problems a * b, a of `digits` digits and b of `multiplier_digits`.

  Args:
    n: number of records.
    seed: selects the set; the first k records of a set do not depend on n.
    digits: length of the multiplicand a (1..9; 1 means 0..9).
    multiplier_digits: length of the multiplier b (1..6), one worked step per digit.
    style: "compact", "instruct", "tool" or "answer" (module docstring).

  Returns:
    Records of task "multiply" whose solution is the worked multiplication.
  """
  task_common.check_common("multiply", n, seed, style, STYLES)
  check = task_common.check
  check(1 <= digits <= 9, "multiply", "digits", f"must be in [1, 9], got {digits}")
  check(1 <= multiplier_digits <= 6, "multiply", "multiplier_digits",
        f"must be in [1, 6], got {multiplier_digits}")
  (a_lo, a_hi), (b_lo, b_hi) = _operand_range(digits), _operand_range(multiplier_digits)
  space = (a_hi - a_lo + 1) * (b_hi - b_lo + 1)
  check(n <= space, "multiply", "n",
        f"{n} distinct problems requested but only {space} exist with digits={digits}, "
        f"multiplier_digits={multiplier_digits}")
  # The tool and answer styles draw the compact style's problems: the same task either way.
  params = {"digits": digits, "multiplier_digits": multiplier_digits,
            "style": "compact" if style in ("tool", "answer") else style}
  fingerprint = task_common.fingerprint("multiply", params, seed)
  stream = task_common.Stream(f"multiply:{fingerprint}")
  seen: set[tuple[int, int]] = set()
  records = []
  while len(records) < n:
    a, b = stream.integer(a_lo, a_hi), stream.integer(b_lo, b_hi)
    if (a, b) in seen:
      continue
    seen.add((a, b))
    if style != "instruct":
      prompt = f"{a}*{b}="
    else:
      prompt = f"Compute {a} * {b} step by step. Put the final answer in \\boxed{{}}."
    records.append({"id": f"multiply-{fingerprint}-{len(records):06d}", "task": "multiply",
                    "prompt": prompt, "answer": str(a * b),
                    "solution": _render(steps(a, b), style, a, b)})
  return records
