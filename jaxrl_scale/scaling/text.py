"""Human-readable report of `jaxrl-scale fit` (the `--json` output carries the same facts).

Every number carries its unit (issue 67 item 7): compute in the unit of the `--x` column
(`units.UNITS`: FLOPs, accelerator-hours, else the column's name), pass rates named as such,
intervals with their level.
"""

from __future__ import annotations

import math

import numpy as np

from jaxrl_scale.scaling import bootstrap as boot_lib
from jaxrl_scale.scaling import compare as compare_lib
from jaxrl_scale.scaling import extrapolation as extrap_lib
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import units


def span(p: tuple[float, float] | None, digits: int = 3) -> str:
  return "" if p is None else f"[{units.num(p[0], digits)}, {units.num(p[1], digits)}]"


def table(rows: list[list[str]], indent: str = "  ") -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                   for r in rows)


_R0_SOURCE = {"given": "--r0", "step0": "step-0 eval", "fitted": "fitted"}


def render_run(r: forecast.RunReport, unit: str = "h") -> str:
  """One run's report; `unit` is the compute's (`unit_of` the `--x` column)."""
  s = r.sigmoid
  x_fit = r.curve.compute[r.fit_mask]
  lines = [f"{r.name}  ({r.curve.path})",
           f"  fitted {s.n_points} eval points, compute {units.num(float(x_fit.min()))} .. "
           f"{units.at(float(x_fit.max()), unit)}; pass rate R0 = {s.r0:.3f} "
           f"({_R0_SOURCE[r.r0_source]}); residual sd {r.residual_sd:.4f} (pass rate)"]
  if r.noise is not None:
    m = r.noise
    size = "binomial se from the eval size" if m.size_known else "estimated from residuals"
    lines.append(f"  eval noise: pass-rate sd {float(np.median(m.sd()[r.fit_mask])):.4f} ({size}), "
                 f"lag-1 autocorrelation {m.rho:.2f} (raw {m.rho_raw:.2f}), "
                 + (f"R0 sd {r.r0_sd:.4f}" if r.r0_sd else "R0 held fixed"))
  if r.curve.n_series > 1:
    lines.append(f"  pooled {r.curve.n_series} seeds: {r.curve.path}")
  lines.append("")
  head = "estimate"
  level = f"{r.level:.0%} interval"
  if r.samples is not None:
    level += f" ({r.samples.size} bootstrap refits)"
  a_txt = f"{s.a:.3f}" if r.well_determined else f"~{s.a:.3f} (not determined)"
  rows = [["sigmoid", head, level, ""],
          ["A", a_txt, span(r.interval("a")),
           f"plateau pass rate; paper's noise margin on A: +-{boot_lib.PAPER_A_MARGIN}"],
          ["B", units.num(s.b), span(r.interval("b")), "steepness (an exponent, no unit)"],
          [f"C_mid ({unit})", units.num(s.c_mid), span(r.interval("c_mid")),
           "compute of half the gain"]]
  lines += [table(rows), "  R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)",
            f"  power law R(C) = A - D / C^B: A = {r.power.a:.3f}, B = {units.num(r.power.b)}, "
            f"D = {units.num(r.power.d)} (for comparison; unbounded forms over-predict A)", ""]
  lines.append(f"  forecast pass rate at C = {units.at(r.target_compute, unit)} "
               f"({r.target_source}): {r.forecast:.3f}"
               + (f" ({r.level:.0%} interval {span(r.forecast_interval)})"
                  if r.forecast_interval is not None else "")
               + f", power law {r.power_forecast:.3f}")
  ext = r.extrapolation
  if ext is not None:
    if ext.prior:
      lines.append(
          f"    extrapolation error: too few evals for the run's own backtests ({ext.n_cuts} "
          f"cuts of the fitted evals); the reference runs' pass-rate sd {ext.kappa:.3f} per "
          f"unit of ln(compute) at {r.target_distance:.2f} in ln(compute) "
          f"(x{math.exp(r.target_distance):.3g}) beyond the data adds "
          f"+-{r.extrapolation_half_width:.3f} (eval noise alone "
          f"{span(r.forecast_interval_noise)})")
    elif ext.n_cuts < extrap_lib.MIN_CUTS:
      lines.append(f"    extrapolation error: not measured ({ext.n_cuts} backtest cuts of "
                   f"the fitted evals, {extrap_lib.MIN_CUTS} needed; taken as 0)")
    else:
      lines.append(
          f"    extrapolation error from the run's own backtests ({ext.n_cuts} cuts): "
          f"pass-rate sd {ext.kappa:.3f} per unit of ln(compute); the target lies "
          f"{r.target_distance:.2f} in ln(compute) (x{math.exp(r.target_distance):.3g}) "
          f"beyond the data, adding +-{r.extrapolation_half_width:.3f} to the pass rate "
          f"(eval noise alone {span(r.forecast_interval_noise)})")
  if r.target_pass_rate is not None:
    lines.append(f"  compute to reach pass rate {r.target_pass_rate:.3f}: "
                 f"{units.at(r.compute_to_target, unit)} {span(r.compute_to_target_interval)}")
  if r.backtest is not None:
    b = r.backtest
    inside = ""
    if b.final_inside is not None:
      inside = (f"; a new eval falls in {span(b.final_prediction_interval)}: "
                + ("inside" if b.final_inside else "OUTSIDE"))
    lines.append(
        f"  backtest (fit on compute <= {units.at(b.fit_until, unit)}, {b.n_heldout} points held "
        f"out): mean |error| {b.mean_abs_error:.4f}, max {b.max_abs_error:.4f} (pass rate)")
    lines.append(
        f"    final point C = {units.at(b.final_compute, unit)}: pass rate "
        f"{b.final_actual:.3f}, forecast {b.final_forecast:.3f} {span(b.final_interval)}, "
        f"power law "
        f"{b.final_power_law:.3f}{inside}")
  if r.declining:
    lines.append(f"  DECLINING: {r.decline.message(unit)}")
  if r.well_determined:
    lines.append("  well determined: yes")
  else:
    lines.append("  well determined: NO" + (" (declining, above)" if r.declining else ""))
    lines += [f"    - {m}" for m in r.messages
              if not (r.declining and m == r.decline.message(unit))]
  return "\n".join(lines)


def render_domains(overall: forecast.RunReport, domains: dict[str, forecast.RunReport],
                   errors: dict[str, str] | None = None, unit: str = "h") -> str:
  """One row per domain of a mixed-domain run (the paper's math and code rows), with the
  reasons a domain's fit is not well determined below the table."""
  target = overall.target_compute
  rows = [["domain", "points", "R0", f"A [{overall.level:.0%} interval]", "B [interval]",
           f"C_mid ({unit})", f"pass rate at {units.at(target, unit)}", "well determined",
           "declining"]]
  notes = []
  for name, r in domains.items():
    s = r.sigmoid
    a_txt = f"{s.a:.3f}" if r.well_determined else f"~{s.a:.3f}"
    rows.append([name, str(s.n_points), f"{s.r0:.3f}", f"{a_txt} {span(r.interval('a'))}",
                 f"{units.num(s.b)} {span(r.interval('b'))}", units.num(s.c_mid),
                 f"{r.forecast:.3f} {span(r.forecast_interval)}",
                 "yes" if r.well_determined else "NO", "YES" if r.declining else "no"])
    notes += [f"    - {name}: {m}" for m in r.messages]
  notes += [f"    - {name}: not fitted: {e}" for name, e in (errors or {}).items()]
  head = (f"{overall.name} per domain: each domain's own sigmoid (R0 its step-0 eval, "
          "weights its own eval size)")
  return "\n".join([head, table(rows)] + notes)


def render_comparison(reports: list[forecast.RunReport],
                      c: compare_lib.Comparison, unit: str = "h") -> str:
  level = f"{reports[0].level:.0%}"
  rows = [["run", "points", "R0", "A", f"A {level} interval", "B", "B interval",
           f"C_mid ({unit})", f"pass rate at {units.at(reports[0].target_compute, unit)}",
           "well determined"]]
  for r in reports:
    s = r.sigmoid
    rows.append([r.name, str(s.n_points), f"{s.r0:.3f}", f"{s.a:.3f}", span(r.interval("a")),
                 units.num(s.b), span(r.interval("b")), units.num(s.c_mid),
                 f"{r.forecast:.3f} {span(r.forecast_interval)}",
                 "yes" if r.well_determined else "NO"])
  lines = ["runs", table(rows), "",
           f"shared-A efficiency comparison (paper Sec. 4): A fixed at {c.shared_a:.3f}, the "
           f"mean over {', '.join(c.runs_in_mean)}; largest A gap {c.max_a_gap:.3f} "
           f"({'within' if c.similar_a else 'beyond'} the +-{boot_lib.PAPER_A_MARGIN} margin)"]
  rows = [["run", "B at shared A", "B interval", f"C_mid ({unit})", ""]]
  by_name = {s.name: s for s in c.shared}
  rows += [[n, units.num(by_name[n].b), span(by_name[n].b_interval), units.num(by_name[n].c_mid),
            "" if by_name[n].well_determined else "(not well determined)"]
           for n in c.ranking]
  lines.append(table(rows))
  if c.p_b_greater:
    names = list(c.ranking)
    rows = [["P(row > column)"] + [f"B>{n}" for n in names] + [f"A>{n}" for n in names]]
    for i in names:
      cell = lambda probs, j, i=i: "" if i == j else f"{probs[(i, j)]:.2f}"
      rows.append([i] + [cell(c.p_b_greater, j) for j in names]
                  + [cell(c.p_a_greater, j) for j in names])
    lines += [f"  probabilities from the joint bootstrap with seed variance, B of the free "
              f"fits (a winner needs >= {c.decisive:.3f} against every other run):",
              table(rows, indent="    ")]
  if c.seed_variance:
    lines.append("  seed-to-seed variance in the probabilities:")
    lines += [f"    {v.describe()}" for v in c.seed_variance]
  best = c.most_efficient or "none: no significant difference"
  lines.append(f"  most compute-efficient (higher B with P >= {c.decisive:.3f}): {best}")
  if c.higher_asymptote:
    lines.append(f"  higher asymptote A (significant): {c.higher_asymptote}")
  lines += [f"  note: {m}" for m in c.messages]
  return "\n".join(lines)


def render(reports: list[forecast.RunReport], comparison: compare_lib.Comparison | None,
           plot_path: str | None = None, seed: int | None = None,
           domains: list | None = None, x: str | None = None) -> str:
  """The full human report: each run (and its domains' table, `domains` holding a
  `domains.DomainAnalysis` per run), then the comparison, then where the plot went; `x`
  is the compute column read (`--x`), whose unit every compute carries."""
  unit = units.unit_of(x)
  parts = []
  for i, r in enumerate(reports):
    parts.append(render_run(r, unit))
    d = domains[i] if domains else None
    if d is not None and (d.domains or d.errors):
      parts.append(render_domains(r, d.domains, d.errors, unit))
  if comparison is not None:
    parts.append(render_comparison(reports, comparison, unit))
  if seed is not None and reports[0].samples is not None:
    parts.append(f"bootstrap seed {seed} (--seed {seed} reproduces these numbers); the "
                 "intervals hold eval noise only, not a seed's training variance")
  if plot_path:
    parts.append(f"plot written to {plot_path}")
  return "\n\n".join(parts)
