"""Do the forecast's error bars hold? Coverage of its intervals on simulated runs.

A scenario draws runs from the paper's Table 1 curves (`synthetic.TABLE1`, cycling through
the rows), with a chosen eval noise, and analyses each exactly as `jaxrl-scale fit` does
(`forecast.analyse`): points from the paper's 1.5k GPU-hour cutoff up to a fraction of the
budget, forecast at the final compute. It counts how often the intervals contain the truth
(the noiseless curve at the final compute, and the row's A), reports each rate with a
Wilson score interval, and the same among the fits flagged well determined.

benchmarks/forecast/forecast_coverage.py runs the full set (>= 240 runs per scenario); the CI test
runs a small fixed seeded subset.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import fit as fit_lib
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import synthetic

# The paper drops about one epoch, ~1.5k GPU-hours, before fitting (App. A.5).
PAPER_CUTOFF = 1500.0


@dataclasses.dataclass(frozen=True)
class Scenario:
  """How the simulated runs are drawn and fitted.

  Attributes:
    name: label.
    noise: "iid", "ar1" or "binomial" (see `synthetic.simulate_evals`).
    rho: lag-1 autocorrelation of "ar1".
    noise_sd: marginal sd of the Gaussian kinds.
    eval_size: problems x samples of "binomial"; logged with every eval so the fit can
      weight by it.
    spacing: "linear" or "log" eval spacing.
    r0: "step0" (R0 from the noisy step-0 eval, the default of `jaxrl-scale fit`) or
      "exact" (the true R0, as --r0 would give).
    n_evals: evals after step 0.
    fit_fraction: fit on compute <= this fraction of the budget.
    rows: indices into synthetic.TABLE1 the runs cycle through (None: all).
    row: one curve for every run instead (e.g. off-table parameters).
  """
  name: str
  noise: str = "iid"
  rho: float = 0.5
  noise_sd: float = 0.01
  eval_size: int = 500
  spacing: str = "linear"
  r0: str = "step0"
  n_evals: int = 80
  fit_fraction: float = 0.5
  rows: tuple[int, ...] | None = None
  row: synthetic.Table1Row | None = None


def scenarios() -> tuple[Scenario, ...]:
  """The benchmark's scenarios: the issue's four plus AR(1) variants and log spacing."""
  return (
      Scenario("iid sd 0.01, R0 exact", r0="exact"),
      Scenario("iid sd 0.01, R0 from step-0 eval"),
      Scenario("AR(1) rho 0.25", noise="ar1", rho=0.25),
      Scenario("AR(1) rho 0.5", noise="ar1", rho=0.5),
      Scenario("binomial, 500 problems", noise="binomial"),
      Scenario("iid, log-spaced evals", spacing="log"),
      Scenario("AR(1) rho 0.5, log-spaced evals", noise="ar1", spacing="log"),
  )


@dataclasses.dataclass
class Tally:
  """Counts over the runs of one scenario."""
  runs: int = 0
  forecast_covered: int = 0
  a_covered: int = 0
  close: int = 0  # |forecast - truth| <= 0.02
  well: int = 0
  well_forecast_covered: int = 0
  well_a_covered: int = 0
  seconds: float = 0.0
  widths: list = dataclasses.field(default_factory=list)  # forecast interval width per run

  @property
  def median_width(self) -> float:
    return float(np.median(self.widths)) if self.widths else float("nan")

  def rate(self, name: str) -> float:
    total = self.well if name.startswith("well_") else self.runs
    return getattr(self, name) / total if total else float("nan")


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
  """Wilson score interval of a binomial proportion k / n."""
  if n == 0:
    return float("nan"), float("nan")
  from scipy import stats  # lazy: only the benchmark and tests need it
  z = float(stats.norm.ppf(0.5 + level / 2.0))
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return centre - half, centre + half


def simulate_curve(scenario: Scenario, index: int, seed: int
                   ) -> tuple[io.Curve, synthetic.Table1Row]:
  """Run `index` of a scenario as a Curve (eval sizes logged for the binomial kind)."""
  rows = scenario.rows if scenario.rows is not None else tuple(range(len(synthetic.TABLE1)))
  row = scenario.row or synthetic.TABLE1[rows[index % len(rows)]]
  compute, noisy, _ = synthetic.simulate_evals(
      row, n_evals=scenario.n_evals, spacing=scenario.spacing, noise=scenario.noise,
      noise_sd=scenario.noise_sd, rho=scenario.rho, eval_size=scenario.eval_size,
      seed=seed)
  size = np.full(compute.shape, float(scenario.eval_size) if scenario.noise == "binomial"
                 else np.nan)
  curve = io.Curve(name=f"{row.name}#{index}", path="<simulated>", compute=compute,
                   pass_rate=noisy, line=np.arange(compute.size), r0=float(noisy[0]),
                   is_start=compute == 0, eval_size=size)
  return curve, row


def run_scenario(scenario: Scenario, n_runs: int, *, seed: int = 0, n_boot: int = 1000,
                 level: float = 0.95, fit: fit_lib.FitOptions = fit_lib.FitOptions()
                 ) -> Tally:
  """Analyses `n_runs` simulated runs of a scenario and counts interval coverage."""
  import time
  tally = Tally()
  t0 = time.perf_counter()
  for i in range(n_runs):
    curve, row = simulate_curve(scenario, i, seed=seed * 100_003 + i)
    options = forecast.AnalysisOptions(
        r0=synthetic.R0 if scenario.r0 == "exact" else None, min_compute=PAPER_CUTOFF,
        backtest=scenario.fit_fraction, n_boot=n_boot, level=level, seed=i, fit=fit)
    report = forecast.analyse(curve, options)
    truth = float(curves.sigmoid(report.target_compute, row.a, row.b, row.c_mid,
                                 synthetic.R0))
    lo, hi = report.forecast_interval
    f_ok = lo <= truth <= hi
    a_lo, a_hi = report.interval("a")
    a_ok = a_lo <= row.a <= a_hi
    tally.runs += 1
    tally.forecast_covered += f_ok
    tally.a_covered += a_ok
    tally.close += abs(report.forecast - truth) <= 0.02
    tally.widths.append(hi - lo)
    if report.well_determined:
      tally.well += 1
      tally.well_forecast_covered += f_ok
      tally.well_a_covered += a_ok
  tally.seconds = time.perf_counter() - t0
  return tally
