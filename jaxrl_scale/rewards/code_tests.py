"""Test cases of code problems: the canonical form, the datasets' layouts, and comparison.

A code record's answer is the canonical JSON

  {"fn_name": null | "name", "inputs": [...], "outputs": [...], "wrapped": false}

stdin/stdout cases (fn_name null): inputs and outputs are texts. Function-call cases:
inputs are argument lists and outputs the expected return values; "wrapped" marks the
APPS/TACO convention where each expected value may sit in a one-element list (their
checker accepts the value or the list; so does ours, for those records only).

`normalize` reads the layouts that code datasets ship as-is:
  APPS / TACO / DeepCoder-taco   {"inputs": [...], "outputs": [...], "fn_name"?: ...}
  LiveCodeBench / DeepCoder-lcb  [{"input", "output", "testtype": "stdin"|"functional"}]
                                 (functional inputs: one JSON value per line, outputs JSON)
  DeepCoder-primeintellect       [{"type": "stdin_stdout"|"function_call", "input",
                                   "output", "fn_name"?}]
  DeepCoder-codeforces           [{"input", "output"}]
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


class TestFormatError(ValueError):
  """The ground-truth tests do not have a known layout (the dataset's fault)."""


@dataclasses.dataclass(frozen=True)
class TestSpec:
  """The test cases of one problem.

  Attributes:
    fn_name: the function to call (function-call cases), or None (stdin/stdout cases).
    inputs: per case, stdin text or an argument list.
    outputs: per case, expected stdout text or return value.
    wrapped: expected values may be wrapped in a one-element list (APPS / TACO).
  """
  fn_name: str | None
  inputs: list
  outputs: list
  wrapped: bool = False

  def to_json(self) -> str:
    return json.dumps({"fn_name": self.fn_name, "inputs": self.inputs,
                       "outputs": self.outputs, "wrapped": self.wrapped})


def _loads(value: Any) -> Any:
  if isinstance(value, (bytes, str)):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise TestFormatError(f"tests are not valid JSON ({e.msg} at column {e.colno})") from None
  return value


def _functional_args(text: Any) -> list:
  """LiveCodeBench functional input: one JSON value per line -> the argument list."""
  if isinstance(text, list):
    return text
  try:
    return [json.loads(line) for line in str(text).split("\n") if line.strip()]
  except json.JSONDecodeError as e:
    raise TestFormatError(f"functional test input is not JSON per line ({e.msg})") from None


def _expected(value: Any) -> Any:
  """A functional expected value: JSON text is parsed, anything else kept."""
  if isinstance(value, str):
    try:
      return json.loads(value)
    except json.JSONDecodeError:
      return value
  return value


def normalize(tests: Any, fn_name: str | None = None) -> TestSpec:
  """Any layout of the module docstring (a JSON text or the parsed value) -> TestSpec.

  Args:
    tests: the dataset's tests field.
    fn_name: the function name when the dataset stores it elsewhere (LiveCodeBench's
      metadata "func_name"); a name inside `tests` wins.
  """
  tests = _loads(tests)
  if isinstance(tests, Mapping) and "inputs" in tests and "outputs" in tests:
    name = tests.get("fn_name") or fn_name
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if name:
      # APPS / TACO call-based outputs follow their checker's convention (module doc).
      spec = TestSpec(str(name), [a if isinstance(a, list) else [a] for a in inputs],
                      outputs, wrapped=bool(tests.get("wrapped", True)))
    else:
      spec = TestSpec(None, [_text(x) for x in inputs], [_text(x) for x in outputs])
  elif isinstance(tests, Sequence) and not isinstance(tests, (str, bytes)):
    spec = _from_list(tests, fn_name)
  else:
    raise TestFormatError(f"unknown tests layout ({type(tests).__name__}); expected "
                          "{inputs, outputs} or a list of {input, output}")
  if not spec.inputs:
    raise TestFormatError("no test cases")
  if len(spec.inputs) != len(spec.outputs):
    raise TestFormatError(f"{len(spec.inputs)} inputs but {len(spec.outputs)} outputs")
  return spec


def _text(value: Any) -> str:
  if isinstance(value, list):  # some TACO rows store stdin as a list of lines
    return "\n".join(str(v) for v in value)
  return str(value)


def _from_list(tests: Sequence, fn_name: str | None) -> TestSpec:
  inputs, outputs, names, kinds = [], [], set(), set()
  for i, case in enumerate(tests):
    if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
      raise TestFormatError(f"test {i} is not an object with input and output")
    kind = case.get("testtype") or case.get("type") or "stdin"
    functional = kind in ("functional", "function_call")
    if not functional and kind not in ("stdin", "stdin_stdout"):
      raise TestFormatError(f"test {i}: unknown test type {kind!r}")
    kinds.add(functional)
    if functional:
      names.add(case.get("fn_name") or fn_name)
      inputs.append(_functional_args(case["input"]))
      outputs.append(_expected(case["output"]))
    else:
      inputs.append(_text(case["input"]))
      outputs.append(_text(case["output"]))
  if len(kinds) > 1:
    raise TestFormatError("tests mix stdin and function-call cases")
  if True in kinds:
    names.discard(None)
    if len(names) != 1:
      raise TestFormatError(f"function-call tests need one function name, got {sorted(names)}")
    return TestSpec(names.pop(), inputs, outputs)
  return TestSpec(None, inputs, outputs)


def parse_answer(answer: str) -> TestSpec:
  """A record's answer (canonical JSON, or any layout `normalize` reads) -> TestSpec."""
  value = _loads(answer)
  if isinstance(value, Mapping) and "wrapped" in value:
    spec = TestSpec(value.get("fn_name"), list(value["inputs"]), list(value["outputs"]),
                    bool(value["wrapped"]))
    if not spec.inputs or len(spec.inputs) != len(spec.outputs):
      raise TestFormatError("canonical tests need as many outputs as inputs, at least one")
    return spec
  return normalize(value)


# ----------------------------------------------------------------------------------------
# Comparison.

_REL_TOL = 1e-6


def _token_equal(got: str, want: str) -> bool:
  if got == want:
    return True
  # Floats only where the expected token is written as one: integer answers stay exact.
  if not any(c in want for c in ".eE") or want.lower() in ("nan", "inf", "-inf"):
    return False
  try:
    g, w = float(got), float(want)
  except ValueError:
    return False
  return math.isfinite(g) and abs(g - w) <= _REL_TOL * max(1.0, abs(w))


def stdout_equal(got: str, want: str) -> bool:
  """Line by line, ignoring trailing whitespace, blank lines at the end and the spacing
  between tokens; float tokens within 1e-6 (relative above 1) where the expected one has
  a point or an exponent."""
  got_lines = [line.split() for line in got.rstrip().split("\n")]
  want_lines = [line.split() for line in want.rstrip().split("\n")]
  if len(got_lines) != len(want_lines):
    return False
  for g, w in zip(got_lines, want_lines):
    if len(g) != len(w) or not all(_token_equal(a, b) for a, b in zip(g, w)):
      return False
  return True


def _canonical(value: Any) -> Any:
  """Tuples as lists, as JSON would write them (the child sends results as JSON)."""
  return json.loads(json.dumps(value, default=repr))


def result_equal(got_json: bytes, want: Any, wrapped: bool) -> bool:
  """A function result (JSON from the child) against the expected value."""
  try:
    got = json.loads(got_json)
  except (json.JSONDecodeError, UnicodeDecodeError):
    return False
  want = _canonical(want)
  if _value_equal(got, want):
    return True
  return wrapped and isinstance(want, list) and len(want) == 1 and _value_equal(got, want[0])


def _value_equal(got: Any, want: Any) -> bool:
  if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
    return math.isclose(got, want, rel_tol=_REL_TOL, abs_tol=_REL_TOL)
  if isinstance(want, list) and isinstance(got, list):
    return len(got) == len(want) and all(_value_equal(g, w) for g, w in zip(got, want))
  if isinstance(want, dict) and isinstance(got, dict):
    return got.keys() == want.keys() and all(_value_equal(got[k], want[k]) for k in want)
  return type(got) is type(want) and got == want
