"""Bootstrap uncertainty for a sigmoid fit: K vmapped refits on resampled residuals.

Residual bootstrap: y*_i = yhat_i + e_j with e_j drawn with replacement from the fit's
residuals (scaled by sqrt(n / (n - p)) so their spread is not biased low by the p fitted
parameters). Keeping the compute design fixed matters for a scaling curve: resampling
points instead would often drop the few high-compute points that pin down A.

Each refit is a Levenberg-Marquardt run started from the full-data optimum (all K at once
with vmap). On a well-determined curve the resampled optima lie close to it; on an
ill-determined one (midpoint beyond the data) the refits slide along the flat valley of the
loss, which is exactly the spread the intervals must show. The paper itself reports no
bootstrap; its error bar on A is +-0.02 from three repeated runs (App. A.5), reported next
to ours (`PAPER_A_MARGIN`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit as fit_lib

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


def bootstrap_sigmoid(compute, pass_rate, fit: fit_lib.SigmoidFit, *, weights=None,
                      n_boot: int = 1000, seed: int = 0, lm_steps: int = 40
                      ) -> SigmoidSamples:
  """Residual-bootstrap replicates of a sigmoid fit.

  Args:
    compute: the compute values the fit was made on (same length as pass_rate).
    pass_rate: the pass rates the fit was made on.
    fit: the full-data fit (its free parameters are refitted; fixed ones stay fixed).
    weights: the weights the fit used (0 drops a point).
    n_boot: number of refits K.
    seed: PRNG seed.
    lm_steps: Levenberg-Marquardt steps per refit.

  Returns:
    The K replicates.
  """
  x_N, y_N, w_N, n = fit_lib.prepare_arrays(compute, pass_rate, weights)
  p = 2 + (0 if fit.fix_a else 1) + (1 if fit.fit_r0 else 0)
  valid_N = w_N > 0
  pred_N = np.where(valid_N, fit.predict(np.where(valid_N, x_N, 1.0)), 0.0)
  resid_V = (y_N - pred_N)[valid_N] * np.sqrt(n / max(n - p, 1))
  # Host-side NumPy draws: a (K, N) index draw is instant, while jax.random would add
  # seconds of compilation to every CLI call.
  rng = np.random.default_rng(seed)
  y_KN = pred_N[None, :] + resid_V[rng.integers(0, resid_V.size, size=(n_boot, x_N.size))]
  with fit_lib.fitting_context():
    t_N = np.where(w_N > 0, np.log(np.where(w_N > 0, x_N, 1.0)) - fit.log_scale, 0.0)
    theta_KP = np.broadcast_to(fit.theta, (n_boot, fit.theta.shape[0]))
    theta_KP, _ = fit_lib.refine_sigmoid_batch(theta_KP, t_N, y_KN, w_N, steps=lm_steps,
                                               fit_r0=fit.fit_r0, fix_a=fit.fix_a)
    theta_KP = np.asarray(theta_KP)
  a, b, c_mid, r0 = fit_lib.theta_to_params(theta_KP, fit.log_scale)
  return SigmoidSamples(a_K=a, b_K=b, c_mid_K=c_mid, r0_K=np.asarray(r0))
