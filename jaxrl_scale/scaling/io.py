"""Reading compute/pass-rate curves from metrics.jsonl or CSV, with one-line errors.

metrics.jsonl (written by `jaxrl-scale train`) has one JSON object per line with at least
`step` and `compute_hours`; eval steps also carry `val/pass_rate`. Rows without the pass-rate
key (or with it null) are train-only steps and are skipped. CSV files need a header row; an
empty pass-rate cell marks a train-only row.

The eval at compute 0 (or step 0) is the starting policy: it becomes R0 and is not a fitted
point.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os

import numpy as np

from jaxrl_scale.errors import UserError


@dataclasses.dataclass(frozen=True)
class Curve:
  """One run's eval points, in file order.

  Attributes:
    name: display name (the run directory for metrics.jsonl, else the file stem).
    path: the file read.
    compute: compute of each eval row (non-decreasing).
    pass_rate: pass rate of each eval row, in [0, 1].
    line: 1-based line number of each eval row in the file (for messages).
    r0: pass rate of the step-0 / compute-0 eval, if the file has one.
    is_start: marks that starting eval (never a fitted point).
  """
  name: str
  path: str
  compute: np.ndarray
  pass_rate: np.ndarray
  line: np.ndarray
  r0: float | None
  is_start: np.ndarray


def run_name(path: str) -> str:
  """metrics.jsonl / metrics.csv in a run directory is named after the directory."""
  stem = os.path.splitext(os.path.basename(path))[0]
  parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
  return parent if stem == "metrics" and parent else stem


def _number(value, path: str, line: int, key: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise UserError(f"{path}:{line}: column '{key}' is not a number: {value!r}")
  try:
    v = float(value)
  except ValueError:
    raise UserError(f"{path}:{line}: column '{key}' is not a number: {value!r}") from None
  if not math.isfinite(v):
    raise UserError(f"{path}:{line}: column '{key}' is {v} (must be finite)")
  return v


def _jsonl_rows(path: str, text: str):
  for line_no, raw in enumerate(text.splitlines(), start=1):
    if not raw.strip():
      continue
    try:
      row = json.loads(raw)
    except json.JSONDecodeError as e:
      raise UserError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
      raise UserError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
    yield line_no, row


def _csv_rows(path: str, text: str, x_key: str, y_key: str):
  reader = csv.DictReader(text.splitlines())
  columns = reader.fieldnames or []
  for key in (x_key, y_key):
    if key not in columns:
      raise UserError(f"{path}: no column '{key}' in the CSV header "
                      f"(columns: {', '.join(columns) or 'none'})")
  for row in reader:
    # DictReader's line_num is the physical line just read (header = line 1).
    cleaned = {k: v for k, v in row.items() if k is not None and v not in (None, "")}
    yield reader.line_num, cleaned


def read_curve(path: str, x_key: str = "compute_hours", y_key: str = "val/pass_rate"
               ) -> Curve:
  """Reads the eval points of one run.

  Args:
    path: metrics.jsonl (JSON lines) or a CSV file with a header row.
    x_key: column holding compute.
    y_key: column holding the pass rate; rows without it are skipped.

  Returns:
    The run's curve.

  Raises:
    UserError: unreadable file, bad JSON, missing column, non-finite or non-numeric value,
      pass rate outside [0, 1], negative or decreasing compute, no eval rows.
  """
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
  except UnicodeDecodeError:
    raise UserError(f"{path}: not a UTF-8 text file") from None
  if not text.strip():
    raise UserError(f"{path}: file is empty")
  ext = os.path.splitext(path)[1].lower()
  is_csv = ext == ".csv" or (ext not in (".jsonl", ".json", ".ndjson")
                             and not text.lstrip().startswith("{"))
  rows = _csv_rows(path, text, x_key, y_key) if is_csv else _jsonl_rows(path, text)

  compute, rate, lines, start = [], [], [], []
  seen_keys: set[str] = set()
  for line_no, row in rows:
    seen_keys.update(row)
    if row.get(y_key) is None:
      continue  # a train-only step
    y = _number(row[y_key], path, line_no, y_key)
    if not 0.0 <= y <= 1.0:
      raise UserError(f"{path}:{line_no}: column '{y_key}' = {y:g} is outside [0, 1]")
    if row.get(x_key) is None:
      raise UserError(f"{path}:{line_no}: row has '{y_key}' but no '{x_key}' column")
    x = _number(row[x_key], path, line_no, x_key)
    if x < 0:
      raise UserError(f"{path}:{line_no}: column '{x_key}' = {x:g} is negative")
    if compute and x < compute[-1]:
      raise UserError(
          f"{path}:{line_no}: column '{x_key}' decreases ({x:g} after {compute[-1]:g} on "
          f"line {lines[-1]}); compute must not go back (a resumed run that re-logged steps?)")
    step = row.get("step")
    is_step0 = step is not None and not isinstance(step, bool) and str(step).strip() in (
        "0", "0.0")
    compute.append(x)
    rate.append(y)
    lines.append(line_no)
    start.append(x == 0.0 or is_step0)
  if not compute:
    cols = ", ".join(sorted(seen_keys)[:12]) or "none"
    raise UserError(f"{path}: no row has column '{y_key}' (columns seen: {cols})")
  start_arr = np.asarray(start, bool)
  # Only the first starting eval is R0; later zero-compute rows (a restart at step 0 of
  # the same policy) are simply not fitted, since log-compute is undefined there.
  r0 = float(np.asarray(rate)[start_arr][0]) if start_arr.any() else None
  return Curve(name=run_name(path), path=path, compute=np.asarray(compute, np.float64),
               pass_rate=np.asarray(rate, np.float64), line=np.asarray(lines, np.int64),
               r0=r0, is_start=start_arr)
