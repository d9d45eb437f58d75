"""Tests for the eval noise model: binomial se, autocorrelation, AR(1) draws."""

import numpy as np
import pytest

from jaxrl_scale.scaling import noise


def test_binomial_se_from_eval_size_with_floor_at_zero_and_one():
  se = noise.binomial_se([0.5, 0.6, 0.0, 1.0, 0.5], [1000 * 16, 500, 500, 500, np.nan])
  assert se[0] == pytest.approx(np.sqrt(0.25 / 16_000))
  assert se[1] == pytest.approx(np.sqrt(0.24 / 500))
  # An eval at 0 or 1 is treated as half a success / failure away, never as exact.
  np.testing.assert_allclose(se[2:4], np.sqrt(0.001 * 0.999 / 500), rtol=1e-12)
  assert np.isnan(se[4])


def test_lag1_autocorrelation_per_series_and_mask():
  z = np.array([1.0, 1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
  mask = np.ones(8, bool)
  rho, n = noise.lag1_autocorrelation(z, mask, np.zeros(8, int))
  assert n == 8 and rho == pytest.approx(1 / 8)  # 7 neighbour products sum to 1
  # Split into two series, the pair across the boundary is not counted.
  alt = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
  series = np.array([0, 0, 0, 0, 1, 1, 1, 1])
  rho, _ = noise.lag1_autocorrelation(alt, mask, series)
  assert rho == pytest.approx(-0.75)
  rho, n = noise.lag1_autocorrelation(alt, np.array([True] * 2 + [False] * 6),
                                      np.zeros(8, int))
  assert (rho, n) == (0.0, 2)


def test_rho_correction_removes_the_short_series_bias_and_clips():
  # raw = rho - (3 + 7 rho) / n  inverts to rho.
  for rho in (0.0, 0.25, 0.5):
    raw = rho - (3 + 7 * rho) / 35
    assert noise.correct_rho(raw, 35) == pytest.approx(rho)
  assert noise.correct_rho(-0.8, 35) == 0.0
  assert noise.correct_rho(0.99, 35) == noise.RHO_MAX


def test_estimate_scale_in_se_units_and_dof():
  rng = np.random.default_rng(0)
  resid = rng.normal(0, 0.01, 200)
  mask = np.ones(200, bool)
  m = noise.estimate(resid, mask, n_params=3)
  assert m.scale == pytest.approx(0.01, rel=0.15)
  assert not m.size_known and np.isnan(m.dispersion)
  # With eval sizes the scale is in se units: residual sd 0.01 on se 0.02 is dispersion
  # ~1/4, and a point's sd is scale * se (heteroscedastic: twice the se, twice the sd).
  se = np.where(np.arange(200) < 100, 0.02, 0.04)
  m = noise.estimate(resid * se / 0.02, mask, rel_sd=se, n_params=3, size_known=True)
  assert m.dispersion == pytest.approx(0.25, rel=0.25)
  assert m.sd()[150] == pytest.approx(2 * m.sd()[50])
  assert m.sd()[50] == pytest.approx(0.01, rel=0.15)
  # A larger autocorrelation means more variance absorbed by the fit.
  assert m.variance(0.5) > m.variance(0.0)


def test_estimate_detects_ar1_residuals():
  rng = np.random.default_rng(1)
  e = rng.normal(size=4000)
  for t in range(1, e.size):
    e[t] = 0.6 * e[t - 1] + np.sqrt(1 - 0.36) * e[t]
  m = noise.estimate(e, np.ones(e.size, bool), n_params=3)
  assert m.rho == pytest.approx(0.6, abs=0.06)
  iid = noise.estimate(rng.normal(size=4000), np.ones(4000, bool), n_params=3)
  assert iid.rho < 0.06


def test_ar1_draws_are_stationary_with_the_requested_autocorrelation():
  rng = np.random.default_rng(2)
  u = rng.standard_normal(5000)
  (e,) = noise.ar1_draws(rng, (u - u.mean()) / u.std(), [60], 0.5, 4000)
  assert e.shape == (4000, 60)
  np.testing.assert_allclose(e.var(axis=0)[[0, 30, 59]], 1.0, atol=0.08)
  lag1 = np.mean(e[:, 1:] * e[:, :-1]) / np.mean(e * e)
  assert lag1 == pytest.approx(0.5, abs=0.03)
  per = noise.ar1_draws(rng, u, [5], np.array([0.0, 0.9]), 2)
  assert per[0].shape == (2, 5)
