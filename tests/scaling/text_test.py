"""Tests for the human-readable number formatting of `jaxrl-scale fit`."""

import math
import re

from jaxrl_scale.scaling import text


def test_span_and_table():
  assert text.span(None) == ""
  assert text.span((0.5, math.inf)) == "[0.500, never]"
  out = text.table([["a", "bb"], ["ccc", "d"]])
  assert out.splitlines() == ["  a    bb", "  ccc  d"]


def _report(tmp_path, capsys, column, *extra):
  """`jaxrl-scale fit` on a simulated run whose compute sits in `column`."""
  import json

  from jaxrl_scale import cli
  from jaxrl_scale.scaling import synthetic

  compute, noisy, _ = synthetic.simulate_evals(synthetic.TABLE1[0], n_evals=80, seed=3)
  paths = []
  for i in range(1 + ("--compare" in extra)):
    path = tmp_path / f"run{i}" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    synthetic.write_metrics_jsonl(str(path), compute, noisy)
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({column: r.pop("compute_hours"), **r}) + "\n"
                            for r in rows))
    paths.append(str(path))
  args = [a for a in extra if a != "--compare"]
  assert cli.main(["fit", *paths, "--x", column, "--bootstrap", "40", "--seed", "0",
                   *args]) == 0
  return capsys.readouterr().out


# A compute as the report prints it: 1.66e+11, 2542, 0.0592 (never a bare exponent or rate).
_COMPUTE = r"(?:\d+(?:\.\d+)?e[+-]\d+|\d+(?:\.\d+)?)"


def test_every_compute_in_the_fit_report_carries_its_unit(tmp_path, capsys):
  # Issue 67 item 7: `C_mid` and "at 0.322" read as bare numbers; a compute names its unit
  # (the --x column's: FLOPs, accelerator-hours, else the column), a pass rate says so.
  for column, unit in (("flops", "FLOPs"), ("compute_hours", "h"), ("gpu_hours", "(gpu_hours)")):
    out = _report(tmp_path / column, capsys, column, "--fit-fraction", "0.5",
                  "--target-pass-rate", "0.55")
    u = re.escape(unit)
    checks = {
        "fitted": rf"compute {_COMPUTE} \.\. {_COMPUTE} {u}; pass rate R0 = ",
        "C_mid": rf"^  C_mid \({u}\) ",
        "forecast": rf"forecast pass rate at C = {_COMPUTE} {u} .*\(95% interval \[",
        "to reach": rf"compute to reach pass rate 0\.550: (?:{_COMPUTE} {u}|never)",
        "backtest": rf"fit on compute <= {_COMPUTE} {u},",
        "final point": rf"final point C = {_COMPUTE} {u}: pass rate ",
        "extrapolation": r"pass-rate sd \d\.\d+ per unit of ln\(compute\).* in ln\(compute\) \(x",
    }
    missing = [k for k, pattern in checks.items() if not re.search(pattern, out, re.M)]
    assert not missing, f"--x {column}: no unit on {missing} in\n{out}"
  out = _report(tmp_path / "two", capsys, "flops", "--compare")
  assert re.search(rf"C_mid \(FLOPs\) +pass rate at {_COMPUTE} FLOPs", out), out
  assert re.search(r"B interval +C_mid \(FLOPs\)", out), out
