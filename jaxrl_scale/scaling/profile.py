"""Profile-likelihood set for the asymptote A, joined with the bootstrap's intervals.

Why: when the midpoint C_mid lies beyond the data, the residual bootstrap's intervals for A
and for a far forecast are too short on the upper side (simulated runs fitted to 10% of a
100k GPU-hour budget: the true A lay above the bootstrap interval in every miss, and the
intervals covered in 0.89-0.92 of runs). The profile does not rely on the refits finding
the rare high-A solutions: for each A on a grid it refits the other parameters with A held,
and keeps every A whose sum of squares is within the chi-square(1) quantile of the best,
in units of the eval noise variance (inflated by (1 + rho) / (1 - rho) for AR(1) noise).

Alone, the profile covered less than the bootstrap in the ordinary cases (iid, AR(1), A
near 1), and more when C_mid was beyond the data; their union covered 0.94-0.96 in all four
(240 simulated runs each, a seed set of its own; benchmarks/forecast/forecast_coverage.py measures
the union in its scenarios). So `forecast.analyse` reports the union for A and for the
forecast (the forecast's profile range: the predictions of the fits whose A is kept).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import special

from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import noise

N_GRID = 100


@dataclasses.dataclass(frozen=True)
class ProfileA:
  """The kept A values and their fits.

  Attributes:
    a_G: the A grid.
    sse_G: least sum of squares with A held at each grid value.
    kept_G: the A values in the profile-likelihood set.
    theta_GP, log_scale: the fits (fit.py's internal parameters), for predictions.
  """
  a_G: np.ndarray
  sse_G: np.ndarray
  kept_G: np.ndarray
  theta_GP: np.ndarray
  log_scale: float

  def a_interval(self) -> tuple[float, float]:
    """Smallest and largest kept A, widened by half a grid step (within [0, 1], where a
    pass rate lives)."""
    a = self.a_G[self.kept_G]
    half = 0.5 * (self.a_G[1] - self.a_G[0])
    return float(max(a.min() - half, 0.0)), float(min(a.max() + half, 1.0))

  def predict_range(self, compute: float) -> tuple[float, float]:
    """Lowest and highest prediction at `compute` among the kept fits."""
    a, b, c_mid, r0 = fit_lib.theta_to_params(self.theta_GP[self.kept_G], self.log_scale)
    pred = curves.sigmoid(compute, a, b, c_mid, r0)
    return float(np.min(pred)), float(np.max(pred))


def profile_a(compute, pass_rate, weights, sigmoid: fit_lib.SigmoidFit,
              model: noise.NoiseModel, level: float = 0.95, n_grid: int = N_GRID,
              options: fit_lib.FitOptions = fit_lib.FitOptions()) -> ProfileA:
  """Profile-likelihood set of A for a fit made on (compute, pass_rate, weights).

  Args:
    compute, pass_rate, weights: the data and weights the fit used (every eval).
    sigmoid: the fit; R0 stays as it was (given, or fitted again with A held).
    model: the eval noise model of the residuals (its sd per eval and its rho).
    level: confidence level of the set.
    n_grid: A values between max(R0, lowest fitted rate - 0.05) and 1.
    options: fitter settings of the refits.
  """
  x, y, w, _ = fit_lib.prepare_arrays(compute, pass_rate, weights)
  fitted = w > 0
  lo = max(sigmoid.r0 + 0.005, float(np.min(y[fitted])) - 0.05)
  a_G = np.linspace(min(lo, sigmoid.a), 1.0, n_grid)
  g = a_G.size
  theta, sse, log_scale = fit_lib.fit_sigmoid_batch(
      np.tile(x, (g, 1)), np.tile(y, (g, 1)), np.tile(w, (g, 1)), np.full(g, sigmoid.r0),
      a_G, options=options, fit_r0=sigmoid.fit_r0, fix_a=True)
  # The weighted residual sqrt(w) * e has variance sd^2 * w per eval (constant when the
  # weights are 1 / se^2); AR(1) noise inflates a sum of squares' spread by about
  # (1 + rho) / (1 - rho).
  rho = min(model.rho, noise.RHO_MAX)
  var = float(np.mean(np.square(model.sd()[fitted]) * w[fitted])) * (1 + rho) / (1 - rho)
  best = min(float(np.min(sse)), sigmoid.sse)
  # chi-square(1) quantile = z^2 of the two-sided normal quantile (scipy.stats costs ~1 s
  # of import in a cold `jaxrl-scale fit`).
  chi2_1 = 2.0 * float(special.erfinv(level)) ** 2
  kept = sse - best <= chi2_1 * var
  if not kept.any():  # the grid missed the optimum's neighbourhood: keep the nearest
    kept = np.abs(a_G - sigmoid.a) == np.min(np.abs(a_G - sigmoid.a))
  return ProfileA(a_G=a_G, sse_G=sse, kept_G=kept, theta_GP=theta,
                  log_scale=float(log_scale[0]))


def union(band: tuple[float, float] | None, other: tuple[float, float]
          ) -> tuple[float, float]:
  """The smallest interval containing both."""
  if band is None:
    return other
  return min(band[0], other[0]), max(band[1], other[1])
