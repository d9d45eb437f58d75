"""A forecaster the training loop feeds one eval point at a time.

Every `update` runs `forecast.analyse` -- the very computation of `jaxrl-scale fit` -- on
the points so far (weighted by each eval's binomial error when its size is given), in NumPy
on the host (nothing queues behind training on the accelerator). So the live line and
`jaxrl-scale fit --fit-fraction` (or fit on the file cut at that eval) print the same
interval on the same data and seed.

    forecaster = live.LiveForecaster(axis="flops", total_steps=steps)
    for each eval:
      f = forecaster.update(flops, pass_rate, step=step, hours=compute_hours)
      if f is not None:
        writer.write(step, f.as_metrics())   # forecast/A, forecast/A_lo, ...
      metrics, lines = forecaster.update_domains(flops, eval_row, step=step,
                                                 hours=compute_hours)

The compute axis. The trainer's forecast runs on model FLOPs by default (`forecast.axis`,
the `flops` column of metrics.jsonl, what `jaxrl-scale fit --x flops` reads): accelerator-
hours move with machine load (another job on the host, a slower node), so two runs of one
config would fit different C_mid and forecast different budgets; the FLOPs of a step are
the tokens it sampled and trained. The hours of every eval are still recorded and
reported (the target's hours at the run's FLOPs per hour so far). A cutoff or target
given in hours (`min_hours`, `target_hours`) is turned into the axis's units: the cutoff
at the first eval past it, the target at the run's FLOPs per hour so far.

A mixed-domain run's eval row also carries val/<domain>/pass_rate: `update_domains` feeds
each domain's points to a forecaster of its own (`domains`), whose metrics are named like
the overall ones with the domain inserted (forecast/math/A, forecast/code/A_lo, ...).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_scale import config as config_lib
from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import units


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
  declining: bool = False  # the recent evals fall below the curve (scaling/decline.py)
  axis: str = "hours"  # the unit of compute, c_mid and target_compute (AXES)
  hours: float | None = None  # accelerator-hours at this eval
  target_hours: float | None = None  # the target in hours, at the FLOPs per hour so far
  level: float = 0.95  # the intervals' level

  def as_metrics(self, prefix: str = "forecast/") -> dict[str, float]:
    """Flat float metrics for a metrics writer (intervals as _lo / _hi)."""
    out = {"A": self.a, "B": self.b, "C_mid": self.c_mid, "R0": self.r0,
           "n_points": float(self.n_points), "well_determined": float(self.well_determined),
           "declining": float(self.declining)}
    for name, band in (("A", self.a_interval), ("B", self.b_interval),
                       ("C_mid", self.c_mid_interval), ("pass_rate", self.forecast_interval)):
      if band is not None:
        out[f"{name}_lo"], out[f"{name}_hi"] = band
    if self.forecast is not None:
      out["pass_rate"] = self.forecast
      out["target_compute"] = float(self.target_compute)
      if self.target_hours is not None:
        out["target_hours"] = self.target_hours
    return {prefix + k: float(v) for k, v in out.items()}

  def summary(self, label: str = "forecast") -> str:
    """One line for a progress display (`label` starts it: a domain's name for its line).

    Every number is named with its unit: A (the pass rate the run heads to), B (the
    steepness, no unit), C_mid (the compute of half the gain) and the target on the
    compute axis (FLOPs or accelerator-hours; on FLOPs the hours at the run's FLOPs per
    hour so far beside them), the forecast a pass rate, the intervals' level at the end.
    """
    a = f"A={self.a:.3f}" if self.well_determined else f"A~{self.a:.2f}?"
    if self.a_interval is not None:
      a += f" [{self.a_interval[0]:.3f}, {self.a_interval[1]:.3f}]"
    line = (f"{label}: plateau {a}, steepness B={self.b:.2f}, half-gain at "
            f"C_mid={self.at(self.c_mid)}")
    if self.forecast is not None:
      line += f"; pass rate at {self.at(self.target_compute)}: {self.forecast:.3f}"
      if self.forecast_interval is not None:
        line += f" [{self.forecast_interval[0]:.3f}, {self.forecast_interval[1]:.3f}]"
    if self.a_interval is not None or self.forecast_interval is not None:
      line += f"; {self.level:.0%} intervals"
    if not self.well_determined:
      line += " (not well determined)"
    if self.declining:
      line += "; DECLINING: the last evals fall below the curve, A is not the plateau"
    return line

  def at(self, compute: float) -> str:
    """`compute` with its unit, and on the FLOPs axis its hours at the FLOPs per hour so far,
    each as `jaxrl-scale fit` prints a compute (`units.at`), so the two read alike."""
    text = units.at(compute, UNITS[self.axis])
    if (self.axis != "hours" and self.target_hours is not None and self.target_compute
        and self.target_compute > 0):
      hours = compute * self.target_hours / self.target_compute
      text += f" (~{units.at(hours, UNITS['hours'])})"
    return text


AXES = ("flops", "hours")
# The metrics.jsonl column of each axis, and the unit a compute on it prints with.
COLUMNS = {"flops": "flops", "hours": "compute_hours"}
UNITS = {axis: units.unit_of(column) for axis, column in COLUMNS.items()}


def cutoff(compute, hours, min_hours: float) -> float:
  """The compute of the first eval at >= `min_hours` hours (inf when none is yet): fitting
  compute >= it is fitting hours >= min_hours, as both rise with every eval."""
  if min_hours <= 0:
    return 0.0
  past = np.flatnonzero(np.asarray(hours, np.float64) >= min_hours)
  return float(np.asarray(compute, np.float64)[past[0]]) if past.size else math.inf


class LiveForecaster:
  """Refits the scaling curve at every eval point it is given.

  Args:
    target_compute: forecast the pass rate at this compute (e.g. the run's budget).
    r0: pass rate at zero compute; default: the first point fed at compute 0 or step 0,
      else fitted.
    min_compute: points below this compute are kept but not fitted.
    n_boot: bootstrap refits per update for the intervals (0: none).
    level: interval level.
    seed: bootstrap seed (every refit uses it, as `jaxrl-scale fit --seed` does).
    options: fitter settings.
    axis: the unit of the compute fed to `update` ("flops" or "hours"; see the module
      docstring); with "hours", `hours` and the compute are one.
    min_hours: points below this many accelerator-hours are kept but not fitted (needs
      `hours` with every update).
    target_hours: forecast at this many hours, converted at the FLOPs per hour so far
      (overrides target_compute).
    total_steps: with neither target given, forecast at the run's projected total compute,
      compute x total_steps / step at every eval.
  """

  def __init__(self, target_compute: float | None = None, *, r0: float | None = None,
               min_compute: float = 0.0, n_boot: int = 200, level: float = 0.95,
               seed: int = 0, options: fit_lib.FitOptions = fit_lib.FitOptions(),
               axis: str = "hours", min_hours: float = 0.0,
               target_hours: float | None = None, total_steps: int | None = None):
    if axis not in AXES:
      raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
    self.target_compute = target_compute
    self.min_compute = min_compute
    self.axis = axis
    self.min_hours = min_hours
    self.target_hours = target_hours
    self.total_steps = total_steps
    self._hours: list[float] = []  # hours of the fitted points (nan: not given)
    self.n_boot = n_boot
    self.level = level
    self.seed = seed
    self.fit_options = options
    self._r0_given = r0
    self._r0_stream: float | None = None
    self._r0_size = float("nan")
    self._compute: list[float] = []  # fitted points, in eval order
    self._rate: list[float] = []
    self._size: list[float] = []  # eval sizes (nan: not given)
    self.history: list[LiveForecast] = []
    # One forecaster per domain of a mixed-domain run, made when its first eval arrives.
    self.domains: dict[str, LiveForecaster] = {}

  @classmethod
  def from_config(cls, cfg: config_lib.ForecastConfig, *, total_steps: int, seed: int
                  ) -> LiveForecaster:
    """The trainer's forecaster: `forecast.axis` (FLOPs by default), its hours settings
    turned into that axis, the run's projected total as the target unless one is given."""
    return cls(axis=cfg.axis, target_hours=cfg.target_compute_hours,
               min_hours=cfg.min_compute_hours, total_steps=total_steps, n_boot=cfg.n_boot,
               seed=seed)

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

  def update(self, compute: float, pass_rate: float, step: int | None = None,
             eval_size: float | None = None, hours: float | None = None
             ) -> LiveForecast | None:
    """Adds one eval point and refits.

    A non-finite point is ignored. A point at lower compute than the last one means the run
    resumed from a checkpoint and replays evals: later points are dropped first.

    Args:
      compute: compute of the eval (the run's compute axis).
      pass_rate: its pass rate.
      step: its training step (step 0 / compute 0 is the starting policy: R0).
      eval_size: problems x samples of the eval (val/num_prompts x
        val/samples_per_prompt), as `jaxrl-scale fit` reads it from metrics.jsonl; with
        every eval's size known the fit is weighted by the binomial error, as there.
      hours: accelerator-hours at the eval (reported; `min_hours`, `target_hours`).

    Returns:
      The new forecast, or None while there are fewer than 4 fittable points.
    """
    compute, pass_rate = float(compute), float(pass_rate)
    size = float("nan") if eval_size is None else float(eval_size)
    hours = compute if self.axis == "hours" else (
        float("nan") if hours is None else float(hours))
    if not (math.isfinite(compute) and math.isfinite(pass_rate)) or compute < 0:
      return self.latest
    if (compute == 0.0 or step == 0) and not self._compute and self._r0_stream is None:
      self._r0_stream = pass_rate  # the starting policy: R0, not a fitted point
      self._r0_size = size
      return None
    keep = int(np.searchsorted(self._compute, compute, side="left"))
    if keep < len(self._compute):  # replayed evals replace those of the abandoned timeline
      del self._compute[keep:], self._rate[keep:], self._size[keep:], self._hours[keep:]
      self.history = [f for f in self.history if f.compute < compute]
    self._compute.append(compute)
    self._rate.append(pass_rate)
    self._size.append(size)
    self._hours.append(hours)
    self._set_target(compute, hours, step)
    result = self._refit(compute, step)
    if result is not None:
      self.history.append(result)
    return result

  def update_domains(self, compute: float, row: dict, step: int | None = None,
                     y_key: str = "val/pass_rate", hours: float | None = None
                     ) -> tuple[dict[str, float], list[str]]:
    """Feeds every domain's pass rate in an eval row to that domain's forecaster.

    A domain's points are its `val/<domain>/pass_rate`, weighted by its own eval size
    (`val/<domain>/num_prompts` x `val/<domain>/samples_per_prompt`); its R0 is its own
    step-0 eval; its forecast is at this forecaster's target compute (the run's).

    Args:
      compute: compute of the eval.
      row: the eval's metrics (as the evaluator returns them or metrics.jsonl holds them).
      step: its training step.
      y_key: the overall pass-rate column the domains' columns are named after.
      hours: accelerator-hours at the eval.

    Returns:
      (metrics forecast/<domain>/... of the domains refitted at this eval, one display line
      per such domain).
    """
    metrics: dict[str, float] = {}
    lines: list[str] = []
    for domain in io.domains_in_row(row, y_key):
      f = self.domains.get(domain)
      if f is None:
        # Own bootstrap draws per domain; the overall --r0 is not a domain's R0.
        f = self.domains[domain] = LiveForecaster(
            self.target_compute, min_compute=self.min_compute, n_boot=self.n_boot,
            level=self.level, seed=self.seed + 613 * (len(self.domains) + 1),
            options=self.fit_options, axis=self.axis, min_hours=self.min_hours)
      f.target_compute = self.target_compute
      size_keys = [io.domain_key(y_key.rpartition("/")[0] + "/" + k, domain)
                   for k in ("num_prompts", "samples_per_prompt")]
      n, k = (row.get(key) for key in size_keys)
      size = None if n is None or k is None else float(n) * float(k)
      fit = f.update(compute, row[io.domain_key(y_key, domain)], step=step, eval_size=size,
                     hours=hours)
      if fit is not None and fit.step == step:
        metrics.update(fit.as_metrics(f"forecast/{domain}/"))
        lines.append("    " + fit.summary(label=domain))
    return metrics, lines

  def curve(self) -> io.Curve:
    """The points fed so far as the curve `jaxrl-scale fit` would read from metrics.jsonl."""
    start = self._r0_stream is not None
    x = ([0.0] if start else []) + self._compute
    return io.Curve(
        name="live", path="<live>", compute=np.asarray(x, np.float64),
        pass_rate=np.asarray(([self._r0_stream] if start else []) + self._rate, np.float64),
        line=np.arange(len(x)), r0=self._r0_stream,
        is_start=np.arange(len(x)) < int(start),
        eval_size=np.asarray(([self._r0_size] if start else []) + self._size, np.float64),
        column=self.column)

  @property
  def column(self) -> str:
    """The metrics.jsonl column of this forecaster's compute axis."""
    return COLUMNS[self.axis]

  @property
  def fit_min_compute(self) -> float:
    """The fit's cutoff on the axis: min_compute, or past it the one min_hours implies."""
    return max(self.min_compute, cutoff(self._compute, self._hours, self.min_hours))

  def _set_target(self, compute: float, hours: float, step: int | None) -> None:
    if self.target_hours is not None:
      if self.axis == "hours":
        self.target_compute = self.target_hours
      elif hours > 0:  # nan (not given) fails too: the target stays
        self.target_compute = self.target_hours * compute / hours
    elif self.total_steps and step:
      self.target_compute = compute * self.total_steps / step

  def analysis_options(self) -> forecast.AnalysisOptions:
    """The `jaxrl-scale fit` options this forecaster's refits use."""
    return forecast.AnalysisOptions(
        r0=self._r0_given, min_compute=self.fit_min_compute,
        target_compute=self.target_compute, n_boot=self.n_boot, level=self.level,
        seed=self.seed, fit=self.fit_options)

  def _refit(self, compute: float, step: int | None) -> LiveForecast | None:
    x = np.asarray(self._compute)
    if int(np.sum((x > 0) & (x >= self.fit_min_compute))) < forecast.MIN_POINTS:
      return None
    # One computation for both: the live line is `forecast.analyse` on the points so far,
    # exactly what `jaxrl-scale fit --fit-fraction` (or fit on a truncated file) runs.
    report = forecast.analyse(self.curve(), self.analysis_options())
    sig = report.sigmoid
    was_well = bool(self.history) and self.history[-1].well_determined
    well, messages = report.well_determined, report.messages
    if was_well and not well and not report.declining:  # hysteresis of the flag only
      well, messages = forecast.assess(sig, report.samples, report.max_fit_compute,
                                       self.level, was_well=True, unit=UNITS[self.axis])
      if report.extrapolation_half_width > forecast.HYSTERESIS * boot_lib.PAPER_A_MARGIN:
        well = False
        messages += tuple(m for m in report.messages if forecast.EXTRAPOLATING in m)
    return LiveForecast(
        step=step, compute=compute, n_points=sig.n_points, a=sig.a, b=sig.b,
        c_mid=sig.c_mid, r0=sig.r0, a_interval=report.interval("a"),
        b_interval=report.interval("b"), c_mid_interval=report.interval("c_mid"),
        well_determined=well, messages=messages, target_compute=self.target_compute,
        forecast=report.forecast if self.target_compute is not None else None,
        forecast_interval=(report.forecast_interval if self.target_compute is not None
                           else None),
        declining=report.declining, axis=self.axis, hours=self._hours[-1],
        target_hours=self._target_hours(), level=self.level)

  def _target_hours(self) -> float | None:
    """The target in hours: itself on the hours axis, else at the FLOPs per hour so far."""
    if self.target_compute is None:
      return None
    if self.axis == "hours":
      return float(self.target_compute)
    x, h = self._compute[-1], self._hours[-1]
    return float(self.target_compute * h / x) if x > 0 and math.isfinite(h) else None
