"""Tests for the forecast plot."""

from matplotlib import pyplot
import numpy as np
import pytest

from jaxrl_scale.scaling import curves
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


# (3e-3, 3.6e-2), a CPU-demo scale, is where matplotlib's default minor-tick labels
# (3x10^-3 4x10^-3, 3x10^-2 4x10^-2) ran into each other.
@pytest.mark.parametrize("lo, hi", [(3e-3, 3.6e-2), (1500.0, 16_000.0), (2e-3, 9e-3),
                                    (1.0, 1e7), (100.0, 100_000.0), (0.5, 3.0)])
def test_compute_tick_labels_do_not_overlap(lo, hi):
  row = synthetic.Table1Row("r", c_mid=float(np.sqrt(lo * hi)), b=1.5, a=0.6, budget=hi)
  compute = np.concatenate([[0.0], np.geomspace(lo, hi, 40)])
  rate = curves.sigmoid(compute, row.a, row.b, row.c_mid, synthetic.R0)
  curve = io.Curve(name="r", path="x", compute=compute, pass_rate=rate,
                   line=np.arange(compute.size), r0=synthetic.R0, is_start=compute == 0)
  report = forecast.analyse(curve, forecast.AnalysisOptions(n_boot=0))
  fig = plot.make_figure([report])
  try:
    labels = [t.get_text() for t in plot.visible_tick_labels(fig, fig.axes[0].xaxis)]
    assert len(labels) >= 2, labels
    assert not plot.label_overlaps(fig, fig.axes[0].xaxis), labels
  finally:
    pyplot.close(fig)
