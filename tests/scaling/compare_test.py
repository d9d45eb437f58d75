"""Tests for the recipe comparison (shared-A refit)."""

import numpy as np
import pytest

from jaxrl_scale.scaling import compare
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import synthetic


def _report(name, a, b, seed, c_mid=2542.0, budget=16_000.0):
  row = synthetic.Table1Row(name, c_mid=c_mid, b=b, a=a, budget=budget)
  compute, noisy, _ = synthetic.make_curve(row, seed=seed, noise_sd=0.005)
  curve = io.Curve(name=name, path=name, compute=compute, pass_rate=noisy,
                   line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)
  return forecast.analyse(curve, forecast.AnalysisOptions(n_boot=100))


def test_shared_a_ranks_by_efficiency():
  runs = [_report("slow", 0.60, 1.5, 0), _report("fast", 0.61, 2.2, 1),
          _report("mid", 0.605, 1.8, 2)]
  c = compare.compare(runs, n_boot=100)
  assert c.shared_a == pytest.approx(np.mean([r.sigmoid.a for r in runs]))
  assert c.ranking == ("fast", "mid", "slow") and c.most_efficient == "fast"
  assert c.similar_a and c.max_a_gap <= 0.02
  for s in c.shared:
    lo, hi = s.b_interval
    assert lo <= s.b <= hi
  d = c.to_dict()
  assert d["ranking_by_B"] == ["fast", "mid", "slow"] and d["A_paper_margin"] == 0.02


def test_different_asymptotes_are_called_out_and_ill_determined_runs_left_out():
  low = _report("low", 0.55, 2.0, 3)
  high = _report("high", 0.70, 2.0, 4)
  far = _report("far", 0.80, 1.5, 5, c_mid=200_000.0)
  assert not far.well_determined
  c = compare.compare([low, high, far], n_boot=0)
  assert not c.similar_a and c.max_a_gap > 0.1
  assert c.runs_in_mean == ("low", "high")
  assert c.shared_a == pytest.approx((low.sigmoid.a + high.sigmoid.a) / 2)
  assert any("far" in m for m in c.messages)
  assert any("differ in asymptote" in m for m in c.messages)
  assert c.ranking[-1] == "far" and c.most_efficient in ("low", "high")
  with pytest.raises(ValueError):
    compare.compare([low])
