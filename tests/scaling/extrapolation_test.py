"""The extrapolation error in the forecast's interval (scaling/extrapolation.py, issue 64)."""

import numpy as np
import pytest

from jaxrl_scale.scaling import coverage
from jaxrl_scale.scaling import extrapolation
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io


def _curve(x, y, name="run"):
  return io.Curve(name=name, path="<simulated>", compute=x, pass_rate=y,
                  line=np.arange(x.size), r0=float(y[0]), is_start=x == 0)


def _off_law(seed: int) -> io.Curve:
  """A run that is no sigmoid: straight in log compute from 0.30, then a second rise."""
  x = np.concatenate([[0.0], np.linspace(1.0, 60.0, 60)])
  t = np.log(np.maximum(x, 1.0))
  y = 0.3 + 0.05 * t + 0.12 * np.clip(t - 2.5, 0.0, None) ** 2
  y = np.clip(y, 0.0, 0.97) + np.random.default_rng(seed).normal(0.0, 0.004, x.size)
  y[0] = 0.3
  return _curve(x, y)


def test_widen_adds_in_quadrature_and_stays_in_the_metric():
  lo, hi = extrapolation.widen(0.5, (0.45, 0.52), 0.01, 0.95)
  z = extrapolation.z_of(0.95)
  assert z == pytest.approx(1.959964, abs=1e-5)
  assert lo == pytest.approx(0.5 - np.hypot(0.05, z * 0.01))
  assert hi == pytest.approx(0.5 + np.hypot(0.02, z * 0.01))
  assert extrapolation.widen(0.99, (0.98, 0.995), 0.05, 0.95)[1] == 1.0
  assert extrapolation.widen(0.5, (0.45, 0.52), 0.0, 0.95) == (0.45, 0.52)
  assert extrapolation.distance(10.0, 20.0) == 0.0
  assert extrapolation.distance(40.0, 20.0) == pytest.approx(np.log(2.0))


def test_a_run_off_the_law_gets_an_interval_that_widens_with_the_distance():
  report = forecast.analyse(_off_law(0), forecast.AnalysisOptions(
      backtest=0.5, n_boot=200, seed=0))
  ext = report.extrapolation
  assert ext.n_cuts >= 2 and ext.kappa > 0.01, ext
  lo, hi = report.forecast_interval
  n_lo, n_hi = report.forecast_interval_noise
  assert lo < n_lo and hi > n_hi  # wider on both sides than the eval noise alone
  assert not report.well_determined
  assert any("own backtests" in m for m in report.messages)
  d = report.to_dict()["forecast"]
  assert d["interval"] == [lo, hi] and d["interval_eval_noise"] == [n_lo, n_hi]
  assert d["extrapolation"]["kappa"] == ext.kappa
  assert d["extrapolation"]["distance_log"] == pytest.approx(report.target_distance)
  assert d["extrapolation"]["half_width"] == pytest.approx(report.extrapolation_half_width)
  # Farther targets: the added error grows with log(target / last fitted compute).
  widths = []
  for target in (60.0, 120.0, 480.0):
    r = forecast.analyse(_off_law(0), forecast.AnalysisOptions(
        backtest=0.5, target_compute=target, n_boot=200, seed=0))
    assert r.extrapolation.kappa == ext.kappa  # the calibration never sees the target
    widths.append(r.extrapolation_half_width)
  assert widths[0] < widths[1] < widths[2]
  assert widths[2] == pytest.approx(widths[0] * np.log(480 / 30) / np.log(60 / 30), rel=0.05)


def test_a_run_that_follows_the_law_keeps_its_interval():
  # Simulated Table-1 runs where the sigmoid is the truth: the calibration finds no excess
  # error on most (both cuts must show one) and the interval is the eval-noise one.
  kept = 0
  for i in range(4):
    curve, _ = coverage.simulate_curve(coverage.Scenario("iid"), i, seed=i)
    r = forecast.analyse(curve, forecast.AnalysisOptions(
        min_compute=coverage.PAPER_CUTOFF, backtest=0.5, n_boot=200, seed=i))
    assert r.extrapolation.n_cuts >= 2 and not r.extrapolation.prior
    kept += r.forecast_interval == r.forecast_interval_noise
  assert kept >= 3, kept


def test_no_calibration_without_a_bootstrap_or_enough_evals():
  r = forecast.analyse(_off_law(1), forecast.AnalysisOptions(backtest=0.5, n_boot=0))
  assert r.extrapolation is None and r.to_dict()["forecast"]["extrapolation"] is None


def test_a_fit_too_short_to_test_itself_takes_the_prior():
  # 9 evals: no backtest cut has MIN_CUT_POINTS, so the run cannot measure its own
  # extrapolation error and the reference runs' (PRIOR_KAPPA) widens the interval.
  x = np.concatenate([[0.0], np.linspace(1.0, 9.0, 9)])
  y = 0.3 + 0.05 * np.log1p(x) + np.random.default_rng(0).normal(0.0, 0.004, x.size)
  r = forecast.analyse(_curve(x, y), forecast.AnalysisOptions(n_boot=50, seed=0))
  ext = r.extrapolation
  assert ext.n_cuts == 0 and ext.prior and ext.kappa == extrapolation.PRIOR_KAPPA > 0
  assert r.target_distance == pytest.approx(np.log(2.0))  # default target: 2x the data
  assert r.forecast_interval == extrapolation.widen(
      r.forecast, r.forecast_interval_noise, extrapolation.PRIOR_KAPPA * np.log(2.0), 0.95)
  lo, hi = r.forecast_interval
  n_lo, n_hi = r.forecast_interval_noise
  assert lo < n_lo and hi > n_hi
  # z x 0.017 x ln 2 = 0.023 is past the paper's 0.02 margin: the flag agrees.
  assert r.extrapolation_half_width > 0.02 and not r.well_determined
  assert any("too few evals for the run to test its own extrapolation" in m
             and forecast.EXTRAPOLATING in m for m in r.messages), r.messages
  assert r.to_dict()["forecast"]["extrapolation"]["prior"] is True
  # Inside the data there is nothing to extrapolate.
  r = forecast.analyse(_curve(x, y), forecast.AnalysisOptions(
      n_boot=50, seed=0, target_compute=9.0))
  assert r.extrapolation.prior and r.forecast_interval == r.forecast_interval_noise


def test_two_cuts_that_find_no_excess_keep_the_interval():
  # Two cuts are enough to test: a run where the law holds is not widened by the prior.
  curve, _ = coverage.simulate_curve(coverage.Scenario("iid"), 0, seed=0)
  r = forecast.analyse(curve, forecast.AnalysisOptions(
      min_compute=coverage.PAPER_CUTOFF, backtest=0.5, n_boot=200, seed=0))
  assert r.extrapolation.n_cuts == 2 and not r.extrapolation.prior
  assert r.extrapolation.kappa == 0.0
  assert r.forecast_interval == r.forecast_interval_noise


def test_one_cut_is_no_evidence_either_way_and_the_prior_applies():
  # 16 evals: only the 70% cut has 10 of them; its own kappa is kept but not used.
  x = np.concatenate([[0.0], np.linspace(1.0, 16.0, 16)])
  y = 0.3 + 0.05 * np.log1p(x) + np.random.default_rng(1).normal(0.0, 0.004, x.size)
  r = forecast.analyse(_curve(x, y), forecast.AnalysisOptions(n_boot=50, seed=0))
  ext = r.extrapolation
  assert ext.n_cuts == 1 and len(ext.kappa_cuts) == 1
  assert ext.prior and ext.kappa == extrapolation.PRIOR_KAPPA
  assert extrapolation.kappa_of([0.3, 0.0]) == (0.0, False)  # two cuts: taken as 0
  assert extrapolation.kappa_of([0.03, 0.02, 0.05]) == (0.02, False)  # three: the smallest
