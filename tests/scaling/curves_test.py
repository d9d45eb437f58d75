"""Tests for the curve formulas."""

import numpy as np
import pytest

from jaxrl_scale.scaling import curves


def test_sigmoid_endpoints_and_midpoint():
  a, b, c_mid, r0 = 0.61, 1.92, 2542.0, 0.40
  assert curves.sigmoid(0.0, a, b, c_mid, r0) == pytest.approx(r0, abs=1e-15)
  assert curves.sigmoid(c_mid, a, b, c_mid, r0) == pytest.approx((a + r0) / 2, abs=1e-12)
  assert curves.sigmoid(1e12, a, b, c_mid, r0) == pytest.approx(a, abs=1e-12)


def test_sigmoid_matches_the_papers_formula():
  c = np.geomspace(10.0, 1e5, 50)
  a, b, c_mid, r0 = 0.645, 1.70, 10909.0, 0.40
  direct = r0 + (a - r0) / (1 + (c_mid / c) ** b)
  np.testing.assert_allclose(curves.sigmoid(c, a, b, c_mid, r0), direct, rtol=1e-12)


def test_compute_to_reach_inverts_sigmoid():
  a, b, c_mid, r0 = 0.61, 1.92, 2542.0, 0.40
  c = np.array([100.0, 2542.0, 9000.0, 40000.0])
  rate = curves.sigmoid(c, a, b, c_mid, r0)
  np.testing.assert_allclose(curves.compute_to_reach(rate, a, b, c_mid, r0), c, rtol=1e-9)


def test_compute_to_reach_beyond_asymptote_is_never():
  assert np.isinf(curves.compute_to_reach(0.62, 0.61, 1.92, 2542.0, 0.40))
  assert curves.compute_to_reach(0.39, 0.61, 1.92, 2542.0, 0.40) == 0.0


def test_power_law():
  np.testing.assert_allclose(curves.power_law(np.array([1.0, 4.0]), 0.9, 0.4, 0.5),
                             [0.5, 0.7], rtol=1e-12)
