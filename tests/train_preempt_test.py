"""Preemption of `jaxrl-scale train` on a tiny config: SIGTERM at any moment (in the warm
start, mid-eval, while an eval is scored; in-process, real signals), and a real subprocess
SIGTERMed mid-eval (slow). Shared set-up: tests/train_setup.py.
"""

import json
import signal
import time

import jax
import numpy as np
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale.pipeline import rollouts
from jaxrl_scale.pipeline import wiring
from tests.train_setup import compile_cache, task_file  # noqa: F401 (fixtures)
from tests.train_setup import (Output, check_stream, finish, launch, read_rows, run_cfg)


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
  ref = run_cfg(task_file, tmp_path / "ref", "eval.every=0", steps=1)
  assert wiring.train(ref, ref.run.output_dir).reason == "done"
  cfg = run_cfg(task_file, tmp_path / "run", "eval.every=0", steps=1)
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
  cfg = run_cfg(task_file, tmp_path / "run", f"pipeline.mode={mode}", "checkpoint.every=0",
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
    assert [r["step"] for r in read_rows(cfg.run.output_dir)] == list(range(eval_step))
    with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
      assert ckpt.latest_step() == eval_step
    outcome = wiring.train(cfg, cfg.run.output_dir, resume=True)
  assert outcome.reason == "done" and outcome.step == 4
  assert evals.count(eval_step) == 2  # redone after resume, with the same params
  rows = read_rows(cfg.run.output_dir)
  check_stream(rows, 4, k=2)
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
  cfg = run_cfg(task_file, tmp_path / "run", "checkpoint.every=0",
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
  assert [r["step"] for r in read_rows(cfg.run.output_dir)] == [0, 1]
  with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
    assert ckpt.latest_step() == 2


@pytest.mark.slow
def test_sigterm_mid_eval_exits_within_30s_then_resume_trains_every_group_once(
    task_file, tmp_path, compile_cache):
  # 8 validation prompts x 30,000 samples: an eval of about a minute on a CPU (at paper
  # scale, 1,000 x 16 samples of up to 14k tokens outlast a preemption's grace period).
  steps, p = 6, 4
  run_dir = tmp_path / "run"
  proc = launch(task_file, run_dir, compile_cache, "pipeline.mode=pipeline", "eval.every=3",
                 "eval.samples_per_prompt=30000", "checkpoint.every=0", steps=steps)
  output = Output(proc)
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
  assert [r["step"] for r in read_rows(run_dir)] == [0, 1, 2]  # row 3 waits for its eval
  # The same command, with a short eval this time: the eval of step 3 is redone first.
  resumed = launch(task_file, run_dir, compile_cache, "pipeline.mode=pipeline",
                    "eval.every=3", "checkpoint.every=0", steps=steps)
  code, out = finish(resumed)
  assert code == 0, out
  assert "resumed from checkpoint step 3" in out
  rows = read_rows(run_dir)
  assert [r["step"] for r in rows] == list(range(steps + 1))
  assert "val/pass_rate" in rows[3] and "rollout/group_ids" in rows[3]
  trained = [i for r in rows[1:] for i in r["rollout/group_ids"]]
  assert sorted(trained) == list(range(steps * p))  # none twice, none lost
  assert all(r.get("pipeline/dropped_stale", 0.0) == 0.0 for r in rows[1:])
