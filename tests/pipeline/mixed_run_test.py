"""A mixed-domain run end to end (`wiring.train` with data.sources): per-domain rollout and
validation metrics in metrics.jsonl, and a stopped-then-resumed run that trains the same
groups of the same domains at every step as an uninterrupted one."""

import json
import pathlib
import signal

import pytest

from jaxrl_scale import config
from jaxrl_scale import metrics
from jaxrl_scale.pipeline import loop as loop_lib
from jaxrl_scale.pipeline import wiring

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cfg(tmp_path: pathlib.Path, run: str):
  parity = tmp_path / "parity.jsonl"
  if not parity.exists():
    with open(parity, "w") as f:
      for i in range(80):
        a = str(i % 2)
        f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a})
                + "\n")
  sources = (f"[{{source: '{parity}', task: arithmetic, name: parity, id_field: id, "
             "solution_field: solution, num_validation: 6, weight: 2}, "
             "{source: code/fn, num_train: 60, num_validation: 4}]")
  return config.load(ROOT / "configs" / "cpu_tiny.yaml", [
      f"run.output_dir={tmp_path / run}", "run.steps=4", "run.tensorboard=false",
      "run.progress=false", "run.sft_stop_pass_rate=null", "model.hidden_size=32",
      "model.num_layers=1", "model.intermediate_size=64", "data.source=arithmetic",
      "data.num_train=2000", "data.num_validation=64", f"data.sources={sources}",
      "data.max_prompt_tokens=24", "sft.steps=15", "sft.lr=1e-2", "sft.batch_size=16",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=4",
      "sampler.decode_chunk=4", "sampler.prompt_buckets=[24]", "eval.every=2",
      "eval.samples_per_prompt=2", "checkpoint.every=2", "checkpoint.async_save=false",
      "forecast.n_boot=0", "pipeline.mode=sync", "rl.no_positive_resampling=false"])


def _per_step(rows, key):
  return [r.get(key) for r in rows[1:]]


@pytest.mark.slow
def test_mixed_run_logs_each_domain_and_resumes_exactly(tmp_path):
  cfg = _cfg(tmp_path, "straight")
  assert wiring.train(cfg, cfg.run.output_dir).reason == "done"
  straight = metrics.read_metrics(pathlib.Path(cfg.run.output_dir) / "metrics.jsonl")
  for row in straight[1:]:
    assert {"rollout/parity/pass_rate", "rollout/code/pass_rate"} <= set(row)
    assert row["rollout/parity/num_groups"] + row["rollout/code/num_groups"] == 4
  for row in (straight[0], straight[2], straight[4]):
    assert (row["val/parity/num_prompts"], row["val/code/num_prompts"]) == (6.0, 4.0)
    assert row["val/parity/samples_per_prompt"] == row["val/code/samples_per_prompt"] == 2.0
    # The overall rate is the mean over all 20 validation samples.
    assert row["val/pass_rate"] == pytest.approx(
        (row["val/parity/pass_rate"] * 12 + row["val/code/pass_rate"] * 8) / 20)

  cfg = _cfg(tmp_path, "stopped")
  loop = None
  original = loop_lib.Loop.__init__

  def capture(self, *args, **kwargs):
    nonlocal loop
    original(self, *args, **kwargs)
    loop = self

  def stop_at_2(step, row):
    if step == 2:
      loop.request_stop(signal.SIGTERM)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop_lib.Loop, "__init__", capture)
    assert wiring.train(cfg, cfg.run.output_dir, on_step=stop_at_2).step == 2
  assert wiring.train(cfg, cfg.run.output_dir, resume=True).reason == "done"
  resumed = metrics.read_metrics(pathlib.Path(cfg.run.output_dir) / "metrics.jsonl")
  # Sync mode with the same seeds: the same prompts of the same domains at every step, so
  # the same samples and verdicts (a resume that lost the mixture's draw counter would draw
  # other prompts).
  for key in ("rollout/group_ids", "rollout/parity/num_groups", "rollout/code/num_groups",
              "rollout/parity/pass_rate", "rollout/code/pass_rate", "rollout/length_mean"):
    assert _per_step(resumed, key) == _per_step(straight, key), key
