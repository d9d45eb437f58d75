"""Forecast plots in the paper's style (Fig. 1): log-compute axis, fitted points, the fit
solid over the fitted range and dashed beyond it, held-out points as crosses, the
asymptote as a dotted line, and the bootstrap band. Several runs share one figure.
"""

from __future__ import annotations

import numpy as np

from jaxrl_scale.errors import UserError
from jaxrl_scale.scaling import forecast


def _fmt(v: float) -> str:
  if v != 0 and not 1e-2 <= abs(v) < 1e4:
    return f"{v:.2e}"
  return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


# Major ticks per decade, densest first; the first choice whose labels do not overlap wins.
_TICK_SUBS = ((1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))


def label_overlaps(fig, axis) -> bool:
  """Whether any two visible tick labels of `axis` overlap once drawn (with a small gap)."""
  return _overlap(fig, axis, visible_tick_labels(fig, axis))


def visible_tick_labels(fig, axis) -> list:
  """The drawn tick labels of `axis`, major and minor, inside its view limits."""
  fig.canvas.draw()
  lo, hi = sorted(axis.get_view_interval())
  ticks = axis.get_major_ticks() + axis.get_minor_ticks()
  return [t.label1 for t in ticks
          if t.label1.get_visible() and t.label1.get_text() and lo <= t.get_loc() <= hi]


def _overlap(fig, axis, labels) -> bool:
  del axis
  renderer = fig.canvas.get_renderer()
  boxes = sorted((lab.get_window_extent(renderer) for lab in labels), key=lambda b: b.x0)
  return any(b.x0 < a.x1 + 4.0 for a, b in zip(boxes, boxes[1:]))


def _set_compute_ticks(fig, ax) -> None:
  """Log-compute ticks labelled in plain numbers, as many as fit without overlapping.

  Matplotlib's default log axis labels the minor ticks when the data span less than a
  decade or so (2x10^3, 3x10^3, ...), and those labels run into each other.
  """
  from matplotlib import ticker
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _fmt(v)))
  for subs in _TICK_SUBS:
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10.0, subs=subs, numticks=12))
    if not label_overlaps(fig, ax.xaxis):
      return
  # Many decades: LogLocator thins to every n-th decade once numticks is small enough.
  for numticks in (8, 6, 4, 3):
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10.0, subs=(1.0,), numticks=numticks))
    if not label_overlaps(fig, ax.xaxis):
      return


def plot_reports(reports: list[forecast.RunReport], path: str, *, title: str | None = None,
                 x_label: str = "compute (accelerator-hours)",
                 y_label: str = "validation pass rate") -> str:
  """Draws the runs' data, fits and forecasts into a PNG at `path`.

  Args:
    reports: analysed runs.
    path: output file (PNG; the format follows the extension).
    title: figure title; defaults to the run name(s).
    x_label: compute axis label.
    y_label: pass-rate axis label.

  Returns:
    The path written.
  """
  from matplotlib import pyplot as plt
  fig = make_figure(reports, title=title, x_label=x_label, y_label=y_label)
  try:
    fig.savefig(path)
  except OSError as e:
    raise UserError(f"{path}: cannot write the plot ({e.strerror or e})") from None
  finally:
    plt.close(fig)
  return path


def make_figure(reports: list[forecast.RunReport], *, title: str | None = None,
                x_label: str = "compute (accelerator-hours)",
                y_label: str = "validation pass rate"):
  """The figure `plot_reports` saves (the caller closes it)."""
  import matplotlib
  matplotlib.use("Agg")  # files only; never needs a display
  from matplotlib import pyplot as plt

  fig, ax = plt.subplots(figsize=(8.0, 6.2), dpi=120)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  x_max = max(max(r.target_compute, float(np.max(r.curve.compute))) for r in reports) * 1.15
  single = len(reports) == 1
  for i, r in enumerate(reports):
    _draw_run(ax, r, colors[i % len(colors)], x_max, single=single)
  if not single:
    # One grey key for the marker and line styles every run shares.
    from matplotlib.lines import Line2D
    keys = [Line2D([], [], color="0.4", marker="o", ls="-", label="fitted points, fit"),
            Line2D([], [], color="0.4", ls="--", label="extrapolation"),
            Line2D([], [], color="0.4", ls=":", label="asymptote A")]
    if any(r.heldout_mask.any() for r in reports):
      keys.append(Line2D([], [], color="0.4", marker="x", ls="", label="held out (backtest)"))
    for k in keys:
      ax.add_line(k)
  ax.set_xscale("log")
  ax.set_xlabel(x_label)
  ax.set_ylabel(y_label)
  ax.set_title(title or ", ".join(r.name for r in reports))
  ax.grid(True, which="major", alpha=0.3)
  # Below the axes: inside, the key would cover the data or the asymptote.
  ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8,
            frameon=False)
  fig.tight_layout()
  _set_compute_ticks(fig, ax)
  return fig


def _draw_run(ax, r: forecast.RunReport, color: str, x_max: float, single: bool) -> None:
  s = r.sigmoid
  x, y = r.curve.compute, r.curve.pass_rate
  positive = x > 0
  x_min = float(np.min(x[positive])) / 1.15
  fit_x, heldout = x[r.fit_mask], r.heldout_mask
  skipped = positive & ~r.fit_mask & ~heldout

  a_txt = f"A={s.a:.3f}" if r.well_determined else f"A~{s.a:.2f}?"
  band = r.interval("a")
  if band is not None:
    a_txt += f" [{band[0]:.3f}, {band[1]:.3f}]"
  label = f"{r.name}: {a_txt}, B={s.b:.2f}, C_mid={_fmt(s.c_mid)}, R0={s.r0:.3f}"
  if r.declining:
    label += f" -- DECLINING (last {r.decline.n_window} evals {r.decline.drop:.3f} below "
    label += "the curve): A is not its plateau"
  elif not r.well_determined:
    label += " (not well determined)"
  ax.scatter(fit_x, y[r.fit_mask], s=16, color=color, zorder=3, label=label)
  if skipped.any():
    ax.scatter(x[skipped], y[skipped], s=16, facecolors="none", edgecolors=color, alpha=0.6,
               zorder=3, label="excluded (below --min-compute)" if single else None)
  if heldout.any():
    ax.scatter(x[heldout], y[heldout], s=22, marker="x", color=color, zorder=3,
               label="held out (backtest)" if single else None)

  lo_fit, hi_fit = float(np.min(fit_x)), float(np.max(fit_x))
  grid_in = np.geomspace(lo_fit, hi_fit, 100)
  grid_out = np.geomspace(hi_fit, x_max, 100)
  ax.plot(grid_in, s.predict(grid_in), color=color, lw=2,
          label="sigmoid fit" if single else None)
  ax.plot(grid_out, s.predict(grid_out), color=color, lw=2, ls="--",
          label="extrapolation" if single else None)
  if r.samples is not None:
    grid_all = np.geomspace(x_min, x_max, 200)
    curves_K = r.samples.predict(grid_all)
    tail = 100 * (1 - r.level) / 2
    lo, hi = np.percentile(curves_K, [tail, 100 - tail], axis=0)
    ax.fill_between(grid_all, lo, hi, color=color, alpha=0.15, lw=0,
                    label=f"{r.level:.0%} band (bootstrap)" if single else None)
  ax.axhline(s.a, color=color, ls=":", lw=1, label="asymptote A" if single else None)
  if single:
    grid_all = np.geomspace(lo_fit, x_max, 200)
    ax.plot(grid_all, r.power.predict(grid_all), color="0.45", lw=1, ls="-.",
            label=f"power law (A={r.power.a:.3f}, B={r.power.b:.2f})")
  yerr = None
  if r.forecast_interval is not None:
    lo_f, hi_f = r.forecast_interval
    yerr = [[max(r.forecast - lo_f, 0.0)], [max(hi_f - r.forecast, 0.0)]]
  ax.errorbar([r.target_compute], [r.forecast], yerr=yerr, fmt="D", color=color, ms=6,
              capsize=4, zorder=4,
              label=(f"forecast at {_fmt(r.target_compute)}: {r.forecast:.3f}"
                     if single else None))
