"""Resume of `jaxrl-scale train` on a tiny config: after a stop request, a corrupt latest
checkpoint, SIGTERM and SIGKILL of a real subprocess (the slow tests), and the CLI's --resume
without a checkpoint. Shared set-up: tests/train_setup.py.
"""

import json
import shutil
import signal

import jax
import numpy as np
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale import train
from jaxrl_scale.errors import UserError
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import wiring
from tests.train_setup import compile_cache, task_file  # noqa: F401 (fixtures)
from tests.train_setup import (ROOT, check_stream, final_params, finish, launch, read_rows,
                               run_cfg, wait_for_step)


def test_stop_request_saves_and_resume_continues_without_gaps(task_file, tmp_path):
  cfg = run_cfg(task_file, tmp_path / "run", steps=5)

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
  check_stream(read_rows(cfg.run.output_dir), 5, k=2)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(task_file, tmp_path):
  cfg = run_cfg(task_file, tmp_path / "run", steps=4)
  wiring.train(cfg, cfg.run.output_dir)
  state_dir = tmp_path / "run" / "checkpoints" / "4" / "state"
  for p in state_dir.iterdir():  # damage step 4's arrays
    if p.is_dir():
      shutil.rmtree(p)
    else:
      p.write_bytes(b"garbage")
  longer = run_cfg(task_file, tmp_path / "run", steps=6)
  with pytest.warns(UserWarning, match="step 4 .* unreadable"):
    outcome = wiring.train(longer, longer.run.output_dir, resume=True)
  assert outcome.step == 6
  rows = read_rows(tmp_path / "run")
  check_stream(rows, 6, k=2)  # steps 3 and 4 were redone, not duplicated


def test_cli_resume_without_checkpoint_is_a_user_error(tmp_path):
  parser = __import__("argparse").ArgumentParser()
  train.add_arguments(parser)
  args = parser.parse_args([str(ROOT / "configs" / "cpu_tiny.yaml"), "run.steps=1",
                            "--resume", "--output-dir", str(tmp_path / "none")])
  with pytest.raises(UserError, match="--resume: no checkpoint"):
    train.run(args)
  assert args.resume and args.output_dir == str(tmp_path / "none")


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(task_file, tmp_path, compile_cache):
  proc = launch(task_file, tmp_path / "run", compile_cache, "checkpoint.every=0", steps=30)
  wait_for_step(tmp_path / "run", 2, proc)
  proc.send_signal(signal.SIGTERM)
  code, out = finish(proc)
  assert code == 0, out
  assert "stopped by SIGTERM" in out
  step = json.loads((tmp_path / "run" / "summary.json").read_text())["steps"]
  with checkpoint.Checkpointer(tmp_path / "run" / "checkpoints") as ckpt:
    assert ckpt.latest_step() == step  # saved on the signal, not on a schedule
  # Steps take a fraction of a second here, so the signal may land in an eval (every 2
  # steps): that step's row then waits in the checkpoint (redone on resume), and only then.
  pending = f"the eval of step {step} was interrupted" in out
  assert [r["step"] for r in read_rows(tmp_path / "run")] == list(range(step + 1 - pending)), out


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_uninterrupted_params(task_file, tmp_path,
                                                               compile_cache):
  steps = 8
  ref = launch(task_file, tmp_path / "ref", compile_cache, steps=steps)
  code, out = finish(ref)
  assert code == 0, out
  killed = launch(task_file, tmp_path / "run", compile_cache, steps=steps)
  wait_for_step(tmp_path / "run", 5, killed)  # checkpoints at 2 and 4; step 5 is lost
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = launch(task_file, tmp_path / "run", compile_cache, steps=steps)
  code, out = finish(resumed)
  assert code == 0, out
  assert "resumed from checkpoint step 4" in out
  ref_step, ref_params = final_params(tmp_path / "ref")
  run_step, run_params = final_params(tmp_path / "run")
  assert ref_step == run_step == steps
  jax.tree.map(np.testing.assert_array_equal, run_params, ref_params)
  ref_rows, run_rows = read_rows(tmp_path / "ref"), read_rows(tmp_path / "run")
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
  killed = launch(task_file, tmp_path / "run", compile_cache, f"pipeline.mode={mode}",
                   steps=steps)
  wait_for_step(tmp_path / "run", kill_at, killed)
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = launch(task_file, tmp_path / "run", compile_cache, f"pipeline.mode={mode}",
                    steps=steps)
  code, out = finish(resumed)
  assert code == 0, out
  assert f"resumed from checkpoint step {kill_at - kill_at % 2}" in out
  rows = read_rows(tmp_path / "run")
  assert [r["step"] for r in rows] == list(range(steps + 1))
  trained = [i for r in rows[1:] for i in r["rollout/group_ids"]]
  assert sorted(trained) == list(range(steps * p))  # none twice, none lost
  assert all(r.get("pipeline/dropped_stale", 0.0) == 0.0 for r in rows[1:])
  assert all(r["staleness/max"] <= 2 for r in rows[1:])
  # The compute axis continues from the checkpoint: the restart's set-up is not in it.
  hours = [r["compute_hours"] for r in rows]
  assert all(b >= a for a, b in zip(hours, hours[1:]))
