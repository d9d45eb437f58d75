"""A forecaster the training loop feeds one eval point at a time.

Every `update` refits the sigmoid on all points so far and bootstraps an interval, in NumPy
on the host (nothing queues behind training on the accelerator); a refit with 200 bootstrap
replicates and the profile-likelihood set of A costs 0.1-0.2 s on a CPU core (4-40 points):
cheap enough for every eval.

    forecaster = live.LiveForecaster(target_compute=budget_hours)
    for each eval:
      f = forecaster.update(compute_hours, pass_rate, step=step)
      if f is not None:
        writer.write(step, f.as_metrics())   # forecast/A, forecast/A_lo, ...
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import profile as profile_lib


@dataclasses.dataclass(frozen=True)
class LiveForecast:
  """The fit after one eval point."""
  step: int | None
  compute: float
  n_points: int
  a: float
  b: float
  c_mid: float
  r0: float
  a_interval: tuple[float, float] | None
  b_interval: tuple[float, float] | None
  c_mid_interval: tuple[float, float] | None
  well_determined: bool
  messages: tuple[str, ...]
  target_compute: float | None
  forecast: float | None
  forecast_interval: tuple[float, float] | None

  def as_metrics(self, prefix: str = "forecast/") -> dict[str, float]:
    """Flat float metrics for a metrics writer (intervals as _lo / _hi)."""
    out = {"A": self.a, "B": self.b, "C_mid": self.c_mid, "R0": self.r0,
           "n_points": float(self.n_points), "well_determined": float(self.well_determined)}
    for name, band in (("A", self.a_interval), ("B", self.b_interval),
                       ("C_mid", self.c_mid_interval), ("pass_rate", self.forecast_interval)):
      if band is not None:
        out[f"{name}_lo"], out[f"{name}_hi"] = band
    if self.forecast is not None:
      out["pass_rate"] = self.forecast
      out["target_compute"] = float(self.target_compute)
    return {prefix + k: float(v) for k, v in out.items()}

  def summary(self) -> str:
    """One line for a progress display."""
    a = f"A={self.a:.3f}" if self.well_determined else f"A~{self.a:.2f}?"
    if self.a_interval is not None:
      a += f" [{self.a_interval[0]:.3f}, {self.a_interval[1]:.3f}]"
    line = f"forecast: {a} B={self.b:.2f} C_mid={self.c_mid:.3g}"
    if self.forecast is not None:
      line += f"; at {self.target_compute:.3g}: {self.forecast:.3f}"
      if self.forecast_interval is not None:
        line += f" [{self.forecast_interval[0]:.3f}, {self.forecast_interval[1]:.3f}]"
    return line


class LiveForecaster:
  """Refits the scaling curve at every eval point it is given.

  Args:
    target_compute: forecast the pass rate at this compute (e.g. the run's budget).
    r0: pass rate at zero compute; default: the first point fed at compute 0 or step 0,
      else fitted.
    min_compute: points below this compute are kept but not fitted.
    n_boot: bootstrap refits per update for the intervals (0: none).
    level: interval level.
    seed: bootstrap seed.
    options: fitter settings.
  """

  def __init__(self, target_compute: float | None = None, *, r0: float | None = None,
               min_compute: float = 0.0, n_boot: int = 200, level: float = 0.95,
               seed: int = 0, options: fit_lib.FitOptions = fit_lib.FitOptions()):
    self.target_compute = target_compute
    self.min_compute = min_compute
    self.n_boot = n_boot
    self.level = level
    self.seed = seed
    self.options = options
    self._r0_given = r0
    self._r0_stream: float | None = None
    self._compute: list[float] = []  # fitted points, in eval order
    self._rate: list[float] = []
    self.history: list[LiveForecast] = []

  @property
  def r0(self) -> float | None:
    return self._r0_given if self._r0_given is not None else self._r0_stream

  @property
  def latest(self) -> LiveForecast | None:
    return self.history[-1] if self.history else None

  def forecast_made_by(self, compute: float) -> LiveForecast | None:
    """The last forecast made with compute <= `compute` (e.g. at half the budget)."""
    made = [f for f in self.history if f.compute <= compute]
    return made[-1] if made else None

  def update(self, compute: float, pass_rate: float, step: int | None = None
             ) -> LiveForecast | None:
    """Adds one eval point and refits.

    A non-finite point is ignored. A point at lower compute than the last one means the run
    resumed from a checkpoint and replays evals: later points are dropped first.

    Returns:
      The new forecast, or None while there are fewer than 4 fittable points.
    """
    compute, pass_rate = float(compute), float(pass_rate)
    if not (math.isfinite(compute) and math.isfinite(pass_rate)) or compute < 0:
      return self.latest
    if (compute == 0.0 or step == 0) and not self._compute and self._r0_stream is None:
      self._r0_stream = pass_rate  # the starting policy: R0, not a fitted point
      return None
    keep = int(np.searchsorted(self._compute, compute, side="left"))
    if keep < len(self._compute):  # replayed evals replace those of the abandoned timeline
      del self._compute[keep:], self._rate[keep:]
      self.history = [f for f in self.history if f.compute < compute]
    self._compute.append(compute)
    self._rate.append(pass_rate)
    result = self._refit(compute, step)
    if result is not None:
      self.history.append(result)
    return result

  def _refit(self, compute: float, step: int | None) -> LiveForecast | None:
    x, y = np.asarray(self._compute), np.asarray(self._rate)
    w = ((x > 0) & (x >= self.min_compute)).astype(float)
    n = int(w.sum())
    if n < forecast.MIN_POINTS:
      return None
    sig = fit_lib.fit_sigmoid(x, y, self.r0, weights=w, options=self.options)
    samples = prof = None
    if self.n_boot > 0:
      model, _ = boot_lib.estimate_noise(x, y, sig, weights=w)
      # R0 from the stream is a noisy eval: redrawn per replicate (a given R0 stays fixed).
      samples = boot_lib.bootstrap_sigmoid(
          x, y, sig, weights=w, noise_model=model, n_boot=self.n_boot, seed=self.seed + n,
          r0_from_eval=self._r0_given is None and self._r0_stream is not None)
      # As in `jaxrl-scale fit`: A and the forecast get the union with the profile set.
      prof = profile_lib.profile_a(x, y, w, sig, model, self.level, options=self.options)
    was_well = bool(self.history) and self.history[-1].well_determined
    well, messages = forecast.assess(sig, samples, float(np.max(x[w > 0])), self.level,
                                     was_well=was_well)
    point = band = None
    if self.target_compute is not None:
      point, band = forecast.forecast_at(sig, samples, self.target_compute, self.level, prof)
    iv = (lambda name: None) if samples is None else (
        lambda name: samples.interval(name, self.level))
    a_band = None if prof is None else profile_lib.union(iv("a"), prof.a_interval())
    return LiveForecast(
        step=step, compute=compute, n_points=n, a=sig.a, b=sig.b, c_mid=sig.c_mid, r0=sig.r0,
        a_interval=a_band, b_interval=iv("b"), c_mid_interval=iv("c_mid"),
        well_determined=well, messages=messages, target_compute=self.target_compute,
        forecast=point, forecast_interval=band)
