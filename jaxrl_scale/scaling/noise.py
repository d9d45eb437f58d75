"""Eval noise of a scaling curve: per-point standard errors, their scale, autocorrelation.

A run evaluates the same held-out prompts every few hundred steps, so eval errors are
neither equal nor independent:

- Size. An eval of N problems x k samples per problem has binomial standard error
  se = sqrt(p (1 - p) / (N k)) at pass rate p. When the metrics log the size
  (`val/num_prompts`, `val/samples_per_prompt`) the fit is weighted by 1 / se^2, with p
  from the fitted curve (not the observed rate, whose noise would leak into its own
  weight). The scale itself still comes from the residuals (in se units, the dispersion):
  the binomial se is not a floor, since on a fixed prompt set with per-problem pass rates
  p_i the sampling variance sum p_i (1 - p_i) / (N^2 k) is below p (1 - p) / (N k), while
  checkpoint-to-checkpoint variation adds to it; flooring the scale at 1 made the simulated
  binomial scenario over-cover (0.99 for a nominal 0.95). Without a size the noise is taken
  as homoscedastic and its scale estimated from the residuals.
- Correlation. The residuals' lag-1 autocorrelation, in eval order within each run, is
  biased low: a short series (about 30 fitted points) and a fitted curve that absorbs its
  slow wander both pull it towards negative values. `RHO_BIAS` corrects it (calibrated on
  simulated Table-1 curves with AR(1) noise, see `calibrate_rho` and
  benchmarks/forecast/forecast_coverage.py); the result is clipped to [0, `RHO_MAX`] since reused
  prompts cannot make errors anti-correlated.
- R0. The step-0 eval is one more noisy eval: its sd is the model's sd at that point.

The bootstrap (`bootstrap.py`) draws AR(1) noise with these parameters.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Corrected rho = (n raw + RHO_BIAS[0]) / (n - RHO_BIAS[1]) on n fitted points of a run. On
# 300 simulated Table-1 fits per case (3 free parameters, 35-37 points, linear / log-spaced
# evals) the mean raw estimate was -0.093 / -0.057, 0.110 / 0.140, 0.306 / 0.327,
# 0.451 / 0.460 at true rho 0, 0.25, 0.5, 0.7: raw ~ rho - (3 + 7 rho) / n.
RHO_BIAS = (3.0, 7.0)
RHO_MAX = 0.9
# Pass rates are clipped to [p_floor, 1 - p_floor] with p_floor = 0.5 / (N k) before the
# binomial se, so that an eval at 0 or 1 does not get infinite weight.
_HALF_COUNT = 0.5


def binomial_se(pass_rate, eval_size) -> np.ndarray:
  """Binomial standard error of a mean over `eval_size` = problems x samples per problem.

  Entries with eval_size <= 0 (unknown) give nan.
  """
  p = np.asarray(pass_rate, np.float64)
  n = np.asarray(eval_size, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    floor = _HALF_COUNT / n
    q = np.clip(p, floor, 1.0 - floor)
    se = np.sqrt(q * (1.0 - q) / n)
  return np.where(n > 0, se, np.nan)


@dataclasses.dataclass(frozen=True)
class NoiseModel:
  """Noise of every eval of a curve (all rows, fitted or not).

  Attributes:
    rel_sd: relative sd per eval: the binomial se when the size is known, else 1.
    scale: noise sd of a point with rel_sd 1 (so a point's sd is scale * rel_sd).
    rho: lag-1 autocorrelation the bootstrap uses (bias-corrected, in [0, RHO_MAX]).
    rho_raw: the residuals' lag-1 autocorrelation as measured.
    rho_sd: standard error of rho (each bootstrap replicate draws its own rho with it, so
      the uncertainty of a short series' autocorrelation widens the intervals too).
    rho_centre: the corrected estimate before clipping at 0: the replicates' rho are drawn
      around it and then clipped, since drawing around the clipped value would push
      independent noise (true rho 0, estimate negative half the time) towards correlation.
    size_known: rel_sd comes from logged eval sizes.
    dispersion: residual variance in se units (1 = exactly binomial); nan without sizes.
    sum_sq, n_fitted, n_params: the standardised residuals' sum of squares, their number
      and the fit's free parameters (for `variance`).
  """
  rel_sd: np.ndarray
  scale: float
  rho: float
  rho_raw: float
  rho_sd: float
  size_known: bool
  dispersion: float
  sum_sq: float = 0.0
  n_fitted: int = 0
  n_params: int = 0
  rho_centre: float | None = None

  def variance(self, rho):
    """Noise variance (rel_sd units) the residuals imply if their autocorrelation is rho.

    A fitted curve absorbs about p (1 + rho) / (1 - rho) of the residual sum of squares
    under AR(1) noise (p for independent noise), so the degrees of freedom shrink with rho;
    a bootstrap replicate that draws a larger rho also gets the larger variance.
    """
    rho = np.asarray(rho, np.float64)
    absorbed = self.n_params * (1.0 + rho) / (1.0 - rho)
    var = self.sum_sq / np.maximum(self.n_fitted - absorbed, max(self.n_fitted / 2.0, 1.0))
    return var

  def sd(self, index=None) -> np.ndarray:
    """Noise sd of the evals at `index` (all when None)."""
    rel = self.rel_sd if index is None else self.rel_sd[index]
    return self.scale * rel

  def rho_draws(self, rng: np.random.Generator, n_draws: int) -> np.ndarray:
    """Autocorrelation per bootstrap replicate: N(rho, rho_sd) clipped to [0, RHO_MAX]."""
    centre = self.rho if self.rho_centre is None else self.rho_centre
    return np.clip(centre + self.rho_sd * rng.standard_normal(n_draws), 0.0, RHO_MAX)


def lag1_autocorrelation(z, mask, series) -> tuple[float, int]:
  """Lag-1 autocorrelation of z over consecutive masked entries of each series.

  Returns (rho, number of masked entries); rho is 0 with fewer than 3 entries.
  """
  z = np.asarray(z, np.float64)
  num = den = 0.0
  n = 0
  for s in np.unique(series[mask]):
    zs = z[mask & (series == s)]
    zs = zs - zs.mean()
    num += float(np.dot(zs[1:], zs[:-1]))
    den += float(np.dot(zs, zs))
    n += zs.size
  if n < 3 or den <= 0:
    return 0.0, n
  return num / den, n


def correct_rho(raw: float, n_per_series: float, clip: bool = True) -> float:
  """Bias-corrected lag-1 autocorrelation (see the module docstring), clipped."""
  n = max(float(n_per_series), RHO_BIAS[1] + 1.0)
  rho = (n * raw + RHO_BIAS[0]) / (n - RHO_BIAS[1])
  return float(np.clip(rho, 0.0, RHO_MAX)) if clip else float(min(rho, RHO_MAX))


def estimate(resid, mask, *, rel_sd=None, series=None, n_params: int,
             size_known: bool = False) -> NoiseModel:
  """Noise model from the residuals of a fit.

  Args:
    resid: y - fitted curve for every eval (any value where mask is False).
    mask: the fitted evals.
    rel_sd: relative sd per eval (binomial se) or None (homoscedastic).
    series: run id per eval (pooled seeds); None = one run. Eval order within a run is the
      array order.
    n_params: free parameters of the fit (for the degrees of freedom).
    size_known: rel_sd is a binomial se (the scale is then the dispersion's square root).

  Returns:
    The noise model.
  """
  resid = np.asarray(resid, np.float64)
  mask = np.asarray(mask, bool)
  rel = np.ones_like(resid) if rel_sd is None else np.asarray(rel_sd, np.float64)
  series = np.zeros(resid.shape, np.int64) if series is None else np.asarray(series)
  z = np.where(mask, resid / np.where(mask, rel, 1.0), 0.0)
  n = int(mask.sum())
  raw, _ = lag1_autocorrelation(z, mask, series)
  n_series = max(len(np.unique(series[mask])), 1)
  rho = correct_rho(raw, n / n_series)
  n_eff = max(n / n_series, RHO_BIAS[1] + 1.0)
  # The textbook sd of a lag-1 estimate, sqrt((1 - rho^2) / n), was too small on the
  # simulated fits (0.178 measured vs 0.142 at rho 0.5, 37 log-spaced points): 1 / sqrt(n)
  # matched them within 0.03. Scaled by the slope of the bias correction.
  rho_sd = float(np.sqrt(n_eff / n_series) / (n_eff - RHO_BIAS[1]))
  model = NoiseModel(rel_sd=rel, scale=1.0, rho=rho, rho_raw=raw, rho_sd=rho_sd,
                     size_known=size_known, dispersion=float("nan"),
                     sum_sq=float(np.sum(z[mask] ** 2)), n_fitted=n, n_params=n_params,
                     rho_centre=correct_rho(raw, n / n_series, clip=False))
  var = float(model.variance(rho))
  dispersion = float(model.sum_sq / max(n - n_params, 1)) if size_known else float("nan")
  return dataclasses.replace(model, scale=float(np.sqrt(var)), dispersion=dispersion)


def ar1_draws(rng: np.random.Generator, innovations, lengths, rho: float, n_draws: int
              ) -> list[np.ndarray]:
  """Stationary AR(1) series with unit marginal variance, innovations resampled.

  Args:
    rng: NumPy generator.
    innovations: standardised innovations (mean 0, variance 1) to resample from.
    lengths: length of each series.
    rho: lag-1 autocorrelation, one for all or one per replicate (K,).
    n_draws: number of replicates K.

  Returns:
    One (K, length) array per series.
  """
  u = np.asarray(innovations, np.float64)
  rho_K = np.broadcast_to(np.asarray(rho, np.float64), (n_draws,))
  gain_K = np.sqrt(1.0 - rho_K * rho_K)
  out = []
  for length in lengths:
    eps = u[rng.integers(0, u.size, size=(n_draws, int(length)))]
    # Unit variance at the start and gain^2 + rho^2 = 1: stationary from the first eval.
    e = np.empty_like(eps)
    e[:, 0] = eps[:, 0]
    for t in range(1, int(length)):
      e[:, t] = rho_K * e[:, t - 1] + gain_K * eps[:, t]
    out.append(e)
  return out


def innovations(z, mask, series, rho: float) -> np.ndarray:
  """Standardised AR(1) innovations of the standardised residuals z (for resampling)."""
  parts = []
  for s in np.unique(series[mask]):
    zs = z[mask & (series == s)]
    parts.append(zs[1:] - rho * zs[:-1] if zs.size > 1 and rho > 0 else zs)
  u = np.concatenate(parts) if parts else np.zeros(1)
  u = u - u.mean()
  sd = u.std()
  return u / sd if sd > 0 else np.zeros(1)
