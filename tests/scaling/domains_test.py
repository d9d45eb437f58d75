"""A curve per domain: `jaxrl-scale fit`, the live forecaster and the plot on a math+code run.

The run is simulated from two known sigmoids, the paper's math+code rows of Table 1 (math
A=0.595 B=2.05, code A=0.615 B=1.09), with binomial eval noise of each domain's own eval
size; the recovered parameters are checked against those TRUE parameters.
"""

import json
import types

import numpy as np
import pytest

from jaxrl_scale import cli
from jaxrl_scale.scaling import curves
from jaxrl_scale.scaling import live
from jaxrl_scale.scaling import synthetic
from jaxrl_scale.scaling import units

MATH, CODE = synthetic.TABLE1[-2], synthetic.TABLE1[-1]
TRUE = {"math": MATH, "code": CODE}
# Problems x samples per problem of each domain's held-out eval: the paper's 1,000 held-out
# prompts x 16 samples, split unevenly so that the domains' eval noise differs.
SIZES = {"math": (600, 16), "code": (400, 16)}
N_EVALS = 40
BOOT = ["--bootstrap", "300", "--seed", "11"]


def _domain_rows(seed: int = 0, n_evals: int = N_EVALS):
  """Eval rows as the mixed-domain trainer logs them: the overall pass rate (all prompts
  pooled), its size, and per domain val/<domain>/{pass_rate,num_prompts,samples_per_prompt}.
  """
  rng = np.random.default_rng(seed)
  compute = np.linspace(0.0, MATH.budget, n_evals + 1)
  rows = [{"step": 10 * i, "compute_hours": float(c)} for i, c in enumerate(compute)]
  total = np.zeros(compute.size)
  for domain, row in TRUE.items():
    n, k = SIZES[domain]
    clean = curves.sigmoid(compute, row.a, row.b, row.c_mid, synthetic.R0)
    passed = rng.binomial(n * k, clean)
    total += passed
    for r, p in zip(rows, passed):
      r.update({f"val/{domain}/pass_rate": p / (n * k), f"val/{domain}/num_prompts": n,
                f"val/{domain}/samples_per_prompt": k})
  n_all = sum(n for n, _ in SIZES.values())
  k_all = SIZES["math"][1]  # one samples-per-prompt for the whole eval
  for r, p in zip(rows, total):
    r.update({"val/pass_rate": p / (n_all * k_all), "val/num_prompts": n_all,
              "val/samples_per_prompt": k_all})
  return compute, rows


def _write(path, rows, drop_domains=False):
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      if drop_domains:
        r = {k: v for k, v in r.items() if k.count("/") < 2}
      f.write(json.dumps(r) + "\n")
      f.write(json.dumps({"step": r["step"] + 5, "compute_hours": r["compute_hours"],
                          "train/loss": 0.0, "rollout/math/pass_rate": 0.5}) + "\n")
  return str(path)


@pytest.fixture(name="run_file")
def _run_file(tmp_path):
  run_dir = tmp_path / "mathcode"
  run_dir.mkdir()
  _, rows = _domain_rows()
  return _write(run_dir / "metrics.jsonl", rows)


def _fit(capsys, argv, code=0):
  assert cli.main(["fit"] + argv) == code
  return capsys.readouterr()


def test_fit_recovers_each_domains_true_sigmoid(run_file, capsys):
  d = json.loads(_fit(capsys, [run_file, "--json", "--target", "30000"] + BOOT).out)
  assert isinstance(d["A"], float)  # the overall fit keeps the contract keys
  assert sorted(d["domains"]) == ["code", "math"]
  for domain, true in TRUE.items():
    f = d["domains"][domain]
    lo, hi = f["intervals"]["A"]
    assert lo <= true.a <= hi, (domain, f["A"], lo, hi)
    assert abs(f["A"] - true.a) < 0.03, (domain, f["A"])
    lo, hi = f["intervals"]["B"]
    assert lo <= true.b <= hi, (domain, f["B"], lo, hi)
    # Each domain's forecast at the common target covers its true curve there.
    assert f["forecast"]["compute"] == 30000.0
    truth = float(curves.sigmoid(30000.0, true.a, true.b, true.c_mid, synthetic.R0))
    lo, hi = f["forecast"]["interval"]
    assert lo <= truth <= hi, (domain, truth, lo, hi)
    assert f["R0_source"] == "step0"
    assert f["noise"]["eval_size_known"] is True
    assert isinstance(f["declining"], bool) and isinstance(f["well_determined"], bool)
  # Each domain's own eval size sets its noise: code evaluates fewer prompts.
  assert d["domains"]["code"]["noise"]["sd"] > d["domains"]["math"]["noise"]["sd"]


def test_fit_prints_one_row_per_domain_beside_the_overall_fit(run_file, capsys):
  out = _fit(capsys, [run_file, "--target", "30000"] + BOOT).out
  d = json.loads(_fit(capsys, [run_file, "--json", "--target", "30000"] + BOOT).out)
  lines = out.splitlines()
  for domain in TRUE:
    rows = [ln for ln in lines if ln.split()[:1] == [domain]]
    assert len(rows) == 1, (domain, out)
    f = d["domains"][domain]
    lo, hi = f["intervals"]["A"]
    assert f"{f['A']:.3f} [{lo:.3f}, {hi:.3f}]" in rows[0], rows[0]
    lo, hi = f["forecast"]["interval"]
    assert f"{f['forecast']['pass_rate']:.3f} [{lo:.3f}, {hi:.3f}]" in rows[0], rows[0]
  # The overall report comes first, the per-domain table after it.
  assert out.index("mathcode  (") < out.index("per domain")


def test_domain_flag_fits_that_domain_alone(run_file, capsys):
  d = json.loads(_fit(capsys, [run_file, "--json", "--domain", "code"] + BOOT).out)
  assert d["domain"] == "code" and "domains" not in d
  lo, hi = d["intervals"]["A"]
  assert lo <= CODE.a <= hi and abs(d["A"] - CODE.a) < 0.03
  _, rows = _domain_rows()
  assert d["R0"] == rows[0]["val/code/pass_rate"]
  text = _fit(capsys, [run_file, "--domain", "code"] + BOOT).out
  assert "per domain" not in text and "mathcode/code" in text


def test_unknown_domain_is_a_one_line_error(run_file, capsys):
  err = _fit(capsys, [run_file, "--domain", "physics"], code=2).err.strip()
  assert "\n" not in err and "physics" in err and "code, math" in err, err


def test_a_file_without_domains_prints_what_it_printed_before(tmp_path, run_file, capsys):
  _, rows = _domain_rows()
  plain_dir = tmp_path / "plain"
  plain_dir.mkdir()
  plain = _write(plain_dir / "metrics.jsonl", rows, drop_domains=True)
  plain_out = _fit(capsys, [plain] + BOOT).out
  plain_json = json.loads(_fit(capsys, [plain, "--json"] + BOOT).out)
  assert "per domain" not in plain_out and "domains" not in plain_json
  # The overall fit of the same evals is untouched by the domain columns beside it.
  mixed_out = _fit(capsys, [run_file] + BOOT).out
  overall = plain_out.split("\n\n")[:3]
  assert mixed_out.replace("mathcode", "plain").split("\n\n")[:3] == overall
  mixed_json = json.loads(_fit(capsys, [run_file, "--json"] + BOOT).out)
  del mixed_json["domains"]
  for key in ("run", "file"):
    del mixed_json[key], plain_json[key]
  assert mixed_json == plain_json


def test_plot_draws_a_curve_per_domain(run_file, tmp_path, capsys, monkeypatch):
  from jaxrl_scale.scaling import plot
  drawn = []
  real = plot.plot_reports
  monkeypatch.setattr(plot, "plot_reports",
                      lambda reports, *a, **k: drawn.append(reports) or real(reports, *a, **k))
  png = tmp_path / "domains.png"
  d = json.loads(_fit(capsys, [run_file, "--json", "--plot", str(png)] + BOOT).out)
  assert d["plot"] == str(png)
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  (reports,) = drawn
  assert sorted(r.name for r in reports) == ["all domains", "code", "math"]
  by_name = {r.name: r for r in reports}
  for domain, true in TRUE.items():
    assert abs(by_name[domain].sigmoid.a - true.a) < 0.03


def test_plot_legend_names_each_domain(run_file):
  from matplotlib import pyplot
  from jaxrl_scale.scaling import domains
  from jaxrl_scale.scaling import plot
  analysis = domains.analyse_file(run_file, n_boot=50, seed=0)
  fig = plot.make_figure(domains.plot_reports([analysis]))
  try:
    labels = fig.axes[0].get_legend_handles_labels()[1]
  finally:
    pyplot.close(fig)
  for domain in TRUE:
    assert any(lab.startswith(f"{domain}: A") for lab in labels), labels


def test_live_forecaster_makes_a_forecast_per_domain():
  compute, rows = _domain_rows(seed=3, n_evals=24)  # few evals, few refits: a fast test
  fc = live.LiveForecaster(target_compute=30000.0, n_boot=30)
  for c, row in zip(compute, rows):
    metrics, lines = fc.update_domains(c, row, step=row["step"])
  assert sorted(fc.domains) == ["code", "math"]
  band = (0.0, 1.0)
  overall = live.LiveForecast(
      step=0, compute=1.0, n_points=4, a=0.5, b=1.0, c_mid=1.0, r0=0.4, a_interval=band,
      b_interval=band, c_mid_interval=band, well_determined=True, messages=(),
      target_compute=2.0, forecast=0.5, forecast_interval=band, target_hours=2.0).as_metrics()
  for domain, true in TRUE.items():
    keys = {k.replace(f"forecast/{domain}/", "forecast/") for k in metrics
            if k.startswith(f"forecast/{domain}/")}
    assert keys == set(overall)  # the overall forecast's names, with the domain inserted
    assert abs(metrics[f"forecast/{domain}/A"] - true.a) < 0.03
    assert metrics[f"forecast/{domain}/R0"] == rows[0][f"val/{domain}/pass_rate"]
    assert sum(ln.lstrip().startswith(f"{domain}:") for ln in lines) == 1, lines
  assert fc.domains["code"].latest.target_compute == 30000.0


def test_eval_step_logs_forecast_keys_per_domain():
  """The loop's eval hook: one forecaster per domain of the eval row, keys in the row."""
  from jaxrl_scale.pipeline import loop as loop_lib
  compute, rows = _domain_rows(seed=4, n_evals=6)
  fc = live.LiveForecaster(target_compute=30000.0, n_boot=20)
  printed = []
  for c, row in zip(compute, rows):
    fake = types.SimpleNamespace(
        evaluator=types.SimpleNamespace(run=lambda params, step, on_progress, row=row:
                                        dict(row)),
        progress=None,
        trainer=types.SimpleNamespace(params=None), state=types.SimpleNamespace(flops=0.0),
        flops_per_token=0.0, _eval_tokens=lambda out: 0.0, forecaster=fc,
        clock=types.SimpleNamespace(hours=c),
        cfg=types.SimpleNamespace(forecast=types.SimpleNamespace(target_compute_hours=3e4),
                                  run=types.SimpleNamespace(steps=400)),
        _forecast_line=None, last_eval=None)
    out = loop_lib.Loop._evaluate(fake, row["step"])
    printed.append(fake._forecast_line)
  for domain in TRUE:
    assert f"forecast/{domain}/A" in out and f"forecast/{domain}/pass_rate_hi" in out
  assert "forecast/A" in out
  assert "code:" in printed[-1] and "math:" in printed[-1]


def test_run_summary_prints_a_fitted_curve_per_domain(tmp_path, monkeypatch):
  """The end of a mixed-domain run: summary.json and the console carry each domain's fit,
  and forecast.png draws each domain."""
  from jaxrl_scale.pipeline import summary
  from jaxrl_scale.scaling import plot
  compute, rows = _domain_rows(seed=5, n_evals=24)
  _write(tmp_path / "metrics.jsonl", rows)
  fc = live.LiveForecaster(target_compute=30000.0, n_boot=0)
  for c, row in zip(compute, rows):
    fc.update(c, row["val/pass_rate"], step=row["step"])
    fc.update_domains(c, row, step=row["step"])
  drawn, printed = [], []
  real = plot.plot_reports
  monkeypatch.setattr(plot, "plot_reports",
                      lambda reports, *a, **k: drawn.append(reports) or real(reports, *a, **k))
  ns = types.SimpleNamespace
  cfg = ns(run=ns(steps=rows[-1]["step"], seed=0),
           forecast=ns(plot=True, axis="hours", min_compute_hours=0.0,
                       target_compute_hours=30000.0,
                       n_boot=0))
  out = summary.finish(cfg, tmp_path, ns(reason="done", signal_name=None,
                                         step=rows[-1]["step"]),
                       fc, ns(compute_hours=compute[-1], sft_compute_hours=0.0, flops=1.0),
                       ns(print=printed.append))
  saved = json.loads((tmp_path / "summary.json").read_text())
  text = printed[-1]
  for domain, true in TRUE.items():
    f = saved["final_forecast_domains"][domain]
    assert abs(f["A"] - true.a) < 0.03 and f["R0"] == rows[0][f"val/{domain}/pass_rate"]
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  {domain}: A")]
    assert f"B={f['B']:.2f} C_mid={units.at(f['C_mid'], 'h')} R0=" in line, line  # hours axis
  assert out["forecast_plot"] == str(tmp_path / "forecast.png")
  (reports,) = drawn
  assert sorted(r.name for r in reports) == ["all domains", "code", "math"]


def test_several_runs_and_pooled_seeds_each_get_their_domains(tmp_path, capsys):
  paths = []
  for seed in (6, 7):
    run_dir = tmp_path / f"seed{seed}"
    run_dir.mkdir()
    paths.append(_write(run_dir / "metrics.jsonl", _domain_rows(seed=seed)[1]))
  d = json.loads(_fit(capsys, paths + ["--json", "--bootstrap", "0"]).out)
  assert [r["run"] for r in d["runs"]] == ["seed6", "seed7"]
  for r in d["runs"]:
    assert sorted(r["domains"]) == ["code", "math"]
    assert r["domains"]["math"]["run"] == f"{r['run']}/math"
    # Every domain forecasts at the runs' common target.
    assert r["domains"]["code"]["forecast"]["compute"] == r["forecast"]["compute"]
  d = json.loads(_fit(capsys, ["--group", f"both={paths[0]},{paths[1]}", "--json",
                               "--bootstrap", "0"]).out)
  for domain, true in TRUE.items():
    f = d["domains"][domain]
    assert f["file"] == ", ".join(paths)  # the seeds' evals of the domain, pooled
    assert f["n_points"] == 2 * N_EVALS and abs(f["A"] - true.a) < 0.03
