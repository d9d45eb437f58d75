"""Least-squares fits of the sigmoid and power-law curves, vectorised in NumPy (float64).

The sigmoid follows the paper's procedure (arXiv 2510.13786, App. A.5): a grid over A and
C_mid, B fitted by least squares in every cell, the cell with the least sum of squared
residuals wins. All cells of a curve are solved at once (array operations over cells x
points); B per cell is found by a small log-B grid and a few one-parameter
Levenberg-Marquardt steps, which is what the paper's curve_fit does. The winning cell then
seeds a joint Levenberg-Marquardt refinement of all parameters (analytic Jacobian, many
curves at once), with A kept in [0, 1] by projection (a logistic transform of A would
freeze at the bound, where its derivative vanishes, and hide the spread of ill-determined
fits), B = exp(beta) > 0 and C_mid in log-compute.

Grids. `grid="paper"` is the paper's: A in 0.450..0.800 step 0.005 (71 values), C_mid 100
linear values in [100, 40000] (GPU-hours, so only meaningful for data in that unit).
`grid="auto"` (default) scales with the data, because a CPU demo spends 1e-3
accelerator-hours and a real run 1e5: A takes `n_a` values in [max(R0, lowest fitted pass
rate), 1] (not from the highest observed rate: with noise that can exceed the true A),
C_mid takes `n_c` log-spaced values over [min C / 100, 100 max C] of the fitted points, so a
midpoint beyond the data can still be found (and then flagged as ill-determined).

Numerics: NumPy float64 on the host, so a live refit neither queues behind training on the
accelerator nor needs float64 from a TPU, and `jaxrl-scale fit` never imports or compiles
JAX (a cold fit with intervals takes about a second; benchmarks/forecast/fit_bench.py). Compute
enters as normalised log-compute t = log(C / max C), so its unit never matters.

Masks: each point carries a weight w (0 = ignored), so arrays of many curves (the
backtests, the coverage benchmark, pooled seeds) are fitted together.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import special

from jaxrl_scale.scaling import curves

# B is searched and refined within [0.01, 100]: outside it the curve is a step or a line.
_BETA_MIN, _BETA_MAX = float(np.log(0.01)), float(np.log(100.0))
_BETA_INIT = np.log(np.geomspace(0.2, 10.0, 8))
# log(C_mid / max C) is kept within +-40: beyond that the curve is constant on the data.
_M_LIM = 40.0
_PAPER_A = 0.450 + 0.005 * np.arange(71)
_PAPER_C_MID = np.linspace(100.0, 40000.0, 100)


@dataclasses.dataclass(frozen=True)
class FitOptions:
  """Settings of the fitter.

  Attributes:
    grid: "auto" (scaled to the data, see module docstring) or "paper".
    n_a: A values of the auto grid.
    n_c: C_mid values of the auto grid.
    c_span: the auto C_mid grid spans [min C / c_span, c_span * max C].
    inner_steps: Levenberg-Marquardt steps on B per grid cell.
    lm_steps: Levenberg-Marquardt steps of the joint refinement.
  """
  grid: str = "auto"
  n_a: int = 50
  n_c: int = 50
  c_span: float = 100.0
  inner_steps: int = 6
  lm_steps: int = 60

  def __post_init__(self):
    if self.grid not in ("auto", "paper"):
      raise ValueError(f"grid must be 'auto' or 'paper', got {self.grid!r}")


# ---------------------------------------------------------------------------------------------
# Arrays: K curves, N points, C grid cells, P parameters. Sigmoid theta = (A, beta, m, r0):
# B = exp(beta), C_mid = max C * exp(m).


def _normalise(x_KN, w_KN):
  """(t_KN, log_scale_K): log(C / max C) on weighted points, 0 elsewhere."""
  valid = w_KN > 0
  log_x = np.log(np.where(valid, x_KN, 1.0))
  log_scale = np.max(np.where(valid, log_x, -np.inf), axis=-1)
  return np.where(valid, log_x - log_scale[..., None], 0.0), log_scale


def _profile_r0(s, a, y, w):
  """Least-squares R0 for fixed A and s = sigmoid(B (t - m)) (sums over the last axis).

  y = r0 (1 - s) + a s is linear in r0: its least-squares value in closed form (variable
  projection), so a fitted R0 costs nothing extra per grid cell.
  """
  q = 1.0 - s
  num = np.sum(w * q * (y - a * s), axis=-1)
  den = np.sum(w * q * q, axis=-1) + 1e-30
  return num / den, num, den


def _cell_resid(beta_C, a_C, m_C, r0, t_n, y_n, w_n, sw_n, fit_r0: bool, with_jac: bool):
  """Residuals (C, n) of every cell at log B = beta_C, and their derivative in beta."""
  b_C = np.exp(beta_C)
  d_Cn = t_n[None, :] - m_C[:, None]
  s = special.expit(b_C[:, None] * d_Cn)
  a = a_C[:, None]
  if fit_r0:
    r0_C, num, den = _profile_r0(s, a, y_n[None], w_n[None])
    r0 = r0_C[:, None]
  r = sw_n * (y_n - r0 - (a - r0) * s)
  if not with_jac:
    return r, None
  ds = s * (1.0 - s) * b_C[:, None] * d_Cn
  if fit_r0:
    q = 1.0 - s
    dnum = np.sum(w_n * ds * (-(y_n - a * s) - a * q), axis=-1)
    dden = -2.0 * np.sum(w_n * q * ds, axis=-1)
    dr0 = ((dnum - r0_C * dden) / den)[:, None]
    return r, sw_n * (-(a - r0) * ds - dr0 * q)
  return r, sw_n * (-(a - r0) * ds)


def _start_sse(a_A, m_M, r0, t_n, y_n, w_n, fit_r0: bool):
  """SSE of every (A, C_mid) cell at each of the log-B starts: shape (G, A * M).

  The sigmoid s does not depend on A, so it is computed once per (C_mid, B) and the SSE of
  each A follows from weighted sums (the residual y - R0 (1 - s) - A s is linear in A and R0).
  """
  s = special.expit(np.exp(_BETA_INIT)[:, None, None] * (t_n - m_M[:, None]))  # (G, M, n)
  q = 1.0 - s
  syy = np.sum(w_n * y_n * y_n)
  sss, sqq, sqs = (np.sum(w_n * u * v, axis=-1) for u, v in ((s, s), (q, q), (q, s)))
  sys, syq = np.sum(w_n * y_n * s, axis=-1), np.sum(w_n * y_n * q, axis=-1)
  a = a_A[:, None, None]  # (A, 1, 1) against (G, M) sums
  if fit_r0:
    r0 = (syq - a * sqs) / (sqq + 1e-30)  # the profiled R0, as in _profile_r0
  sse = (syy + r0 * r0 * sqq + a * a * sss - 2.0 * r0 * syq - 2.0 * a * sys
         + 2.0 * a * r0 * sqs)  # (A, G, M)
  return np.moveaxis(sse, 1, 0).reshape(_BETA_INIT.size, -1)


def _fit_b_in_cells(a_A, m_M, r0, t_n, y_n, w_n, *, fit_r0: bool, steps: int):
  """Least-squares log B for every cell of the A x C_mid grid (R0 fixed or profiled).

  The best of a few log-spaced starts, then one-parameter Levenberg-Marquardt in log B
  (what curve_fit does for the paper, with B kept positive). Returns (beta_C, sse_C) over
  the cells in A-major order.
  """
  a_AM, m_AM = np.meshgrid(a_A, m_M, indexing="ij")
  a_C, m_C = a_AM.ravel(), m_AM.ravel()
  sw_n = np.sqrt(w_n)
  c = a_C.size
  sse_GC = _start_sse(a_A, m_M, r0, t_n, y_n, w_n, fit_r0)
  sse_GC = np.where(np.isfinite(sse_GC), sse_GC, np.inf)
  beta = _BETA_INIT[np.argmin(sse_GC, axis=0)]
  # The steps only have to rank cells, which float32 does as well as float64 at half the
  # cost; the joint refinement of the winner runs in float64.
  f32 = lambda v: np.asarray(v, np.float32)
  beta, a_C, m_C, r0, t_n, y_n, w_n, sw_n = (
      f32(v) for v in (beta, a_C, m_C, r0, t_n, y_n, w_n, sw_n))
  # The expanded sums lose digits to cancellation: they only pick the start, whose SSE is
  # then computed directly (the steps below compare against it).
  sse = np.sum(np.square(_cell_resid(beta, a_C, m_C, r0, t_n, y_n, w_n, sw_n, fit_r0,
                                     False)[0]), axis=-1)
  lam = np.full(c, 1e-3, np.float32)
  for _ in range(steps):
    r, j = _cell_resid(beta, a_C, m_C, r0, t_n, y_n, w_n, sw_n, fit_r0, True)
    step = -np.sum(j * r, axis=-1) / (np.sum(j * j, axis=-1) * (1.0 + lam) + 1e-30)
    cand = np.clip(beta + np.clip(step, -1.0, 1.0), _BETA_MIN, _BETA_MAX)
    cand_sse = np.sum(np.square(_cell_resid(cand, a_C, m_C, r0, t_n, y_n, w_n, sw_n, fit_r0,
                                            False)[0]), axis=-1)
    better = np.isfinite(cand_sse) & (cand_sse < sse)
    beta = np.where(better, cand, beta)
    sse = np.where(better, cand_sse, sse)
    lam = np.where(better, lam * np.float32(0.1), lam * np.float32(10.0))
  return beta.astype(np.float64), sse.astype(np.float64)


def _sigmoid_model(theta_KP, t_KN):
  """(pred_KN, dpred_KNP) of R = r0 + (A - r0) sigmoid(B (t - m))."""
  a, beta, m, r0 = (theta_KP[:, i:i + 1] for i in range(4))
  b = np.exp(beta)
  s = special.expit(b * (t_KN - m))
  g = (a - r0) * s * (1.0 - s) * b
  return r0 + (a - r0) * s, np.stack([s, g * (t_KN - m), -g, 1.0 - s], axis=-1)


def _power_model(theta_KP, t_KN):
  """(pred_KN, dpred_KNP) of R = A - exp(delta - B t)."""
  a, delta, beta = (theta_KP[:, i:i + 1] for i in range(3))
  b = np.exp(beta)
  e = np.exp(delta - b * t_KN)
  return a - e, np.stack([np.ones_like(e), -e, e * b * t_KN], axis=-1)


def _solve(h_KPP, g_KP):
  """Batched solve; a system LAPACK calls singular gives a non-finite (rejected) step."""
  try:
    return np.linalg.solve(h_KPP, g_KP[..., None])[..., 0]
  except np.linalg.LinAlgError:
    out = np.full_like(g_KP, np.nan)
    for k in range(g_KP.shape[0]):
      try:
        out[k] = np.linalg.solve(h_KPP[k], g_KP[k])
      except np.linalg.LinAlgError:
        continue  # stays nan: the step is rejected
    return out


def _lm(model, theta_KP, t_KN, y_KN, w_KN, free_P, steps: int, lo_P, hi_P):
  """Projected Levenberg-Marquardt of K curves at once on the free entries of theta.

  free_P is 1.0 / 0.0 per parameter. Returns (theta_KP, sse_K).
  """
  used = np.any(w_KN > 0, axis=0)  # points no curve weights cost time and change nothing
  t_KN, y_KN, w_KN = t_KN[:, used], y_KN[:, used], w_KN[:, used]
  sw = np.sqrt(w_KN)

  def sse_of(theta):
    return np.sum(np.square(sw * (y_KN - model(theta, t_KN)[0])), axis=-1)

  theta = np.array(theta_KP, np.float64)
  sse = sse_of(theta)
  lam = np.full(theta.shape[0], 1e-3)
  for _ in range(steps):
    pred, dpred = model(theta, t_KN)
    r = sw * (y_KN - pred)
    j = -(sw[..., None] * dpred) * free_P
    g = np.matmul(r[:, None, :], j)[:, 0]
    h = np.matmul(j.transpose(0, 2, 1), j)
    # Marquardt scaling by diag(H); fixed parameters get an identity row so the system
    # stays regular and their step is exactly zero.
    damp = lam[:, None] * (np.diagonal(h, axis1=1, axis2=2) + 1e-12) + (1.0 - free_P)
    h = h + damp[:, :, None] * np.eye(free_P.size)
    delta = -_solve(h, g) * free_P
    new = np.clip(theta + delta, lo_P, hi_P)
    new_sse = sse_of(new)
    ok = np.isfinite(new_sse) & (new_sse < sse)
    theta = np.where(ok[:, None], new, theta)
    sse = np.where(ok, new_sse, sse)
    lam = np.clip(np.where(ok, lam * 0.3, lam * 5.0), 1e-10, 1e10)
  return theta, sse


# Box of the projected LM: 0 <= A <= 1 (paper, Eq. 1), B and C_mid as above.
_SIG_LO = np.asarray([0.0, _BETA_MIN, -_M_LIM, -1.0])
_SIG_HI = np.asarray([1.0, _BETA_MAX, _M_LIM, 2.0])


def _free_mask(fix_a: bool, fit_r0: bool):
  return np.asarray([0.0 if fix_a else 1.0, 1.0, 1.0, 1.0 if fit_r0 else 0.0])


def _sigmoid_grid(t_n, y_n, w_n, r0, a_fixed, *, options: FitOptions, log_scale: float,
                  fit_r0: bool, fix_a: bool):
  """The paper's grid stage for one curve (valid points only): the best cell's theta."""
  if fix_a:
    a_A = np.asarray([a_fixed], np.float64)
  elif options.grid == "paper":
    a_A = _PAPER_A
  else:
    a_lo = np.min(y_n)
    if not fit_r0:
      a_lo = max(a_lo, r0 + 1e-3)
    a_A = np.linspace(np.clip(a_lo, 1e-3, 0.99), 1.0, options.n_a)
  if options.grid == "paper":
    m_M = np.log(_PAPER_C_MID) - log_scale
  else:
    span = np.log(options.c_span)
    m_M = np.linspace(np.min(t_n) - span, span, options.n_c)
  beta_C, sse_C = _fit_b_in_cells(a_A, m_M, r0, t_n, y_n, w_n, fit_r0=fit_r0,
                                  steps=options.inner_steps)
  a_C = np.repeat(a_A, m_M.size)
  m_C = np.tile(m_M, a_A.size)
  k = int(np.argmin(np.where(np.isfinite(sse_C), sse_C, np.inf)))
  a0, m0, beta0 = a_C[k], m_C[k], beta_C[k]
  if fit_r0:
    s = special.expit(np.exp(beta0) * (t_n - m0))
    r0 = _profile_r0(s, a0, y_n, w_n)[0]
  return np.asarray([a0, beta0, m0, r0], np.float64)


def fit_sigmoid_batch(x_KN, y_KN, w_KN, r0_K, a_fixed_K, *, options: FitOptions,
                      fit_r0: bool = False, fix_a: bool = False):
  """Fits K curves: the grid stage per curve, then one joint refinement of all K.

  Args:
    x_KN: compute, > 0 wherever w_KN > 0.
    y_KN: pass rates.
    w_KN: point weights; 0 drops a point (padding, compute cutoff, held-out suffix).
    r0_K: R0 per curve (ignored when fit_r0).
    a_fixed_K: A per curve when fix_a (the shared-A refit), else ignored.
    options: grid and iteration settings.
    fit_r0: fit R0 as a free parameter.
    fix_a: hold A at a_fixed_K.

  Returns:
    theta_KP (A, log B, log(C_mid / max C), R0), sse_K, log_scale_K (log max C).
  """
  x_KN, y_KN, w_KN = (np.asarray(v, np.float64) for v in (x_KN, y_KN, w_KN))
  r0_K = np.broadcast_to(np.asarray(r0_K, np.float64), x_KN.shape[:1])
  a_fixed_K = np.broadcast_to(np.asarray(a_fixed_K, np.float64), x_KN.shape[:1])
  with np.errstate(all="ignore"):
    t_KN, log_scale_K = _normalise(x_KN, w_KN)
    theta0 = []
    for k in range(x_KN.shape[0]):
      keep = w_KN[k] > 0
      theta0.append(_sigmoid_grid(
          t_KN[k, keep], y_KN[k, keep], w_KN[k, keep], float(r0_K[k]), float(a_fixed_K[k]),
          options=options, log_scale=float(log_scale_K[k]), fit_r0=fit_r0, fix_a=fix_a))
    theta, sse = _lm(_sigmoid_model, np.stack(theta0), t_KN, y_KN, w_KN,
                     _free_mask(fix_a, fit_r0), options.lm_steps, _SIG_LO, _SIG_HI)
  return theta, sse, log_scale_K


def refine_sigmoid_batch(theta_KP, t_N, y_KN, w_N, *, steps: int, fit_r0: bool,
                         fix_a: bool):
  """Levenberg-Marquardt refits of K data sets on one design, each from its own start.

  Returns (theta_KP, sse_K).
  """
  y_KN = np.asarray(y_KN, np.float64)
  t_KN = np.broadcast_to(np.asarray(t_N, np.float64), y_KN.shape)
  w_KN = np.broadcast_to(np.asarray(w_N, np.float64), y_KN.shape)
  with np.errstate(all="ignore"):
    return _lm(_sigmoid_model, theta_KP, t_KN, y_KN, w_KN, _free_mask(fix_a, fit_r0), steps,
               _SIG_LO, _SIG_HI)


def theta_to_params(theta_P, log_scale):
  """Internal parameters -> (A, B, C_mid, R0) as NumPy float64 (works on batches)."""
  theta = np.asarray(theta_P, dtype=np.float64)
  a, beta, m, r0 = theta[..., 0], theta[..., 1], theta[..., 2], theta[..., 3]
  return a, np.exp(beta), np.exp(m + np.asarray(log_scale, np.float64)), r0


# ---------------------------------------------------------------------------------------------
# Power law R = A - D / C^B, fitted as A - exp(delta - B t) in the same normalised t.
# theta = (A, delta, beta): 0 <= A <= 1 (bounded metric), D = exp(delta) max C^B.

_POW_LO = np.asarray([0.0, -60.0, float(np.log(1e-3))])
_POW_HI = np.asarray([1.0, 60.0, float(np.log(20.0))])


def _power_grid(t_n, y_n, w_n, n_grid: int):
  """Grid over (A, B) with the least-squares D of each cell in closed form (D >= 0)."""
  a_A = np.linspace(np.clip(np.min(y_n), 1e-3, 0.99), 1.0, n_grid)
  beta_B = np.linspace(np.log(1e-3), np.log(5.0), n_grid)
  e_Bn = np.exp(-np.exp(beta_B)[:, None] * t_n[None, :])
  resid_ABn = a_A[:, None, None] - y_n  # a - y
  d_AB = (np.sum(w_n * resid_ABn * e_Bn[None], axis=-1)
          / (np.sum(w_n * e_Bn * e_Bn, axis=-1)[None] + 1e-30))
  d_AB = np.maximum(d_AB, 1e-12)
  sse_AB = np.sum(w_n * np.square(d_AB[..., None] * e_Bn[None] - resid_ABn), axis=-1)
  i, j = np.unravel_index(np.argmin(np.where(np.isfinite(sse_AB), sse_AB, np.inf)),
                          sse_AB.shape)
  return np.asarray([a_A[i], np.log(d_AB[i, j]), beta_B[j]])


def fit_power_law_batch(x_KN, y_KN, w_KN, *, n_grid: int = 60, lm_steps: int = 60):
  """Fits K power laws; returns theta_KP (A, delta, beta), sse_K, log_scale_K."""
  x_KN, y_KN, w_KN = (np.asarray(v, np.float64) for v in (x_KN, y_KN, w_KN))
  with np.errstate(all="ignore"):
    t_KN, log_scale_K = _normalise(x_KN, w_KN)
    theta0 = np.stack([_power_grid(t_KN[k, w_KN[k] > 0], y_KN[k, w_KN[k] > 0],
                                   w_KN[k, w_KN[k] > 0], n_grid)
                       for k in range(x_KN.shape[0])])
    theta, sse = _lm(_power_model, theta0, t_KN, y_KN, w_KN, np.ones(3), lm_steps, _POW_LO,
                     _POW_HI)
  return theta, sse, log_scale_K


def power_theta_to_params(theta_P, log_scale):
  """Internal power-law parameters -> (A, D, B) in the data's compute unit."""
  theta = np.asarray(theta_P, dtype=np.float64)
  b = np.exp(theta[..., 2])
  a = theta[..., 0]
  # exp(delta - B t) with t = log C - log_scale  =>  D = exp(delta + B log_scale).
  return a, np.exp(theta[..., 1] + b * np.asarray(log_scale, np.float64)), b


# ---------------------------------------------------------------------------------------------
# One-curve API on NumPy inputs.


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
  """A fitted sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B).

  Attributes:
    a, b, c_mid, r0: the curve parameters (C_mid in the data's compute unit).
    sse: weighted sum of squared residuals on the fitted points.
    n_points: number of fitted points.
    fit_r0: R0 was a free parameter. fix_a: A was held fixed.
    theta: internal parameters (A, log B, log(C_mid / max C), R0); log_scale = log max C.
  """
  a: float
  b: float
  c_mid: float
  r0: float
  sse: float
  n_points: int
  fit_r0: bool
  fix_a: bool
  theta: np.ndarray = dataclasses.field(repr=False)
  log_scale: float = dataclasses.field(repr=False)

  def predict(self, compute) -> np.ndarray:
    """Pass rate of the fitted curve at `compute` (NumPy float64)."""
    return curves.sigmoid(compute, self.a, self.b, self.c_mid, self.r0)


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
  """A fitted power law R(C) = A - D / C^B."""
  a: float
  d: float
  b: float
  sse: float
  n_points: int

  def predict(self, compute) -> np.ndarray:
    """Pass rate of the fitted power law at `compute` > 0 (NumPy float64)."""
    return curves.power_law(compute, self.a, self.d, self.b)


def prepare_arrays(compute, pass_rate, weights):
  """float64 (x_N, y_N, w_N) and the number of usable points.

  Points with compute <= 0 (the R0 eval) get weight 0, having no log-compute.
  """
  x = np.asarray(compute, np.float64).ravel()
  y = np.asarray(pass_rate, np.float64).ravel()
  w = np.ones_like(x) if weights is None else np.asarray(weights, np.float64).ravel()
  if not x.size == y.size == w.size:
    raise ValueError(f"compute, pass_rate and weights differ in length: "
                     f"{x.size}, {y.size}, {w.size}")
  w = np.where(x > 0, w, 0.0)
  n = int(np.sum(w > 0))
  if n < 3:
    raise ValueError(f"need at least 3 points with compute > 0 and weight > 0, got {n}")
  return x, y, w, n


def fit_sigmoid(compute, pass_rate, r0: float | None = None, *, weights=None,
                options: FitOptions = FitOptions(), a_fixed: float | None = None
                ) -> SigmoidFit:
  """Fits the sigmoid to one curve by the paper's grid procedure plus joint refinement.

  Args:
    compute: compute of each point; points with compute <= 0 are ignored.
    pass_rate: pass rate of each point.
    r0: pass rate at zero compute; None fits it.
    weights: optional per-point weights (0 drops a point, e.g. below a compute cutoff).
    options: grid ("auto" or "paper") and iteration settings.
    a_fixed: hold A at this value (the paper's shared-A efficiency comparison).

  Returns:
    The fitted curve.
  """
  x_N, y_N, w_N, n = prepare_arrays(compute, pass_rate, weights)
  fit_r0 = r0 is None
  fix_a = a_fixed is not None
  theta, sse, log_scale = fit_sigmoid_batch(
      x_N[None], y_N[None], w_N[None], np.asarray([0.0 if fit_r0 else r0]),
      np.asarray([0.5 if a_fixed is None else a_fixed]), options=options, fit_r0=fit_r0,
      fix_a=fix_a)
  theta, sse, log_scale = theta[0], float(sse[0]), float(log_scale[0])
  a, b, c_mid, r0_fit = theta_to_params(theta, log_scale)
  return SigmoidFit(a=float(a), b=float(b), c_mid=float(c_mid), r0=float(r0_fit), sse=sse,
                    n_points=n, fit_r0=fit_r0, fix_a=fix_a, theta=theta, log_scale=log_scale)


def fit_power_law(compute, pass_rate, *, weights=None) -> PowerLawFit:
  """Fits R = A - D / C^B (A.4 of the paper) to one curve; 0 < A < 1, D > 0, B > 0."""
  x_N, y_N, w_N, n = prepare_arrays(compute, pass_rate, weights)
  theta, sse, log_scale = fit_power_law_batch(x_N[None], y_N[None], w_N[None])
  theta, sse, log_scale = theta[0], float(sse[0]), float(log_scale[0])
  a, d, b = power_theta_to_params(theta, log_scale)
  return PowerLawFit(a=float(a), d=float(d), b=float(b), sse=sse, n_points=n)
