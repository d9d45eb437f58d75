"""The embedded demo's recipe still learns: a shortened demo must rise on each of two seeds.

`jaxrl-scale train` with no config runs configs/cpu_tiny.yaml. This runs that exact recipe
(warm start included) for its first RL steps on two seeds and requires the validation pass
rate to rise by MARGIN above where the warm start left it. A change that stops the recipe
learning (a sign flip in the loss or the advantages, log-probs of another distribution than
the sampler's, a broken weight transfer to the sampler, a learning rate that no longer moves
the model) fails it.

Numbers behind the margin (benchmarks/demos/demo_seeds.py --seeds 0-9, 2 cores, evals at step 30):
the recipe (pipeline mode, constant learning rate 4e-4) rose 0.17-0.26 in 30 steps on every
seed; the earlier sync recipe (cosine from 1e-3) rose 0.15-0.28. The 2-layer recipe before
that rose 0.03-0.08 on seeds 0 and 2 (on the machine of an earlier session) and would fail
here. Eval noise on 512 prompts x 4 samples is about 0.02 per eval. Pipeline mode is not
deterministic (weight swaps land where the threads' timing puts them), so the margin leaves
room for that.
"""

import pathlib

import pytest

from jaxrl_scale import config
from jaxrl_scale import metrics
from jaxrl_scale.pipeline import wiring

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 30
MARGIN = 0.1


# Seed 1 is slow-only (41 s): the default run keeps one seed of the demo, inside 15 minutes.
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_shortened_demo_rises_above_its_warm_start(tmp_path, seed):
  run_dir = tmp_path / f"seed{seed}"
  cfg = config.load(ROOT / "configs" / "cpu_tiny.yaml", [
      f"run.seed={seed}", f"run.steps={STEPS}", f"run.output_dir={run_dir}",
      f"eval.every={STEPS}", "run.progress=false", "run.tensorboard=false",
      "checkpoint.every=0", "forecast.enabled=false"])
  outcome = wiring.train(cfg, run_dir)
  assert outcome.reason == "done" and outcome.step == STEPS
  rows = metrics.read_metrics(run_dir / "metrics.jsonl")
  evals = {r["step"]: r["val/pass_rate"] for r in rows if "val/pass_rate" in r}
  assert sorted(evals) == [0, STEPS]
  start, end = evals[0], evals[STEPS]
  print(f"seed {seed}: {start:.3f} -> {end:.3f} in {STEPS} steps")  # shown with pytest -s
  assert start <= 0.5, f"the warm start overshot: {start:.3f}"
  assert end >= start + MARGIN, f"seed {seed}: {start:.3f} -> {end:.3f} in {STEPS} steps"
  trained = [r for r in rows if "train/loss" in r]
  assert len(trained) == STEPS  # every step trained (none skipped for want of variance)
