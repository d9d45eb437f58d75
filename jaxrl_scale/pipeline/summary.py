"""The end of a run: summary.json, the forecast plot, and the console summary that puts the
forecast made at half the compute budget next to the pass rate actually reached.
"""

from __future__ import annotations

import json
import logging
import pathlib
from typing import Any

from jaxrl_scale import metrics as metrics_lib
from jaxrl_scale.config import Config
from jaxrl_scale.errors import UserError
from jaxrl_scale.pipeline import progress as progress_lib
from jaxrl_scale.scaling import units

log = logging.getLogger(__name__)


def _half_budget(forecaster: Any, final_compute: float) -> dict[str, Any] | None:
  """The forecast the run had made by half its compute (on the forecaster's axis),
  evaluated at the final compute."""
  from jaxrl_scale.scaling import curves  # pylint: disable=g-import-not-at-top

  made = forecaster.forecast_made_by(final_compute / 2)
  if made is None:
    return None
  return {
      "made_at_step": made.step, "made_at_compute_hours": made.hours, "axis": made.axis,
      "made_at_compute": made.compute,
      "n_points": made.n_points, "A": made.a, "B": made.b, "C_mid": made.c_mid, "R0": made.r0,
      "A_interval": made.a_interval, "well_determined": made.well_determined,
      "predicted_final": float(curves.sigmoid(final_compute, made.a, made.b, made.c_mid,
                                              made.r0)),
      "predicted_at_target": made.forecast, "target_compute": made.target_compute,
      "target_compute_hours": made.target_hours, "predicted_interval": made.forecast_interval,
  }


def _plot(cfg: Config, run_dir: pathlib.Path, rows: list[dict[str, Any]]) -> str | None:
  from jaxrl_scale.scaling import domains  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.scaling import live  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.scaling import plot  # pylint: disable=g-import-not-at-top

  # On the live forecast's axis; its hours settings turned into that axis as it does.
  column = live.COLUMNS[cfg.forecast.axis]
  evals = [r for r in rows if r.get("val/pass_rate") is not None and r.get(column) is not None]
  x = [r[column] for r in evals]
  hours = [r.get("compute_hours", float("nan")) for r in evals]
  target = cfg.forecast.target_compute_hours
  if target is not None and cfg.forecast.axis != "hours":
    target = target * x[-1] / hours[-1] if evals and hours[-1] > 0 else None
  try:
    # A mixed-domain run's plot has each domain's curve beside the overall one.
    analysis = domains.analyse_file(
        str(run_dir / "metrics.jsonl"), x_key=column,
        min_compute=min(live.cutoff(x, hours, cfg.forecast.min_compute_hours),
                        max(x, default=0.0)),
        target_compute=target, n_boot=cfg.forecast.n_boot, seed=cfg.run.seed)
    title = f"{analysis.overall.name}: per domain" if analysis.domains else None
    return plot.plot_reports(domains.plot_reports([analysis]), str(run_dir / "forecast.png"),
                             title=title)
  except UserError as e:  # too few eval points for a fit: no plot, say why
    log.info("no forecast plot: %s", e)
    return None


def _domain_forecasts(forecaster: Any) -> dict[str, dict[str, Any]]:
  """Each domain's live forecast at its last eval (a mixed-domain run; else empty)."""
  out = {}
  for domain, f in sorted(getattr(forecaster, "domains", {}).items()):
    made = f.latest
    if made is not None:
      out[domain] = {"step": made.step, "n_points": made.n_points, "A": made.a,
                     "A_interval": made.a_interval, "B": made.b, "C_mid": made.c_mid,
                     "R0": made.r0, "well_determined": made.well_determined,
                     "declining": made.declining, "axis": made.axis,
                     "target_compute": made.target_compute,
                     "target_compute_hours": made.target_hours,
                     "forecast": made.forecast, "forecast_interval": made.forecast_interval}
  return out


def _timing(rows: list[dict[str, Any]]) -> dict[str, float]:
  """Wall time of the RL steps, what compute_hours leaves out, and each role's idle share.

  trainer idle: time waiting for rollouts / wall time; generator idle: the per-step
  gen/idle_frac weighted by each step's wall time (the pipelined generator: stalled with
  nothing to decode; sync rounds: not sampling).
  """
  steps = [r for r in rows[1:] if r.get("time/step_s") is not None]
  wall = sum(r["time/step_s"] for r in steps)
  out = {"rl_wall_s": wall}
  for kind in ("eval", "checkpoint", "compile"):
    out[f"{kind}_s"] = sum(r.get(f"time/{kind}_s", 0.0) for r in steps)
  if wall > 0:
    out["trainer_idle_frac"] = sum(r.get("time/wait_s", 0.0) for r in steps) / wall
    if any("gen/idle_frac" in r for r in steps):
      out["generator_idle_frac"] = sum(r.get("gen/idle_frac", 0.0) * r["time/step_s"]
                                       for r in steps) / wall
  return out


def finish(cfg: Config, run_dir: pathlib.Path, outcome: Any, forecaster: Any, host: Any,
           progress: progress_lib.Progress) -> dict[str, Any] | None:
  """Writes summary.json (and forecast.png) and prints the summary; returns the summary."""
  if outcome is None:
    return None
  rows = metrics_lib.read_metrics(run_dir / "metrics.jsonl")
  evals = [(r["step"], r["compute_hours"], r["val/pass_rate"]) for r in rows
           if r.get("val/pass_rate") is not None]
  summary: dict[str, Any] = {
      "outcome": outcome.reason, "signal": outcome.signal_name, "steps": outcome.step,
      "target_steps": cfg.run.steps, "compute_hours": host.compute_hours,
      "sft_compute_hours": host.sft_compute_hours, "flops": host.flops,
  }
  summary.update(_timing(rows))
  if evals:
    summary["start_pass_rate"] = evals[0][2] if evals[0][0] == 0 else None
    summary["final_pass_rate"] = evals[-1][2]
    summary["final_step"] = evals[-1][0]
  if forecaster is not None and forecaster.latest is not None and evals:
    final = [r for r in rows if r.get("val/pass_rate") is not None][-1]
    summary["half_budget_forecast"] = _half_budget(forecaster, final[forecaster.column])
    latest = forecaster.latest
    summary["final_forecast"] = {"A": latest.a, "B": latest.b, "C_mid": latest.c_mid,
                                 "A_interval": latest.a_interval,
                                 "well_determined": latest.well_determined}
    by_domain = _domain_forecasts(forecaster)
    if by_domain:
      summary["final_forecast_domains"] = by_domain
  if cfg.forecast.plot and outcome.reason == "done" and len(evals) >= 5:
    summary["forecast_plot"] = _plot(cfg, run_dir, rows)
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
  progress.print(render(summary))
  return summary


def _unit(f: dict[str, Any]) -> str:
  """The unit of a forecast's compute (its C_mid, its target): that of its axis' column."""
  from jaxrl_scale.scaling import live  # pylint: disable=g-import-not-at-top

  return live.UNITS[f.get("axis", "hours")]


def _compute(f: dict[str, Any], key: str) -> str:
  """`f[key]` with the unit of `f`'s axis, as `jaxrl-scale fit` prints it."""
  return units.at(f[key], _unit(f))


def _at(f: dict[str, Any]) -> str:
  """A forecast's target: in hours, with its FLOPs first on the FLOPs axis."""
  hours = f.get("target_compute_hours")
  hours_text = "" if hours is None else units.at(hours, units.unit_of("compute_hours"))
  if f.get("axis", "hours") == "hours":
    return hours_text or _compute(f, "target_compute")
  return _compute(f, "target_compute") + (f" (~{hours_text})" if hours_text else "")


def render(summary: dict[str, Any]) -> str:
  """The console summary block."""
  lines = ["", "=" * 72]
  if summary["outcome"] == "signal":
    lines.append(f"stopped by {summary['signal']} after step {summary['steps']}: checkpoint "
                 "saved; run the same command again (or add --resume) to continue")
  else:
    lines.append(f"finished {summary['steps']} RL steps")
  lines.append(f"compute: {summary['compute_hours']:.4g} accelerator-hours RL (+ "
               f"{summary['sft_compute_hours']:.3g} SFT), {summary['flops']:.3g} FLOPs")
  if summary.get("rl_wall_s"):
    idle = [f"{role} {summary[f'{role}_idle_frac']:.0%}" for role in ("trainer", "generator")
            if summary.get(f"{role}_idle_frac") is not None]
    lines.append(
        f"time: {progress_lib.duration(summary['rl_wall_s'])} of RL steps, of which eval "
        f"{summary['eval_s']:.0f}s, checkpoints {summary['checkpoint_s']:.0f}s, compiles "
        f"{summary['compile_s']:.0f}s (not in compute)"
        + (f" | idle: {', '.join(idle)}" if idle else ""))
  if "final_pass_rate" in summary:
    start = summary.get("start_pass_rate")
    after = " (after SFT)" if summary.get("sft_compute_hours") else ""
    start_text = f"{start:.3f} at step 0{after} -> " if start is not None else ""
    lines.append(f"validation pass rate: {start_text}{summary['final_pass_rate']:.3f} at step "
                 f"{summary['final_step']}")
  half = summary.get("half_budget_forecast")
  if half is not None:
    lines.append(
        f"forecast made at half the budget (step {half['made_at_step']}, "
        f"{units.at(half['made_at_compute_hours'], units.unit_of('compute_hours'))}, "
        f"{half['n_points']} points): A={half['A']:.3f} "
        f"B={half['B']:.2f} C_mid={_compute(half, 'C_mid')}"
        + ("" if half.get("well_determined", True) else
           " (not well determined: the data did not pin A down yet; read the interval)"))
    lines.append(f"  predicted pass rate at the final compute: {half['predicted_final']:.3f}"
                 f" | actual: {summary['final_pass_rate']:.3f}")
    band = half.get("predicted_interval")
    if band and half.get("target_compute_hours"):
      lines.append(f"  (its forecast for the budget it projected, {_at(half)}: "
                   f"{half['predicted_at_target']:.3f} [{band[0]:.3f}, {band[1]:.3f}])")
  elif summary.get("final_forecast") is not None:
    lines.append("no forecast had been made by half the budget (fewer than 4 eval points)")
  by_domain = summary.get("final_forecast_domains")
  if by_domain:
    lines.append("fitted curve per domain (the live forecast at the last eval):")
    for domain, f in by_domain.items():
      a = f"A={f['A']:.3f}" if f["well_determined"] else f"A~{f['A']:.2f}? (not determined)"
      if f.get("A_interval"):
        a += f" [{f['A_interval'][0]:.3f}, {f['A_interval'][1]:.3f}]"
      line = f"  {domain}: {a} B={f['B']:.2f} C_mid={_compute(f, 'C_mid')} R0={f['R0']:.3f}"
      if f.get("forecast") is not None:
        line += f"; at {_at(f)}: {f['forecast']:.3f}"
        if f.get("forecast_interval"):
          line += f" [{f['forecast_interval'][0]:.3f}, {f['forecast_interval'][1]:.3f}]"
      if f.get("declining"):
        line += "; DECLINING"
      lines.append(line)
  if summary.get("forecast_plot"):
    lines.append(f"forecast plot: {summary['forecast_plot']}")
  lines.append("=" * 72)
  return "\n".join(lines)
