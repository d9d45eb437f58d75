r"""Built-in verifiable tasks for CPU mode, generated deterministically from a seed.

Record contract (shared with jaxrl_scale/rewards, the SFT warm start and every other
source in jaxrl_scale/data): a dict of str with keys

  id        stable and unique within a generated set: "{task}-{fingerprint}-{index:06d}",
            where the fingerprint hashes the task parameters and the seed.
  task      "arithmetic", "countdown" or "code"; the reward function is
            REWARD_FOR_TASK[task].
  prompt    the question, before any chat template.
  answer    the ground truth.
              arithmetic: the integer result in plain decimal ("46", "-7"; no separators).
              countdown: json.dumps({"numbers": [...], "target": N}) with the numbers in
              prompt order, e.g. '{"numbers": [3, 5, 2], "target": 16}'.
              code: the canonical tests JSON of jaxrl_scale/data/code_layouts.py.
  solution  a short worked solution ending in the final answer: the SFT warm-start target,
            i.e. what a correct completion looks like (the sampler appends EOS).

Two prompt styles. "compact" (default) keeps completions a few bytes long for a tiny
byte-level model on CPU; "instruct" reads naturally for a pretrained chat model:

  arithmetic compact   prompt "12+34="             solution "46"
  arithmetic instruct  prompt "Compute 12 + 34. Put the final answer in \boxed{}."
                       solution "12 + 34 = 46. The answer is \boxed{46}."
  countdown compact    prompt "3 5 2 -> 16:"       solution "(3+5)*2"
  countdown instruct   prompt "Using the numbers [3, 5, 2], write an expression that
                       equals 16. ... Put the final expression in \boxed{}."
                       solution "(3+5)*2 = 16. The answer is \boxed{(3+5)*2}."

What the verifiers accept (so both styles score 1 on their own solutions):
  arithmetic: the last \boxed{...} if present, else the last integer in the response,
    equals the answer.
  countdown: the last \boxed{...} if present, else the last non-empty line with any
    trailing "= N" removed, parses (never eval) as integers, + - * / and parentheses,
    uses each number exactly once and equals the target in exact rational arithmetic.

Every countdown problem is solvable by construction: the target is the value of a random
expression over all the numbers (intermediate values positive integers, division exact).
Randomness comes from BLAKE2b over (parameters, seed, counter), so a set is identical on
every platform and Python/NumPy version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jaxrl_scale.data import code_task, multiply_task, task_common
from jaxrl_scale.errors import UserError

RECORD_KEYS = ("id", "task", "prompt", "answer", "solution")

# Task name -> reward function name in jaxrl_scale/rewards.
REWARD_FOR_TASK = {
    "arithmetic": "arithmetic",
    "countdown": "countdown",
    "multiply": "arithmetic",  # worked long multiplication (data/multiply_task.py)
    "math": "math",  # gsm8k, MATH, math_dataset and local files default to the math verifier
    "code": "code",  # built-in code task and code files (data/code_task.py, code_problems.py)
    "code_fraction": "code_fraction",  # code files scored by the fraction of tests passed
}

def reward_name(task: str) -> str:
  """The reward function for records of `task` (UserError naming the task when unknown)."""
  if task not in REWARD_FOR_TASK:
    raise UserError(f"task {task!r} has no reward function; known: {sorted(REWARD_FOR_TASK)}")
  return REWARD_FOR_TASK[task]


def arithmetic(n: int, seed: int = 0, *, digits: int = 2, ops: str = "+-*",
               style: str = "compact") -> list[dict[str, str]]:
  """`n` distinct problems "a OP b" with both operands of exactly `digits` digits.

  Args:
    n: number of records.
    seed: selects the set; the first k records of a set do not depend on n.
    digits: operand length (1 means 0..9).
    ops: operators to draw from, a subset of "+-*".
    style: "compact" or "instruct" (module docstring).

  Returns:
    Records in the module's contract; subtraction answers may be negative.
  """
  task_common.check_common("arithmetic", n, seed, style)
  check = task_common.check
  check(1 <= digits <= 18, "arithmetic", "digits", f"must be in [1, 18], got {digits}")
  check(bool(ops) and set(ops) <= set("+-*") and len(set(ops)) == len(ops), "arithmetic",
        "ops", f"must be distinct characters from '+-*', got {ops!r}")
  lo, hi = (0, 9) if digits == 1 else (10 ** (digits - 1), 10 ** digits - 1)
  space = len(ops) * (hi - lo + 1) ** 2
  check(n <= space, "arithmetic", "n",
        f"{n} distinct problems requested but only {space} exist with digits={digits}, "
        f"ops={ops!r}")
  params = {"digits": digits, "ops": ops, "style": style}
  fingerprint = task_common.fingerprint("arithmetic", params, seed)
  stream = task_common.Stream(f"arithmetic:{fingerprint}")
  seen: set[tuple[int, str, int]] = set()
  records = []
  while len(records) < n:
    a, op, b = stream.integer(lo, hi), ops[stream.below(len(ops))], stream.integer(lo, hi)
    if (a, op, b) in seen:
      continue
    seen.add((a, op, b))
    value = a + b if op == "+" else a - b if op == "-" else a * b
    if style == "compact":
      prompt, solution = f"{a}{op}{b}=", str(value)
    else:
      prompt = f"Compute {a} {op} {b}. Put the final answer in \\boxed{{}}."
      solution = f"{a} {op} {b} = {value}. The answer is \\boxed{{{value}}}."
    records.append({"id": f"arithmetic-{fingerprint}-{len(records):06d}", "task": "arithmetic",
                    "prompt": prompt, "answer": str(value), "solution": solution})
  return records


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


def _combine(stream: task_common.Stream, left: tuple[int, str, int],
             right: tuple[int, str, int]
             ) -> tuple[int, str, int] | None:
  """Joins two (value, expression, precedence) terms with a random valid operator."""
  (a, a_text, a_prec), (b, b_text, b_prec) = left, right
  candidates = ["+", "*"]
  if a > b:
    candidates.append("-")
  if b > 1 and a % b == 0:
    candidates.append("/")
  op = candidates[stream.below(len(candidates))]
  value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
  prec = _PRECEDENCE[op]
  # Minimal parentheses: the right operand of '-' and '/' needs them at equal precedence.
  if a_prec < prec:
    a_text = f"({a_text})"
  if b_prec < prec or (b_prec == prec and op in "-/"):
    b_text = f"({b_text})"
  return value, f"{a_text}{op}{b_text}", prec


def countdown(n: int, seed: int = 0, *, count: int = 3, max_number: int = 10,
              max_target: int = 100, style: str = "compact") -> list[dict[str, str]]:
  """`n` distinct countdown problems: reach the target using every number exactly once.

  Args:
    n: number of records.
    seed: selects the set; the first k records of a set do not depend on n.
    count: how many numbers per problem (2..6).
    max_number: numbers are drawn from [1, max_number].
    max_target: targets lie in [1, max_target]; expressions outside are redrawn.
    style: "compact" or "instruct" (module docstring).

  Returns:
    Records in the module's contract, each with a solution expression of value target.
  """
  task_common.check_common("countdown", n, seed, style)
  check = task_common.check
  check(2 <= count <= 6, "countdown", "count", f"must be in [2, 6], got {count}")
  check(max_number >= 2, "countdown", "max_number", f"must be >= 2, got {max_number}")
  check(max_target >= 1, "countdown", "max_target", f"must be >= 1, got {max_target}")
  params = {"count": count, "max_number": max_number, "max_target": max_target, "style": style}
  fingerprint = task_common.fingerprint("countdown", params, seed)
  stream = task_common.Stream(f"countdown:{fingerprint}")
  seen: set[tuple[tuple[int, ...], int]] = set()
  records = []
  attempts, max_attempts = 0, 50 * n + 5_000
  while len(records) < n:
    attempts += 1
    if attempts > max_attempts:
      raise UserError(f"countdown: found only {len(records)} of {n} distinct problems with "
                      f"count={count}, max_number={max_number}, max_target={max_target}; "
                      "raise max_number or max_target")
    numbers = [stream.integer(1, max_number) for _ in range(count)]
    terms = [(x, str(x), _ATOM) for x in numbers]
    while len(terms) > 1:
      left = terms.pop(stream.below(len(terms)))
      right = terms.pop(stream.below(len(terms)))
      terms.append(_combine(stream, left, right))
    target, expression, _ = terms[0]
    key = (tuple(sorted(numbers)), target)
    if not 1 <= target <= max_target or key in seen:
      continue
    seen.add(key)
    answer = json.dumps({"numbers": numbers, "target": target})
    if style == "compact":
      prompt, solution = f"{' '.join(map(str, numbers))} -> {target}:", expression
    else:
      prompt = (f"Using the numbers {numbers}, write an expression that equals {target}. "
                "Use each number exactly once, with + - * / and parentheses. "
                "Put the final expression in \\boxed{}.")
      solution = f"{expression} = {target}. The answer is \\boxed{{{expression}}}."
    records.append({"id": f"countdown-{fingerprint}-{len(records):06d}", "task": "countdown",
                    "prompt": prompt, "answer": answer, "solution": solution})
  return records


# Named parameter sets ("arithmetic/d3"); the TFDS builders expose the same names as configs.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "arithmetic": {
        "d1": {"digits": 1},
        "d2": {"digits": 2},
        "d3": {"digits": 3},
        "d4": {"digits": 4},
        "add2": {"digits": 2, "ops": "+"},  # the CPU demo's task: 2-digit addition only
    },
    "countdown": {
        "n3": {"count": 3, "max_number": 10, "max_target": 100},
        "n4": {"count": 4, "max_number": 20, "max_target": 200},
    },
    "multiply": {  # data/multiply_task.py
        "d3x1": {"digits": 3, "multiplier_digits": 1},  # one step: the CPU check's size
        "d3x2": {"digits": 3, "multiplier_digits": 2},  # configs/gpu_small.yaml's task
        "d3x3": {"digits": 3, "multiplier_digits": 3},
        # configs/cpu_tool.yaml: 3 x 4 digits, solved with the Python tool or not at all
        "d3x4_tool": {"digits": 3, "multiplier_digits": 4, "style": "tool"},
        "d3x4_answer": {"digits": 3, "multiplier_digits": 4, "style": "answer"},
    },
    "code": {  # data/code_task.py
        "fn": {},  # every template, compact, function-call tests of f
        "easy": {"templates": "linear,abs,max"},  # no Python notation traps
        "io": {"style": "instruct"},  # stdin/stdout programs, chat-style prompts
    },
}
DEFAULT_PRESET = {"arithmetic": "d2", "countdown": "n3", "multiply": "d3x2", "code": "fn"}


def parse_task(spec: str) -> tuple[str, str, dict[str, Any]]:
  """"arithmetic" or "arithmetic/d3" -> (task, preset name, generator parameters)."""
  task, _, preset = spec.partition("/")
  if task not in TASKS:
    raise UserError(f"unknown built-in task {task!r}; known: {sorted(TASKS)}")
  preset = preset or DEFAULT_PRESET[task]
  if preset not in PRESETS[task]:
    raise UserError(f"{task}: no preset {preset!r} (presets: {', '.join(PRESETS[task])})")
  return task, preset, dict(PRESETS[task][preset])


# The generators of the other built-in tasks, by name here like arithmetic and countdown.
multiply = multiply_task.multiply  # worked long multiplication
code = code_task.code  # small Python functions with tests

TASKS: dict[str, Callable[..., list[dict[str, str]]]] = {
    "arithmetic": arithmetic,
    "countdown": countdown,
    "multiply": multiply,
    "code": code,
}


def generate(task: str, n: int, seed: int = 0, **params) -> list[dict[str, str]]:
  """Records of a built-in task by name; `params` go to the task's generator."""
  if task not in TASKS:
    raise UserError(f"unknown built-in task {task!r}; known: {sorted(TASKS)}")
  try:
    return TASKS[task](n, seed, **params)
  except TypeError as e:  # an unknown parameter name from a config
    raise UserError(f"{task}: {e}") from None
