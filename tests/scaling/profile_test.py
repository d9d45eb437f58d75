"""Tests for the profile-likelihood set of A."""

import numpy as np
import pytest
from scipy import optimize

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import coverage
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import noise
from jaxrl_scale.scaling import profile
from jaxrl_scale.scaling import synthetic

ROW = synthetic.TABLE1[0]


def _setup(fraction: float, seed: int = 4):
  compute, noisy, _ = synthetic.make_curve(ROW, seed=seed)
  w = ((compute >= 1500) & (compute <= fraction * ROW.budget)).astype(float)
  r0 = float(noisy[0])
  f = fit.fit_sigmoid(compute, noisy, r0, weights=w)
  resid = noisy - np.where(compute > 0, f.predict(np.maximum(compute, 1.0)), r0)
  model = noise.estimate(resid, w > 0, rel_sd=np.ones_like(compute), n_params=3)
  return compute, noisy, w, r0, f, model


def test_profile_sums_of_squares_match_scipy_with_a_held():
  compute, noisy, w, r0, f, model = _setup(0.5)
  prof = profile.profile_a(compute, noisy, w, f, model)
  x, y = compute[w > 0], noisy[w > 0]
  for g in np.flatnonzero(prof.kept_G)[[0, -1]].tolist() + [int(np.argmin(prof.sse_G))]:
    a = prof.a_G[g]
    resid = lambda p, a=a: curves.sigmoid(x, a, p[0], p[1], r0) - y
    _, b0, c0, _ = fit.theta_to_params(prof.theta_GP[g], prof.log_scale)
    ref = optimize.least_squares(resid, [b0 * 1.3, c0 * 0.8], x_scale=[1.0, c0],
                                 bounds=([1e-2, 1e-6], [1e2, np.inf]), xtol=1e-14,
                                 ftol=1e-14, gtol=1e-14)
    assert prof.sse_G[g] <= np.sum(ref.fun ** 2) * (1 + 1e-6)


def test_profile_set_is_the_chi_square_threshold():
  compute, noisy, w, r0, f, model = _setup(0.5)
  prof = profile.profile_a(compute, noisy, w, f, model)
  rho = model.rho
  var = model.scale ** 2 * (1 + rho) / (1 - rho)
  delta = prof.sse_G - min(prof.sse_G.min(), f.sse)
  np.testing.assert_array_equal(prof.kept_G, delta <= 3.841458820694124 * var)
  lo, hi = prof.a_interval()
  assert lo <= f.a <= hi
  assert hi - lo < 0.2  # half the budget of a Table-1 curve pins A down


def test_beyond_the_data_the_profile_covers_what_the_bootstrap_misses():
  """A run fitted to 10% of a 100k budget, midpoint beyond the data, whose bootstrap
  interval ends below the true A (found in the simulations that chose the union): the
  report's intervals for A and the forecast are the union and contain the truth."""
  big = tuple(i for i, r in enumerate(synthetic.TABLE1) if r.budget == 100_000)
  scenario = coverage.Scenario("beyond", fit_fraction=0.1, rows=big)
  curve, row = coverage.simulate_curve(scenario, 38, seed=7 * 100_003 + 38)
  report = forecast.analyse(curve, forecast.AnalysisOptions(
      min_compute=coverage.PAPER_CUTOFF, backtest=0.1, n_boot=1000, seed=38))
  boot = report.samples.interval("a", report.level)
  prof = report.profile.a_interval()
  assert boot[1] < row.a <= prof[1]
  assert report.interval("a") == (min(boot[0], prof[0]), max(boot[1], prof[1]))
  truth = float(curves.sigmoid(report.target_compute, row.a, row.b, row.c_mid, synthetic.R0))
  f_boot = boot_lib.percentile_interval(report.samples.predict(report.target_compute))
  lo, hi = report.forecast_interval
  assert f_boot[1] < truth <= hi and lo <= f_boot[0]


def test_union():
  assert profile.union((0.2, 0.5), (0.3, 0.7)) == (0.2, 0.7)
  assert profile.union(None, (0.3, 0.7)) == (0.3, 0.7)
  with pytest.raises(TypeError):
    profile.union((0.2, 0.5), None)
