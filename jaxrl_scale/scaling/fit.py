"""Least-squares fits of the sigmoid and power-law curves, vectorised in JAX.

The sigmoid follows the paper's procedure (arXiv 2510.13786, App. A.5): a grid over A and
C_mid, B fitted by least squares in every cell, the cell with the least sum of squared
residuals wins. All cells are solved at once (vmap); B per cell is found by a small log-B
grid and a few one-parameter Levenberg-Marquardt steps, which is what the paper's
curve_fit does. The winning cell then seeds a joint Levenberg-Marquardt refinement
of all parameters, with A kept in [0, 1] by projection (a logistic transform of A would
freeze at the bound, where its derivative vanishes, and hide the spread of ill-determined
fits), B = exp(beta) > 0 and C_mid in log-compute.

Grids. `grid="paper"` is the paper's: A in 0.450..0.800 step 0.005 (71 values), C_mid 100
linear values in [100, 40000] (GPU-hours, so only meaningful for data in that unit).
`grid="auto"` (default) scales with the data, because a CPU demo spends 1e-3
accelerator-hours and a real run 1e5: A takes `n_a` values in [max(R0, lowest fitted pass
rate), 1] (not from the highest observed rate: with noise that can exceed the true A),
C_mid takes `n_c` log-spaced values over [min C / 100, 100 max C] of the fitted points, so a
midpoint beyond the data can still be found (and then flagged as ill-determined).

Numerics: every fit runs inside `fitting_context()`: float64 through `jax.enable_x64(True)`
(a local context; the rest of the stack keeps its float32 default) and on the host CPU,
so a live refit neither queues behind training on the accelerator nor asks a TPU for
float64. The grid stage runs in float32 (it only ranks cells); the refinement in float64.
Compute enters as normalised log-compute t = log(C / max C), so its unit never matters.

Masks: each point carries a weight w (0 = ignored). Fixed-shape padded arrays plus masks let
one compiled function serve every prefix (backtests, the live forecaster, many seeds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import nn as jnn
import numpy as np

from jaxrl_scale.scaling import curves

# B is searched and refined within [0.01, 100]: outside it the curve is a step or a line.
_BETA_MIN, _BETA_MAX = float(np.log(0.01)), float(np.log(100.0))
_BETA_INIT = tuple(float(v) for v in np.log(np.geomspace(0.2, 10.0, 8)))
# log(C_mid / max C) is kept within +-40: beyond that the curve is constant on the data.
_M_LIM = 40.0
_PAPER_A = tuple(0.450 + 0.005 * i for i in range(71))
_PAPER_C_MID = tuple(float(v) for v in np.linspace(100.0, 40000.0, 100))
# Curves fitted together per lax.map step (bounds memory; see _map_curves).
_CURVE_BATCH = 4


@dataclasses.dataclass(frozen=True)
class FitOptions:
  """Static settings of the fitter (hashable: it keys the compiled functions).

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
# Jitted cores. Arrays: N points, A/M grid sizes, P = 4 sigmoid parameters
# theta = (A, beta, m, r0): B = exp(beta), C_mid = max C * exp(m).


def _normalise(x_N, w_N):
  valid_N = w_N > 0
  log_x_N = jnp.log(jnp.where(valid_N, x_N, 1.0))
  log_scale = jnp.max(jnp.where(valid_N, log_x_N, -jnp.inf))
  return jnp.where(valid_N, log_x_N - log_scale, 0.0), log_scale


def _masked_min(v_N, w_N):
  return jnp.min(jnp.where(w_N > 0, v_N, jnp.inf))


def _sigmoid_resid(theta_P, t_N, y_N, sw_N):
  a, beta, m, r0 = theta_P[0], theta_P[1], theta_P[2], theta_P[3]
  pred_N = r0 + (a - r0) * jnn.sigmoid(jnp.exp(beta) * (t_N - m))
  return sw_N * (y_N - pred_N)


def _profile_r0(s_N, a, y_N, w_N):
  # y = r0 (1 - s) + a s is linear in r0: its least-squares value in closed form
  # (variable projection), so a fitted R0 costs nothing extra per grid cell.
  q_N = 1.0 - s_N
  return jnp.sum(w_N * q_N * (y_N - a * s_N)) / (jnp.sum(w_N * q_N * q_N) + 1e-30)


def _cell_resid(beta, a, m, r0, t_N, y_N, w_N, fit_r0: bool):
  s_N = jnn.sigmoid(jnp.exp(beta) * (t_N - m))
  if fit_r0:
    r0 = _profile_r0(s_N, a, y_N, w_N)
  return jnp.sqrt(w_N) * (y_N - r0 - (a - r0) * s_N)


def _fit_b_in_cell(a, m, r0, t_N, y_N, w_N, fit_r0: bool, steps: int):
  """Least-squares B for fixed (A, C_mid[, R0]); returns (beta, sse).

  The best of a few log-spaced starts, then one-parameter Levenberg-Marquardt in log B
  (what curve_fit does for the paper, with B kept positive).
  """
  resid = functools.partial(_cell_resid, a=a, m=m, r0=r0, t_N=t_N, y_N=y_N, w_N=w_N,
                            fit_r0=fit_r0)
  sse_fn = lambda beta: jnp.sum(jnp.square(resid(beta)))
  init_G = jnp.asarray(_BETA_INIT, t_N.dtype)
  sse_G = jax.vmap(sse_fn)(init_G)
  best = jnp.argmin(jnp.where(jnp.isfinite(sse_G), sse_G, jnp.inf))

  def body(_, state):
    beta, sse, lam = state
    r_N, j_N = jax.jvp(resid, (beta,), (jnp.ones_like(beta),))
    step = -jnp.dot(j_N, r_N) / (jnp.dot(j_N, j_N) * (1.0 + lam) + 1e-30)
    cand = jnp.clip(beta + jnp.clip(step, -1.0, 1.0), _BETA_MIN, _BETA_MAX)
    cand_sse = sse_fn(cand)
    better = jnp.isfinite(cand_sse) & (cand_sse < sse)
    return (jnp.where(better, cand, beta), jnp.where(better, cand_sse, sse),
            jnp.where(better, lam * 0.1, lam * 10.0))

  init = (init_G[best], sse_G[best], jnp.asarray(1e-3, t_N.dtype))
  beta, sse, _ = jax.lax.fori_loop(0, steps, body, init)
  return beta, sse


def _lm(resid_fn, theta_P, free_P, steps: int, clip_lo_P, clip_hi_P):
  """Levenberg-Marquardt on the free entries of theta (free_P is 1.0 / 0.0)."""
  sse_fn = lambda th: jnp.sum(jnp.square(resid_fn(th)))

  def body(_, state):
    theta, sse, lam = state
    r_N = resid_fn(theta)
    j_NP = jax.jacfwd(resid_fn)(theta) * free_P[None, :]
    g_P = j_NP.T @ r_N
    h_PP = j_NP.T @ j_NP
    # Marquardt scaling by diag(H); fixed parameters get an identity row so the system
    # stays regular and their step is exactly zero.
    damp_P = lam * (jnp.diag(h_PP) + 1e-12) + (1.0 - free_P)
    delta_P = -jnp.linalg.solve(h_PP + jnp.diag(damp_P), g_P) * free_P
    new = jnp.clip(theta + delta_P, clip_lo_P, clip_hi_P)
    new_sse = sse_fn(new)
    ok = jnp.isfinite(new_sse) & (new_sse < sse)
    theta = jnp.where(ok, new, theta)
    sse = jnp.where(ok, new_sse, sse)
    lam = jnp.clip(jnp.where(ok, lam * 0.3, lam * 5.0), 1e-10, 1e10)
    return theta, sse, lam

  theta, sse, _ = jax.lax.fori_loop(0, steps, body, (theta_P, sse_fn(theta_P), 1e-3))
  return theta, sse


# Box of the projected LM: 0 <= A <= 1 (paper, Eq. 1), B and C_mid as above.
_SIG_LO = jnp.asarray([0.0, _BETA_MIN, -_M_LIM, -1.0])
_SIG_HI = jnp.asarray([1.0, _BETA_MAX, _M_LIM, 2.0])


def _free_mask(fix_a: bool, fit_r0: bool):
  return jnp.asarray([0.0 if fix_a else 1.0, 1.0, 1.0, 1.0 if fit_r0 else 0.0])


def _sigmoid_core(x_N, y_N, w_N, r0, a_fixed, *, options: FitOptions, fit_r0: bool,
                  fix_a: bool):
  """Grid search + joint refinement for one curve. Returns (theta_P, sse, log_scale)."""
  t_N, log_scale = _normalise(x_N, w_N)
  if fix_a:
    a_A = jnp.reshape(a_fixed, (1,))
  elif options.grid == "paper":
    a_A = jnp.asarray(_PAPER_A)
  else:
    a_lo = _masked_min(y_N, w_N)
    if not fit_r0:
      a_lo = jnp.maximum(a_lo, r0 + 1e-3)
    a_lo = jnp.clip(a_lo, 1e-3, 0.99)
    a_A = jnp.linspace(a_lo, 1.0, options.n_a)
  if options.grid == "paper":
    m_M = jnp.log(jnp.asarray(_PAPER_C_MID)) - log_scale
  else:
    span = np.log(options.c_span)
    m_M = jnp.linspace(_masked_min(t_N, w_N) - span, span, options.n_c)
  a_AM, m_AM = jnp.meshgrid(a_A, m_M, indexing="ij")
  # The grid only has to rank cells, which float32 does as well as float64 at half the
  # cost (benchmarks/fit_bench.py); the joint refinement below runs in the input dtype.
  f32 = lambda v: jnp.asarray(v, jnp.float32)
  cell = functools.partial(_fit_b_in_cell, r0=f32(r0), t_N=f32(t_N), y_N=f32(y_N),
                           w_N=f32(w_N), fit_r0=fit_r0, steps=options.inner_steps)
  beta_C, sse_C = jax.vmap(cell)(f32(a_AM.ravel()), f32(m_AM.ravel()))
  sse_C = jnp.where(jnp.isfinite(sse_C), sse_C, jnp.inf)
  k = jnp.argmin(sse_C)
  a0, m0 = a_AM.ravel()[k], m_AM.ravel()[k]
  beta0 = jnp.asarray(beta_C[k], a0.dtype)
  if fit_r0:
    s_N = jnn.sigmoid(jnp.exp(beta0) * (t_N - m0))
    r0 = _profile_r0(s_N, a0, y_N, w_N)
  theta0 = jnp.stack([a0, beta0, m0, jnp.asarray(r0, a0.dtype)])
  resid = functools.partial(_sigmoid_resid, t_N=t_N, y_N=y_N, sw_N=jnp.sqrt(w_N))
  theta, sse = _lm(resid, theta0, _free_mask(fix_a, fit_r0), options.lm_steps, _SIG_LO,
                   _SIG_HI)
  return theta, sse, log_scale


@functools.partial(jax.jit, static_argnames=("options", "fit_r0", "fix_a"))
def fit_sigmoid_batch(x_KN, y_KN, w_KN, r0_K, a_fixed_K, *, options: FitOptions,
                      fit_r0: bool = False, fix_a: bool = False):
  """Fits K curves at once (call inside `fitting_context()` for float64 on the CPU).

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
  core = functools.partial(_sigmoid_core, options=options, fit_r0=fit_r0, fix_a=fix_a)
  return _map_curves(core, (x_KN, y_KN, w_KN, r0_K, a_fixed_K))


def _map_curves(core, args):
  # Curves go through lax.map in small batches: vmapping K curves x all grid cells at once
  # would materialise K * cells * N intermediates (gigabytes for 200 curves). The batch
  # divides K, since lax.map compiles a second copy of the body for a remainder.
  k = args[0].shape[0]
  batch = max(d for d in range(1, _CURVE_BATCH + 1) if k % d == 0)
  if batch == k:
    return jax.vmap(core)(*args)
  return jax.lax.map(lambda a: core(*a), args, batch_size=batch)


@functools.partial(jax.jit, static_argnames=("steps", "fit_r0", "fix_a"))
def refine_sigmoid_batch(theta_KP, t_N, y_KN, w_N, *, steps: int, fit_r0: bool,
                         fix_a: bool):
  """Levenberg-Marquardt refits of K data sets on one design, each from its own start."""

  def one(theta_P, y_N):
    resid = functools.partial(_sigmoid_resid, t_N=t_N, y_N=y_N, sw_N=jnp.sqrt(w_N))
    return _lm(resid, theta_P, _free_mask(fix_a, fit_r0), steps, _SIG_LO, _SIG_HI)

  return jax.vmap(one)(theta_KP, y_KN)


def theta_to_params(theta_P, log_scale):
  """Internal parameters -> (A, B, C_mid, R0) as NumPy float64 (works on batches)."""
  theta = np.asarray(theta_P, dtype=np.float64)
  a, beta, m, r0 = theta[..., 0], theta[..., 1], theta[..., 2], theta[..., 3]
  return a, np.exp(beta), np.exp(m + np.asarray(log_scale, np.float64)), r0


# ---------------------------------------------------------------------------------------------
# Power law R = A - D / C^B, fitted as A - exp(delta - B t) in the same normalised t.
# theta = (A, delta, beta): 0 <= A <= 1 (bounded metric), D = exp(delta) max C^B.


def _power_resid(theta_P, t_N, y_N, sw_N):
  a, delta, beta = theta_P[0], theta_P[1], theta_P[2]
  return sw_N * (y_N - a + jnp.exp(delta - jnp.exp(beta) * t_N))


_POW_LO = jnp.asarray([0.0, -60.0, float(np.log(1e-3))])
_POW_HI = jnp.asarray([1.0, 60.0, float(np.log(20.0))])


def _power_core(x_N, y_N, w_N, *, n_grid: int, lm_steps: int):
  t_N, log_scale = _normalise(x_N, w_N)
  a_A = jnp.linspace(jnp.clip(_masked_min(y_N, w_N), 1e-3, 0.99), 1.0, n_grid)
  beta_B = jnp.linspace(np.log(1e-3), np.log(5.0), n_grid)

  def cell(a, beta):
    # For fixed A and B the law is linear in D: closed-form least squares, D >= 0.
    e_N = jnp.exp(-jnp.exp(beta) * t_N)
    d = jnp.sum(w_N * (a - y_N) * e_N) / (jnp.sum(w_N * e_N * e_N) + 1e-30)
    d = jnp.maximum(d, 1e-12)
    return jnp.sum(w_N * jnp.square(y_N - a + d * e_N)), d

  a_AB, beta_AB = jnp.meshgrid(a_A, beta_B, indexing="ij")
  sse_C, d_C = jax.vmap(cell)(a_AB.ravel(), beta_AB.ravel())
  k = jnp.argmin(jnp.where(jnp.isfinite(sse_C), sse_C, jnp.inf))
  theta0 = jnp.stack([a_AB.ravel()[k], jnp.log(d_C[k]), beta_AB.ravel()[k]])
  resid = functools.partial(_power_resid, t_N=t_N, y_N=y_N, sw_N=jnp.sqrt(w_N))
  theta, sse = _lm(resid, theta0, jnp.ones(3), lm_steps, _POW_LO, _POW_HI)
  return theta, sse, log_scale


@functools.partial(jax.jit, static_argnames=("n_grid", "lm_steps"))
def fit_power_law_batch(x_KN, y_KN, w_KN, *, n_grid: int = 60, lm_steps: int = 60):
  """Fits K power laws at once; returns theta_KP (A, delta, beta), sse_K, log_scale_K."""
  core = functools.partial(_power_core, n_grid=n_grid, lm_steps=lm_steps)
  return _map_curves(core, (x_KN, y_KN, w_KN))


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


@contextlib.contextmanager
def fitting_context():
  """float64 on the host CPU for the duration of a fit (see the module docstring)."""
  try:
    cpu = jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS excludes the CPU: stay on the default device
    cpu = None
  place = jax.default_device(cpu) if cpu is not None else contextlib.nullcontext()
  with jax.enable_x64(True), place:
    yield


def padded_size(n: int) -> int:
  """Arrays are padded to 16, 32, 64, ... points so that most curves share one compile."""
  return max(16, 1 << (max(n, 1) - 1).bit_length())


def prepare_arrays(compute, pass_rate, weights):
  """Padded float64 (x_N, y_N, w_N) and the number of usable points.

  Points with compute <= 0 (the R0 eval) get weight 0, having no log-compute; padding
  entries have compute 0 and weight 0.
  """
  x = np.asarray(compute, np.float64).ravel()
  y = np.asarray(pass_rate, np.float64).ravel()
  w = np.ones_like(x) if weights is None else np.asarray(weights, np.float64).ravel()
  if not x.size == y.size == w.size:
    raise ValueError(f"compute, pass_rate and weights differ in length: "
                     f"{x.size}, {y.size}, {w.size}")
  pad = padded_size(x.size) - x.size
  x_N, y_N, w_N = (np.pad(v, (0, pad)) for v in (x, y, w))
  w_N = np.where(x_N > 0, w_N, 0.0)
  n = int(np.sum(w_N > 0))
  if n < 3:
    raise ValueError(f"need at least 3 points with compute > 0 and weight > 0, got {n}")
  return x_N, y_N, w_N, n


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
  with fitting_context():
    theta, sse, log_scale = fit_sigmoid_batch(
        x_N[None], y_N[None], w_N[None], np.asarray([0.0 if fit_r0 else r0]),
        np.asarray([0.5 if a_fixed is None else a_fixed]), options=options, fit_r0=fit_r0,
        fix_a=fix_a)
    theta, sse, log_scale = np.asarray(theta[0]), float(sse[0]), float(log_scale[0])
  a, b, c_mid, r0_fit = theta_to_params(theta, log_scale)
  return SigmoidFit(a=float(a), b=float(b), c_mid=float(c_mid), r0=float(r0_fit), sse=sse,
                    n_points=n, fit_r0=fit_r0, fix_a=fix_a, theta=theta, log_scale=log_scale)


def fit_power_law(compute, pass_rate, *, weights=None) -> PowerLawFit:
  """Fits R = A - D / C^B (A.4 of the paper) to one curve; 0 < A < 1, D > 0, B > 0."""
  x_N, y_N, w_N, n = prepare_arrays(compute, pass_rate, weights)
  with fitting_context():
    theta, sse, log_scale = fit_power_law_batch(x_N[None], y_N[None], w_N[None])
    theta, sse, log_scale = np.asarray(theta[0]), float(sse[0]), float(log_scale[0])
  a, d, b = power_theta_to_params(theta, log_scale)
  return PowerLawFit(a=float(a), d=float(d), b=float(b), sse=sse, n_points=n)
