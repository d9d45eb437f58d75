"""The metrics stream: metrics.jsonl (the contract the fitter reads) and TensorBoard.

Every line of metrics.jsonl is one JSON object with at least `step` and `compute_hours`;
eval steps add `val/pass_rate`. On resume the writer drops lines at or after the resume step
before appending, so the stream has no gaps and no duplicate steps.

In a multi-process run only process 0 writes (`MetricsWriter`); the others get a
`NullMetricsWriter` with the same interface, so the stream exists once.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time
from typing import Any

from jaxrl_scale.errors import UserError


def _jsonable(value: Any) -> Any:
  """Python scalars for JSON; NaN/inf become null (JSON has no NaN)."""
  if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  return value


class MetricsWriter:
  """Appends metric rows to `<run_dir>/metrics.jsonl` and, optionally, TensorBoard events."""

  def __init__(self, run_dir: str | os.PathLike, resume_step: int | None = None,
               tensorboard: bool = True):
    self.run_dir = pathlib.Path(run_dir)
    self.run_dir.mkdir(parents=True, exist_ok=True)
    self.path = self.run_dir / "metrics.jsonl"
    if resume_step is not None and self.path.exists():
      self._truncate_from(resume_step)
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter  # lazy: heavy import
      except ImportError:  # a declared dependency, but machines with their own packages lack it
        print("note: tensorboardX is not installed (pip install tensorboardX): metrics go to "
              "metrics.jsonl only (run.tensorboard=false silences this)", file=sys.stderr)
      else:
        self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step)

  def _truncate_from(self, step: int) -> None:
    """Keeps only rows with step < `step`; written atomically so a crash never loses rows."""
    kept = []
    with open(self.path, encoding="utf-8") as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          continue  # a line torn by a kill mid-write: drop it
        if isinstance(row, dict) and row.get("step", math.inf) < step:
          kept.append(line if line.endswith("\n") else line + "\n")
    tmp = self.path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(kept)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    """Writes one row. `metrics` must include `compute_hours`."""
    if "compute_hours" not in metrics:
      raise ValueError("every metrics row needs compute_hours")
    row = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
          self._tb.add_scalar(key, value, int(step))

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class NullMetricsWriter:
  """A MetricsWriter that writes nothing (processes other than 0 of a multi-process run)."""

  def __init__(self, run_dir: str | os.PathLike):
    self.run_dir = pathlib.Path(run_dir)
    self.path = self.run_dir / "metrics.jsonl"

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if "compute_hours" not in metrics:
      raise ValueError("every metrics row needs compute_hours")
    del step

  def close(self) -> None:
    pass

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads metrics.jsonl; a malformed line is a one-line error naming file and line."""
  path = pathlib.Path(path)
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except OSError as e:
    raise UserError(f"cannot read metrics file {path}: {e.strerror}") from None
  rows = []
  for i, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      raise UserError(f"{path} line {i}: not valid JSON") from None
    if not isinstance(row, dict):
      raise UserError(f"{path} line {i}: expected a JSON object")
    rows.append(row)
  return rows


class ComputeClock:
  """Accelerator-hours spent: devices of each role x wall time, accumulated across resumes.

  The paper's compute axis is GPU-hours of the whole job (generators plus trainers), so both
  roles count for the whole wall time whether busy or idle.
  """

  def __init__(self, num_devices: int, start_hours: float = 0.0):
    self.num_devices = num_devices
    self._base = start_hours
    self._t0 = time.monotonic()

  @property
  def hours(self) -> float:
    return self._base + self.num_devices * (time.monotonic() - self._t0) / 3600.0
