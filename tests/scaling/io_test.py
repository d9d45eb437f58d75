"""Tests for reading metrics files, including every kind of bad input."""

import json
import os

import numpy as np
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.scaling import io


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return str(path)


def _jsonl(rows):
  return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = [
    {"step": 0, "compute_hours": 0.0, "val/pass_rate": 0.4},
    {"step": 50, "compute_hours": 0.5, "train/loss": 1.0},
    {"step": 100, "compute_hours": 1.0, "val/pass_rate": 0.45},
    {"step": 150, "compute_hours": 1.5, "val/pass_rate": None},
    {"step": 200, "compute_hours": 2.0, "val/pass_rate": 0.5},
]


def test_reads_eval_rows_skips_train_rows_and_takes_r0_from_step0(tmp_path):
  path = _write(tmp_path, "myrun/metrics.jsonl", _jsonl(GOOD) + "\n")
  c = io.read_curve(path)
  assert c.name == "myrun"
  np.testing.assert_array_equal(c.compute, [0.0, 1.0, 2.0])
  np.testing.assert_array_equal(c.pass_rate, [0.4, 0.45, 0.5])
  np.testing.assert_array_equal(c.line, [1, 3, 5])
  assert c.r0 == 0.4
  np.testing.assert_array_equal(c.is_start, [True, False, False])


def test_step0_with_positive_compute_is_the_start(tmp_path):
  rows = [{"step": 0, "compute_hours": 0.01, "val/pass_rate": 0.3},
          {"step": 1, "compute_hours": 0.02, "val/pass_rate": 0.35}]
  c = io.read_curve(_write(tmp_path, "a.jsonl", _jsonl(rows)))
  assert c.r0 == 0.3 and c.name == "a"
  np.testing.assert_array_equal(c.is_start, [True, False])


def test_no_start_row_gives_no_r0(tmp_path):
  c = io.read_curve(_write(tmp_path, "a.jsonl", _jsonl(GOOD[2:])))
  assert c.r0 is None


def test_custom_columns_and_csv(tmp_path):
  text = "step,gpu_h,acc\n0,0,0.2\n10,1.5,\n20,3,0.3\n30,4.5,0.35\n"
  c = io.read_curve(_write(tmp_path, "r.csv", text), x_key="gpu_h", y_key="acc")
  np.testing.assert_array_equal(c.compute, [0.0, 3.0, 4.5])
  np.testing.assert_array_equal(c.line, [2, 4, 5])
  assert c.r0 == 0.2


@pytest.mark.parametrize("text, pattern", [
    ("", r"bad\.jsonl: file is empty"),
    ('{"step": 0}\nnot json\n', r"bad\.jsonl:2: not valid JSON"),
    ("[1, 2]\n", r"bad\.jsonl:1: expected a JSON object"),
    (_jsonl([{"step": 1, "compute_hours": 1.0, "val/pass_rate": float("nan")}]),
     r"bad\.jsonl:1: column 'val/pass_rate' is nan"),
    (_jsonl([{"step": 1, "compute_hours": float("inf"), "val/pass_rate": 0.5}]),
     r"bad\.jsonl:1: column 'compute_hours' is inf"),
    (_jsonl([{"step": 1, "compute_hours": 1.0, "val/pass_rate": 1.5}]),
     r"bad\.jsonl:1: column 'val/pass_rate' = 1\.5 is outside \[0, 1\]"),
    (_jsonl([{"step": 1, "compute_hours": 1.0, "val/pass_rate": "high"}]),
     r"bad\.jsonl:1: column 'val/pass_rate' is not a number: 'high'"),
    (_jsonl([{"step": 1, "compute_hours": -1.0, "val/pass_rate": 0.5}]),
     r"bad\.jsonl:1: column 'compute_hours' = -1 is negative"),
    (_jsonl([{"step": 1, "val/pass_rate": 0.5}]),
     r"bad\.jsonl:1: row has 'val/pass_rate' but no 'compute_hours' column"),
    (_jsonl([{"step": 1, "compute_hours": 2.0, "val/pass_rate": 0.5},
             {"step": 2, "compute_hours": 1.0, "val/pass_rate": 0.6}]),
     r"bad\.jsonl:2: column 'compute_hours' decreases \(1 after 2 at .*bad\.jsonl:1\)"),
    (_jsonl([{"step": 1, "compute_hours": 1.0, "loss": 0.5}]),
     r"bad\.jsonl: no row has column 'val/pass_rate' \(columns seen: compute_hours, loss, step\)"),
])
def test_bad_jsonl_gives_one_line_error_naming_the_place(tmp_path, text, pattern):
  path = _write(tmp_path, "bad.jsonl", text)
  with pytest.raises(UserError, match=pattern) as e:
    io.read_curve(path)
  assert "\n" not in str(e.value)


def test_bad_csv_and_unreadable_files(tmp_path):
  path = _write(tmp_path, "bad.csv", "step,compute_hours\n0,1\n")
  with pytest.raises(UserError, match=r"bad\.csv: no column 'val/pass_rate' in the CSV "
                     r"header \(columns: step, compute_hours\)"):
    io.read_curve(path)
  with pytest.raises(UserError, match=r"missing\.jsonl: cannot read"):
    io.read_curve(str(tmp_path / "missing.jsonl"))
  with pytest.raises(UserError, match="a directory without metrics.jsonl or TensorBoard"):
    io.read_curve(str(tmp_path))
  binary = tmp_path / "bin.jsonl"
  binary.write_bytes(b"\xff\xfe\x00")
  with pytest.raises(UserError, match=r"bin\.jsonl: not a UTF-8 text file"):
    io.read_curve(str(binary))


def test_run_name():
  assert io.run_name(os.path.join("runs", "exp1", "metrics.jsonl")) == "exp1"
  assert io.run_name("curves/bs512.csv") == "bs512"


def _trainer_run(tmp_path, name="tbrun"):
  """A run directory written by the trainer's own MetricsWriter (metrics.jsonl + tb/)."""
  from jaxrl_scale import metrics
  run_dir = tmp_path / name
  with metrics.MetricsWriter(run_dir) as w:
    for i in range(6):
      w.write(100 * i, {"compute_hours": 0.5 * i, "train/loss": 1.0})
      w.write(100 * i + 1, {"compute_hours": 0.5 * i + 0.01, "val/pass_rate": 0.3 + 0.05 * i,
                            "val/num_prompts": 200.0, "val/samples_per_prompt": 4.0})
  return run_dir


def test_tensorboard_events_read_like_the_jsonl(tmp_path):
  run_dir = _trainer_run(tmp_path)
  from_jsonl = io.read_curve(str(run_dir / "metrics.jsonl"))
  assert io.read_curve(str(run_dir)).path.endswith("metrics.jsonl")  # the contract wins
  (run_dir / "metrics.jsonl").unlink()
  for path in (run_dir / "tb", run_dir, next((run_dir / "tb").glob("*tfevents*"))):
    c = io.read_curve(str(path))
    assert c.name == "tbrun"
    np.testing.assert_allclose(c.compute, from_jsonl.compute, rtol=1e-6)
    np.testing.assert_allclose(c.pass_rate, from_jsonl.pass_rate, rtol=1e-6)
    np.testing.assert_array_equal(c.eval_size, [800.0] * 6)
  assert from_jsonl.r0 is None and from_jsonl.compute[0] == pytest.approx(0.01)


def test_tensorboard_torn_tail_is_ignored_and_garbage_is_named(tmp_path):
  run_dir = _trainer_run(tmp_path)
  events = next((run_dir / "tb").glob("*tfevents*"))
  whole = io.read_curve(str(events))
  events.write_bytes(events.read_bytes()[:-7])  # killed mid-write
  torn = io.read_curve(str(events))
  assert torn.compute.size in (whole.compute.size - 1, whole.compute.size)
  bad = tmp_path / "x" / "events.out.tfevents.1.host"
  bad.parent.mkdir()
  bad.write_bytes(b"not an event file at all, just text")
  with pytest.raises(UserError, match=r"events\.out\.tfevents\.1\.host: not a TensorBoard"):
    io.read_curve(str(bad))


def test_eval_size_columns_and_bad_sizes(tmp_path):
  rows = [{"step": 0, "compute_hours": 0.0, "val/pass_rate": 0.4, "val/num_prompts": 1000,
           "val/samples_per_prompt": 16},
          {"step": 100, "compute_hours": 1.0, "val/pass_rate": 0.45}]
  c = io.read_curve(_write(tmp_path, "s.jsonl", _jsonl(rows)))
  assert c.eval_size[0] == 16_000 and np.isnan(c.eval_size[1])
  rows[1].update({"val/num_prompts": 0, "val/samples_per_prompt": 16})
  with pytest.raises(UserError, match=r"s2\.jsonl:2: eval size val/num_prompts"):
    io.read_curve(_write(tmp_path, "s2.jsonl", _jsonl(rows)))


def test_pool_keeps_series_and_averages_r0(tmp_path):
  a = io.read_curve(_write(tmp_path, "a.jsonl", _jsonl(GOOD)))
  rows = [dict(r) for r in GOOD]
  rows[0]["val/pass_rate"] = 0.5
  b = io.read_curve(_write(tmp_path, "b.jsonl", _jsonl(rows)))
  p = io.pool([a, b], "ab")
  assert p.name == "ab" and p.n_series == 2 and p.r0 == pytest.approx(0.45)
  np.testing.assert_array_equal(p.series, [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(p.is_start, [True, False, False] * 2)
