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
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import io

MIN_POINTS = 4
# An A interval wider than this (a fifth of the metric's range, 10x the paper's noise
# margin) means the data do not pin the asymptote down.
A_WIDTH_LIMIT = 0.2
# A this close to 1 is the optimiser sitting on the bound, not an estimate.
A_BOUND = 0.999


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
  """What to fit and forecast for one run (the `jaxrl-scale fit` flags)."""
  r0: float | None = None
  min_compute: float = 0.0
  target_compute: float | None = None
  target_pass_rate: float | None = None
  backtest: float | None = None
  n_boot: int = 1000
  level: float = 0.95
  seed: int = 0
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

  @property
  def name(self) -> str:
    return self.curve.name

  @property
  def max_fit_compute(self) -> float:
    return float(np.max(self.curve.compute[self.fit_mask]))

  def interval(self, name: str) -> tuple[float, float] | None:
    """Bootstrap interval of "a", "b", "c_mid" or "r0", or None without a bootstrap."""
    return None if self.samples is None else self.samples.interval(name, self.level)

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
        "A_paper_margin": boot_lib.PAPER_A_MARGIN,
        "well_determined": self.well_determined,
        "messages": list(self.messages),
        "n_points": s.n_points,
        "fit_compute_range": [float(np.min(self.curve.compute[self.fit_mask])),
                              self.max_fit_compute],
        "residual_sd": math.sqrt(s.sse / max(s.n_points, 1)),
        "power_law": {"A": self.power.a, "B": self.power.b, "D": self.power.d,
                      "forecast": _num(self.power_forecast)},
        "forecast": {"compute": self.target_compute, "target_source": self.target_source,
                     "pass_rate": _num(self.forecast),
                     "interval": _pair(self.forecast_interval),
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
           max_fit_compute: float, level: float = 0.95) -> tuple[bool, tuple[str, ...]]:
  """Is the asymptote pinned down by the data? Returns (well_determined, reasons)."""
  reasons = []
  if sigmoid.c_mid > max_fit_compute:
    reasons.append(
        f"the midpoint C_mid={sigmoid.c_mid:.3g} lies beyond the last fitted point "
        f"({max_fit_compute:.3g}): the curve is still in its near-linear phase and A is an "
        "extrapolation; fit again with more compute")
  if sigmoid.a >= A_BOUND:
    reasons.append("A sits on its upper bound 1: the data show no saturation yet")
  elif sigmoid.a <= sigmoid.r0:
    reasons.append(f"A={sigmoid.a:.3f} is not above R0={sigmoid.r0:.3f}: no gain to fit")
  if samples is not None:
    lo, hi = samples.interval("a", level)
    if hi - lo > A_WIDTH_LIMIT:
      reasons.append(f"the {level:.0%} interval on A [{lo:.3f}, {hi:.3f}] is wider than "
                     f"{A_WIDTH_LIMIT}")
  return not reasons, tuple(reasons)


def forecast_at(sigmoid: fit_lib.SigmoidFit, samples: boot_lib.SigmoidSamples | None,
                compute: float, level: float = 0.95
                ) -> tuple[float, tuple[float, float] | None]:
  """Pass rate of the fitted curve at `compute`, with its bootstrap interval."""
  point = float(sigmoid.predict(compute))
  if samples is None:
    return point, None
  return point, boot_lib.percentile_interval(samples.predict(compute), level)


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


def analyse(curve: io.Curve, options: AnalysisOptions = AnalysisOptions()) -> RunReport:
  """Fits one run and computes its forecasts (see `AnalysisOptions`)."""
  fit_mask, heldout = _masks(curve, options)
  n = int(fit_mask.sum())
  if n < MIN_POINTS:
    where = ["compute > 0"]
    if options.min_compute > 0:
      where.append(f">= --min-compute {options.min_compute:g}")
    if options.backtest is not None:
      where.append(f"<= {options.backtest:g} x max compute (--backtest)")
    raise UserError(f"{curve.path}: {n} usable eval points ({', '.join(where)}); "
                    f"need at least {MIN_POINTS}")
  if options.r0 is not None:
    r0, r0_source = options.r0, "given"
  elif curve.r0 is not None:
    r0, r0_source = curve.r0, "step0"
  else:
    r0, r0_source = None, "fitted"

  x, y, w = curve.compute, curve.pass_rate, fit_mask.astype(np.float64)
  sigmoid = fit_lib.fit_sigmoid(x, y, r0, weights=w, options=options.fit)
  samples = None
  if options.n_boot > 0:
    samples = boot_lib.bootstrap_sigmoid(x, y, sigmoid, weights=w, n_boot=options.n_boot,
                                         seed=options.seed)
  power = fit_lib.fit_power_law(x, y, weights=w)
  max_fit = float(np.max(x[fit_mask]))
  well, messages = assess(sigmoid, samples, max_fit, options.level)

  if options.target_compute is not None:
    target, source = float(options.target_compute), "--target"
  elif options.backtest is not None:
    target, source = float(np.max(x)), "last point (backtest)"
  else:
    target, source = 2.0 * max_fit, "default: 2x the last fitted compute"
  point, band = forecast_at(sigmoid, samples, target, options.level)
  extra = {}
  if options.target_pass_rate is not None:
    need, need_band = compute_to_reach(sigmoid, samples, options.target_pass_rate,
                                       options.level)
    extra = dict(target_pass_rate=float(options.target_pass_rate), compute_to_target=need,
                 compute_to_target_interval=need_band)
  backtest = None
  if options.backtest is not None and heldout.any():
    backtest = _backtest(x, y, fit_mask, heldout, sigmoid, samples, power, options, max_fit)
  elif options.backtest is not None:
    messages += (f"backtest: no eval point beyond {options.backtest:g} x max compute",)
  return RunReport(
      curve=curve, r0_source=r0_source, fit_mask=fit_mask, heldout_mask=heldout,
      sigmoid=sigmoid, samples=samples, power=power, level=options.level,
      well_determined=well, messages=messages, target_compute=target, target_source=source,
      forecast=point, forecast_interval=band,
      power_forecast=float(power.predict(target)), backtest=backtest, **extra)


def _backtest(x, y, fit_mask, heldout, sigmoid, samples, power, options, max_fit) -> Backtest:
  err = sigmoid.predict(x[heldout]) - y[heldout]
  final = int(np.flatnonzero(heldout)[-1])
  point, band = forecast_at(sigmoid, samples, float(x[final]), options.level)
  predicted = None
  if samples is not None:
    # A single held-out eval carries its own noise: compare it with the curve's interval
    # widened by the fit's residuals (a prediction interval), not with the curve's alone.
    resid = y[fit_mask] - sigmoid.predict(x[fit_mask])
    rng = np.random.default_rng(options.seed + 1)
    mean_K = samples.predict(float(x[final]))
    predicted = boot_lib.percentile_interval(mean_K + rng.choice(resid, mean_K.shape),
                                             options.level)
  return Backtest(
      fraction=float(options.backtest), fit_until=max_fit, n_heldout=int(heldout.sum()),
      mean_abs_error=float(np.mean(np.abs(err))), max_abs_error=float(np.max(np.abs(err))),
      final_compute=float(x[final]), final_actual=float(y[final]), final_forecast=point,
      final_interval=band, final_prediction_interval=predicted,
      final_power_law=float(power.predict(x[final])))
