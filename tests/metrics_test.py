import json
import math
import sys

import numpy as np
import pytest

from jaxrl_scale import metrics
from jaxrl_scale.errors import UserError


def test_write_resume_truncates_without_gaps_or_duplicates(tmp_path):
  with metrics.MetricsWriter(tmp_path, tensorboard=False) as w:
    for step in range(6):
      w.write(step, {"compute_hours": step * 0.1, "loss": np.float32(1.0 / (step + 1))})
    w.write(6, {"compute_hours": 0.6, "loss": math.nan})
  # Simulate a line torn by SIGKILL mid-write.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 7, "comp')
  with metrics.MetricsWriter(tmp_path, resume_step=4, tensorboard=False) as w:
    for step in range(4, 8):
      w.write(step, {"compute_hours": step * 0.1})
  rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(8))
  assert rows[1]["loss"] == pytest.approx(0.5)
  assert all("compute_hours" in r for r in rows)


def test_nan_becomes_null_and_tensorboard_written(tmp_path):
  with metrics.MetricsWriter(tmp_path) as w:
    w.write(0, {"compute_hours": 0.0, "val/pass_rate": 0.25, "bad": float("inf")})
  row = json.loads((tmp_path / "metrics.jsonl").read_text())
  assert row == {"step": 0, "compute_hours": 0.0, "val/pass_rate": 0.25, "bad": None}
  assert any((tmp_path / "tb").iterdir())


def test_without_tensorboardx_the_run_writes_metrics_jsonl_and_says_so(tmp_path, monkeypatch,
                                                                      capsys):
  """A machine with its own packages may lack tensorboardX (the H100 of 2026-11-28 did: the
  demo stopped with a traceback before its first step); the stream the fitter reads goes on."""
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # its import now raises ImportError
  with metrics.MetricsWriter(tmp_path) as w:
    w.write(0, {"compute_hours": 0.0, "val/pass_rate": 0.5})
    w.write(1, {"compute_hours": 0.1})
  assert [r["step"] for r in metrics.read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]
  assert not (tmp_path / "tb").exists()
  err = capsys.readouterr().err
  assert "tensorboardX is not installed" in err and len(err.strip().splitlines()) == 1


def test_read_errors_name_file_and_line(tmp_path):
  p = tmp_path / "m.jsonl"
  p.write_text('{"step": 0}\nnot json\n')
  with pytest.raises(UserError, match=r"m.jsonl line 2: not valid JSON"):
    metrics.read_metrics(p)
  with pytest.raises(UserError, match="cannot read metrics file"):
    metrics.read_metrics(tmp_path / "missing.jsonl")


def test_compute_clock_counts_devices():
  clock = metrics.ComputeClock(num_devices=8, start_hours=2.0)
  h = clock.hours
  assert 2.0 <= h < 2.0 + 8 * 60 / 3600
