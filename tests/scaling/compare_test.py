"""Tests for the recipe comparison (shared-A refit, joint-bootstrap probabilities, pooling)."""

import dataclasses

import numpy as np
import pytest

from jaxrl_scale.scaling import compare
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import synthetic


def _curve(name, a, b, seed, c_mid=2542.0, budget=16_000.0, noise_sd=0.005):
  row = synthetic.Table1Row(name, c_mid=c_mid, b=b, a=a, budget=budget)
  compute, noisy, _ = synthetic.simulate_evals(row, seed=seed, noise_sd=noise_sd)
  return io.Curve(name=name, path=name, compute=compute, pass_rate=noisy,
                  line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)


def _report(curve, n_boot=200, seed=0):
  return forecast.analyse(curve, forecast.AnalysisOptions(n_boot=n_boot, seed=seed))


def test_clearly_different_efficiency_names_the_winner_with_probabilities():
  runs = [_report(_curve("slow", 0.60, 1.5, 0), seed=1),
          _report(_curve("fast", 0.61, 2.2, 1), seed=2),
          _report(_curve("mid", 0.605, 1.8, 2), seed=3)]
  c = compare.compare(runs)
  assert c.shared_a == pytest.approx(np.mean([r.sigmoid.a for r in runs]))
  assert c.ranking == ("fast", "mid", "slow")
  assert c.p_b_greater[("fast", "mid")] >= 0.95 and c.p_b_greater[("fast", "slow")] >= 0.95
  assert c.p_b_greater[("slow", "fast")] == pytest.approx(1 - c.p_b_greater[("fast", "slow")])
  assert c.most_efficient == "fast"
  for s in c.shared:
    lo, hi = s.b_interval
    assert lo <= s.b <= hi
  d = c.to_dict()
  assert d["ranking_by_B"] == ["fast", "mid", "slow"] and d["most_efficient"] == "fast"
  assert {"run": "fast", "other": "slow",
          "probability": c.p_b_greater[("fast", "slow")]} in d["P_B_greater"]


def test_identical_data_names_no_winner():
  # The same eval points twice (as two seeds that happened to agree): whichever B is higher
  # by rounding, the joint bootstrap puts the probability near one half, and no run wins.
  curve = _curve("seed1", 0.61, 1.92, 4)
  twin = dataclasses.replace(curve, name="seed2")
  c = compare.compare([_report(curve, seed=1), _report(twin, seed=2)])
  p = c.p_b_greater[("seed1", "seed2")]
  assert 0.3 < p < 0.7, p
  assert c.most_efficient is None and c.higher_asymptote is None
  assert any("no significant difference" in m for m in c.messages)
  assert c.to_dict()["most_efficient"] is None


def test_different_asymptotes_are_called_out_and_ill_determined_runs_left_out():
  low = _report(_curve("low", 0.55, 2.0, 3))
  high = _report(_curve("high", 0.70, 2.0, 4), seed=1)
  far = _report(_curve("far", 0.80, 1.5, 5, c_mid=200_000.0), seed=2)
  assert not far.well_determined
  c = compare.compare([low, high, far])
  assert not c.similar_a and c.max_a_gap > 0.1
  assert c.runs_in_mean == ("low", "high")
  assert c.shared_a == pytest.approx((low.sigmoid.a + high.sigmoid.a) / 2)
  assert any("far" in m for m in c.messages)
  assert any("differ in asymptote" in m for m in c.messages)
  assert c.ranking[-1] == "far"
  assert c.p_a_greater[("high", "low")] >= 0.95
  with pytest.raises(ValueError):
    compare.compare([low])


def test_without_bootstrap_no_winner_is_named():
  runs = [_report(_curve("slow", 0.60, 1.5, 0), n_boot=0),
          _report(_curve("fast", 0.61, 2.2, 1), n_boot=0)]
  c = compare.compare(runs)
  assert c.ranking == ("fast", "slow")
  assert c.most_efficient is None and c.p_b_greater == {}
  assert any("no joint bootstrap" in m for m in c.messages)


def test_pooled_seeds_fit_as_one_run_with_narrower_intervals():
  row = synthetic.TABLE1[0]
  seeds = [_curve(f"s{i}", row.a, row.b, 10 + i, noise_sd=0.01) for i in range(3)]
  pooled = io.pool(seeds, "recipe")
  assert pooled.n_series == 3 and pooled.compute.size == 3 * seeds[0].compute.size
  assert pooled.r0 == pytest.approx(np.mean([s.r0 for s in seeds]))
  one, three = _report(seeds[0]), _report(pooled)
  assert three.sigmoid.n_points == 3 * one.sigmoid.n_points
  width = lambda r: np.diff(r.interval("a"))[0]
  assert width(three) < 0.8 * width(one)
  assert abs(three.sigmoid.a - row.a) < 0.02
