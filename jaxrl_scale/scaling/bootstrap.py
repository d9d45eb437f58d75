"""Bootstrap uncertainty for a sigmoid fit: K batched refits on simulated replicates.

Replicates are the fitted curve plus noise from the eval noise model (`noise.py`): per-eval
sd (binomial se from the eval size, or homoscedastic), scaled by the residuals with their
degrees of freedom, and AR(1) correlated in eval order with the residuals' bias-corrected
lag-1 autocorrelation. The innovations are the fit's own whitened residuals, resampled with
replacement (an AR-sieve bootstrap), so a heavy-tailed eval keeps its shape. When R0 is the
step-0 eval it is redrawn in every replicate with that eval's noise, so its error widens the
intervals too. Keeping the compute design fixed matters for a scaling curve: resampling
points instead would often drop the few high-compute points that pin down A.

Each refit is a Levenberg-Marquardt run started from the full-data optimum (all K at once
as arrays). On a well-determined curve the resampled optima lie close to it; on an
ill-determined one (midpoint beyond the data) the refits slide along the flat valley of the
loss, which is exactly the spread the intervals must show. The paper itself reports no
bootstrap; its error bar on A is +-0.02 from three repeated runs (App. A.5), reported next
to ours (`PAPER_A_MARGIN`). The replicates hold eval noise only: seed-to-seed training
variance enters where runs are compared (`seeds.py`).

Seeds. `seed=None` (the default everywhere) draws fresh entropy, so two callers never share
their draws by accident; the seed actually used is recorded on the result (`.seed`), and
passing it back reproduces the draws exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import noise

# App. A.5: A varied by at most +-0.015 over three identical runs; the paper treats
# |delta A| <= 0.02 as noise.
PAPER_A_MARGIN = 0.02


@dataclasses.dataclass(frozen=True)
class SigmoidSamples:
  """Bootstrap replicates of the sigmoid parameters, one entry per refit (K)."""
  a_K: np.ndarray
  b_K: np.ndarray
  c_mid_K: np.ndarray
  r0_K: np.ndarray
  seed: int | None = None  # the PRNG seed that drew the replicates

  @property
  def size(self) -> int:
    return int(self.a_K.shape[0])

  def interval(self, name: str, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of parameter `name` ("a", "b", "c_mid", "r0")."""
    return percentile_interval(getattr(self, f"{name}_K"), level)

  def predict(self, compute) -> np.ndarray:
    """Curves of all replicates at `compute`: shape (K,) + compute.shape."""
    c = np.asarray(compute, np.float64)
    col = lambda v: v.reshape((-1,) + (1,) * c.ndim)
    return curves.sigmoid(c[None], col(self.a_K), col(self.b_K), col(self.c_mid_K),
                          col(self.r0_K))


def percentile_interval(values_K, level: float = 0.95) -> tuple[float, float]:
  """Central percentile interval; non-finite replicates count as beyond either end."""
  v = np.asarray(values_K, np.float64)
  tail = 100.0 * (1.0 - level) / 2.0
  # nan -> +inf keeps "never reached" replicates (compute-to-target) in the count.
  v = np.where(np.isnan(v), np.inf, v)
  # Linear interpolation towards an inf gives nan; then take the nearest rank instead.
  method = "linear" if np.all(np.isfinite(v)) else "nearest"
  lo, hi = np.percentile(v, [tail, 100.0 - tail], method=method)
  return float(lo), float(hi)


def resolve_seed(seed: int | None) -> int:
  """`seed`, or fresh OS entropy (a 32-bit int, short enough to pass back as --seed)."""
  if seed is not None:
    return int(seed)
  return int(np.random.SeedSequence().generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class Replicates:
  """Simulated data sets of a bootstrap, kept for refits under other constraints (shared A).

  Attributes:
    y_KN: replicate pass rates, one row per replicate.
    r0_K: replicate R0 (the fitted R0 when it is not drawn).
    w_N: fit weights. t_N: normalised log-compute of the fit (log(C / max C)).
    seed: the PRNG seed that drew them.
  """
  y_KN: np.ndarray
  r0_K: np.ndarray
  w_N: np.ndarray
  t_N: np.ndarray
  seed: int | None = None


def simulate(compute, fit: fit_lib.SigmoidFit, noise_model: noise.NoiseModel, *,
             weights=None, series=None, r0_sd: float | None = None, n_boot: int = 1000,
             seed: int | None = None, resid=None) -> Replicates:
  """Replicate data sets: the fitted curve plus AR(1) noise drawn from the noise model.

  Args:
    compute: compute of every eval of the curve (fitted or not), in eval order.
    fit: the fitted curve (the replicates' truth).
    noise_model: per-eval sd and autocorrelation (`noise.estimate`).
    weights: the fit weights (0: not fitted).
    series: run id per eval when seeds are pooled (eval order within each run).
    r0_sd: sd of the step-0 eval when R0 came from it (drawn with the first eval of each
      run, so it shares that eval's correlation); None or 0 keeps R0 fixed.
    n_boot: number of replicates K.
    seed: PRNG seed (None: fresh entropy; recorded as `Replicates.seed`).
    resid: residuals y - fit for every eval, resampled as standardised innovations
      (None: Gaussian innovations).

  Returns:
    The replicates.
  """
  x_N, _, w_N, _ = fit_lib.prepare_arrays(compute, np.zeros(np.size(compute)), weights)
  e = x_N.size
  mask = w_N > 0
  series = np.zeros(e, np.int64) if series is None else np.asarray(series)
  seed = resolve_seed(seed)
  rng = np.random.default_rng(seed)
  if resid is None:
    u = rng.standard_normal(4096)
    u = (u - u.mean()) / u.std()
  else:
    z = np.where(mask, np.asarray(resid, np.float64) / noise_model.rel_sd, 0.0)
    u = noise.innovations(z, mask, series, noise_model.rho)
  ids = np.unique(series)
  rho_K = noise_model.rho_draws(rng, n_boot)
  draws = noise.ar1_draws(rng, u, [int(np.sum(series == s)) for s in ids], rho_K, n_boot)
  e_KE = np.empty((n_boot, e))
  for s, d in zip(ids, draws):
    e_KE[:, series == s] = d
  if noise_model.n_fitted:
    # Each replicate's noise scale follows its own rho (see NoiseModel.variance).
    e_KE *= np.sqrt(noise_model.variance(rho_K))[:, None] / noise_model.scale
  y_KN = fit.predict(x_N)[None] + e_KE * noise_model.sd()[None]
  r0_K = np.full(n_boot, fit.r0)
  if r0_sd and not fit.fit_r0:
    first = [int(np.flatnonzero(series == s)[0]) for s in ids]
    r0_K = fit.r0 + r0_sd * e_KE[:, first].mean(axis=1)
  t_N = np.where(w_N > 0, np.log(np.where(w_N > 0, x_N, 1.0)) - fit.log_scale, 0.0)
  return Replicates(y_KN=y_KN, r0_K=r0_K, w_N=w_N, t_N=t_N, seed=seed)


def refit(fit: fit_lib.SigmoidFit, reps: Replicates, *, a_K=None, lm_steps: int = 40
          ) -> SigmoidSamples:
  """Refits every replicate from the full-data optimum (A held at a_K when given)."""
  theta_KP = np.array(np.broadcast_to(fit.theta, (reps.y_KN.shape[0], fit.theta.size)))
  theta_KP[:, 3] = reps.r0_K
  fix_a = fit.fix_a or a_K is not None
  if a_K is not None:
    theta_KP[:, 0] = a_K
  theta_KP, _ = fit_lib.refine_sigmoid_batch(theta_KP, reps.t_N, reps.y_KN, reps.w_N,
                                             steps=lm_steps, fit_r0=fit.fit_r0, fix_a=fix_a)
  a, b, c_mid, r0 = fit_lib.theta_to_params(theta_KP, fit.log_scale)
  return SigmoidSamples(a_K=a, b_K=b, c_mid_K=c_mid, r0_K=np.asarray(r0), seed=reps.seed)


def bootstrap_sigmoid(compute, pass_rate, fit: fit_lib.SigmoidFit, *, weights=None,
                      noise_model: noise.NoiseModel | None = None, series=None,
                      r0_sd: float | None = None, r0_from_eval: bool = False,
                      n_boot: int = 1000, seed: int | None = None, lm_steps: int = 40
                      ) -> SigmoidSamples:
  """AR(1) residual-bootstrap replicates of a sigmoid fit.

  Args:
    compute: the compute values the fit was made on (every eval, in eval order).
    pass_rate: the pass rates the fit was made on.
    fit: the full-data fit (its free parameters are refitted; fixed ones stay fixed).
    weights: the weights the fit used (0 drops a point).
    noise_model: the eval noise; None estimates it from the residuals (homoscedastic
      unless the weights differ, then rel sd = 1 / sqrt(weight)).
    series: run id per eval when several seeds are pooled.
    r0_sd: sd of the step-0 eval R0 came from (None: R0 fixed, e.g. given by --r0).
    r0_from_eval: R0 is an eval not among `compute` (the live forecaster's step-0 point):
      its sd is the noise model's homoscedastic sd (ignored when r0_sd is given).
    n_boot: number of refits K.
    seed: PRNG seed (None: fresh entropy; recorded as `.seed` of the result).
    lm_steps: Levenberg-Marquardt steps per refit.

  Returns:
    The K replicates.
  """
  resid = residuals(compute, pass_rate, fit)
  if noise_model is None:
    noise_model, _ = estimate_noise(compute, pass_rate, fit, weights=weights, series=series)
  if r0_sd is None and r0_from_eval:
    r0_sd = noise_model.scale
  reps = simulate(compute, fit, noise_model, weights=weights, series=series, r0_sd=r0_sd,
                  n_boot=n_boot, seed=seed, resid=resid)
  return refit(fit, reps, lm_steps=lm_steps)


def estimate_noise(compute, pass_rate, fit: fit_lib.SigmoidFit, *, weights=None, series=None
                   ) -> tuple[noise.NoiseModel, np.ndarray]:
  """The eval noise model the residuals of `fit` imply, and those residuals (every eval).

  Homoscedastic unless the weights differ, then rel sd = 1 / sqrt(weight).
  """
  _, _, w, _ = fit_lib.prepare_arrays(compute, pass_rate, weights)
  mask = w > 0
  resid = residuals(compute, pass_rate, fit)
  rel = np.where(mask, 1.0 / np.sqrt(np.where(mask, w, 1.0)), 1.0)
  rel = rel / np.min(rel[mask])
  model = noise.estimate(resid, mask, rel_sd=rel, series=series,
                         n_params=free_parameters(fit))
  return model, resid


def residuals(compute, pass_rate, fit: fit_lib.SigmoidFit) -> np.ndarray:
  """pass_rate - fit at every eval (the curve gives exactly R0 at compute 0)."""
  return np.asarray(pass_rate, np.float64) - fit.predict(compute)


def free_parameters(fit: fit_lib.SigmoidFit) -> int:
  """Number of fitted parameters (B and C_mid always; A unless fixed; R0 if fitted)."""
  return 2 + (0 if fit.fix_a else 1) + (1 if fit.fit_r0 else 0)
