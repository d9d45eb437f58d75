"""Test-case layouts of code datasets -> the canonical tests JSON of a code record.

The canonical form (read by jaxrl_scale/rewards/code_tests.py):

  {"fn_name": null | "name", "inputs": [...], "outputs": [...], "wrapped": false}

stdin/stdout cases (fn_name null): inputs and outputs are texts. Function-call cases:
inputs are argument lists and outputs the expected return values; "wrapped" marks the
APPS/TACO convention where each expected value may sit in a one-element list (their
checker accepts the value or the list; so does ours, for those records only).

Layouts read as-is:
  APPS / TACO / DeepCoder-taco   {"inputs": [...], "outputs": [...], "fn_name"?: ...}
  LiveCodeBench / DeepCoder-lcb  [{"input", "output", "testtype": "stdin"|"functional"}]
                                 (functional inputs: one JSON value per line, outputs JSON)
  DeepCoder-primeintellect       [{"type": "stdin_stdout"|"function_call", "input",
                                   "output", "fn_name"?}]
  DeepCoder-codeforces           [{"input", "output"}]

Assertion tests, {"test_code": SOURCE, "entry_point": NAME} (run by
jaxrl_scale/rewards/code_asserts.py apart from the program), from a whole record
(`normalize_asserts`):
  HumanEval      {"prompt", "test" (defines check(candidate)), "entry_point"}: the prompt
                 comes first, for the helpers the check calls (HumanEval/32's poly)
  MBPP           {"test_list": [assert ...], "test_setup_code"?, "test_imports"?, "code"}:
                 the entry point is the reference code's first function (else the first
                 assert's call)
  KodCode        {"test" (pytest functions, `from solution import f`), "test_info":
                 [{"function_name"}]}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any


class LayoutError(ValueError):
  """The tests do not have a known layout (the dataset's fault)."""


def _canonical(fn_name: str | None, inputs: list, outputs: list,
               wrapped: bool = False) -> dict[str, Any]:
  return {"fn_name": fn_name, "inputs": inputs, "outputs": outputs, "wrapped": wrapped}


def _loads(value: Any) -> Any:
  if isinstance(value, (bytes, str)):
    try:
      return json.loads(value)
    except json.JSONDecodeError as e:
      raise LayoutError(f"tests are not valid JSON ({e.msg} at column {e.colno})") from None
  return value


def _functional_args(text: Any) -> list:
  """LiveCodeBench functional input: one JSON value per line -> the argument list."""
  if isinstance(text, list):
    return text
  try:
    return [json.loads(line) for line in str(text).split("\n") if line.strip()]
  except json.JSONDecodeError as e:
    raise LayoutError(f"functional test input is not JSON per line ({e.msg})") from None


def _expected(value: Any) -> Any:
  """A functional expected value: JSON text is parsed, anything else kept."""
  if isinstance(value, str):
    try:
      return json.loads(value)
    except json.JSONDecodeError:
      return value
  return value


def normalize(tests: Any, fn_name: str | None = None) -> dict[str, Any]:
  """Any layout of the module docstring (a JSON text or the parsed value) -> canonical.

  Args:
    tests: the dataset's tests field.
    fn_name: the function name when the dataset stores it elsewhere (LiveCodeBench's
      metadata "func_name"); a name inside `tests` wins.
  """
  tests = _loads(tests)
  if isinstance(tests, Mapping) and "test_code" in tests:
    return {"test_code": str(tests["test_code"]),
            "entry_point": str(tests.get("entry_point") or fn_name or "")}
  if isinstance(tests, Mapping) and "inputs" in tests and "outputs" in tests:
    name = tests.get("fn_name") or fn_name
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if name:
      # APPS / TACO call-based outputs follow their checker's convention (module doc).
      spec = _canonical(str(name), [a if isinstance(a, list) else [a] for a in inputs],
                        outputs, bool(tests.get("wrapped", True)))
    else:
      spec = _canonical(None, [_text(x) for x in inputs], [_text(x) for x in outputs])
  elif isinstance(tests, Sequence) and not isinstance(tests, (str, bytes)):
    spec = _from_list(tests, fn_name)
  else:
    raise LayoutError(f"unknown tests layout ({type(tests).__name__}); expected "
                      "{inputs, outputs} or a list of {input, output}")
  if not spec["inputs"]:
    raise LayoutError("no test cases")
  if len(spec["inputs"]) != len(spec["outputs"]):
    raise LayoutError(f"{len(spec['inputs'])} inputs but {len(spec['outputs'])} outputs")
  return spec


def _text(value: Any) -> str:
  if isinstance(value, list):  # some TACO rows store stdin as a list of lines
    return "\n".join(str(v) for v in value)
  return str(value)


def _from_list(tests: Sequence, fn_name: str | None) -> dict[str, Any]:
  inputs, outputs, names, kinds, wrapped = [], [], set(), set(), False
  for i, case in enumerate(tests):
    if not isinstance(case, Mapping) or "input" not in case or "output" not in case:
      raise LayoutError(f"test {i} is not an object with input and output")
    kind = case.get("testtype") or case.get("type") or "stdin"
    functional = kind in ("functional", "function_call")
    if not functional and kind not in ("stdin", "stdin_stdout"):
      raise LayoutError(f"test {i}: unknown test type {kind!r}")
    kinds.add(functional)
    if functional:
      # DeepCoder's primeintellect function_call outputs follow the APPS convention.
      wrapped = wrapped or kind == "function_call"
      names.add(case.get("fn_name") or fn_name)
      inputs.append(_functional_args(case["input"]))
      outputs.append(_expected(case["output"]))
    else:
      inputs.append(_text(case["input"]))
      outputs.append(_text(case["output"]))
  if len(kinds) > 1:
    raise LayoutError("tests mix stdin and function-call cases")
  if True in kinds:
    names.discard(None)
    if len(names) != 1:
      raise LayoutError(f"function-call tests need one function name, got {sorted(names)}")
    return _canonical(names.pop(), inputs, outputs, wrapped)
  return _canonical(None, inputs, outputs)


_DEF_RE = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)
_ASSERT_CALL_RE = re.compile(r"assert\b[^\n]*?\b([A-Za-z_]\w*)\s*\(")
_NOT_ENTRY = frozenset(("set", "list", "tuple", "sorted", "abs", "len", "math", "isclose",
                        "round", "str", "int", "float", "all", "any", "not"))


def normalize_asserts(record: Mapping) -> dict[str, str]:
  """A HumanEval, MBPP or KodCode record (module docstring) -> assertion tests."""
  if "test_list" in record:  # MBPP
    asserts = [str(a) for a in record["test_list"]]
    names = _DEF_RE.findall(str(record.get("code", "")))
    calls = [n for a in asserts[:1] for n in _ASSERT_CALL_RE.findall(a)
             if n not in _NOT_ENTRY]
    entry = record.get("entry_point") or (names or calls or [""])[0]
    source = "\n".join([str(record.get("test_imports") and "\n".join(record["test_imports"])
                             or ""), str(record.get("test_setup_code") or "")] + asserts)
  elif "test" in record and "test_info" in record:  # KodCode
    infos = [i for i in record["test_info"] if isinstance(i, Mapping)]
    entry = record.get("entry_point") or (infos[0].get("function_name") if infos else "")
    source = str(record["test"])
  elif "test" in record and "entry_point" in record:  # HumanEval
    entry = record["entry_point"]
    source = f"{record.get('prompt', '')}\n\n{record['test']}"
  else:
    raise LayoutError("no assertion tests (HumanEval prompt/test/entry_point, MBPP "
                      "test_list, KodCode test/test_info)")
  if not isinstance(entry, str) or not entry.isidentifier():
    raise LayoutError(f"no entry point for the assertion tests (got {entry!r})")
  return {"test_code": source.strip() + "\n", "entry_point": entry}
