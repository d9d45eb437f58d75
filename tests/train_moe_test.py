"""`jaxrl-scale train` with an MoE policy and routing replay (configs/cpu_tiny_moe.yaml, tiny
shapes): warm start, rollouts with routing records, CISPO steps on the replayed routing, a
checkpoint, and a resume that continues the metrics stream."""

import json
import pathlib

import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale import config
from jaxrl_scale import metrics
from jaxrl_scale.pipeline import wiring

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _overrides(data: pathlib.Path, run_dir: pathlib.Path, steps: int) -> list[str]:
  # train_test.tiny_overrides' shapes and budgets on the MoE demo (layer 0 sparse, 1 dense).
  return [
      f"run.steps={steps}", "run.tensorboard=false", "run.progress=false",
      f"run.output_dir={run_dir}", "model.hidden_size=32", "model.num_layers=2",
      f"data.source={data}", "data.task=arithmetic", "data.id_field=id",
      "data.solution_field=solution", "data.num_validation=8", "data.max_prompt_tokens=8",
      "sft.steps=15", "sft.lr=1e-2", "sft.batch_size=16", "run.sft_stop_pass_rate=null",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=4",
      "sampler.decode_chunk=4", "sampler.prompt_buckets=[8]",
      "eval.every=2", "eval.samples_per_prompt=2", "checkpoint.every=2",
      "checkpoint.async_save=false", "forecast.n_boot=0", "pipeline.max_staleness=2",
      "pipeline.mode=sync",
  ]


@pytest.mark.slow  # two runs of a warm start and RL steps: about a minute on 2 cores
def test_moe_policy_trains_with_routing_replay_checkpoints_and_resumes(tmp_path):
  data = tmp_path / "parity.jsonl"
  with open(data, "w") as f:
    for i in range(80):
      a = str(i % 2)
      f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a}) + "\n")
  run_dir = tmp_path / "run"
  cfg = config.load(ROOT / "configs" / "cpu_tiny_moe.yaml", _overrides(data, run_dir, 4))
  assert cfg.model.routing == "replay" and cfg.model.preset == "tiny_qwen3_moe"
  assert wiring.train(cfg, run_dir).step == 4
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    assert ckpt.latest_step() == 4
  longer = config.load(ROOT / "configs" / "cpu_tiny_moe.yaml", _overrides(data, run_dir, 6))
  outcome = wiring.train(longer, run_dir, resume=True)
  assert outcome.reason == "done" and outcome.step == 6
  rows = metrics.read_metrics(run_dir / "metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(7))
  trained = [r for r in rows[1:] if "train/loss" in r]
  assert len(trained) == 6
  # Every step scored its rollouts on the sampler's routing: the recorded choices reached
  # the trainer (the metric exists) and its own router agrees with most of them.
  assert all(0 <= r["train/routing_mismatch"] < 0.5 for r in trained)
  # Sync mode is on-policy: with the sampler's routing replayed, ratios are 1.
  assert all(abs(r["train/ratio_max"] - 1) < 1e-3 and abs(r["train/ratio_min"] - 1) < 1e-3
             for r in trained)
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)
