"""Tests for the live forecaster the training loop feeds."""

import dataclasses
import json
import re

import numpy as np
import pytest

from jaxrl_scale import cli
from jaxrl_scale.scaling import fit
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import live
from jaxrl_scale.scaling import synthetic
from jaxrl_scale.scaling import units

ROW = synthetic.TABLE1[0]


def test_forecasts_converge():
  compute, noisy, clean = synthetic.make_curve(ROW, seed=0)
  fc = live.LiveForecaster(target_compute=ROW.budget, n_boot=100)
  outs = []
  for i, (c, r) in enumerate(zip(compute, noisy)):
    outs.append(fc.update(c, r, step=100 * i))
  assert fc.r0 == noisy[0]
  assert outs[:4] == [None] * 4  # the start (R0) + three points: not enough yet
  assert outs[4] is not None and outs[4].n_points == 4
  last = outs[-1]
  assert last.n_points == 60 and last.step == 6000
  assert abs(last.a - ROW.a) < 0.03
  assert abs(last.forecast - clean[-1]) < 0.01
  lo, hi = last.forecast_interval
  assert lo <= last.forecast <= hi
  half = fc.forecast_made_by(ROW.budget / 2)
  assert half is not None and half.compute <= ROW.budget / 2
  assert abs(half.forecast - clean[-1]) < 0.03


def test_as_metrics_and_summary():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=1)
  fc = live.LiveForecaster(target_compute=20_000.0, n_boot=100)
  for c, r in zip(compute[:20], noisy[:20]):
    f = fc.update(c, r)
  m = f.as_metrics()
  for key in ("A", "A_lo", "A_hi", "B", "C_mid", "R0", "pass_rate", "pass_rate_lo",
              "pass_rate_hi", "target_compute", "well_determined", "n_points"):
    assert isinstance(m[f"forecast/{key}"], float)
  assert m["forecast/A_lo"] <= m["forecast/A"] <= m["forecast/A_hi"]
  assert "forecast:" in f.summary() and "at 2.00e+04 h" in f.summary()


def test_non_finite_points_are_ignored_and_replays_rewind():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=2)
  fc = live.LiveForecaster(n_boot=0)
  for c, r in zip(compute[:30], noisy[:30]):
    fc.update(c, r)
  before = fc.latest
  assert fc.update(compute[30], float("nan")) is before
  # A resumed run replays evals from index 20 on: the abandoned ones are dropped.
  f = fc.update(compute[20], noisy[20])
  assert f.n_points == 20
  assert all(h.compute < compute[20] for h in fc.history[:-1])


def test_matches_a_batch_fit():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=3)
  fc = live.LiveForecaster(n_boot=0)
  for c, r in zip(compute, noisy):
    f = fc.update(c, r)
  assert f.n_points == 60
  batch = fit.fit_sigmoid(compute, noisy, noisy[0])
  np.testing.assert_allclose([f.a, f.b, f.c_mid], [batch.a, batch.b, batch.c_mid], rtol=1e-9)
  assert f.forecast is None and f.a_interval is None


def test_well_determined_has_hysteresis():
  compute, noisy, _ = synthetic.make_curve(ROW, seed=6)
  w = (compute > 0) & (compute <= 0.6 * ROW.budget)
  f = fit.fit_sigmoid(compute, noisy, noisy[0], weights=w.astype(float))
  # A last fitted point a little below the midpoint: fails fresh, passes for a run that
  # was already well determined (within the HYSTERESIS slack).
  just_below = f.c_mid / 1.1
  assert not forecast.assess(f, None, just_below)[0]
  assert forecast.assess(f, None, just_below, was_well=True)[0]
  assert not forecast.assess(f, None, f.c_mid / 1.5, was_well=True)[0]


def test_live_flag_does_not_flip_back_on_a_saturating_run():
  # Seed 9: with HYSTERESIS = 1 the flag goes 0 -> 1 -> 0 -> 1 around the 20th point.
  compute, noisy, _ = synthetic.make_curve(ROW, seed=9)
  fc = live.LiveForecaster(target_compute=ROW.budget, n_boot=50)
  flags = [f.well_determined for c, r in zip(compute, noisy)
           if (f := fc.update(c, r)) is not None]
  first = flags.index(True)
  assert all(flags[first:]), flags
  assert not any(flags[:forecast.MIN_POINTS_DETERMINED - forecast.MIN_POINTS])


@pytest.mark.parametrize("sized", [False, True])
def test_live_line_is_fits_line_on_the_same_data(tmp_path, capsys, sized):
  # Issue 37: at half the budget the live forecaster printed 0.983 [0.963, 0.986] while
  # `fit --fit-fraction` on the same run said 0.985 [0.946, 0.989]. The same points, seed
  # and refits must give the same numbers (eval sizes logged: the fit weights by them).
  compute, noisy, _ = synthetic.simulate_evals(ROW, n_evals=40, noise="binomial",
                                               eval_size=2048, seed=11)
  size = (512, 4) if sized else None
  path = tmp_path / "metrics.jsonl"
  synthetic.write_metrics_jsonl(str(path), compute, noisy, eval_size=size)
  fc = live.LiveForecaster(target_compute=float(compute[-1]), n_boot=200, seed=7)
  kw = {} if size is None else {"eval_size": 2048}
  for i, (c, r) in enumerate(zip(compute, noisy)):
    fc.update(c, r, step=100 * i, **kw)
  half = fc.forecast_made_by(compute[-1] / 2)
  k = int(np.flatnonzero(compute == half.compute)[0])
  frac = 0.5 * (compute[k] + compute[k + 1]) / compute[-1]
  assert cli.main(["fit", str(path), "--fit-fraction", repr(float(frac)), "--seed", "7",
                   "--bootstrap", "200", "--json"]) == 0
  d = json.loads(capsys.readouterr().out)
  assert d["n_points"] == half.n_points
  np.testing.assert_allclose(half.forecast, d["forecast"]["pass_rate"], rtol=1e-9)
  np.testing.assert_allclose(half.forecast_interval, d["forecast"]["interval"], rtol=1e-9)
  np.testing.assert_allclose(half.a_interval, d["intervals"]["A"], rtol=1e-9)
  assert half.well_determined == d["well_determined"]


def test_live_line_prints_each_compute_as_fit_does(tmp_path, capsys):
  # Issue 67: the live line printed hours as 0.0592 h (its own "%.3g") where `fit` printed
  # 0.059 h. Both go through units.at, so the same compute reads the same in both.
  compute, noisy, _ = synthetic.simulate_evals(ROW, n_evals=30, seed=4)
  compute = compute / compute[-1] * 0.05  # hours, so that the target 0.0592 h is past them
  path = tmp_path / "metrics.jsonl"
  synthetic.write_metrics_jsonl(str(path), compute, noisy)
  fc = live.LiveForecaster(target_compute=0.0592, n_boot=0)
  for i, (c, r) in enumerate(zip(compute, noisy)):
    fc.update(c, r, step=100 * i)
  line = fc.latest.summary()
  assert cli.main(["fit", str(path), "--target", "0.0592", "--bootstrap", "0"]) == 0
  report = capsys.readouterr().out
  assert "forecast pass rate at C = 0.059 h " in report, report
  assert "pass rate at 0.059 h: " in line and "0.0592" not in line, line
  # On the FLOPs axis the hours beside each compute read as fit's hours too.
  on_flops = dataclasses.replace(fc.latest, axis="flops", target_compute=2e12,
                                 target_hours=0.0592)
  assert on_flops.at(2e12) == "2.00e+12 FLOPs (~0.059 h)"


def _loaded_run(load, seed=12, n_evals=40):
  """One run's evals: FLOPs per eval fixed by the config (1e13 per step), hours per eval
  scaled by `load(i)` (another job on the machine, a slower node)."""
  compute, noisy, _ = synthetic.simulate_evals(ROW, n_evals=n_evals, seed=seed)
  flops = compute / ROW.budget * 1e13 * 100 * n_evals
  hours = np.concatenate([[0.0], np.cumsum([np.diff(compute)[i] * load(i)
                                            for i in range(n_evals)])])
  return flops, hours, noisy


def _feed(fc, flops, hours, noisy):
  x = flops if fc.axis == "flops" else hours
  return [fc.update(x[i], noisy[i], step=100 * i, hours=hours[i]) for i in range(x.size)]


def test_default_axis_is_flops_so_load_leaves_the_forecast_alone():
  # Issue 64: the live forecast ran on hours, so one config on a machine that got 2x slower
  # half-way forecast another C_mid and another budget. On FLOPs the two forecast alike.
  from jaxrl_scale import config
  steady = _loaded_run(lambda i: 1.0, n_evals=24)
  slowed = _loaded_run(lambda i: 1.0 if i < 12 else 2.0, n_evals=24)
  np.testing.assert_array_equal(steady[0], slowed[0])  # same FLOPs, different hours
  outs = {}
  for axis in ("flops", "hours"):
    cfg = config.ForecastConfig(n_boot=20) if axis == "flops" else config.ForecastConfig(
        axis="hours", n_boot=0)
    for name, run in (("steady", steady), ("slowed", slowed)):
      fc = live.LiveForecaster.from_config(cfg, total_steps=2400, seed=3)
      outs[axis, name] = _feed(fc, *run)[-1]
  assert config.ForecastConfig().axis == "flops"
  assert outs["flops", "steady"].axis == "flops"
  a, b = outs["flops", "steady"], outs["flops", "slowed"]
  assert (a.a, a.b, a.c_mid, a.forecast, a.forecast_interval) == (
      b.a, b.b, b.c_mid, b.forecast, b.forecast_interval)
  # Hours are still reported: the eval's hours, the target's at the FLOPs per hour so far.
  assert b.hours == pytest.approx(slowed[1][-1]) and a.hours == pytest.approx(steady[1][-1])
  assert b.target_hours == pytest.approx(slowed[1][-1])  # the last eval is the budget
  assert "FLOPs (~" in b.summary() and b.as_metrics()["forecast/target_hours"] > 0
  # Every number of the line is named with its unit (issue 67 item 7).
  line = b.summary()
  ratio = b.target_hours / b.target_compute
  assert "plateau A" in line and f"steepness B={b.b:.2f}" in line
  at = lambda flops: f"{units.at(flops, 'FLOPs')} (~{units.at(flops * ratio, 'h')})"
  assert f"half-gain at C_mid={at(b.c_mid)}" in line
  assert (f"pass rate at {at(b.target_compute)}: "
          f"{b.forecast:.3f} [{b.forecast_interval[0]:.3f}, {b.forecast_interval[1]:.3f}]; "
          "95% intervals") in line
  # No bare number is left: each one follows its name (A=, B=, C_mid=, "at", ": ", "[")
  # and a compute is followed by its unit.
  assert not re.findall(r"\d e[+-]", line)
  for m in re.finditer(r"(\d+(?:\.\d+)?(?:e[+-]\d+)?)", line):
    before, after = line[:m.start()], line[m.end():]
    if "e+" in m.group(1) or after.startswith(" h"):
      assert after.startswith((" FLOPs", " h")), (m.group(1), line)
    else:
      assert before.endswith(("A=", "B=", ": ", "[", ", ", "(~", "A~")) or \
          after.startswith("% intervals"), (m.group(1), line)
  assert "; 95% intervals" not in dataclasses.replace(
      b, a_interval=None, forecast_interval=None).summary()
  # On hours the slowed run's curve is another one (the old default).
  h1, h2 = outs["hours", "steady"], outs["hours", "slowed"]
  assert f"C_mid={units.at(h1.c_mid, 'h')};" in h1.summary() and "FLOPs" not in h1.summary()
  assert abs(h2.b - h1.b) > 0.05, (h1.b, h2.b)


def test_flops_line_is_fit_x_flops_with_the_hours_cutoff_and_target(tmp_path, capsys):
  # The live forecast on FLOPs with a cutoff and a target given in hours is `fit --x flops`
  # with them turned into FLOPs: the cutoff at the first eval past it, the target at the
  # FLOPs per hour so far.
  flops, hours, noisy = _loaded_run(lambda i: 1.0 + 0.5 * (i % 3 == 0), seed=13)
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps({"step": 100 * i, "compute_hours": float(hours[i]),
                                      "flops": float(flops[i]),
                                      "val/pass_rate": float(noisy[i])}) + "\n"
                          for i in range(flops.size)))
  fc = live.LiveForecaster(axis="flops", min_hours=0.1 * hours[-1],
                           target_hours=2 * hours[-1], n_boot=50, seed=5)
  last = _feed(fc, flops, hours, noisy)[-1]
  cut = float(flops[np.flatnonzero(hours >= 0.1 * hours[-1])[0]])
  assert fc.fit_min_compute == cut and cut > flops[1]
  target = 2 * hours[-1] * flops[-1] / hours[-1]
  assert last.target_compute == pytest.approx(target, rel=1e-12)
  assert cli.main(["fit", str(path), "--x", "flops", "--min-compute", repr(cut),
                   "--target", repr(float(last.target_compute)), "--seed", "5",
                   "--bootstrap", "50", "--json"]) == 0
  d = json.loads(capsys.readouterr().out)
  assert d["n_points"] == last.n_points == int(np.sum(flops >= cut))
  np.testing.assert_allclose([last.a, last.b, last.c_mid], [d["A"], d["B"], d["C_mid"]],
                             rtol=1e-9)
  np.testing.assert_allclose(last.forecast_interval, d["forecast"]["interval"], rtol=1e-9)



def test_training_loop_feeds_the_flops_axis_and_reports_hours():
  # The loop's eval hook (pipeline/loop.py) gives a FLOPs forecaster the run's FLOPs, with
  # the clock's hours beside them; a target in hours is turned into FLOPs.
  import types
  from jaxrl_scale import config
  from jaxrl_scale.pipeline import loop as loop_lib
  flops, hours, noisy = _loaded_run(lambda i: 1.0 + (i > 4), n_evals=8)
  fc = live.LiveForecaster.from_config(
      config.ForecastConfig(n_boot=0, target_compute_hours=2 * hours[-1]), total_steps=800,
      seed=0)
  ns = types.SimpleNamespace
  for i in range(flops.size):
    fake = ns(evaluator=ns(run=lambda params, step, on_progress, i=i:
                           {"val/pass_rate": float(noisy[i])}),
              progress=None, trainer=ns(params=None), state=ns(flops=float(flops[i])),
              flops_per_token=0.0, _eval_tokens=lambda out: 0.0, forecaster=fc,
              clock=ns(hours=float(hours[i])), _forecast_line=None, last_eval=None,
              cfg=ns(run=ns(steps=800), forecast=ns(target_compute_hours=None)))
    out = loop_lib.Loop._evaluate(fake, 100 * i)
  np.testing.assert_array_equal(fc.curve().compute, flops)
  assert fc.latest.hours == hours[-1]
  assert out["forecast/target_compute"] == pytest.approx(2 * flops[-1])
  assert out["forecast/target_hours"] == pytest.approx(2 * hours[-1])
  assert "FLOPs (~" in fake._forecast_line
