"""End-to-end runs of `jaxrl-scale train` on a tiny config: every mode, resume after SIGTERM
and SIGKILL, a corrupt latest checkpoint, non-finite steps, the CLI.

The runs share one persistent compilation cache (the shapes are the same in every test),
so only the first run of the session pays for XLA compiles.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale import config
from jaxrl_scale import metrics
from jaxrl_scale import train
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import wiring
from jaxrl_scale.rl import train_step

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _write_task(path: pathlib.Path) -> None:
  """Prompts 'N:' whose answer is N mod 2: a few SFT steps give a policy that is right about
  half the time, so every group has reward variance and every step trains."""
  with open(path, "w") as f:
    for i in range(80):
      a = str(i % 2)
      f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a}) + "\n")


def tiny_overrides(data: pathlib.Path, steps: int = 4) -> list[str]:
  return [
      f"run.steps={steps}", "run.tensorboard=false", "run.progress=false",
      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
      f"data.source={data}", "data.task=arithmetic", "data.id_field=id",
      "data.solution_field=solution", "data.num_validation=8", "data.max_prompt_tokens=8",
      "sft.steps=15", "sft.lr=1e-2", "sft.batch_size=16", "run.sft_stop_pass_rate=null",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=4",
      "sampler.decode_chunk=4", "sampler.prompt_buckets=[8]",
      "eval.every=2", "eval.samples_per_prompt=2", "checkpoint.every=2",
      "checkpoint.async_save=false", "forecast.n_boot=0", "pipeline.max_staleness=2",
      "pipeline.mode=sync",  # the demo's mode is pipeline; tests name the mode they need
  ]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "parity.jsonl"
  _write_task(path)
  return path


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
  cache = str(tmp_path_factory.mktemp("jax_cache"))
  old = (jax.config.jax_compilation_cache_dir,
         jax.config.jax_persistent_cache_min_compile_time_secs)
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  yield cache
  jax.config.update("jax_compilation_cache_dir", old[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])


def _cfg(task_file, run_dir, *extra, steps=4):
  return config.load(ROOT / "configs" / "cpu_tiny.yaml",
                     tiny_overrides(task_file, steps) + [f"run.output_dir={run_dir}", *extra])


def _rows(run_dir):
  return metrics.read_metrics(pathlib.Path(run_dir) / "metrics.jsonl")


def _final_params(run_dir):
  """The params of a run's newest checkpoint as host arrays."""
  with checkpoint.Checkpointer(pathlib.Path(run_dir) / "checkpoints") as ckpt:
    step = ckpt.latest_step()
    return step, ckpt.read_arrays(step)


def _check_stream(rows, steps, k):
  assert [r["step"] for r in rows] == list(range(steps + 1))
  hours = [r["compute_hours"] for r in rows]
  assert all(b >= a for a, b in zip(hours, hours[1:]))
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)
  trained = [r for r in rows[1:] if "train/loss" in r]
  assert trained, "no step trained"
  assert all(r["staleness/max"] <= k for r in rows[1:])
  assert all(r["flops"] > 0 for r in rows[1:])


# colocated is slow-only (15 s): tests/pipeline/overlap_test.py runs colocated weights in the
# default run; the other three modes stay.
@pytest.mark.parametrize("mode", ["sync", "pipeline", "ppo_offpolicy",
                                  pytest.param("colocated", marks=pytest.mark.slow)])
def test_each_mode_runs_end_to_end(task_file, tmp_path, mode, monkeypatch):
  cfg = _cfg(task_file, tmp_path / mode, f"pipeline.mode={mode}")
  built = []  # eval, SFT dev checks and rollouts share the process's one Sampler
  init = engine.Sampler.__init__
  monkeypatch.setattr(engine.Sampler, "__init__",
                      lambda self, *a, **k: (built.append(self), init(self, *a, **k))[1])
  outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "done" and outcome.step == 4
  assert len(built) == 1
  rows = _rows(cfg.run.output_dir)
  _check_stream(rows, 4, k=2)
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
  cfg = _cfg(task_file, tmp_path / mode, f"pipeline.mode={mode}", "mesh.colocated=true",
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
  rows = _rows(cfg.run.output_dir)
  assert all("train/loss" in r for r in rows[1:])  # every step trained (and donated)
  # 15 SFT steps (the warm start frees the sampler in every mode), then the 4 RL steps.
  assert asleep == [True] * 15 + [mode != "pipeline"] * 4
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)


def test_forecast_lines_follow_their_step_line(task_file, tmp_path):
  import io
  cfg = _cfg(task_file, tmp_path / "run", "run.progress=true", "forecast.enabled=true",
             "checkpoint.every=0", "optim.schedule=cosine", "optim.decay_steps=8", steps=8)
  out = io.StringIO()
  wiring.train(cfg, cfg.run.output_dir, stream=out)
  lines = out.getvalue().splitlines()
  # A decaying learning rate is named next to the forecast it biases.
  assert any("optim.schedule=cosine decays the learning rate" in line for line in lines)
  forecasts = [i for i, line in enumerate(lines) if line.startswith("  forecast:")]
  assert forecasts, out.getvalue()
  rows = {r["step"]: r for r in _rows(tmp_path / "run")}
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
  cfg = _cfg(task_file, tmp_path / "run", "run.progress=true", "checkpoint.every=0",
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


def test_sft_stops_at_the_dev_pass_rate_target(task_file, tmp_path, monkeypatch):
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
  cfg = _cfg(task_file, tmp_path / "run", "run.sft_stop_pass_rate=0.3", "run.sft_dev_prompts=8",
             "run.sft_check_every=2", "eval.every=0", steps=1)
  wiring.train(cfg, cfg.run.output_dir)
  sft_rows = [json.loads(line) for line in (tmp_path / "run" / "sft.jsonl").read_text().splitlines()]
  # Checked after steps 2 and 4 (every 2), then after every step once 0.2 >= 0.3 / 2: the
  # check after step 5 reaches the target and stops the warm start there.
  assert len(checks) == 3 and len(sft_rows) == 5
  rates = {i + 1: r["dev/pass_rate"] for i, r in enumerate(sft_rows) if "dev/pass_rate" in r}
  assert rates == pytest.approx({2: 0.1, 4: 0.2, 5: 0.3})
  assert dev_sizes[0] == 8  # the warm start's dev prompts (eval is off)


def test_sft_dev_prompts_must_leave_training_examples(task_file, tmp_path):
  cfg = _cfg(task_file, tmp_path / "run", "run.sft_stop_pass_rate=0.5",
             "run.sft_dev_prompts=500", steps=1)
  with pytest.raises(UserError, match="run.sft_dev_prompts"):
    wiring.train(cfg, cfg.run.output_dir)


def test_stop_request_saves_and_resume_continues_without_gaps(task_file, tmp_path):
  cfg = _cfg(task_file, tmp_path / "run", steps=5)

  def stop_at_3(step, row):
    if step == 3:
      loop.request_stop(signal.SIGTERM)

  loop = None
  original = loop_lib.Loop.__init__

  def capture(self, *args, **kwargs):
    nonlocal loop
    original(self, *args, **kwargs)
    loop = self

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop_lib.Loop, "__init__", capture)
    outcome = wiring.train(cfg, cfg.run.output_dir, on_step=stop_at_3)
  assert outcome.reason == "signal" and outcome.step == 3
  with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
    assert ckpt.latest_step() == 3
  outcome = wiring.train(cfg, cfg.run.output_dir, resume=True)
  assert outcome.reason == "done" and outcome.step == 5
  _check_stream(_rows(cfg.run.output_dir), 5, k=2)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(task_file, tmp_path):
  cfg = _cfg(task_file, tmp_path / "run", steps=4)
  wiring.train(cfg, cfg.run.output_dir)
  state_dir = tmp_path / "run" / "checkpoints" / "4" / "state"
  for p in state_dir.iterdir():  # damage step 4's arrays
    if p.is_dir():
      shutil.rmtree(p)
    else:
      p.write_bytes(b"garbage")
  longer = _cfg(task_file, tmp_path / "run", steps=6)
  with pytest.warns(UserWarning, match="step 4 .* unreadable"):
    outcome = wiring.train(longer, longer.run.output_dir, resume=True)
  assert outcome.step == 6
  rows = _rows(tmp_path / "run")
  _check_stream(rows, 6, k=2)  # steps 3 and 4 were redone, not duplicated


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
  cfg = _cfg(task_file, tmp_path / "run", "optim.max_nonfinite_steps=2", steps=4)
  with pytest.raises(loop_lib.TrainingAborted, match="NaN/inf for 2 steps in a row"):
    wiring.train(cfg, cfg.run.output_dir)
  rows = _rows(tmp_path / "run")
  assert [r.get("train/nonfinite") for r in rows[1:]] == [1.0, 1.0]
  step, params = _final_params(tmp_path / "run")
  assert step == 0  # the only checkpoint, written before RL, is intact and finite
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_cli_resume_without_checkpoint_is_a_user_error(tmp_path):
  parser = __import__("argparse").ArgumentParser()
  train.add_arguments(parser)
  args = parser.parse_args([str(ROOT / "configs" / "cpu_tiny.yaml"), "run.steps=1",
                            "--resume", "--output-dir", str(tmp_path / "none")])
  with pytest.raises(UserError, match="--resume: no checkpoint"):
    train.run(args)
  assert args.resume and args.output_dir == str(tmp_path / "none")


# ---- subprocesses: real signals ------------------------------------------------------------


def _launch(task_file, run_dir, cache, *extra, steps):
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("XLA_FLAGS", None)  # the command simulates its own devices
  cmd = [sys.executable, "-m", "jaxrl_scale.train", str(ROOT / "configs" / "cpu_tiny.yaml"),
         *tiny_overrides(task_file, steps), "run.progress=true", *extra,
         "--output-dir", str(run_dir)]
  return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _wait_for_step(run_dir, step, proc, timeout=300):
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise AssertionError(f"run exited early:\n{proc.stdout.read()}")
    if path.exists() and any(json.loads(line).get("step") == step
                             for line in path.read_text().splitlines() if line.endswith("}")):
      return
    time.sleep(0.05)
  raise AssertionError(f"step {step} not reached in {timeout}s")


def _finish(proc, timeout=300):
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


class _Output:
  """Reads a launched run's output in a thread, so a test can wait for a line meanwhile."""

  def __init__(self, proc):
    self.proc, self.lines = proc, []
    self._reader = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
    self._reader.start()

  def wait_for(self, text, timeout):
    deadline = time.monotonic() + timeout
    while not any(text in line for line in list(self.lines)):
      if not self._reader.is_alive():
        raise AssertionError(f"the run ended before printing {text!r}:\n{''.join(self.lines)}")
      if time.monotonic() > deadline:
        raise AssertionError(f"no {text!r} in {timeout}s:\n{''.join(self.lines)}")
      time.sleep(0.05)

  def finish(self, timeout=300):
    self.proc.wait(timeout=timeout)
    self._reader.join(timeout=timeout)
    return self.proc.returncode, "".join(self.lines)


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(task_file, tmp_path, compile_cache):
  proc = _launch(task_file, tmp_path / "run", compile_cache, "checkpoint.every=0", steps=30)
  _wait_for_step(tmp_path / "run", 2, proc)
  proc.send_signal(signal.SIGTERM)
  code, out = _finish(proc)
  assert code == 0, out
  assert "stopped by SIGTERM" in out
  step = json.loads((tmp_path / "run" / "summary.json").read_text())["steps"]
  with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
    assert ckpt.latest_step() == step  # saved on the signal, not on a schedule
  # Steps take a fraction of a second here, so the signal may land in an eval (every 2
  # steps): that step's row then waits in the checkpoint (redone on resume), and only then.
  pending = f"the eval of step {step} was interrupted" in out
  assert [r["step"] for r in _rows(tmp_path / "run")] == list(range(step + 1 - pending)), out


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_uninterrupted_params(task_file, tmp_path,
                                                               compile_cache):
  steps = 8
  ref = _launch(task_file, tmp_path / "ref", compile_cache, steps=steps)
  code, out = _finish(ref)
  assert code == 0, out
  killed = _launch(task_file, tmp_path / "run", compile_cache, steps=steps)
  _wait_for_step(tmp_path / "run", 5, killed)  # checkpoints at 2 and 4; step 5 is lost
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = _launch(task_file, tmp_path / "run", compile_cache, steps=steps)
  code, out = _finish(resumed)
  assert code == 0, out
  assert "resumed from checkpoint step 4" in out
  ref_step, ref_params = _final_params(tmp_path / "ref")
  run_step, run_params = _final_params(tmp_path / "run")
  assert ref_step == run_step == steps
  jax.tree.map(np.testing.assert_array_equal, run_params, ref_params)
  ref_rows, run_rows = _rows(tmp_path / "ref"), _rows(tmp_path / "run")
  assert [r["step"] for r in run_rows] == list(range(steps + 1))
  for a, b in zip(ref_rows, run_rows):  # the same losses, step by step
    assert a.get("train/loss") == b.get("train/loss")
    assert a.get("rollout/group_ids") == b.get("rollout/group_ids")


@pytest.mark.slow
@pytest.mark.parametrize("mode, kill_at", [("pipeline", 5), ("pipeline", 3),
                                           ("ppo_offpolicy", 5)])
def test_sigkill_then_resume_trains_every_group_exactly_once(task_file, tmp_path,
                                                             compile_cache, mode, kill_at):
  # The uninterrupted run trains groups 0 .. steps * P - 1, P per step in admission order
  # (checked by the kill-free check below on the resumed run's rows); a kill loses the steps
  # after the last checkpoint (every 2 steps), and the restart trains exactly those groups.
  steps, p = 8, 4
  killed = _launch(task_file, tmp_path / "run", compile_cache, f"pipeline.mode={mode}",
                   steps=steps)
  _wait_for_step(tmp_path / "run", kill_at, killed)
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = _launch(task_file, tmp_path / "run", compile_cache, f"pipeline.mode={mode}",
                    steps=steps)
  code, out = _finish(resumed)
  assert code == 0, out
  assert f"resumed from checkpoint step {kill_at - kill_at % 2}" in out
  rows = _rows(tmp_path / "run")
  assert [r["step"] for r in rows] == list(range(steps + 1))
  trained = [i for r in rows[1:] for i in r["rollout/group_ids"]]
  assert sorted(trained) == list(range(steps * p))  # none twice, none lost
  assert all(r.get("pipeline/dropped_stale", 0.0) == 0.0 for r in rows[1:])
  assert all(r["staleness/max"] <= 2 for r in rows[1:])
  # The compute axis continues from the checkpoint: the restart's set-up is not in it.
  hours = [r["compute_hours"] for r in rows]
  assert all(b >= a for a, b in zip(hours, hours[1:]))


# ---- preemption: SIGTERM at any moment (in-process, real signals) ----------------------------


@pytest.fixture
def sigterm_guard():
  """A SIGTERM that no handler of the run catches fails the test instead of killing pytest
  (what the default handler would do to `jaxrl-scale train`: exit -15, nothing saved)."""

  def unhandled(signum, frame):
    raise AssertionError("SIGTERM reached the default handler: the run would have died")

  old = signal.signal(signal.SIGTERM, unhandled)
  yield
  signal.signal(signal.SIGTERM, old)


def _sigterm_at_sft_step(mp, n):
  """SIGTERM to this process right after the warm start's n-th SFT step."""
  from jaxrl_scale.rl import sft as sft_lib
  real = sft_lib.make_trainer

  def make(*args, **kwargs):
    trainer = real(*args, **kwargs)
    step, calls = trainer.step, []

    def stepped(batch):
      out = step(batch)
      calls.append(1)
      if len(calls) == n:
        signal.raise_signal(signal.SIGTERM)
      return out

    trainer.step = stepped
    return trainer

  mp.setattr(sft_lib, "make_trainer", make)


def test_sigterm_in_the_warm_start_saves_it_and_resume_continues_it(task_file, tmp_path,
                                                                     sigterm_guard):
  ref = _cfg(task_file, tmp_path / "ref", "eval.every=0", steps=1)
  assert wiring.train(ref, ref.run.output_dir).reason == "done"
  cfg = _cfg(task_file, tmp_path / "run", "eval.every=0", steps=1)
  with pytest.MonkeyPatch.context() as mp:
    _sigterm_at_sft_step(mp, 6)
    outcome = wiring.train(cfg, cfg.run.output_dir)
  assert outcome.reason == "signal" and outcome.signal_name == "SIGTERM"
  assert not (tmp_path / "run" / "checkpoints").is_dir() or not any(
      (tmp_path / "run" / "checkpoints").iterdir())  # no RL step, no RL checkpoint
  sft_rows = [json.loads(x) for x in (tmp_path / "run" / "sft.jsonl").read_text().splitlines()]
  assert [r["step"] for r in sft_rows] == list(range(6))
  outcome = wiring.train(cfg, cfg.run.output_dir)  # resumes the warm start at step 7 of 15
  assert outcome.reason == "done" and outcome.step == 1
  sft_rows = [json.loads(x) for x in (tmp_path / "run" / "sft.jsonl").read_text().splitlines()]
  assert [r["step"] for r in sft_rows] == list(range(15))
  assert not (tmp_path / "run" / "warm_start").exists()  # dropped once checkpoint 0 is saved
  # The warm start continued exactly: RL started from the uninterrupted run's policy.
  with checkpoint.Checkpointer(tmp_path / "ref" / "checkpoints") as a, checkpoint.Checkpointer(
      tmp_path / "run" / "checkpoints") as b:
    jax.tree.map(np.testing.assert_array_equal, b.read_arrays(0), a.read_arrays(0))


@pytest.mark.parametrize("mode, eval_step", [("sync", 2), ("sync", 0), ("pipeline", 2)])
def test_sigterm_mid_eval_stops_it_and_resume_redoes_it(task_file, tmp_path, sigterm_guard,
                                                        mode, eval_step):
  from jaxrl_scale import eval as eval_lib
  cfg = _cfg(task_file, tmp_path / "run", f"pipeline.mode={mode}", "checkpoint.every=0",
             steps=4)
  real_run = eval_lib.Evaluator.run
  evals = []

  def signalled_run(self, params=None, version=None, on_progress=None):
    evals.append(version)
    if version == eval_step and evals.count(eval_step) == 1:  # the first time only
      signal.raise_signal(signal.SIGTERM)
    return real_run(self, params, version, on_progress)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(eval_lib.Evaluator, "run", signalled_run)
    outcome = wiring.train(cfg, cfg.run.output_dir)
    assert outcome.reason == "signal" and outcome.step == eval_step
    # The eval was abandoned: its step's row waits in the checkpoint, not in the stream.
    assert [r["step"] for r in _rows(cfg.run.output_dir)] == list(range(eval_step))
    with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
      assert ckpt.latest_step() == eval_step
    outcome = wiring.train(cfg, cfg.run.output_dir, resume=True)
  assert outcome.reason == "done" and outcome.step == 4
  assert evals.count(eval_step) == 2  # redone after resume, with the same params
  rows = _rows(cfg.run.output_dir)
  _check_stream(rows, 4, k=2)
  trained = [i for r in rows[1:] for i in r["rollout/group_ids"]]
  assert sorted(trained) == list(range(4 * 4))  # every group once


def test_sigterm_while_an_eval_is_scored_abandons_it_at_once(task_file, tmp_path,
                                                             sigterm_guard):
  """Verifying an eval's code answers can outlast the grace period: a SIGTERM while its
  samples are scored stops the scoring, not after every verifier call (issue 63)."""
  import threading  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import eval as eval_lib  # pylint: disable=g-import-not-at-top
  # No watchdog: a scoring that waited for every call would be killed by it (os._exit, the
  # step lost) instead of failing the assertions below.
  cfg = _cfg(task_file, tmp_path / "run", "checkpoint.every=0",
             "checkpoint.preempt_grace_seconds=0", steps=4)
  real_run, real_score = eval_lib.Evaluator.run, rollouts.GroupScorer.score
  state = {"in_eval": False, "calls": 0}
  release = threading.Event()

  def run(self, params=None, version=None, on_progress=None):
    state["in_eval"] = version == 2
    try:
      return real_run(self, params, version, on_progress)
    finally:
      state["in_eval"] = False

  def score(self, prompt, completions):
    if state["in_eval"]:
      state["calls"] += 1
      if state["calls"] == 1:
        signal.raise_signal(signal.SIGTERM)  # arrives while the eval's answers are judged
      release.wait(20)  # a verifier that runs until the test lets it go (20 s at most)
    return real_score(self, prompt, completions)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(eval_lib.Evaluator, "run", run)
    mp.setattr(rollouts.GroupScorer, "score", score)
    try:
      outcome = wiring.train(cfg, cfg.run.output_dir)
    finally:
      release.set()
  assert outcome.reason == "signal" and outcome.step == 2
  # Abandoned while its first calls still ran: no row for step 2 (a scoring that waited for
  # every call would finish the eval and write it), the step saved for a redo.
  assert [r["step"] for r in _rows(cfg.run.output_dir)] == [0, 1]
  with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
    assert ckpt.latest_step() == 2


@pytest.mark.slow
def test_sigterm_mid_eval_exits_within_30s_then_resume_trains_every_group_once(
    task_file, tmp_path, compile_cache):
  # 8 validation prompts x 30,000 samples: an eval of about a minute on a CPU (at paper
  # scale, 1,000 x 16 samples of up to 14k tokens outlast a preemption's grace period).
  steps, p = 6, 4
  run_dir = tmp_path / "run"
  proc = _launch(task_file, run_dir, compile_cache, "pipeline.mode=pipeline", "eval.every=3",
                 "eval.samples_per_prompt=30000", "checkpoint.every=0", steps=steps)
  output = _Output(proc)
  output.wait_for("  eval of step 3: ", timeout=600)  # 10 s into the eval, then each minute
  signalled = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  code, out = output.finish()
  exited_s = time.monotonic() - signalled
  assert code == 0, out
  assert "the eval of step 3 was interrupted" in out, out
  assert exited_s < 30, (exited_s, out)  # checkpoint.preempt_grace_seconds' default
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    assert ckpt.latest_step() == 3  # saved on the signal (no scheduled checkpoints)
  assert [r["step"] for r in _rows(run_dir)] == [0, 1, 2]  # row 3 waits for its eval
  # The same command, with a short eval this time: the eval of step 3 is redone first.
  resumed = _launch(task_file, run_dir, compile_cache, "pipeline.mode=pipeline",
                    "eval.every=3", "checkpoint.every=0", steps=steps)
  code, out = _finish(resumed)
  assert code == 0, out
  assert "resumed from checkpoint step 3" in out
  rows = _rows(run_dir)
  assert [r["step"] for r in rows] == list(range(steps + 1))
  assert "val/pass_rate" in rows[3] and "rollout/group_ids" in rows[3]
  trained = [i for r in rows[1:] for i in r["rollout/group_ids"]]
  assert sorted(trained) == list(range(steps * p))  # none twice, none lost
  assert all(r.get("pipeline/dropped_stale", 0.0) == 0.0 for r in rows[1:])
