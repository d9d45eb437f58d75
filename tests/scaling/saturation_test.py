"""Forecast intervals when the data show no saturation yet (issue 37)."""

import numpy as np

from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import synthetic

PLATEAU = 0.95


def _demo_like(seed: int) -> io.Curve:
  x, y = synthetic.demo_shape(seed, plateau=PLATEAU)
  return io.Curve(name=f"demo{seed}", path="<simulated>", compute=x, pass_rate=y,
                  line=np.arange(x.size), r0=float(y[0]), is_start=x == 0)


def test_interval_holds_a_plateau_the_data_have_not_reached():
  # Fitted to half the run: before the floor, 5 of these 10 intervals at the final compute
  # lay above the plateau (the sigmoid's band ties the curvature seen to its asymptote).
  held = 0
  for seed in range(10):
    r = forecast.analyse(_demo_like(seed), forecast.AnalysisOptions(
        backtest=0.5 + 1e-9, n_boot=200, seed=seed))
    assert r.sigmoid.a >= forecast.A_BOUND and not r.well_determined
    assert r.floor is not None and r.floor[0] == r.max_fit_compute
    lo, hi = r.forecast_interval
    held += lo <= PLATEAU <= hi
    assert r.interval("a")[0] <= r.floor[1]
    assert any("no saturation in the data yet" in m for m in r.messages)
    assert r.to_dict()["saturation_floor"]["pass_rate"] == r.floor[1]
  assert held >= 9, held


def test_no_floor_when_the_fit_saw_saturation():
  compute, noisy, _ = synthetic.make_curve(synthetic.TABLE1[0], seed=3)
  curve = io.Curve(name="s", path="-", compute=compute, pass_rate=noisy,
                   line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)
  r = forecast.analyse(curve, forecast.AnalysisOptions(backtest=0.5, n_boot=200, seed=1))
  assert r.well_determined and r.floor is None
  point, band = forecast.forecast_at(r.sigmoid, r.samples, r.target_compute, r.level,
                                     r.profile)
  assert r.forecast_interval == band
