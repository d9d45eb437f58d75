"""Tests for run analysis: forecasts, compute-to-target, backtest, JSON summary."""

import json
import re

import numpy as np
import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import synthetic

ROW = synthetic.TABLE1[0]
OPTS = forecast.AnalysisOptions(n_boot=200)
# A compute as a message prints it: 1.66e+11, 2542, 0.059.
_COMPUTE = r"(?:\d+(?:\.\d+)?e[+-]\d+|\d+(?:\.\d+)?)"


def _curve(compute, rate, name="run", with_start=True):
  start = compute == 0 if with_start else np.zeros(compute.shape, bool)
  r0 = float(rate[0]) if with_start and compute[0] == 0 else None
  return io.Curve(name=name, path=f"{name}.jsonl", compute=compute, pass_rate=rate,
                  line=np.arange(1, compute.size + 1), r0=r0, is_start=start)


def test_analyse_reads_r0_from_the_start_and_forecasts():
  compute, noisy, clean = synthetic.make_curve(ROW, seed=0)
  r = forecast.analyse(_curve(compute, noisy), OPTS)
  assert r.r0_source == "step0" and r.sigmoid.r0 == noisy[0]
  assert r.target_compute == pytest.approx(2 * compute.max())
  truth = curves.sigmoid(r.target_compute, ROW.a, ROW.b, ROW.c_mid, synthetic.R0)
  assert abs(r.forecast - truth) < 0.02
  lo, hi = r.forecast_interval
  assert lo <= r.forecast <= hi
  assert r.well_determined


def test_given_r0_overrides_and_missing_r0_is_fitted():
  compute, _, clean = synthetic.make_curve(ROW, noise_sd=0.0)
  r = forecast.analyse(_curve(compute, clean), forecast.AnalysisOptions(r0=0.3, n_boot=0))
  assert r.r0_source == "given" and r.sigmoid.r0 == 0.3
  r = forecast.analyse(_curve(compute[1:], clean[1:], with_start=False),
                       forecast.AnalysisOptions(n_boot=0))
  assert r.r0_source == "fitted"
  assert r.sigmoid.r0 == pytest.approx(synthetic.R0, abs=1e-3)


def test_compute_to_target_pass_rate():
  compute, _, clean = synthetic.make_curve(ROW, noise_sd=0.0)
  opts = forecast.AnalysisOptions(target_pass_rate=0.55, n_boot=0)
  r = forecast.analyse(_curve(compute, clean), opts)
  expected = curves.compute_to_reach(0.55, ROW.a, ROW.b, ROW.c_mid, synthetic.R0)
  assert r.compute_to_target == pytest.approx(float(expected), rel=1e-3)
  never = forecast.analyse(_curve(compute, clean),
                           forecast.AnalysisOptions(target_pass_rate=0.9, n_boot=0))
  assert np.isinf(never.compute_to_target)
  d = never.to_dict()["compute_to_target"]
  assert d["compute"] is None and d["reachable"] is False


def test_backtest_on_first_half():
  compute, noisy, clean = synthetic.make_curve(ROW, seed=7)
  opts = forecast.AnalysisOptions(backtest=0.5, min_compute=1500, n_boot=200)
  r = forecast.analyse(_curve(compute, noisy), opts)
  b = r.backtest
  assert b.n_heldout == int(np.sum(compute > ROW.budget / 2))
  assert r.heldout_mask.sum() == b.n_heldout
  assert not (r.fit_mask & r.heldout_mask).any()
  assert r.target_compute == compute.max()
  assert b.final_actual == noisy[-1]
  assert abs(b.final_forecast - clean[-1]) < 0.02
  assert b.mean_abs_error < 0.02
  assert b.final_inside


def test_too_few_points_names_file_and_count():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=0)
  with pytest.raises(UserError, match=r"run\.jsonl: 3 usable eval points.*at least 4"):
    forecast.analyse(_curve(compute[:4], noisy[:4]), OPTS)
  with pytest.raises(UserError, match="--min-compute"):
    forecast.analyse(_curve(compute, noisy),
                     forecast.AnalysisOptions(min_compute=15_500, n_boot=0))


def test_to_dict_is_strict_json_with_the_contract_keys():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=0)
  r = forecast.analyse(_curve(compute, noisy),
                       forecast.AnalysisOptions(backtest=0.5, target_pass_rate=0.58,
                                                n_boot=200))
  d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
  for key in ("A", "B", "C_mid", "R0", "forecast", "intervals", "well_determined",
              "power_law", "backtest", "compute_to_target", "A_paper_margin"):
    assert key in d
  assert d["forecast"]["compute"] == compute.max()
  assert len(d["intervals"]["A"]) == 2


def test_every_compute_in_a_fits_messages_carries_its_columns_unit():
  # Issue 67 item 7: "the forecast beyond C=4.81e+12" named no unit; a message's compute
  # carries the unit of the column the curve was read from (FLOPs, h, else the column).
  compute, noisy, _ = synthetic.make_curve(ROW, seed=0)
  early = compute < 0.6 * ROW.c_mid  # still rising: C_mid beyond the data, no saturation
  for column, unit in (("flops", "FLOPs"), ("compute_hours", "h"), ("gpu_hours", "(gpu_hours)")):
    curve = io.Curve(name="run", path="run.jsonl", compute=compute[early],
                     pass_rate=noisy[early], line=np.arange(int(early.sum())),
                     r0=float(noisy[0]), is_start=compute[early] == 0, column=column)
    r = forecast.analyse(curve, forecast.AnalysisOptions(n_boot=100, seed=0))
    text = "\n".join(r.messages)
    u = re.escape(unit)
    assert re.search(rf"the midpoint C_mid={_COMPUTE} {u} lies beyond the last fitted point "
                     rf"\({_COMPUTE} {u}\)", text), text
    assert re.search(rf"the forecast beyond C={_COMPUTE} {u} and A reach down to", text), text
    with pytest.raises(UserError, match=rf">= --min-compute 1\.00e\+30 {u}\)"):
      forecast.analyse(curve, forecast.AnalysisOptions(min_compute=1e30, n_boot=0))


def test_read_curve_and_pool_keep_the_compute_column(tmp_path):
  compute, noisy, _ = synthetic.make_curve(ROW, seed=0)
  path = str(tmp_path / "metrics.jsonl")
  synthetic.write_metrics_jsonl(path, compute, noisy)
  rows = [json.loads(l) for l in open(path, encoding="utf-8")]
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"flops": r["compute_hours"], **r}) + "\n" for r in rows)
  assert io.read_curve(path).column == "compute_hours"
  curve = io.read_curve(path, x_key="flops")
  assert curve.column == "flops" and io.pool([curve, curve], "both").column == "flops"


def test_a_run_that_never_scores_gets_intervals_inside_zero_one():
  # Every eval at 0 (a policy that never earns reward): the profile's half grid step and
  # the refits' rounding used to give A [-0.004, 0.006] and a forecast band below 0.
  compute = np.linspace(0.0, 5.8e10, 5)
  r = forecast.analyse(_curve(compute, np.zeros(5)),
                       forecast.AnalysisOptions(n_boot=100, seed=0))
  lo, hi = r.interval("a")
  assert 0.0 <= lo <= r.sigmoid.a <= hi <= 1.0
  lo, hi = r.forecast_interval
  assert 0.0 <= lo <= r.forecast <= hi <= 1.0
  assert not r.well_determined
