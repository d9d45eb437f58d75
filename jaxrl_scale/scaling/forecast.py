"""One run from curve to forecast: fit, bootstrap, power-law baseline, targets, backtest.

`analyse` is what `jaxrl-scale fit` runs per file. It also decides whether the fit is well
determined: the paper's fits (App. A.5-A.7) start after the near-linear first epoch and
reach past C_mid; a fit whose midpoint lies beyond the data, or whose A sits on its bound or
has a very wide interval, is reported as such instead of as a confident asymptote.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_scale.errors import UserError
from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import decline as decline_lib
from jaxrl_scale.scaling import extrapolation as extrap_lib
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import noise
from jaxrl_scale.scaling import profile as profile_lib
from jaxrl_scale.scaling import units

MIN_POINTS = 4
# "Well determined" (see `assess`) is calibrated on simulated Table-1 runs (iid and AR(1)
# rho 0.5 noise, R0 from the noisy step-0 eval) fitted on 15% .. 100% of the budget
# (benchmarks/forecast/well_determined_calibration.py). Without a point minimum, fits on 5-12 early
# points that looked saturated by chance passed with narrow intervals and covered A in as
# few as 22% of cases. With 20-22 points the eval noise's autocorrelation is not yet
# measurable (the AR(1) misses had estimated rho ~0.15 for a true 0.5): flagged fits covered
# A in 0.88 of cases. 23 was the smallest minimum with >= 0.90 in every cell of the
# calibration seeds; 25 keeps a margin. On the verification seeds flagged fits cover the
# forecast and A in >= 0.90 at every fraction.
MIN_POINTS_DETERMINED = 25
# An A interval wider than this (a fifth of the metric's range, 10x the paper's noise
# margin) means the data do not pin the asymptote down.
A_WIDTH_LIMIT = 0.2
# A this close to 1 is the optimiser sitting on the bound, not an estimate.
A_BOUND = 0.999
# Hysteresis of the live forecaster: once well determined, a run loses the flag only when
# the midpoint or the A interval width fails its check by this factor.
HYSTERESIS = 1.25


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
  """What to fit and forecast for one run (the `jaxrl-scale fit` flags)."""
  r0: float | None = None
  min_compute: float = 0.0
  target_compute: float | None = None
  target_pass_rate: float | None = None
  backtest: float | None = None  # the fit fraction (--fit-fraction)
  eval_size: float | None = None  # problems x samples per eval, where the file has none
  n_boot: int = 1000
  level: float = 0.95
  seed: int | None = None  # None: fresh entropy, recorded as RunReport.seed
  fit: fit_lib.FitOptions = fit_lib.FitOptions()


@dataclasses.dataclass(frozen=True)
class Backtest:
  """Fit on compute <= fraction * max compute, errors on the held-out rest."""
  fraction: float
  fit_until: float
  n_heldout: int
  mean_abs_error: float
  max_abs_error: float
  final_compute: float
  final_actual: float
  final_forecast: float
  final_interval: tuple[float, float] | None
  final_prediction_interval: tuple[float, float] | None
  final_power_law: float

  @property
  def final_inside(self) -> bool | None:
    """Whether the actual final eval lies in the prediction interval (curve + eval noise)."""
    if self.final_prediction_interval is None:
      return None
    lo, hi = self.final_prediction_interval
    return bool(lo <= self.final_actual <= hi)


@dataclasses.dataclass(frozen=True)
class RunReport:
  """Everything `jaxrl-scale fit` reports and plots for one run."""
  curve: io.Curve
  r0_source: str  # "given" | "step0" | "fitted"
  fit_mask: np.ndarray
  heldout_mask: np.ndarray
  sigmoid: fit_lib.SigmoidFit
  samples: boot_lib.SigmoidSamples | None
  power: fit_lib.PowerLawFit
  level: float
  well_determined: bool
  messages: tuple[str, ...]
  target_compute: float
  target_source: str
  forecast: float
  forecast_interval: tuple[float, float] | None
  power_forecast: float
  target_pass_rate: float | None = None
  compute_to_target: float | None = None
  compute_to_target_interval: tuple[float, float] | None = None
  backtest: Backtest | None = None
  noise: noise.NoiseModel | None = None
  r0_sd: float | None = None
  weights: np.ndarray | None = dataclasses.field(default=None, repr=False)
  replicates: boot_lib.Replicates | None = dataclasses.field(default=None, repr=False)
  profile: profile_lib.ProfileA | None = dataclasses.field(default=None, repr=False)
  seed: int | None = None  # the bootstrap's seed (AnalysisOptions.seed reproduces it)
  decline: decline_lib.Decline | None = None  # the late-decline test (None: too few evals)
  # (compute, pass rate): the lower end of the curve's interval at the last fitted point when
  # the data show no saturation (see `saturation_floor`); None when they do.
  floor: tuple[float, float] | None = None
  # The run's own leave-future-out backtests (extrapolation.py; None without a bootstrap)
  # and the forecast interval before their error was added (eval noise only).
  extrapolation: extrap_lib.ExtrapolationError | None = None
  forecast_interval_noise: tuple[float, float] | None = None

  @property
  def extrapolation_half_width(self) -> float:
    """What the extrapolation error adds to each side of the forecast's interval."""
    if self.extrapolation is None:
      return 0.0
    return extrap_lib.z_of(self.level) * self.extrapolation.sd(self.target_distance)

  @property
  def target_distance(self) -> float:
    """log(target / last fitted compute): how far the forecast reaches beyond the data."""
    return extrap_lib.distance(self.target_compute, self.max_fit_compute)

  @property
  def declining(self) -> bool:
    """The recent evals run below the fitted curve beyond the eval noise (decline.py)."""
    return self.decline is not None and self.decline.declining

  @property
  def name(self) -> str:
    return self.curve.name

  @property
  def max_fit_compute(self) -> float:
    return float(np.max(self.curve.compute[self.fit_mask]))

  def interval(self, name: str) -> tuple[float, float] | None:
    """Interval of "a", "b", "c_mid" or "r0", or None without a bootstrap.

    The bootstrap's percentile interval; for A joined with the profile-likelihood set
    (scaling/profile.py), which keeps A honest when C_mid lies beyond the data.
    """
    if self.samples is None:
      return None
    band = self.samples.interval(name, self.level)
    if name == "a" and self.profile is not None:
      band = profile_lib.union(band, self.profile.a_interval())
    if name == "a" and self.floor is not None:  # a plateau at today's level is not ruled out
      band = (min(band[0], self.floor[1]), band[1])
    return band

  @property
  def residual_sd(self) -> float:
    """Root mean square of the unweighted residuals on the fitted points."""
    x, y = self.curve.compute[self.fit_mask], self.curve.pass_rate[self.fit_mask]
    return float(np.sqrt(np.mean((y - self.sigmoid.predict(x)) ** 2)))

  def noise_dict(self) -> dict | None:
    """The eval noise model as JSON (see `noise.NoiseModel`)."""
    m = self.noise
    if m is None:
      return None
    return {"sd": float(np.median(m.sd()[self.fit_mask])),
            "autocorrelation": m.rho, "autocorrelation_raw": m.rho_raw,
            "autocorrelation_sd": m.rho_sd, "eval_size_known": m.size_known,
            "dispersion": _num(m.dispersion), "R0_sd": _num(self.r0_sd)}

  def to_dict(self) -> dict:
    """A JSON-ready summary (inf and nan become null)."""
    s = self.sigmoid
    out = {
        "run": self.name, "file": self.curve.path,
        "A": s.a, "B": s.b, "C_mid": s.c_mid, "R0": s.r0, "R0_source": self.r0_source,
        "intervals": {k: _pair(self.interval(n)) for k, n in
                      (("A", "a"), ("B", "b"), ("C_mid", "c_mid"))},
        "level": self.level,
        "n_boot": 0 if self.samples is None else self.samples.size,
        "seed": self.seed,
        "A_paper_margin": boot_lib.PAPER_A_MARGIN,
        "well_determined": self.well_determined,
        "declining": self.declining,
        "saturation_floor": None if self.floor is None else {
            "compute": self.floor[0], "pass_rate": self.floor[1]},
        "decline": None if self.decline is None else self.decline.to_dict(),
        "messages": list(self.messages),
        "n_points": s.n_points,
        "fit_compute_range": [float(np.min(self.curve.compute[self.fit_mask])),
                              self.max_fit_compute],
        "residual_sd": self.residual_sd,
        "noise": self.noise_dict(),
        "power_law": {"A": self.power.a, "B": self.power.b, "D": self.power.d,
                      "forecast": _num(self.power_forecast)},
        "forecast": {"compute": self.target_compute, "target_source": self.target_source,
                     "pass_rate": _num(self.forecast),
                     "interval": _pair(self.forecast_interval),
                     "interval_eval_noise": _pair(self.forecast_interval_noise),
                     "extrapolation": None if self.extrapolation is None else {
                         k: v if isinstance(v, (list, bool)) else _num(v)
                         for k, v in self.extrapolation.to_dict(
                             self.target_distance, self.level).items()},
                     "power_law": _num(self.power_forecast)},
    }
    if self.target_pass_rate is not None:
      out["compute_to_target"] = {
          "pass_rate": self.target_pass_rate,
          "compute": _num(self.compute_to_target),
          "reachable": bool(np.isfinite(self.compute_to_target)),
          "interval": _pair(self.compute_to_target_interval)}
    if self.backtest is not None:
      out["backtest"] = {k: (_pair(v) if isinstance(v, tuple) else _num(v))
                         for k, v in dataclasses.asdict(self.backtest).items()}
      out["backtest"]["final_inside_prediction_interval"] = self.backtest.final_inside
    return out


def _num(v):
  return None if v is None or not math.isfinite(float(v)) else float(v)


def _pair(p):
  return None if p is None else [_num(p[0]), _num(p[1])]


def assess(sigmoid: fit_lib.SigmoidFit, samples: boot_lib.SigmoidSamples | None,
           max_fit_compute: float, level: float = 0.95, *, was_well: bool = False,
           unit: str = units.unit_of(None)) -> tuple[bool, tuple[str, ...]]:
  """Is the asymptote pinned down by the data? Returns (well_determined, reasons).

  Args:
    sigmoid: the fit.
    samples: its bootstrap replicates (None: the interval check is skipped).
    max_fit_compute: compute of the last fitted point.
    level: interval level.
    was_well: the previous fit of the same live run was well determined; the midpoint and
      width checks then get `HYSTERESIS` slack, so the flag does not flip back and forth.
    unit: the unit of the compute, which the reasons print with it (`units.unit_of`).
  """
  slack = HYSTERESIS if was_well else 1.0
  reasons = []
  if sigmoid.n_points < MIN_POINTS_DETERMINED:
    reasons.append(f"only {sigmoid.n_points} fitted eval points (< {MIN_POINTS_DETERMINED}): "
                   "too few to tell saturation from noise")
  if sigmoid.c_mid > slack * max_fit_compute:
    reasons.append(
        f"the midpoint C_mid={units.at(sigmoid.c_mid, unit)} lies beyond the last fitted "
        f"point ({units.at(max_fit_compute, unit)}): the curve is still in its near-linear "
        "phase and A is an extrapolation; fit again with more compute")
  if sigmoid.a >= A_BOUND:
    reasons.append("A sits on its upper bound 1: the data show no saturation yet")
  elif sigmoid.a <= sigmoid.r0:
    reasons.append(f"A={sigmoid.a:.3f} is not above R0={sigmoid.r0:.3f}: no gain to fit")
  if samples is not None:
    lo, hi = samples.interval("a", level)
    if hi - lo > slack * A_WIDTH_LIMIT:
      reasons.append(f"the {level:.0%} interval on A [{lo:.3f}, {hi:.3f}] is wider than "
                     f"{slack * A_WIDTH_LIMIT:.3g}")
  return not reasons, tuple(reasons)


def forecast_at(sigmoid: fit_lib.SigmoidFit, samples: boot_lib.SigmoidSamples | None,
                compute: float, level: float = 0.95,
                profile: profile_lib.ProfileA | None = None,
                floor: tuple[float, float] | None = None
                ) -> tuple[float, tuple[float, float] | None]:
  """Pass rate of the fitted curve at `compute`, with its bootstrap interval (joined with
  the range of the profile-likelihood fits when `profile` is given, and reaching down to
  `floor`'s pass rate beyond `floor`'s compute; see `saturation_floor`)."""
  point = float(sigmoid.predict(compute))
  if samples is None:
    return point, None
  band = boot_lib.percentile_interval(samples.predict(compute), level)
  if profile is not None:
    band = profile_lib.union(band, profile.predict_range(compute))
  if floor is not None and compute > floor[0]:
    band = (min(band[0], floor[1]), band[1])
  # A pass rate: the curve's refits can land a rounding error outside [0, 1].
  return point, (max(band[0], 0.0), min(band[1], 1.0))


def saturation_floor(sigmoid: fit_lib.SigmoidFit, samples: boot_lib.SigmoidSamples | None,
                     max_fit_compute: float, level: float = 0.95,
                     profile: profile_lib.ProfileA | None = None
                     ) -> tuple[float, float] | None:
  """(last fitted compute, lower end of the curve's interval there) when A is not pinned.

  Why: when A sits on its bound or the midpoint lies beyond the data, the data show no
  saturation yet, and then they cannot rule out that it starts right after the last
  fitted point. The sigmoid ties the curvature it has seen to its asymptote, so a run that
  rises steeply and then stops abruptly (the CPU demo: 0.40 -> 0.91 by step 200, then flat
  at 0.95) gets a narrow band above its plateau: fitted to step 200 of 600, the forecast
  interval at step 600 held the plateau by 0.003; the live one at step 310 missed it.
  A monotone curve cannot end below its level at the last fitted point, so that level's
  lower bound is what the data allow. On simulated sigmoid runs this changes little (their
  bands already reach that low when C_mid lies beyond the data): iid half-budget coverage
  and width, and the fit-to-10% runs, moved by <= 0.02 and <= 1.2% (60 runs each).

  Returns:
    None when the fit shows saturation (or without a bootstrap).
  """
  if samples is None or (sigmoid.a < A_BOUND and sigmoid.c_mid <= max_fit_compute):
    return None
  _, band = forecast_at(sigmoid, samples, max_fit_compute, level, profile)
  return float(max_fit_compute), band[0]


def compute_to_reach(sigmoid: fit_lib.SigmoidFit, samples: boot_lib.SigmoidSamples | None,
                     rate: float, level: float = 0.95
                     ) -> tuple[float, tuple[float, float] | None]:
  """Compute at which the curve reaches `rate` (inf if never), with its interval."""
  point = float(curves.compute_to_reach(rate, sigmoid.a, sigmoid.b, sigmoid.c_mid,
                                        sigmoid.r0))
  if samples is None:
    return point, None
  need_K = curves.compute_to_reach(rate, samples.a_K, samples.b_K, samples.c_mid_K,
                                   samples.r0_K)
  return point, boot_lib.percentile_interval(need_K, level)


def _masks(curve: io.Curve, options: AnalysisOptions):
  usable = (curve.compute > 0) & ~curve.is_start
  region = np.ones_like(usable)
  if options.backtest is not None:
    region = curve.compute <= options.backtest * float(np.max(curve.compute))
  fit_mask = usable & region & (curve.compute >= options.min_compute)
  return fit_mask, usable & ~region


def fit_weighted(curve: io.Curve, fit_mask, r0: float | None, eval_size,
                 options: fit_lib.FitOptions):
  """The sigmoid fit, weighted by 1 / se^2 when every fitted eval's size is known.

  Returns (fit, weights, rel_sd): rel_sd is each eval's binomial se from the fitted curve
  (ones when the size is unknown). The weights come from the fitted curve, not from the
  observed rates (whose noise would leak into their own weights): a first fit weighted by
  the observed rates gives the curve for the second.
  """
  x, y = curve.compute, curve.pass_rate
  mask = np.asarray(fit_mask, bool)
  w = mask.astype(np.float64)
  if eval_size is None:
    return fit_lib.fit_sigmoid(x, y, r0, weights=w, options=options), w, np.ones_like(x)
  size = np.where(np.isfinite(eval_size), eval_size, np.nanmedian(eval_size[mask]))
  rel = noise.binomial_se(y, size)
  for _ in range(2):
    w = np.where(mask, 1.0 / np.square(rel), 0.0)
    w = w / np.mean(w[mask])
    sigmoid = fit_lib.fit_sigmoid(x, y, r0, weights=w, options=options)
    rel = noise.binomial_se(sigmoid.predict(x), size)
  return sigmoid, w, rel


def analyse(curve: io.Curve, options: AnalysisOptions = AnalysisOptions()) -> RunReport:
  """Fits one run and computes its forecasts (see `AnalysisOptions`)."""
  options = dataclasses.replace(options, seed=boot_lib.resolve_seed(options.seed))
  fit_mask, heldout = _masks(curve, options)
  unit = units.unit_of(curve.column)
  n = int(fit_mask.sum())
  if n < MIN_POINTS:
    where = ["compute > 0"]
    if options.min_compute > 0:
      where.append(f">= --min-compute {units.at(options.min_compute, unit)}")
    if options.backtest is not None:
      where.append(f"<= {options.backtest:g} x max compute (--fit-fraction)")
    raise UserError(f"{curve.path}: {n} usable eval points ({', '.join(where)}); "
                    f"need at least {MIN_POINTS}")
  if options.r0 is not None:
    r0, r0_source = options.r0, "given"
  elif curve.r0 is not None:
    r0, r0_source = curve.r0, "step0"
  else:
    r0, r0_source = None, "fitted"

  x, y = curve.compute, curve.pass_rate
  size = curve.eval_size
  if options.eval_size is not None:
    size = np.where(np.isfinite(size), size, float(options.eval_size))
  size_known = bool(np.all(np.isfinite(size[fit_mask])))
  sigmoid, w, rel = fit_weighted(curve, fit_mask, r0, size if size_known else None,
                                 options.fit)
  resid = boot_lib.residuals(x, y, sigmoid)
  model = noise.estimate(resid, fit_mask, rel_sd=rel, series=curve.series,
                         n_params=boot_lib.free_parameters(sigmoid), size_known=size_known)
  # R0 from the step-0 eval carries that eval's noise (pooled seeds: one eval per seed).
  r0_sd = None
  if r0_source == "step0":
    r0_sd = float(model.sd()[curve.is_start][0]) if curve.is_start.any() else model.scale
  samples = reps = prof = None
  if options.n_boot > 0:
    # The replicates span the evals up to the fit-fraction cut only, so the draws (and the
    # intervals) are those of the file cut there, or of the live forecaster at that eval.
    seen = ~heldout
    reps = boot_lib.simulate(x[seen], sigmoid,
                             dataclasses.replace(model, rel_sd=model.rel_sd[seen]),
                             weights=w[seen], series=curve.series[seen], r0_sd=r0_sd,
                             n_boot=options.n_boot, seed=options.seed, resid=resid[seen])
    samples = boot_lib.refit(sigmoid, reps)
    prof = profile_lib.profile_a(x, y, w, sigmoid, model, options.level, options=options.fit)
  power = fit_lib.fit_power_law(x, y, weights=fit_mask.astype(np.float64))
  max_fit = float(np.max(x[fit_mask]))
  well, messages = assess(sigmoid, samples, max_fit, options.level, unit=unit)
  dec = decline_lib.detect(x, y, w, sigmoid)
  if dec is not None and dec.declining:  # A is then where the curve bent over, no plateau
    well, messages = False, (dec.message(unit),) + messages
  floor = saturation_floor(sigmoid, samples, max_fit, options.level, prof)
  if floor is not None:
    messages += (f"no saturation in the data yet: the forecast beyond "
                 f"C={units.at(floor[0], unit)} and A "
                 f"reach down to {floor[1]:.3f}, the curve's level there (the run may "
                 "plateau now)",)

  if options.target_compute is not None:
    target, source = float(options.target_compute), "--target"
  elif options.backtest is not None:
    target, source = float(np.max(x)), "last point (--fit-fraction)"
  else:
    target, source = 2.0 * max_fit, "default: 2x the last fitted compute"
  point, band_noise = forecast_at(sigmoid, samples, target, options.level, prof, floor)
  ext = None
  if samples is not None:
    ext = extrap_lib.calibrate(x, y, w, sigmoid, model, series=curve.series, r0_sd=r0_sd,
                               resid=resid, n_boot=options.n_boot, level=options.level,
                               seed=options.seed + 31,
                               options=options.fit)
  ext_sd = 0.0 if ext is None else ext.sd(extrap_lib.distance(target, max_fit))
  band = extrap_lib.widen(point, band_noise, ext_sd, options.level)
  half = extrap_lib.z_of(options.level) * ext_sd
  if half > boot_lib.PAPER_A_MARGIN:
    # The flag and the interval agree: a forecast whose extrapolation error (the run's
    # own backtests', or the prior's) lies past the paper's noise margin is not a confident one.
    well = False
    messages += (extrapolation_message(ext, half),)
  extra = {}
  if options.target_pass_rate is not None:
    need, need_band = compute_to_reach(sigmoid, samples, options.target_pass_rate,
                                       options.level)
    extra = dict(target_pass_rate=float(options.target_pass_rate), compute_to_target=need,
                 compute_to_target_interval=need_band)
  backtest = None
  if options.backtest is not None and heldout.any():
    backtest = _backtest(x, y, heldout, sigmoid, samples, power, options, max_fit,
                         model.sd(), prof, floor, ext)
  elif options.backtest is not None:
    messages += (f"backtest: no eval point beyond {options.backtest:g} x max compute",)
  return RunReport(
      curve=curve, r0_source=r0_source, fit_mask=fit_mask, heldout_mask=heldout,
      sigmoid=sigmoid, samples=samples, power=power, level=options.level,
      well_determined=well, messages=messages, target_compute=target, target_source=source,
      forecast=point, forecast_interval=band,
      power_forecast=float(power.predict(target)), backtest=backtest, noise=model,
      r0_sd=r0_sd, weights=w, replicates=reps, profile=prof, seed=options.seed, decline=dec,
      floor=floor, extrapolation=ext, forecast_interval_noise=band_noise, **extra)


def extrapolation_message(ext: extrap_lib.ExtrapolationError, half: float) -> str:
  """Why a forecast whose extrapolation error adds +-half is not well determined."""
  if ext.prior:
    why = (f"too few evals for the run to test its own extrapolation ({ext.n_cuts} "
           f"backtest cuts, {extrap_lib.PRIOR_BELOW_CUTS} needed): the reference runs' "
           f"error, sd {ext.kappa:.3f}")
  else:
    why = (f"the run's own backtests miss by more than the eval noise: sd {ext.kappa:.3f}")
  return (f"{why} per unit of log compute beyond the data, {EXTRAPOLATING} +-{half:.3f}")


# Every extrapolation message says this (live.py keeps them when the flag's hysteresis acts).
EXTRAPOLATING = "extrapolating to the target adds"


def _backtest(x, y, heldout, sigmoid, samples, power, options, max_fit, sd_E, prof, floor,
              ext) -> Backtest:
  err = sigmoid.predict(x[heldout]) - y[heldout]
  idx = np.flatnonzero(heldout)
  final = int(idx[np.argmax(x[idx])])
  point, band = forecast_at(sigmoid, samples, float(x[final]), options.level, prof, floor)
  ext_sd = 0.0 if ext is None else ext.sd(extrap_lib.distance(float(x[final]), max_fit))
  band = extrap_lib.widen(point, band, ext_sd, options.level)
  predicted = None
  if samples is not None:
    # A single held-out eval carries its own noise: compare it with the curve's interval
    # widened by that eval's noise sd (a prediction interval), not with the curve's alone;
    # the extrapolation error (extrapolation.py) is drawn in too.
    rng = np.random.default_rng(options.seed + 1)
    mean_K = samples.predict(float(x[final]))
    sd = math.hypot(sd_E[final], ext_sd)
    predicted = boot_lib.percentile_interval(
        mean_K + sd * rng.standard_normal(mean_K.shape), options.level)
  return Backtest(
      fraction=float(options.backtest), fit_until=max_fit, n_heldout=int(heldout.sum()),
      mean_abs_error=float(np.mean(np.abs(err))), max_abs_error=float(np.max(np.abs(err))),
      final_compute=float(x[final]), final_actual=float(y[final]), final_forecast=point,
      final_interval=band, final_prediction_interval=predicted,
      final_power_law=float(power.predict(x[final])))
