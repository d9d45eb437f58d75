"""Reading compute/pass-rate curves from metrics.jsonl, CSV or TensorBoard event files.

metrics.jsonl (written by `jaxrl-scale train`) has one JSON object per line with at least
`step` and `compute_hours`; eval steps also carry `val/pass_rate`. Rows without the pass-rate
key (or with it null) are train-only steps and are skipped. CSV files need a header row; an
empty pass-rate cell marks a train-only row. TensorBoard: an events.out.tfevents.* file or
a directory holding them (a run directory's `tb/`); the scalars of one step form one row.

The eval at compute 0 (or step 0) is the starting policy: it becomes R0 and is not a fitted
point. An eval row that also logs its size (`val/num_prompts` and `val/samples_per_prompt`,
as the trainer's evaluator does) gives the eval's binomial standard error.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import math
import os
import struct

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
    r0: pass rate of the step-0 / compute-0 eval, if the file has one (pooled seeds: the
      mean over the seeds' starting evals).
    is_start: marks that starting eval (never a fitted point).
    eval_size: problems x samples per problem of each eval; nan where not logged.
    series: run id of each eval (0 for one run; one id per seed when pooled), eval order
      within a run being the array order.
    column: the column the compute was read from, whose unit every compute printed of the
      curve carries (`units.unit_of`).
  """
  name: str
  path: str
  compute: np.ndarray
  pass_rate: np.ndarray
  line: np.ndarray
  r0: float | None
  is_start: np.ndarray
  eval_size: np.ndarray | None = None
  series: np.ndarray | None = None
  column: str = "compute_hours"

  def __post_init__(self):
    if self.eval_size is None:
      object.__setattr__(self, "eval_size", np.full(self.compute.shape, np.nan))
    if self.series is None:
      object.__setattr__(self, "series", np.zeros(self.compute.shape, np.int64))

  @property
  def n_series(self) -> int:
    return int(np.unique(self.series).size)


def pool(curves: list[Curve], name: str) -> Curve:
  """Several seeds of one recipe as one curve: all their evals, one series id per seed."""
  if not curves:
    raise ValueError("pool needs at least one curve")
  cat = lambda attr: np.concatenate([getattr(c, attr) for c in curves])
  starts = [c.r0 for c in curves if c.r0 is not None]
  return Curve(name=name, path=", ".join(c.path for c in curves), compute=cat("compute"),
               pass_rate=cat("pass_rate"), line=cat("line"),
               r0=float(np.mean(starts)) if starts else None, is_start=cat("is_start"),
               eval_size=cat("eval_size"),
               series=np.concatenate([np.full(c.compute.size, i, np.int64)
                                      for i, c in enumerate(curves)]),
               column=curves[0].column)


def run_name(path: str) -> str:
  """metrics.jsonl / metrics.csv in a run directory is named after the directory."""
  stem = os.path.splitext(os.path.basename(path))[0]
  parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
  return parent if stem == "metrics" and parent else stem


def _tb_run_name(path: str) -> str:
  """Event files in <run>/tb/ (or <run>/ itself) are named after <run>."""
  d = os.path.abspath(path if os.path.isdir(path) else os.path.dirname(path))
  if os.path.basename(d) == "tb":
    d = os.path.dirname(d)
  return os.path.basename(d)


def _number(value, where: str, key: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, str)):
    raise UserError(f"{where}: column '{key}' is not a number: {value!r}")
  try:
    v = float(value)
  except ValueError:
    raise UserError(f"{where}: column '{key}' is not a number: {value!r}") from None
  if not math.isfinite(v):
    raise UserError(f"{where}: column '{key}' is {v} (must be finite)")
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


_EVENT_GLOB = "*tfevents*"
# The eval's size, logged by jaxrl_scale.eval next to the pass rate (same prefix).
_SIZE_KEYS = ("num_prompts", "samples_per_prompt")


def is_tensorboard(path: str) -> bool:
  """An event file, or a directory with event files (itself or its tb/ subdirectory)."""
  if os.path.isdir(path):
    return bool(_event_files(path))
  return "tfevents" in os.path.basename(path)


def _event_files(path: str) -> list[str]:
  for d in (path, os.path.join(path, "tb")):
    files = sorted(glob.glob(os.path.join(d, _EVENT_GLOB)))
    if files:
      return files
  return []


def _tb_records(path: str, data: bytes):
  """TFRecord framing: u64 length, u32 masked crc of the length, data, u32 crc of the data.

  The length's checksum is verified (it catches a misaligned or foreign file); a record cut
  short at the end (the writer was killed mid-write) ends the file.
  """
  from tensorboardX.record_writer import masked_crc32c  # lazy: heavy import
  pos = 0
  while pos + 12 <= len(data):
    header = data[pos:pos + 8]
    (length,), (crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[pos + 8:pos + 12])
    if crc != masked_crc32c(header):
      raise UserError(f"{path}: not a TensorBoard event file (bad record checksum at byte "
                      f"{pos})")
    if pos + 12 + length + 4 > len(data):
      return
    yield data[pos + 12:pos + 12 + length]
    pos += 12 + length + 4


def _tb_rows(path: str):
  """Scalars of all event files, merged into one row per step (a later value wins)."""
  from tensorboardX.proto import event_pb2  # lazy: heavy import
  files = _event_files(path) if os.path.isdir(path) else [path]
  if not files:
    raise UserError(f"{path}: no TensorBoard event files ({_EVENT_GLOB}) here or in tb/")
  by_step: dict[int, dict] = {}
  for name in files:
    try:
      with open(name, "rb") as f:
        data = f.read()
    except OSError as e:
      raise UserError(f"{name}: cannot read ({e.strerror or e})") from None
    for record in _tb_records(name, data):
      try:
        event = event_pb2.Event.FromString(record)
      except Exception:  # protobuf's DecodeError; its module path varies by version
        raise UserError(f"{name}: not a TensorBoard event file (undecodable record)") from None
      for value in event.summary.value:
        if value.HasField("simple_value"):
          v = float(value.simple_value)
        elif value.HasField("tensor") and value.tensor.float_val:
          v = float(value.tensor.float_val[0])
        elif value.HasField("tensor") and value.tensor.double_val:
          v = float(value.tensor.double_val[0])
        else:
          continue
        by_step.setdefault(int(event.step), {"step": int(event.step)})[value.tag] = v
  for step in sorted(by_step):
    yield f"{path} step {step}", step, by_step[step]


def _text_rows(path: str, x_key: str, y_key: str):
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
  for line_no, row in rows:
    yield f"{path}:{line_no}", line_no, row


def _eval_size(row: dict, y_key: str, where: str) -> float:
  prefix = y_key.rsplit("/", 1)[0] + "/" if "/" in y_key else ""
  values = [row.get(prefix + k) for k in _SIZE_KEYS]
  if any(v is None for v in values):
    return float("nan")
  n, k = (_number(v, where, prefix + key) for v, key in zip(values, _SIZE_KEYS))
  if n < 1 or k < 1:
    raise UserError(f"{where}: eval size {prefix}{_SIZE_KEYS[0]} x {_SIZE_KEYS[1]} = "
                    f"{n:g} x {k:g} (must be >= 1 each)")
  return n * k


def domain_key(y_key: str, domain: str) -> str:
  """The column of `domain`'s pass rate: 'val/pass_rate', 'math' -> 'val/math/pass_rate'."""
  prefix, _, leaf = y_key.rpartition("/")
  return f"{prefix}/{domain}/{leaf}" if prefix else f"{domain}/{leaf}"


def domains_in_row(row: dict, y_key: str = "val/pass_rate") -> list[str]:
  """Domains whose pass rate the row carries (a mixed-domain run logs val/<domain>/pass_rate
  next to val/pass_rate), in the row's order."""
  prefix, _, leaf = y_key.rpartition("/")
  head = prefix + "/" if prefix else ""
  tail = "/" + leaf
  found = []
  for key, value in row.items():
    if key.startswith(head) and key.endswith(tail) and value is not None:
      middle = key[len(head):len(key) - len(tail)]
      if middle and "/" not in middle:
        found.append(middle)
  return found


def find_domains(path: str, x_key: str = "compute_hours", y_key: str = "val/pass_rate"
                 ) -> list[str]:
  """The domains with a pass-rate column in the file (see `domains_in_row`), sorted."""
  _, rows = _rows(path, x_key, y_key)
  found: set[str] = set()
  for _, _, row in rows:
    found.update(domains_in_row(row, y_key))
  return sorted(found)


def _rows(path: str, x_key: str, y_key: str):
  """(the file read, its rows as (where, line number, dict)) of a file or run directory."""
  if os.path.isdir(path) and os.path.exists(os.path.join(path, "metrics.jsonl")):
    path = os.path.join(path, "metrics.jsonl")  # a run directory: the contract file wins
  tb = is_tensorboard(path)
  if not tb and os.path.isdir(path):
    raise UserError(f"{path}: a directory without metrics.jsonl or TensorBoard event files")
  return path, (_tb_rows(path) if tb else _text_rows(path, x_key, y_key))


def read_curve(path: str, x_key: str = "compute_hours", y_key: str = "val/pass_rate"
               ) -> Curve:
  """Reads the eval points of one run.

  Args:
    path: metrics.jsonl (JSON lines), a CSV file with a header row, TensorBoard event
      files (a file or a directory), or a run directory (its metrics.jsonl, else its tb/).
    x_key: column holding compute.
    y_key: column holding the pass rate; rows without it are skipped.

  Returns:
    The run's curve.

  Raises:
    UserError: unreadable file, bad JSON, missing column, non-finite or non-numeric value,
      pass rate outside [0, 1], negative or decreasing compute, no eval rows.
  """
  path, rows = _rows(path, x_key, y_key)
  tb = is_tensorboard(path)

  compute, rate, lines, start, size, wheres = [], [], [], [], [], []
  seen_keys: set[str] = set()
  for where, line_no, row in rows:
    seen_keys.update(row)
    if row.get(y_key) is None:
      continue  # a train-only step
    y = _number(row[y_key], where, y_key)
    if not 0.0 <= y <= 1.0:
      raise UserError(f"{where}: column '{y_key}' = {y:g} is outside [0, 1]")
    if row.get(x_key) is None:
      raise UserError(f"{where}: row has '{y_key}' but no '{x_key}' column")
    x = _number(row[x_key], where, x_key)
    if x < 0:
      raise UserError(f"{where}: column '{x_key}' = {x:g} is negative")
    if compute and x < compute[-1]:
      raise UserError(
          f"{where}: column '{x_key}' decreases ({x:g} after {compute[-1]:g} at "
          f"{wheres[-1]}); compute must not go back (a resumed run that re-logged steps?)")
    step = row.get("step")
    is_step0 = step is not None and not isinstance(step, bool) and str(step).strip() in (
        "0", "0.0")
    compute.append(x)
    rate.append(y)
    lines.append(line_no)
    wheres.append(where)
    size.append(_eval_size(row, y_key, where))
    start.append(x == 0.0 or is_step0)
  if not compute:
    cols = ", ".join(sorted(seen_keys)[:12]) or "none"
    raise UserError(f"{path}: no row has column '{y_key}' (columns seen: {cols})")
  start_arr = np.asarray(start, bool)
  # Only the first starting eval is R0; later zero-compute rows (a restart at step 0 of
  # the same policy) are simply not fitted, since log-compute is undefined there.
  r0 = float(np.asarray(rate)[start_arr][0]) if start_arr.any() else None
  return Curve(name=_tb_run_name(path) if tb else run_name(path), path=path, compute=np.asarray(compute, np.float64),
               pass_rate=np.asarray(rate, np.float64), line=np.asarray(lines, np.int64),
               r0=r0, is_start=start_arr, eval_size=np.asarray(size, np.float64),
               column=x_key)
