"""Test cases of code problems: the canonical form and the comparison of outputs.

A code record's answer is the canonical JSON (jaxrl_scale/data/code_layouts.py writes it
from the datasets' layouts), or assertion tests:

  {"fn_name": null | "name", "inputs": [...], "outputs": [...], "wrapped": false}
  {"test_code": SOURCE, "entry_point": NAME}

SOURCE defines `check(candidate)` (HumanEval), or is plain asserts calling NAME (MBPP), or
pytest-style `test_*` functions importing NAME `from solution` (KodCode); code_asserts.py
runs it apart from the program.

stdin/stdout cases (fn_name null): inputs and outputs are texts. Function-call cases:
inputs are argument lists and outputs the expected return values; "wrapped" marks the
APPS/TACO convention where each expected value may sit in a one-element list (their
checker accepts the value or the list; so does ours, for those records only).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any


class TestFormatError(ValueError):
  """The ground-truth tests are not the canonical form (the dataset's fault)."""


@dataclasses.dataclass(frozen=True)
class TestSpec:
  """The test cases of one problem.

  Attributes:
    fn_name: the function to call (function-call cases), or None (stdin/stdout cases).
    inputs: per case, stdin text or an argument list.
    outputs: per case, expected stdout text or return value.
    wrapped: expected values may be wrapped in a one-element list (APPS / TACO).
    test_code: assertion tests (then fn_name is the entry point, inputs and outputs empty).
  """
  fn_name: str | None
  inputs: list
  outputs: list
  wrapped: bool = False
  test_code: str | None = None

  def to_json(self) -> str:
    if self.test_code is not None:
      return json.dumps({"test_code": self.test_code, "entry_point": self.fn_name})
    return json.dumps({"fn_name": self.fn_name, "inputs": self.inputs,
                       "outputs": self.outputs, "wrapped": self.wrapped})


def _loads(value: Any) -> Any:
  if isinstance(value, (bytes, str)):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise TestFormatError(f"tests are not valid JSON ({e.msg} at column {e.colno})") from None
  return value


def parse_answer(answer: str) -> TestSpec:
  """A record's answer, the canonical JSON of the module docstring -> TestSpec."""
  value = _loads(answer)
  if isinstance(value, Mapping) and "test_code" in value:
    code, entry = value["test_code"], value.get("entry_point")
    if not isinstance(code, str) or not code.strip():
      raise TestFormatError("test_code must be non-empty Python source")
    if not isinstance(entry, str) or not entry.isidentifier():
      raise TestFormatError("assertion tests need an identifier entry_point")
    try:
      compile(code, "tests.py", "exec")  # (compiled only: it runs in the sandbox)
    except (SyntaxError, ValueError) as e:
      raise TestFormatError(f"test_code does not compile: {e}") from None
    return TestSpec(entry, [], [], test_code=code)
  if not isinstance(value, Mapping) or not {"inputs", "outputs"} <= set(value):
    raise TestFormatError("tests must be the canonical {fn_name, inputs, outputs, wrapped} "
                          "or {test_code, entry_point} (jaxrl_scale.data.code_layouts."
                          "normalize reads dataset layouts)")
  inputs, outputs = value["inputs"], value["outputs"]
  fn_name = value.get("fn_name")
  if not isinstance(inputs, list) or not isinstance(outputs, list):
    raise TestFormatError("tests: inputs and outputs must be lists")
  if not inputs:
    raise TestFormatError("no test cases")
  if len(inputs) != len(outputs):
    raise TestFormatError(f"{len(inputs)} inputs but {len(outputs)} outputs")
  if fn_name is None and not all(isinstance(x, str) for x in inputs + outputs):
    raise TestFormatError("stdin/stdout tests need text inputs and outputs")
  if fn_name is not None and (not isinstance(fn_name, str) or not fn_name.isidentifier()
                              or not all(isinstance(x, list) for x in inputs)):
    raise TestFormatError("function-call tests need an identifier fn_name and argument lists")
  return TestSpec(fn_name, inputs, outputs, bool(value.get("wrapped", False)))


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
