"""benchmarks/demos/demo_seeds.py: seed lists, the spread it reports, and the targets it checks."""

import argparse
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location(
      "demo_seeds", ROOT / "benchmarks" / "demos" / "demo_seeds.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_seed_lists(bench):
  assert bench.parse_seeds("0-4") == [0, 1, 2, 3, 4]
  assert bench.parse_seeds("0-2,9") == [0, 1, 2, 9]
  assert bench.parse_seeds("7") == [7]
  for bad in ("4-0", "a", "0,0", "1-"):
    with pytest.raises(argparse.ArgumentTypeError):
      bench.parse_seeds(bad)


def _row(seed, start, final, wall, forecast, well):
  return {"seed": seed, "start": start, "final": final, "wall_s": wall, "forecast": forecast,
          "forecast_abs_err": abs(forecast - final), "forecast_well_determined": well}


def test_summary_and_targets_by_hand(bench):
  rows = [_row(0, 0.40, 0.90, 200.0, 0.88, True),    # err 0.02
          _row(1, 0.45, 0.80, 250.0, 0.70, False),   # err 0.10, not well determined
          _row(2, 0.38, 0.70, 310.0, 0.78, True),    # err 0.08 in a well-determined fit
          {"seed": 3, "wall_s": 5.0, "error": "exit 2: boom"}]
  args = argparse.Namespace(mode="sync", jobs=1, overrides=[])
  s = bench.summarise(rows, args)
  assert s["n_failed"] == 1
  assert s["final_mean"] == pytest.approx(0.8)
  assert s["final_sd"] == pytest.approx(0.1)  # sample sd of 0.9, 0.8, 0.7
  assert s["final_min"] == 0.70 and s["start_max"] == 0.45 and s["wall_s_max"] == 310.0
  assert s["forecast_abs_err_max"] == pytest.approx(0.10)
  assert s["forecast_within"] == 1 and s["forecast_n"] == 3
  assert s["well_determined_misses"] == [2]
  checks = dict(bench.check_targets(s, rows))
  assert list(checks.values()) == [False, True, False, False, False, False, False]

  good = [_row(i, 0.4, 0.9 + 0.01 * (i % 2), 200.0, 0.9, i % 2 == 0) for i in range(5)]
  s = bench.summarise(good, args)
  assert all(ok for _, ok in bench.check_targets(s, good))


def test_a_failed_run_is_reported_with_its_error(bench, tmp_path):
  args = bench.parse_args(["--seeds", "0", "--config", str(tmp_path / "missing.yaml"),
                           "--out-dir", str(tmp_path)])
  row = bench.run_seed(0, args, tmp_path / "seed0")
  assert row["returncode"] == 2
  assert "missing.yaml" in row["error"]
  assert json.dumps(row)  # JSON-ready
