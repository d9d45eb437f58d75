"""Tests for the forecast plot."""

import numpy as np

from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import plot
from jaxrl_scale.scaling import synthetic


def _report(row, seed, **kw):
  compute, noisy, _ = synthetic.make_curve(row, seed=seed)
  curve = io.Curve(name=row.name, path="x", compute=compute, pass_rate=noisy,
                   line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)
  return forecast.analyse(curve, forecast.AnalysisOptions(n_boot=100, **kw))


def test_single_and_multi_run_pngs(tmp_path):
  one = _report(synthetic.TABLE1[0], 0, backtest=0.5, min_compute=1500)
  path = plot.plot_reports([one], str(tmp_path / "one.png"))
  data = open(path, "rb").read()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
  two = [one, _report(synthetic.TABLE1[6], 1)]
  path = plot.plot_reports(two, str(tmp_path / "two.png"), title="cmp")
  assert open(path, "rb").read()[:4] == b"\x89PNG"
