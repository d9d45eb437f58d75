"""End-to-end runs of `jaxrl-scale train` on a tiny config: every mode, colocated roles, the
progress and forecast lines, the SFT warm start's stop, non-finite steps.

Resume and checkpoints: tests/train_resume_test.py; SIGTERM at any moment:
tests/train_preempt_test.py. All three share tests/train_setup.py and one persistent
compilation cache (the shapes are the same in every test), so only the first run of the
session pays for XLA compiles.
"""

import json

import jax
import numpy as np
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import wiring
from jaxrl_scale.rl import train_step
from tests.train_setup import compile_cache, task_file  # noqa: F401 (fixtures)
from tests.train_setup import check_stream, final_params, read_rows, run_cfg


# colocated is slow-only (15 s): tests/pipeline/overlap_test.py runs colocated weights in the
# default run; the other three modes stay.
@pytest.mark.parametrize("mode", ["sync", "pipeline", "ppo_offpolicy",
                                  pytest.param("colocated", marks=pytest.mark.slow)])
def test_each_mode_runs_end_to_end(task_file, tmp_path, mode, monkeypatch):
  cfg = run_cfg(task_file, tmp_path / mode, f"pipeline.mode={mode}")
  built = []  # eval, SFT dev checks and rollouts share the process's one Sampler
  init = engine.Sampler.__init__
  monkeypatch.setattr(engine.Sampler, "__init__",
                      lambda self, *a, **k: (built.append(self), init(self, *a, **k))[1])
  outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "done" and outcome.step == 4
  assert len(built) == 1
  rows = read_rows(cfg.run.output_dir)
  check_stream(rows, 4, k=2)
  if mode == "ppo_offpolicy":  # one round of k = 2 mini-batches per policy
    assert [r["staleness/max"] for r in rows[1:]] == [0.0, 1.0, 0.0, 1.0]
  if mode == "sync":
    assert all(r["staleness/max"] == 0 for r in rows[1:])
  summary = json.loads((tmp_path / mode / "summary.json").read_text())
  assert summary["steps"] == 4 and summary["final_pass_rate"] == rows[-1]["val/pass_rate"]
  assert (tmp_path / mode / "config.yaml").exists()
  with checkpoint.Checkpointer(tmp_path / mode / "checkpoints") as ckpt:
    assert ckpt.all_steps() == [0, 2, 4]


# pipeline is slow-only (18 s): tests/pipeline/overlap_test.py covers colocated donation
# with the pipeline's overlap in the default run.
@pytest.mark.parametrize("mode", [pytest.param("pipeline", marks=pytest.mark.slow), "sync",
                                  "ppo_offpolicy"])
def test_colocated_roles_never_decode_with_donated_buffers(task_file, tmp_path, mode,
                                                           monkeypatch):
  # One device set for both roles: the sampler's weights must be its own copy, not the
  # buffers the next train step donates (that was a segfault in pipeline mode).
  cfg = run_cfg(task_file, tmp_path / mode, f"pipeline.mode={mode}", "mesh.colocated=true",
             "rl.zero_variance_filter=false", "eval.every=2", "checkpoint.every=0")
  # sampler.sleep_while_training (the default): every RL step of the sync modes runs while
  # the sampler has freed its memory (pipeline mode overlaps them, so it never sleeps); the
  # evals between steps wake it with the weights just posted.
  samplers, asleep = [], []
  init, step = engine.Sampler.__init__, train_step.Trainer.step
  monkeypatch.setattr(engine.Sampler, "__init__",
                      lambda self, *a, **k: (samplers.append(self), init(self, *a, **k))[1])
  monkeypatch.setattr(train_step.Trainer, "step",
                      lambda self, *a, **k: (asleep.append(samplers[0].asleep),
                                             step(self, *a, **k))[1])
  outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "done" and outcome.step == 4
  rows = read_rows(cfg.run.output_dir)
  assert all("train/loss" in r for r in rows[1:])  # every step trained (and donated)
  # 15 SFT steps (the warm start frees the sampler in every mode), then the 4 RL steps.
  assert asleep == [True] * 15 + [mode != "pipeline"] * 4
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)


def test_forecast_lines_follow_their_step_line(task_file, tmp_path):
  import io
  cfg = run_cfg(task_file, tmp_path / "run", "run.progress=true", "forecast.enabled=true",
             "checkpoint.every=0", "optim.schedule=cosine", "optim.decay_steps=8", steps=8)
  out = io.StringIO()
  wiring.train(cfg, cfg.run.output_dir, stream=out)
  lines = out.getvalue().splitlines()
  # A decaying learning rate is named next to the forecast it biases.
  assert any("optim.schedule=cosine decays the learning rate" in line for line in lines)
  forecasts = [i for i, line in enumerate(lines) if line.startswith("  forecast:")]
  assert forecasts, out.getvalue()
  rows = {r["step"]: r for r in read_rows(tmp_path / "run")}
  for i in forecasts:  # the line above is the step the forecast was fitted at
    step = int(lines[i - 1].split()[1].split("/")[0])
    assert f"A={rows[step]['forecast/A']:.3f}" in lines[i] or (
        f"A~{rows[step]['forecast/A']:.2f}?" in lines[i]), (lines[i - 1], lines[i])


@pytest.mark.parametrize("mode", ["sync", "pipeline"])
def test_a_long_eval_prints_its_progress_before_its_step_line(task_file, tmp_path, monkeypatch,
                                                              mode):
  import functools
  import io
  from jaxrl_scale.pipeline import progress as progress_lib
  # Every eval counts as long here: a line at each completion the sampler reports.
  monkeypatch.setattr(progress_lib, "eval_progress", functools.partial(
      progress_lib.eval_progress, first_s=0.0, every_s=0.0))
  cfg = run_cfg(task_file, tmp_path / "run", "run.progress=true", "checkpoint.every=0",
             f"pipeline.mode={mode}", "sft.steps=0", steps=2)
  out = io.StringIO()
  wiring.train(cfg, cfg.run.output_dir, stream=out)
  lines = out.getvalue().splitlines()
  # eval.every=2: 8 validation prompts x 2 samples each. Pipelined, step 2's eval goes
  # through the running generator, which reports every 50 ms: it ends sooner here (tested
  # in tests/pipeline/generator_eval_test.py); step 0's runs before the generator starts.
  for step in (0, 2) if mode == "sync" else (0,):
    reports = [i for i, line in enumerate(lines)
               if line.startswith(f"  eval of step {step}: ") and "/16 samples (" in line]
    assert reports, out.getvalue()
    row = next(i for i, line in enumerate(lines) if line.startswith(f"step {step}/2 |"))
    assert max(reports) < row, out.getvalue()


def test_steps_without_a_reward_signal_say_so_once(task_file, tmp_path):
  import io
  # Equal rewards for right and wrong: every group has zero variance, so no step trains.
  cfg = run_cfg(task_file, tmp_path / "run", "run.progress=true", "checkpoint.every=0",
                "eval.every=0", "sft.steps=0", "rl.reward_correct=0", "rl.reward_incorrect=0",
                steps=4)
  out = io.StringIO()
  wiring.train(cfg, cfg.run.output_dir, stream=out)
  rows = read_rows(cfg.run.output_dir)
  assert [r.get("train/skipped_no_signal") for r in rows if r["step"] > 0] == [1.0] * 4
  notes = [line for line in out.getvalue().splitlines() if "trained nothing" in line]
  last = rows[3]  # step 3's counts are the note's
  assert notes == [
      f"  note: steps 1-3 trained nothing: every prompt's 4 rewards were equal (step 3: "
      f"{int(last['rollout/num_all_wrong'])} prompts all wrong, "
      f"{int(last['rollout/num_all_correct'])} all right), so no sample had an advantage; "
      + ("a policy that never scores needs a warm start (sft.steps) or easier prompts"
         if last["rollout/num_all_wrong"] >= last["rollout/num_all_correct"] else
         "a policy that always scores needs harder prompts")], out.getvalue()


@pytest.mark.parametrize("target,near_every,checked", [
    # Checked after steps 2 and 4 (every 2), then after every step once 0.2 >= 0.3 / 2: the
    # check after step 5 reaches the target and stops the warm start there.
    (0.3, 1, {2: 0.1, 4: 0.2, 5: 0.3}),
    # Past half of 0.4 after step 4, then every 3 steps: 6 and 9, which reaches it.
    (0.4, 3, {2: 0.1, 4: 0.2, 6: 0.3, 9: 0.4}),
])
def test_sft_stops_at_the_dev_pass_rate_target(task_file, tmp_path, monkeypatch, target,
                                                near_every, checked):
  from jaxrl_scale import eval as eval_lib
  checks = []

  def fake_run(self, params=None, version=None):
    checks.append(version)
    return {"val/pass_rate": 0.1 * len(checks)}  # 0.1, 0.2, 0.3, ...

  real_init = eval_lib.Evaluator.__init__
  dev_sizes = []

  def capture(self, sampler, prompts, *args, **kwargs):
    dev_sizes.append(len(prompts))
    real_init(self, sampler, prompts, *args, **kwargs)

  monkeypatch.setattr(eval_lib.Evaluator, "__init__", capture)
  monkeypatch.setattr(eval_lib.Evaluator, "run", fake_run)
  cfg = run_cfg(task_file, tmp_path / "run", f"run.sft_stop_pass_rate={target}",
             "run.sft_dev_prompts=8", "run.sft_check_every=2",
             f"run.sft_check_every_near={near_every}", "eval.every=0", steps=1)
  wiring.train(cfg, cfg.run.output_dir)
  sft_rows = [json.loads(line) for line in (tmp_path / "run" / "sft.jsonl").read_text().splitlines()]
  assert len(checks) == len(checked) and len(sft_rows) == max(checked)
  rates = {i + 1: r["dev/pass_rate"] for i, r in enumerate(sft_rows) if "dev/pass_rate" in r}
  assert rates == pytest.approx(checked)
  assert dev_sizes[0] == 8  # the warm start's dev prompts (eval is off)


def test_sft_dev_prompts_must_leave_training_examples(task_file, tmp_path):
  cfg = run_cfg(task_file, tmp_path / "run", "run.sft_stop_pass_rate=0.5",
             "run.sft_dev_prompts=500", steps=1)
  with pytest.raises(UserError, match="run.sft_dev_prompts"):
    wiring.train(cfg, cfg.run.output_dir)


@pytest.mark.parametrize("override, key", [
    ("rl.loss=cipso", "rl.loss: unknown loss 'cipso'"),
    ("rl.aggregation=prompt", "rl.aggregation: unknown aggregation"),
    ("rl.advantage_norm=group", "rl.advantage_norm: unknown advantage normalization"),
    ("rl.loss=grpo rl.clip_low=-1", "rl.clip_low")])
def test_a_bad_objective_stops_before_the_run_writes_or_trains(task_file, tmp_path, override,
                                                               key, monkeypatch):
  # Read first by the trainer after the warm start (and the first batch): the run must
  # stop before either, and before it makes its directory.
  monkeypatch.setattr(wiring.warm_start, "run", lambda *a, **k: pytest.fail("warm start ran"))
  run = tmp_path / "run"
  cfg = run_cfg(task_file, run, *override.split(), steps=1)
  with pytest.raises(UserError, match=key):
    wiring.train(cfg, cfg.run.output_dir)
  assert not run.exists()


def test_a_run_directory_that_is_a_file_stops_with_one_line(task_file, tmp_path):
  run = tmp_path / "run"
  run.write_text("mine")
  cfg = run_cfg(task_file, run, steps=1)
  with pytest.raises(UserError, match=f"run directory {run}: cannot create it"):
    wiring.train(cfg, cfg.run.output_dir)
  assert run.read_text() == "mine"


def test_a_missing_downstream_file_stops_before_the_warm_start(task_file, tmp_path,
                                                               monkeypatch):
  monkeypatch.setattr(wiring.warm_start, "run", lambda *a, **k: pytest.fail("warm start ran"))
  cfg = run_cfg(task_file, tmp_path / "run", f"eval.downstream=[{tmp_path / 'gone.jsonl'}]",
                "eval.every=1", "eval.downstream_every=1", steps=1)
  with pytest.raises(UserError, match="eval.downstream': .*gone.jsonl: no such file"):
    wiring.train(cfg, cfg.run.output_dir)


def test_nonfinite_steps_are_skipped_then_abort(task_file, tmp_path, monkeypatch):
  real = rollouts.build_batch

  def poisoned(groups, rl, shape, **kwargs):
    batch, stats, keep = real(groups, rl, shape, **kwargs)
    # NaN advantages: a NaN generator log-prob no longer reaches the loss (its token is
    # left out, and build_batch drops its group), so poison what the loss does multiply.
    bad = batch.advantages_PG.copy()
    bad[:] = np.nan
    import dataclasses
    return dataclasses.replace(batch, advantages_PG=bad), stats, keep

  monkeypatch.setattr(rollouts, "build_batch", poisoned)
  cfg = run_cfg(task_file, tmp_path / "run", "optim.max_nonfinite_steps=2", steps=4)
  with pytest.raises(loop_lib.TrainingAborted, match="NaN/inf for 2 steps in a row"):
    wiring.train(cfg, cfg.run.output_dir)
  rows = read_rows(tmp_path / "run")
  assert [r.get("train/nonfinite") for r in rows[1:]] == [1.0, 1.0]
  step, params = final_params(tmp_path / "run")
  assert step == 0  # the only checkpoint, written before RL, is intact and finite
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
