"""Code problems from local JSONL / Parquet files, in the layouts the datasets ship.

A code record follows the contract of `jaxrl_scale.data.tasks` with task "code" (or
"code_fraction"), and its answer is the canonical test JSON of
`jaxrl_scale.data.code_layouts` (stdin/stdout cases, or function-call cases with
fn_name). Rows are read as-is:

  DeepCoder-Preview   problem, tests (JSON text: any layout code_layouts.normalize reads),
                      metadata (JSON text, optional func_name), solutions (optional)
  LiveCodeBench       question_content, starter_code, public_test_cases (JSON text),
                      private_test_cases (JSON text, or base64(zlib(pickle(JSON text)))
                      as code_generation_lite ships it), metadata (JSON, func_name)
  APPS / TACO         question, input_output (JSON text {inputs, outputs, fn_name?}),
                      starter_code, solutions (JSON list of programs)
  our own             prompt, tests, fn_name?, starter_code?, solution?
  HumanEval           prompt (signature + docstring), test (check(candidate)),
                      entry_point, canonical_solution: assertion tests
  MBPP                text, test_list (asserts), test_setup_code?, code: assertion tests
  KodCode             question, test (pytest functions), test_info, solution: assertion
                      tests (`code_layouts.normalize_asserts` reads all three)

The prompt is the problem text, then the starter code (fenced) when there is one, then
`INSTRUCTION`. The solution (the SFT target) is the dataset's first reference program,
fenced, or "" when it has none.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from typing import Any

from jaxrl_scale.data import code_layouts
from jaxrl_scale.data import records as records_lib
from jaxrl_scale.errors import UserError

CODE_TASKS = ("code", "code_fraction")
INSTRUCTION = ("Write a Python 3 solution using only the standard library and return it "
               "in one ```python code block.")
_PROMPT_FIELDS = ("prompt", "problem", "question_content", "question", "text")
_TEST_FIELDS = ("tests", "input_output", "public_test_cases")
# Rows whose tests are assertions (HumanEval, MBPP, KodCode), by the fields that say so.
ASSERT_FIELDS = ("test_list", "entry_point", "test_info")


class _StringsOnly(pickle.Unpickler):
  """LiveCodeBench pickles a str; refusing every class makes loading it inert."""

  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"refusing {module}.{name} in private_test_cases")


def _decode_private(value: str) -> Any:
  """LiveCodeBench private_test_cases: JSON text, or base64(zlib(pickle(JSON text)))."""
  try:
    return json.loads(value)
  except json.JSONDecodeError:
    pass
  try:
    raw = zlib.decompress(base64.b64decode(value))
    text = _StringsOnly(io.BytesIO(raw)).load()
  except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as e:
    raise ValueError(f"private_test_cases is neither JSON nor LiveCodeBench's compressed "
                     f"form ({type(e).__name__})") from None
  if not isinstance(text, (str, bytes)):
    raise ValueError("private_test_cases did not decode to JSON text")
  return json.loads(text)


def _json_field(row: Mapping[str, Any], name: str) -> Any:
  value = row.get(name)
  if isinstance(value, (str, bytes)) and value.strip():
    try:
      return json.loads(value)
    except json.JSONDecodeError:
      return value
  return value


def _fn_name(row: Mapping[str, Any]) -> str | None:
  if row.get("fn_name"):
    return str(row["fn_name"])
  metadata = _json_field(row, "metadata")
  if isinstance(metadata, Mapping) and metadata.get("func_name"):
    return str(metadata["func_name"])
  return None


def _tests(row: Mapping[str, Any]) -> dict[str, Any]:
  if any(row.get(f) not in (None, "", []) for f in ASSERT_FIELDS):
    try:
      return code_layouts.normalize_asserts(row)
    except code_layouts.LayoutError as e:
      raise ValueError(str(e)) from None
  field = next((f for f in _TEST_FIELDS if row.get(f) not in (None, "", [])), None)
  if field is None:
    raise ValueError(f"no tests (looked for {', '.join(_TEST_FIELDS)})")
  tests = _json_field(row, field)
  if field == "public_test_cases" and row.get("private_test_cases"):
    tests = list(tests) + list(_decode_private(row["private_test_cases"]))
  try:
    return code_layouts.normalize(tests, fn_name=_fn_name(row))
  except code_layouts.LayoutError as e:
    raise ValueError(f"field {field!r}: {e}") from None


def _solution(row: Mapping[str, Any]) -> str:
  solution = row.get("solution") or row.get("code")  # MBPP: "code"
  if not solution and row.get("canonical_solution"):  # HumanEval: the body of the prompt's
    solution = str(row.get("prompt", "")) + str(row["canonical_solution"])
  if not solution:
    solutions = _json_field(row, "solutions")
    if isinstance(solutions, list) and solutions:
      solution = solutions[0]
    elif isinstance(solutions, str):
      solution = solutions
  if not solution:
    return ""
  solution = str(solution)
  return solution if "```" in solution else f"```python\n{solution.rstrip()}\n```"


def code_record(row: Mapping[str, Any], *, task: str = "code", origin: str = "code",
                row_index: int = 0) -> dict[str, str]:
  """One row of any layout in the module docstring -> a record (UserError on bad rows)."""
  where = f"{origin}: row {row_index}"
  field = next((f for f in _PROMPT_FIELDS if isinstance(row.get(f), str) and row[f].strip()),
               None)
  if field is None:
    present = ", ".join(str(k) for k in row if k != "__row__")
    raise UserError(f"{where}: no problem text (looked for {', '.join(_PROMPT_FIELDS)}; "
                    f"fields: {present})")
  try:
    spec = _tests(row)
  except ValueError as e:
    raise UserError(f"{where}: {e}") from None
  prompt = row[field].strip()
  starter = row.get("starter_code")
  if isinstance(starter, str) and starter.strip():
    prompt += f"\n\n```python\n{starter.rstrip()}\n```"
  prompt += f"\n\n{INSTRUCTION}"
  answer = json.dumps(spec)
  row_id = next((str(row[k]) for k in ("id", "question_id", "problem_id", "task_id")
                 if row.get(k)
                 not in (None, "")), None)
  return {"id": row_id or records_lib.content_id("code", prompt, answer), "task": task,
          "prompt": prompt, "answer": answer, "solution": _solution(row)}


def read_local(path: str, *, task: str = "code") -> list[dict[str, str]]:
  """All code records of a local .jsonl / .parquet file (ids must not repeat)."""
  if task not in CODE_TASKS:
    raise UserError(f"{path}: task {task!r} is not a code task {CODE_TASKS}")
  rows = records_lib.read_rows(path)
  if not rows:
    raise UserError(f"{path}: no rows")
  records, first_row = [], {}
  for row in rows:
    record = code_record(row, task=task, origin=path, row_index=row["__row__"])
    if record["id"] in first_row:
      raise UserError(f"{path}: row {row['__row__']} repeats id {record['id']!r} of row "
                      f"{first_row[record['id']]}")
    first_row[record["id"]] = row["__row__"]
    records.append(record)
  return records
