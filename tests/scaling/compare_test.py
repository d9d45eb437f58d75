"""Tests for the recipe comparison (shared-A refit, joint-bootstrap probabilities, pooling)."""

import dataclasses

import numpy as np
import pytest

from jaxrl_scale.scaling import compare
from jaxrl_scale.scaling import forecast
from jaxrl_scale.scaling import io
from jaxrl_scale.scaling import seeds
from jaxrl_scale.scaling import synthetic


def _curve(name, a, b, seed, c_mid=2542.0, budget=16_000.0, noise_sd=0.005):
  row = synthetic.Table1Row(name, c_mid=c_mid, b=b, a=a, budget=budget)
  compute, noisy, _ = synthetic.simulate_evals(row, seed=seed, noise_sd=noise_sd)
  return io.Curve(name=name, path=name, compute=compute, pass_rate=noisy,
                  line=np.arange(compute.size), r0=float(noisy[0]), is_start=compute == 0)


def _report(curve, n_boot=200, seed=0):
  return forecast.analyse(curve, forecast.AnalysisOptions(n_boot=n_boot, seed=seed))


def test_clearly_different_efficiency_names_the_winner_with_probabilities():
  # B's 1.6x apart or more: beyond one run's seed spread of B (10%) and the eval noise.
  runs = [_report(_curve("slow", 0.60, 0.8, 0), seed=1),
          _report(_curve("fast", 0.61, 2.2, 1), seed=2),
          _report(_curve("mid", 0.605, 1.3, 2), seed=3)]
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


def _seed_pair(row_a, row_b, i, sd=0.015, n_boot=200):
  """Two single runs whose true A's carry a per-seed training offset of sd `sd`."""
  offsets = np.random.default_rng(1000 + i).normal(0.0, sd, 2)
  reports = []
  for j, (row, off) in enumerate(zip((row_a, row_b), offsets)):
    shifted = row._replace(a=row.a + off)
    compute, noisy, _ = synthetic.simulate_evals(shifted, seed=10_000 * (j + 1) + i)
    curve = io.Curve(name=f"run{j}", path="<sim>", compute=compute, pass_rate=noisy,
                     line=np.arange(compute.size), r0=float(noisy[0]),
                     is_start=compute == 0)
    reports.append(forecast.analyse(curve, forecast.AnalysisOptions(
        min_compute=1500.0, n_boot=n_boot, seed=2 * i + j)))
  return compare.compare(reports, seed=i)


def test_a_difference_under_the_paper_margin_is_no_difference():
  # dA = 0.01 on quiet evals: the eval noise alone would make it "significant", but the
  # paper treats |dA| <= 0.02 as noise (seeds of one recipe differ that much).
  low = _report(_curve("low", 0.60, 1.92, 21, noise_sd=0.003), seed=1)
  high = _report(_curve("high", 0.61, 1.92, 22, noise_sd=0.003), seed=2)
  c = compare.compare([low, high], seed=0)
  assert abs(high.sigmoid.a - low.sigmoid.a) < 0.02
  assert c.higher_asymptote is None
  assert any("no difference in A" in m for m in c.messages), c.messages
  assert c.to_dict()["higher_asymptote"] is None


def test_seeds_of_one_recipe_with_training_noise_are_not_called_different():
  # Per-seed A offsets of sd 0.015 (paper App. A.5: +-0.015 over three runs). Today's
  # eval-noise-only probabilities call most such pairs different; the full calibration is
  # benchmarks/forecast/forecast_coverage.py section 4.
  row = synthetic.TABLE1[0]
  named = []
  for i in range(10):
    c = _seed_pair(row, row, i)
    named.append((c.most_efficient, c.higher_asymptote))
  false = [n for n in named if n != (None, None)]
  assert len(false) <= 1, named


def test_b_1p92_vs_1p09_is_still_found_with_seed_noise():
  # One run per recipe, seed spreads of A and B drawn in: the price is power (the benchmark
  # measures the rate), never the wrong winner.
  named = [_seed_pair(synthetic.TABLE1[0], synthetic.TABLE1[9], i).most_efficient
           for i in range(5)]
  assert named.count("run0") >= 3 and "run1" not in named, named


def test_comparison_seed_is_fresh_by_default_and_reproducible():
  runs = [_report(_curve("x", 0.60, 1.9, 31), seed=1),
          _report(_curve("y", 0.62, 1.9, 32), seed=2)]
  first, second = compare.compare(runs), compare.compare(runs)
  assert first.seed != second.seed
  # The draws follow the seed (two fresh calls may still round to equal probabilities, as CI
  # once saw: 0.3 / 0.7 both times, so those are not compared).
  assert (compare.compare(runs, seed=1).p_a_greater
          != compare.compare(runs, seed=2).p_a_greater)
  again = compare.compare(runs, seed=first.seed)
  assert again.p_a_greater == first.p_a_greater and again.p_b_greater == first.p_b_greater
  assert first.to_dict()["seed"] == first.seed


def test_group_between_seed_spread_widens_its_probabilities():
  row = synthetic.TABLE1[0]
  def group(name, offsets, seed):
    seeds = [_curve(f"{name}{k}", row.a + o, row.b, seed + k, noise_sd=0.005)
             for k, o in enumerate(offsets)]
    return _report(io.pool(seeds, name), seed=seed)
  tight = group("tight", (0.0, 0.0, 0.0), 40)
  loose = group("loose", (-0.04, 0.0, 0.04), 50)
  single = _report(_curve("single", row.a, row.b, 60, noise_sd=0.005), seed=3)
  c = compare.compare([tight, loose, single], seed=0)
  sv = {s.name: s for s in c.seed_variance}
  assert sv["tight"].n_seeds == 3 and sv["single"].n_seeds == 1
  assert sv["single"].source == "prior" and sv["loose"].source == "seeds"
  assert len(sv["loose"].a_per_seed) == 3
  assert np.std(sv["loose"].a_per_seed, ddof=1) > 0.03
  # The loose group's mean carries its measured spread; the tight one's the prior only.
  assert sv["loose"].a_sd > sv["tight"].a_sd
  assert sv["tight"].a_sd < sv["single"].a_sd
  d = c.to_dict()["seed_variance"]
  assert {e["run"] for e in d} == {"tight", "loose", "single"}


def test_one_run_each_gets_the_prior_seed_spread_of_b():
  # B 12% apart on quiet evals (sd 0.003): eval noise alone pins each B to ~2%, so without a
  # seed spread of B the faster run "wins"; seeds of one recipe differ by ~10% of B (the
  # paper's 8/16/24/32-generation runs), so this is no evidence of a better recipe.
  slow = _report(_curve("slow", 0.61, 1.92, 71, noise_sd=0.003), seed=1)
  fast = _report(_curve("fast", 0.61, 2.15, 72, noise_sd=0.003), seed=2)
  c = compare.compare([slow, fast], seed=0)
  assert 0.6 < c.p_b_greater[("fast", "slow")] < 0.98, c.p_b_greater
  assert c.most_efficient is None
  sv = {s.name: s for s in c.seed_variance}
  assert sv["fast"].b_sd == seeds.PRIOR_LOG_B_SD and sv["fast"].tau_b == seeds.PRIOR_LOG_B_SD
  d = {e["run"]: e for e in c.to_dict()["seed_variance"]}
  assert d["fast"]["added_sd_log_B"] == seeds.PRIOR_LOG_B_SD


def test_group_seed_spread_of_b_is_never_zero_and_grows_with_the_seeds():
  row = synthetic.TABLE1[0]
  def group(name, factors, seed):
    runs = [_curve(f"{name}{k}", row.a, row.b * f, seed + k, noise_sd=0.005)
            for k, f in enumerate(factors)]
    return _report(io.pool(runs, name), seed=seed)
  same = seeds.estimate(group("same", (1.0, 1.0, 1.0), 80))
  spread = seeds.estimate(group("spread", (0.7, 1.0, 1.4), 90))
  # Three seeds with one B: the moment estimate is ~0, the prior keeps tau_B at
  # sqrt(2 / 4) of its 0.10 (2 degrees of freedom against the group's 2).
  assert same.tau_b == pytest.approx(seeds.PRIOR_LOG_B_SD / np.sqrt(2), rel=0.15)
  assert same.b_sd == pytest.approx(same.tau_b / np.sqrt(3))
  # log B per seed spread by sd ~0.35: well above the prior.
  assert spread.tau_b > 0.2
  assert np.std(np.log(spread.b_per_seed), ddof=1) > 0.25
