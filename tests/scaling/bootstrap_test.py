"""Tests for the bootstrap intervals."""

import dataclasses

import numpy as np
import pytest

from jaxrl_scale.scaling import bootstrap
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import noise
from jaxrl_scale.scaling import synthetic

N_BOOT = 200


def _half_fit(row, seed):
  compute, noisy, clean = synthetic.make_curve(row, seed=seed)
  w = (compute >= 1500) & (compute <= row.budget / 2)
  f = fit.fit_sigmoid(compute, noisy, synthetic.R0, weights=w)
  return compute, noisy, clean, w, f


def test_intervals_contain_truth_on_a_well_determined_curve():
  row = synthetic.TABLE1[0]
  compute, noisy, clean, w, f = _half_fit(row, seed=5)
  s = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT, seed=0)
  assert s.size == N_BOOT
  for name, truth in (("a", row.a), ("b", row.b), ("c_mid", row.c_mid)):
    lo, hi = s.interval(name)
    assert lo <= truth <= hi, (name, lo, hi)
  lo, hi = bootstrap.percentile_interval(s.predict(row.budget))
  assert lo <= clean[-1] <= hi
  # Noise of sd 0.01 on ~24 points: the interval on the forecast is a few hundredths wide.
  assert 0.005 < hi - lo < 0.1


def test_fixed_parameters_stay_fixed():
  row = synthetic.TABLE1[0]
  compute, noisy, _, w, _ = _half_fit(row, seed=1)
  f = fit.fit_sigmoid(compute, noisy, synthetic.R0, weights=w, a_fixed=0.6)
  s = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT)
  np.testing.assert_allclose(s.a_K, 0.6, atol=1e-12)
  np.testing.assert_allclose(s.r0_K, synthetic.R0, atol=1e-12)
  assert np.std(s.b_K) > 0


def test_ill_conditioned_fit_has_wide_intervals_and_is_flagged():
  # Data only up to a fifth of the midpoint: the curve is still near-linear in log C.
  row = synthetic.Table1Row("far", c_mid=10000.0, b=1.5, a=0.70, budget=2000.0)
  compute, noisy, _ = synthetic.make_curve(row, seed=2)
  f = fit.fit_sigmoid(compute, noisy, synthetic.R0)
  s = bootstrap.bootstrap_sigmoid(compute, noisy, f, n_boot=N_BOOT)
  lo, hi = s.interval("a")
  assert hi - lo > forecast.A_WIDTH_LIMIT
  well, reasons = forecast.assess(f, s, float(compute.max()))
  assert not well
  assert any("midpoint" in r for r in reasons)


def test_well_determined_fit_passes_the_check():
  row = synthetic.TABLE1[0]
  compute, noisy, _ = synthetic.make_curve(row, seed=4)
  f = fit.fit_sigmoid(compute, noisy, synthetic.R0)
  s = bootstrap.bootstrap_sigmoid(compute, noisy, f, n_boot=N_BOOT)
  well, reasons = forecast.assess(f, s, float(compute.max()))
  assert well, reasons


def test_predict_shapes():
  s = bootstrap.SigmoidSamples(a_K=np.array([0.6, 0.7]), b_K=np.array([1.0, 2.0]),
                               c_mid_K=np.array([10.0, 20.0]), r0_K=np.array([0.1, 0.2]))
  out = s.predict(np.array([[1.0, 10.0, 100.0]]))
  assert out.shape == (2, 1, 3)
  assert out[1, 0, 2] == pytest.approx(curves.sigmoid(100.0, 0.7, 2.0, 20.0, 0.2))


def test_percentile_interval_counts_never_as_beyond():
  lo, hi = bootstrap.percentile_interval(np.array([1.0] * 90 + [np.inf] * 10), 0.9)
  assert lo == 1.0 and np.isinf(hi)


def _ar_fit(rho, seed):
  row = synthetic.TABLE1[0]
  compute, noisy, _ = synthetic.simulate_evals(row, noise="ar1", rho=rho, seed=seed)
  mask = (compute >= 1500) & (compute <= row.budget / 2)
  f = fit.fit_sigmoid(compute, noisy, synthetic.R0, weights=mask.astype(float))
  resid = bootstrap.residuals(compute, noisy, f)
  model = noise.estimate(resid, mask, n_params=3)
  return row, compute, noisy, mask, f, resid, model


def test_correlated_residuals_widen_the_forecast_interval():
  row, compute, noisy, mask, f, resid, model = _ar_fit(0.7, seed=3)
  assert model.rho > 0.3
  iid = dataclasses.replace(model, rho=0.0, rho_sd=0.0, rho_centre=0.0)
  width = {}
  for name, m in (("ar", model), ("iid", iid)):
    reps = bootstrap.simulate(compute, f, m, weights=mask.astype(float), n_boot=N_BOOT,
                              seed=0, resid=resid)
    lo, hi = bootstrap.percentile_interval(bootstrap.refit(f, reps).predict(row.budget))
    width[name] = hi - lo
  # Under AR(1) with rho ~ 0.5-0.7 the slow wander of the noise is (1+rho)/(1-rho) = 3-6x
  # the iid variance: the interval must be clearly wider, not just noisier.
  assert width["ar"] > 1.4 * width["iid"], width


def test_r0_from_the_step0_eval_is_redrawn_with_its_noise():
  row, compute, noisy, mask, f, resid, model = _ar_fit(0.0, seed=4)
  w = mask.astype(float)
  fixed = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT)
  drawn = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT,
                                      r0_sd=0.01)
  np.testing.assert_allclose(fixed.r0_K, synthetic.R0)
  assert np.std(drawn.r0_K) == pytest.approx(0.01, rel=0.25)
  assert np.mean(drawn.r0_K) == pytest.approx(synthetic.R0, abs=0.003)
  # Below the fitted range the curve hangs on R0: its spread there must grow.
  spread = lambda s: np.std(s.predict(500.0))
  assert spread(drawn) > 1.2 * spread(fixed), (spread(drawn), spread(fixed))


def test_default_seed_is_fresh_recorded_and_reproducible():
  row = synthetic.TABLE1[0]
  compute, noisy, _, w, f = _half_fit(row, seed=6)
  one = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT)
  two = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT)
  assert one.seed != two.seed
  assert not np.array_equal(one.a_K, two.a_K)
  again = bootstrap.bootstrap_sigmoid(compute, noisy, f, weights=w, n_boot=N_BOOT,
                                      seed=one.seed)
  np.testing.assert_array_equal(again.a_K, one.a_K)


def test_analyse_default_seed_is_fresh_and_recorded():
  from jaxrl_scale.scaling import io
  compute, noisy, _ = synthetic.simulate_evals(synthetic.TABLE1[0], seed=8)
  curve = io.Curve(name="r", path="r", compute=compute, pass_rate=noisy,
                   line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)
  opts = forecast.AnalysisOptions(n_boot=N_BOOT)
  one, two = forecast.analyse(curve, opts), forecast.analyse(curve, opts)
  assert one.seed != two.seed and one.forecast_interval != two.forecast_interval
  again = forecast.analyse(curve, dataclasses.replace(opts, seed=one.seed))
  assert again.forecast_interval == one.forecast_interval
  assert one.to_dict()["seed"] == one.seed
