r"""Rows of outside datasets -> records in the contract of `jaxrl_scale.data.tasks`.

A record is a dict of str with keys id, task, prompt, answer, solution (see tasks.py).
This module maps GSM8K, MATH (Hendrycks et al.), DeepMind's math_dataset and local
JSONL / Parquet files with configurable field names onto it, and reads local files with
one-line errors that name the file, the row and the field.

Answer formats for configurable files:
  raw     the answer field is the ground truth as is.
  gsm8k   the answer field is a worked solution ending "#### 72": the answer is what
          follows '####'; the solution is the reasoning with calculator annotations
          (<<48/2=24>>) removed, ending "The answer is \boxed{72}."
  boxed   the answer field is a MATH-style solution: the answer is the content of its
          last \boxed{...} (or \fbox{...}); the solution is the field itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from jaxrl_scale.errors import UserError

ANSWER_FORMATS = ("raw", "gsm8k", "boxed")

_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


def last_boxed(text: str) -> str | None:
  r"""Content of the last \boxed{...} or \fbox{...} in `text`, braces balanced; else None."""
  starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
  for start in reversed(starts):
    depth = 1
    for i in range(start, len(text)):
      if text[i] == "{":
        depth += 1
      elif text[i] == "}":
        depth -= 1
        if depth == 0:
          return text[start:i].strip()
  return None


def boxed_solution(reasoning: str, answer: str) -> str:
  r"""A solution text that ends in "The answer is \boxed{answer}."."""
  reasoning = reasoning.strip()
  tail = f"The answer is \\boxed{{{answer}}}."
  return f"{reasoning}\n{tail}" if reasoning else tail


def content_id(prefix: str, *parts: str) -> str:
  """A stable id from the content, so re-preparing a dataset keeps every prompt's id."""
  digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]
  return f"{prefix}-{digest}"


def gsm8k_record(row: Mapping[str, str]) -> dict[str, str]:
  """GSM8K (raw JSONL or the TFDS `gsm8k` features) -> record; the answer follows '####'."""
  question = row["question"]
  if "short_answer" in row and "annotation" in row:  # TFDS split the answer already
    answer, reasoning = row["short_answer"].strip(), row["annotation"]
  else:
    reasoning, sep, answer = row["answer"].rpartition("####")
    if not sep:
      raise ValueError("gsm8k answer has no '####' marker")
    answer = answer.strip()
  reasoning = _CALCULATOR_RE.sub("", reasoning)
  return {"id": content_id("gsm8k", question, answer), "task": "math", "prompt": question,
          "answer": answer, "solution": boxed_solution(reasoning, answer)}


def math_record(row: Mapping[str, str]) -> dict[str, str]:
  r"""MATH (Hendrycks): problem + solution; the answer is the solution's last \boxed{}."""
  problem, solution = row["problem"], row["solution"]
  answer = last_boxed(solution)
  if answer is None:
    raise ValueError("MATH solution has no \\boxed{} answer")
  return {"id": content_id("math", problem, answer), "task": "math", "prompt": problem,
          "answer": answer, "solution": solution}


def math_dataset_record(row: Mapping[str, str]) -> dict[str, str]:
  """DeepMind Mathematics (TFDS `math_dataset`): question + short answer."""
  question, answer = row["question"].strip(), row["answer"].strip()
  return {"id": content_id("math_dataset", question, answer), "task": "math",
          "prompt": question, "answer": answer, "solution": boxed_solution("", answer)}


@dataclasses.dataclass(frozen=True)
class FieldMap:
  """How a row of a configurable file (or an unknown TFDS dataset) becomes a record.

  Attributes:
    prompt_field: the question.
    answer_field: the ground truth, read according to `answer_format`.
    id_field: a unique id per row; None derives "{id_prefix}-{row}".
    solution_field: an SFT target; None derives one from the answer.
    answer_format: "raw", "gsm8k" or "boxed" (module docstring).
    task: the record's task, which selects the reward function.
    id_prefix: prefix of derived ids (the file's stem by default).
  """

  prompt_field: str = "prompt"
  answer_field: str = "answer"
  id_field: str | None = None
  solution_field: str | None = None
  answer_format: str = "raw"
  task: str = "math"
  id_prefix: str = "row"

  def __post_init__(self):
    if self.answer_format not in ANSWER_FORMATS:
      raise UserError(f"answer_format must be one of {ANSWER_FORMATS}, got "
                      f"{self.answer_format!r}")

  @property
  def fields(self) -> tuple[str, ...]:
    return tuple(f for f in (self.prompt_field, self.answer_field, self.id_field,
                             self.solution_field) if f is not None)


def _text(value: Any) -> str:
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, str):
    return value
  if isinstance(value, (list, dict)):
    return json.dumps(value)  # e.g. structured countdown answers
  return str(value)


def map_row(row: Mapping[str, Any], fields: FieldMap, *, origin: str, row_index: int
            ) -> dict[str, str]:
  """One row -> record; UserError naming `origin`, the row and the field on bad input."""
  where = f"{origin}: row {row_index}"
  if not isinstance(row, Mapping):
    raise UserError(f"{where}: expected an object with fields, got {type(row).__name__}")
  for name in fields.fields:
    if name not in row:
      present = ", ".join(str(k) for k in row if k != "__row__")
      raise UserError(f"{where}: no field {name!r} (fields: {present})")
    if row[name] is None:
      raise UserError(f"{where}: field {name!r} is null")
  prompt = _text(row[fields.prompt_field])
  if not prompt.strip():
    raise UserError(f"{where}: field {fields.prompt_field!r} is empty")
  raw_answer = _text(row[fields.answer_field])
  solution = _text(row[fields.solution_field]) if fields.solution_field else None
  if fields.answer_format == "gsm8k":
    reasoning, sep, answer = raw_answer.rpartition("####")
    if not sep:
      raise UserError(f"{where}: field {fields.answer_field!r} has no '####' answer marker")
    answer = answer.strip()
    derived = boxed_solution(_CALCULATOR_RE.sub("", reasoning), answer)
  elif fields.answer_format == "boxed":
    answer = last_boxed(raw_answer)
    if answer is None:
      raise UserError(f"{where}: field {fields.answer_field!r} has no \\boxed{{}} answer")
    derived = raw_answer
  else:
    answer = raw_answer.strip()
    derived = boxed_solution("", answer)
  if not answer:
    raise UserError(f"{where}: field {fields.answer_field!r} gives an empty answer")
  record_id = (_text(row[fields.id_field]) if fields.id_field
               else f"{fields.id_prefix}-{row_index}")
  return {"id": record_id, "task": fields.task, "prompt": prompt, "answer": answer,
          "solution": solution if solution is not None else derived}


def read_rows(path: str) -> list[dict[str, Any]]:
  """Rows of a .jsonl (one JSON object a line; .json is read the same) or .parquet file.

  Rows are numbered from 1 in errors: the line of a JSONL file, the row of a Parquet file.
  """
  if not os.path.isfile(path):
    raise UserError(f"{path}: no such file")
  ext = os.path.splitext(path)[1].lower()
  if ext in (".jsonl", ".json"):
    return _read_jsonl(path)
  if ext == ".parquet":
    return _read_parquet(path)
  raise UserError(f"{path}: unknown file type {ext!r} (expected .jsonl or .parquet)")


def _read_jsonl(path: str) -> list[dict[str, Any]]:
  rows = []
  try:
    with open(path, encoding="utf-8") as f:
      for line_no, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise UserError(f"{path}: row {line_no}: invalid JSON ({e.msg} at column "
                          f"{e.colno})") from None
        if not isinstance(row, dict):
          raise UserError(f"{path}: row {line_no}: expected a JSON object, got "
                          f"{type(row).__name__}")
        row["__row__"] = line_no
        rows.append(row)
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  return rows


def _read_parquet(path: str) -> list[dict[str, Any]]:
  try:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
  try:
    rows = pq.read_table(path).to_pylist()
  except Exception as e:  # pyarrow raises ArrowInvalid/OSError subclasses on bad files
    raise UserError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
  for i, row in enumerate(rows, start=1):
    row["__row__"] = i
  return rows


def read_local(path: str, fields: FieldMap) -> list[dict[str, str]]:
  """All records of a local JSONL / Parquet file (ids default to "{stem}-{row}")."""
  rows = read_rows(path)
  if not rows:
    raise UserError(f"{path}: no rows")
  if fields.id_field is None and fields.id_prefix == "row":
    fields = dataclasses.replace(fields, id_prefix=_stem(path))
  records, first_row = [], {}
  for row in rows:
    record = map_row(row, fields, origin=path, row_index=row["__row__"])
    # The curriculum keys each prompt's pass-rate history by id: a repeat is a data bug.
    if record["id"] in first_row:
      raise UserError(f"{path}: row {row['__row__']}: field {fields.id_field!r} repeats id "
                      f"{record['id']!r} of row {first_row[record['id']]}")
    first_row[record["id"]] = row["__row__"]
    records.append(record)
  return records


def _stem(path: str) -> str:
  return os.path.splitext(os.path.basename(path))[0]
