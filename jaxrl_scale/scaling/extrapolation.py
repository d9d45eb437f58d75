"""How wrong the sigmoid's extrapolation is, measured on the run itself (leave-future-out).

The bootstrap intervals (bootstrap.py, profile.py) model the eval noise around the fitted
curve: they say how far the curve could move if the law is right. They do not say how far
a real run departs from the law beyond its data, an error that grows with the distance to
the target. On the CPU demo run to 3x its budget, the 95% intervals fitted to half held
the plateau on 8 of 14 fits across seeds; every miss had the run still rising past them.

`calibrate` measures that error on the evals the fit has already seen: it refits the
sigmoid on the first part of the fitted evals (cuts at CUT_FRACTIONS of the last fitted
compute, each with at least MIN_CUT_POINTS evals), predicts the later fitted evals, and
compares each error e with what the noise alone explains: the eval's own noise variance
plus the cut fit's band at that compute (a small bootstrap per cut joined with a coarse
profile-likelihood range, as the forecast's own band is built; the half of it on the
error's side, over z, as an sd). What is left over is the extrapolation error, modelled as
a normal error of sd kappa x d, d the distance in log compute (natural log) from the cut's
last eval to the one predicted. Each cut's kappa is the maximum-likelihood value of
e ~ N(0, v + (kappa d)^2) over its later evals; the run's kappa is the smallest over the
cuts: under a law that holds a cut's estimate is 0 about half the time, so the smallest of
three rarely is not, while a run that departs from its sigmoid departs in every cut. With
two cuts kappa is 0: their smallest is positive on too many runs where the law holds, but
two cuts that both find no excess are evidence of none. With fewer than two the run cannot
test its own extrapolation at all, and kappa is PRIOR_KAPPA, the error measured on the
reference runs (see its comment). The forecast's interval at a target D = log(target /
last fitted compute) beyond the data is then widened in quadrature on both sides by
z x kappa x D (z the normal quantile of the level): see `widen`.

What it does not catch, measured on the CPU demo (benchmarks/forecast/extension.py): a run whose
earlier evals follow the sigmoid and whose later ones leave it (a late second rise, a late
decline) shows no excess in cuts made before the change; fits on fewer than about 30 evals
have too few cuts to measure anything, and fits on fewer than about 20 take the prior.

No method here is tuned on the runs it is judged on: benchmarks/forecast/extension.py splits the
demo's seeds into a tuning and a checking set, and forecast_coverage.py keeps the
simulated coverage (where the law holds) within 0.92-0.98.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import noise as noise_lib
from jaxrl_scale.scaling import profile as profile_lib

# Cuts at these fractions of the last fitted compute: a cut at 0.35 predicts up to
# log(1 / 0.35) = 1.05 beyond its data, about as far as a fit to 1/3 of a run reaches.
CUT_FRACTIONS = (0.35, 0.5, 0.7)
# A cut needs this many fitted evals: with 6-8 a sigmoid (3-4 free parameters) fits noise
# (a step of B = 100 on simulated runs where the law holds).
MIN_CUT_POINTS = 10
# kappa needs this many cuts (see `calibrate`): with two, 2 of 16 simulated runs where the
# law holds (iid and AR(1), fit to half the budget) got a kappa > 0.
MIN_CUTS = 3
# Bootstrap refits per cut (of the fit's n_boot, clipped to this range).
CUT_BOOT = (25, 200)
# A values of each cut's profile-likelihood set (the forecast's own has 100).
PROFILE_GRID = 30
# kappa's maximum-likelihood grid: 0 .. KAPPA_MAX per unit of log compute.
KAPPA_MAX = 0.5
KAPPA_GRID = 201
# kappa of a fit with fewer than PRIOR_BELOW_CUTS cuts, which cannot test itself: the
# extrapolation error of the reference runs that have that few evals. Chosen on the CPU
# math+code demo's tuning seeds 0-14 (benchmarks/forecast/extension.py, fits at 1/3 and 1/2
# of 3x the budget: 10 and 15 evals, none or one cut), before checking seeds 25-34 trained:
# the smallest kappa with at most 1 of their 30 intervals missing the plateau (kappa 0
# missed 4). A run with more evals measures its own instead.
PRIOR_KAPPA = 0.017
PRIOR_BELOW_CUTS = 2


@dataclasses.dataclass(frozen=True)
class ExtrapolationError:
  """The extrapolation error the run's own backtests measured.

  Attributes:
    kappa: sd of the error per unit of log-compute distance (0: none beyond the noise).
    n_cuts: backtest cuts that had enough evals.
    n_pairs: (cut, later eval) pairs scored.
    excess: mean of e^2 - v over the pairs (negative: the noise explains the errors).
    max_distance: the longest distance (log compute) a backtest covered.
    rms_error: root mean square of the backtests' errors.
    prior: kappa is PRIOR_KAPPA: too few cuts for the run to test its own extrapolation.
  """
  kappa: float
  kappa_cuts: tuple[float, ...]
  kappa_pooled: float
  n_cuts: int
  n_pairs: int
  excess: float
  max_distance: float
  rms_error: float
  prior: bool = False

  def sd(self, distance: float) -> float:
    """sd of the extrapolation error at `distance` (log compute) beyond the data."""
    return self.kappa * max(float(distance), 0.0)

  def to_dict(self, distance: float, level: float) -> dict:
    return {"kappa": self.kappa, "distance_log": max(float(distance), 0.0),
            "sd": self.sd(distance),
            "half_width": z_of(level) * self.sd(distance),
            "kappa_cuts": list(self.kappa_cuts), "kappa_pooled": self.kappa_pooled,
            "n_cuts": self.n_cuts, "n_pairs": self.n_pairs, "excess": self.excess,
            "max_backtest_distance_log": self.max_distance, "rms_error": self.rms_error,
            "prior": self.prior}


# No cut had enough evals: the prior alone.
PRIOR = ExtrapolationError(kappa=PRIOR_KAPPA, kappa_cuts=(), kappa_pooled=0.0, n_cuts=0,
                           n_pairs=0, excess=float("nan"), max_distance=0.0,
                           rms_error=float("nan"), prior=True)


def z_of(level: float) -> float:
  """The two-sided normal quantile of `level` (scipy.stats costs a second of import)."""
  return math.sqrt(2.0) * float(special.erfinv(level))


def distance(target: float, max_fit_compute: float) -> float:
  """log(target / last fitted compute), 0 inside the data."""
  if not (target > 0 and max_fit_compute > 0):
    return 0.0
  return max(math.log(target / max_fit_compute), 0.0)


def widen(point: float, band: tuple[float, float] | None, extra_sd: float, level: float
          ) -> tuple[float, float] | None:
  """`band` around `point` with z x extra_sd added in quadrature to each side, in [0, 1]."""
  if band is None or extra_sd <= 0:
    return band
  half = z_of(level) * extra_sd
  lo = point - math.hypot(max(point - band[0], 0.0), half)
  hi = point + math.hypot(max(band[1] - point, 0.0), half)
  return max(min(lo, band[0]), 0.0), min(max(hi, band[1]), 1.0)


def calibrate(x, y, w, sigmoid: fit_lib.SigmoidFit, model: noise_lib.NoiseModel, *,
              series=None, r0_sd: float | None = None, resid=None, n_boot: int = 1000,
              level: float = 0.95, seed: int = 0, options: fit_lib.FitOptions = fit_lib.FitOptions()
              ) -> ExtrapolationError:
  """Leave-future-out backtests on the fitted evals (w > 0); see the module docstring.

  Args:
    x, y: compute and pass rate of every eval of the curve (eval order).
    w: the main fit's weights (0: not fitted; the evals beyond a --fit-fraction cut must
      be 0 here: the calibration never sees them).
    sigmoid: the main fit (its R0, fixed or fitted, is the cuts').
    model: its eval noise model (per-eval sd, autocorrelation).
    series: run id per eval (pooled seeds).
    r0_sd: sd of the step-0 eval R0 came from (redrawn in the cuts' bootstraps).
    resid: the main fit's residuals (resampled as the cuts' bootstrap innovations).
    n_boot: the main fit's bootstrap size (the cuts use a share of it, CUT_BOOT).
    level: the level of the cuts' bands (their half-widths / z are the noise's sd).
    seed: PRNG seed.
    options: fitter settings.

  Returns:
    The measured error (the prior, PRIOR_KAPPA, with fewer than PRIOR_BELOW_CUTS cuts).
  """
  x, y, w = (np.asarray(v, np.float64) for v in (x, y, w))
  fitted = (w > 0) & (x > 0)
  if not fitted.any():
    return PRIOR
  series = np.zeros(x.shape, np.int64) if series is None else np.asarray(series)
  max_c = float(np.max(x[fitted]))
  cuts = []
  for f in CUT_FRACTIONS:
    inside = fitted & (x <= f * max_c)
    later = fitted & (x > f * max_c)
    if int(inside.sum()) >= MIN_CUT_POINTS and later.any():
      cuts.append((inside, later))
  if not cuts:
    return PRIOR
  k = len(cuts)
  w_KN = np.stack([np.where(inside, w, 0.0) for inside, _ in cuts])
  x_KN = np.broadcast_to(x, w_KN.shape)
  y_KN = np.broadcast_to(y, w_KN.shape)
  theta, sse, log_scale = fit_lib.fit_sigmoid_batch(
      x_KN, y_KN, w_KN, np.full(k, sigmoid.r0), np.zeros(k), options=options,
      fit_r0=sigmoid.fit_r0)
  n_cut_boot = int(np.clip(n_boot // 4, *CUT_BOOT))
  sd_E = model.sd()
  z = z_of(level)
  errs, var, dist = [], [], []
  for i, (inside, later) in enumerate(cuts):
    a, b, c_mid, r0 = fit_lib.theta_to_params(theta[i], log_scale[i])
    cut_fit = fit_lib.SigmoidFit(
        a=float(a), b=float(b), c_mid=float(c_mid), r0=float(r0), sse=float(sse[i]),
        n_points=int(inside.sum()), fit_r0=sigmoid.fit_r0, fix_a=False, theta=theta[i],
        log_scale=float(log_scale[i]))
    reps = boot_lib.simulate(x, cut_fit, model, weights=w_KN[i], series=series,
                             r0_sd=r0_sd, n_boot=n_cut_boot, seed=seed + 7 * i,
                             resid=resid)
    pred_KH = boot_lib.refit(cut_fit, reps).predict(x[later])
    lo_H, hi_H = np.percentile(pred_KH, [50.0 * (1 - level), 50.0 * (1 + level)], axis=0)
    # The profile's range too, as the forecast's band has it: a cut whose midpoint lies
    # beyond its data has a bootstrap far too narrow (its refits stay in the valley).
    prof = profile_lib.profile_a(x, y, w_KN[i], cut_fit, model, level, n_grid=PROFILE_GRID,
                                 options=options)
    a_G, b_G, c_G, r0_G = fit_lib.theta_to_params(prof.theta_GP[prof.kept_G],
                                                  prof.log_scale)
    prof_GH = curves.sigmoid(x[later][None], a_G[:, None], b_G[:, None], c_G[:, None],
                             np.asarray(r0_G).reshape(-1, 1))
    lo_H, hi_H = np.minimum(lo_H, prof_GH.min(axis=0)), np.maximum(hi_H, prof_GH.max(axis=0))
    pred = cut_fit.predict(x[later])
    e = y[later] - pred
    # The band's half on the error's side, as an sd: an asymmetric band (A near its bound)
    # explains an error on its long side better than on its short one.
    half = np.where(e > 0, hi_H - pred, pred - lo_H)
    errs.append(e)
    var.append(np.square(sd_E[later]) + np.square(np.maximum(half, 0.0) / z))
    dist.append(np.log(x[later] / float(np.max(x[inside]))))
  per_cut = []
  for e, v, d in zip(errs, var, dist):
    ok = np.isfinite(e) & np.isfinite(v) & (v > 0)
    per_cut.append(_max_likelihood_kappa(e[ok], v[ok], d[ok]) if ok.any() else 0.0)
  e, v, d = (np.concatenate(p) for p in (errs, var, dist))
  ok = np.isfinite(e) & np.isfinite(v) & (v > 0)
  e, v, d = e[ok], v[ok], d[ok]
  if not e.size:
    return PRIOR
  # Every cut must show the excess: under a law that holds each cut's estimate is 0 about
  # half the time, so the smallest of three rarely is not; a run that departs from its
  # sigmoid does so in every cut. One cut alone is no evidence: the prior then.
  kappa, prior = kappa_of(per_cut)
  excess = float(np.mean(np.square(e) - v))
  return ExtrapolationError(kappa=kappa, kappa_cuts=tuple(per_cut), prior=prior,
                            kappa_pooled=_max_likelihood_kappa(e, v, d), n_cuts=k,
                            n_pairs=int(e.size),
                            excess=excess, max_distance=float(np.max(d)),
                            rms_error=float(np.sqrt(np.mean(np.square(e)))))


def kappa_of(kappa_cuts) -> tuple[float, bool]:
  """The run's kappa from its cuts' estimates, and whether it is the prior (see `calibrate`)."""
  if len(kappa_cuts) < PRIOR_BELOW_CUTS:
    return PRIOR_KAPPA, True
  return (float(min(kappa_cuts)) if len(kappa_cuts) >= MIN_CUTS else 0.0), False


def _max_likelihood_kappa(e, v, d) -> float:
  """kappa maximising the normal likelihood of errors e with variances v + (kappa d)^2.

  A pair whose cut predicts it with a wide band (large v) says little about kappa and
  weighs little; under a law that holds the maximum sits at 0 about half the time.
  """
  k_G = np.linspace(0.0, KAPPA_MAX, KAPPA_GRID)
  s_GP = v[None] + np.square(k_G[:, None] * d[None])
  loglik = -0.5 * np.sum(np.log(s_GP) + np.square(e)[None] / s_GP, axis=1)
  return float(k_G[int(np.argmax(loglik))])
