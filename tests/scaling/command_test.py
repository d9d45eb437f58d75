"""Tests for `jaxrl-scale fit` through the real CLI entry point."""

import json

import pytest

from jaxrl_scale import cli
from jaxrl_scale.scaling import synthetic

BOOT = ["--bootstrap", "200"]


def _run_file(tmp_path, name, row=synthetic.TABLE1[0], seed=0):
  compute, noisy, _ = synthetic.make_curve(row, seed=seed)
  run_dir = tmp_path / name
  run_dir.mkdir()
  path = run_dir / "metrics.jsonl"
  synthetic.write_metrics_jsonl(str(path), compute, noisy)
  return str(path)


def _json(capsys, argv):
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  return json.loads(out)


def test_json_single_run_has_the_contract_keys(tmp_path, capsys):
  path = _run_file(tmp_path, "runA")
  d = _json(capsys, ["fit", path, "--target", "30000", "--json"] + BOOT)
  for key in ("A", "B", "C_mid", "R0"):
    assert isinstance(d[key], float)
  assert d["R0_source"] == "step0"
  assert d["run"] == "runA"
  assert d["forecast"]["compute"] == 30000.0
  assert 0.55 < d["forecast"]["pass_rate"] < 0.65
  lo, hi = d["forecast"]["interval"]
  assert lo <= d["forecast"]["pass_rate"] <= hi
  assert abs(d["A"] - 0.61) < 0.03
  assert d["A_paper_margin"] == 0.02
  assert d["well_determined"] is True


def test_json_options_backtest_target_rate_r0_min_compute(tmp_path, capsys):
  path = _run_file(tmp_path, "runA")
  d = _json(capsys, ["fit", path, "--json", "--backtest", "0.5", "--min-compute", "1500",
                     "--target-pass-rate", "0.58", "--r0", "0.4"] + BOOT)
  assert d["R0"] == 0.4 and d["R0_source"] == "given"
  assert d["fit_compute_range"][0] >= 1500
  assert d["fit_compute_range"][1] <= 8000
  compute, _, _ = synthetic.make_curve(synthetic.TABLE1[0])
  assert d["backtest"]["n_heldout"] == int((compute > 0.5 * compute.max()).sum())
  assert abs(d["backtest"]["final_forecast"] - d["backtest"]["final_actual"]) < 0.04
  assert d["compute_to_target"]["reachable"] is True
  assert 2000 < d["compute_to_target"]["compute"] < 16000


def test_several_runs_give_one_object_with_comparison_and_a_plot(tmp_path, capsys):
  # Same asymptote, different efficiency: the shared-A refit must rank the steeper first.
  fast = synthetic.Table1Row("fast", c_mid=2542, b=2.4, a=0.61, budget=16_000)
  slow = synthetic.Table1Row("slow", c_mid=2542, b=1.4, a=0.61, budget=16_000)
  a = _run_file(tmp_path, "fast", fast, seed=1)
  b = _run_file(tmp_path, "slow", slow, seed=2)
  png = tmp_path / "cmp.png"
  d = _json(capsys, ["fit", a, b, "--json", "--plot", str(png)] + BOOT)
  assert [r["run"] for r in d["runs"]] == ["fast", "slow"]
  assert d["runs"][0]["forecast"]["compute"] == d["runs"][1]["forecast"]["compute"]
  cmp = d["comparison"]
  assert cmp["ranking_by_B"] == ["fast", "slow"]
  assert cmp["A_within_paper_margin"] is True
  b_fast, b_slow = (f["B"] for f in cmp["shared_A_fits"])
  assert b_fast == pytest.approx(2.4, rel=0.15) and b_slow == pytest.approx(1.4, rel=0.15)
  assert cmp["shared_A"] == pytest.approx((d["runs"][0]["A"] + d["runs"][1]["A"]) / 2)
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert d["plot"] == str(png)


def test_human_output_and_plot(tmp_path, capsys):
  path = _run_file(tmp_path, "runA")
  png = tmp_path / "fit.png"
  assert cli.main(["fit", path, "--plot", str(png), "--backtest", "0.5"] + BOOT) == 0
  out = capsys.readouterr().out
  for text in ("runA", "A ", "C_mid", "power law", "forecast pass rate at C", "backtest",
               "paper's noise margin on A: +-0.02", f"plot written to {png}"):
    assert text in out
  assert png.stat().st_size > 10_000


def test_paper_grid_flag(tmp_path, capsys):
  path = _run_file(tmp_path, "runA")
  d = _json(capsys, ["fit", path, "--json", "--grid", "paper", "--bootstrap", "0"])
  assert abs(d["A"] - 0.61) < 0.03
  assert d["intervals"]["A"] is None and d["n_boot"] == 0


@pytest.mark.parametrize("argv, pattern", [
    (["--backtest", "1.5"], "--fit-fraction must be in (0, 1)"),
    (["--fit-fraction", "0"], "--fit-fraction must be in (0, 1)"),
    (["--eval-size", "1000y16"], "--eval-size must look like 1000x16"),
    (["--eval-size", "0x16"], "--eval-size must look like 1000x16"),
    (["--group", "nofiles="], "--group must look like NAME=FILE1,FILE2"),
    (["--r0", "2"], "--r0 must be in [0, 1]"),
    (["--level", "1"], "--level must be in (0, 1)"),
    (["--target", "-1"], "--target must be > 0"),
    (["--min-compute", "1e9"], "usable eval points"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, argv, pattern):
  path = _run_file(tmp_path, "runA")
  assert cli.main(["fit", path, "--bootstrap", "0"] + argv) == 2
  err = capsys.readouterr().err
  assert pattern in err
  assert err.startswith("jaxrl-scale fit: error:") and err.count("\n") == 1


def test_bad_file_exit_2_naming_the_row(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "compute_hours": 0, "val/pass_rate": 0.4}\n'
                  '{"step": 1, "compute_hours": 1, "val/pass_rate": NaN}\n')
  assert cli.main(["fit", str(path)]) == 2
  err = capsys.readouterr().err
  assert f"{path}:2: column 'val/pass_rate' is nan" in err
  assert err.count("\n") == 1


def test_group_pools_seeds_into_one_fit_and_eval_size_weights(tmp_path, capsys):
  seeds = [_run_file(tmp_path, f"seed{i}", seed=10 + i) for i in range(3)]
  other = _run_file(tmp_path, "other", synthetic.TABLE1[9], seed=20)
  d = _json(capsys, ["fit", other, "--group", "recipe=" + ",".join(seeds), "--json",
                     "--eval-size", "1000x16"] + BOOT)
  runs = {r["run"]: r for r in d["runs"]}
  assert set(runs) == {"other", "recipe"}
  assert runs["recipe"]["n_points"] == 3 * runs["other"]["n_points"]
  assert runs["recipe"]["noise"]["eval_size_known"] is True
  assert runs["recipe"]["noise"]["R0_sd"] > 0
  cmp = d["comparison"]
  assert {(p["run"], p["other"]) for p in cmp["P_B_greater"]} == {("other", "recipe"),
                                                                  ("recipe", "other")}
  # ScaleRL (B 1.92) against the code curve (B 1.09): a clear, significant winner.
  assert cmp["most_efficient"] == "recipe"


def test_default_seed_varies_is_reported_and_reproduces(tmp_path, capsys):
  path = _run_file(tmp_path, "runA")
  one = _json(capsys, ["fit", path, "--json"] + BOOT)
  two = _json(capsys, ["fit", path, "--json"] + BOOT)
  assert isinstance(one["seed"], int) and one["seed"] != two["seed"]
  assert one["intervals"] != two["intervals"]
  again = _json(capsys, ["fit", path, "--json", "--seed", str(one["seed"])] + BOOT)
  assert again["intervals"] == one["intervals"] and again["seed"] == one["seed"]
  assert cli.main(["fit", path, "--seed", "7"] + BOOT) == 0
  assert "--seed 7" in capsys.readouterr().out


def test_comparison_says_where_seed_variance_comes_from(tmp_path, capsys):
  a = _run_file(tmp_path, "a", seed=1)
  b = _run_file(tmp_path, "b", seed=2)
  seeds = [_run_file(tmp_path, f"s{i}", seed=30 + i) for i in range(3)]
  argv = ["fit", a, b, "--group", "g=" + ",".join(seeds), "--seed", "3"] + BOOT
  d = _json(capsys, argv + ["--json"])
  sv = {e["run"]: e for e in d["comparison"]["seed_variance"]}
  assert sv["a"]["source"] == "prior" and sv["a"]["n_seeds"] == 1
  assert sv["g"]["source"] == "seeds" and len(sv["g"]["A_per_seed"]) == 3
  assert d["comparison"]["seed"] == d["seed"] + 7919 * 3
  assert cli.main(argv) == 0
  out = capsys.readouterr().out
  assert "one run: prior seed sd of A 0.02" in out
  assert "of B 10% (the paper's runs of one recipe)" in out
