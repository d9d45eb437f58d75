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
from tests import train_setup

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _overrides(data: pathlib.Path, run_dir: pathlib.Path, steps: int) -> list[str]:
  """train_setup.tiny_overrides' shapes and budgets on the MoE demo (layer 0 sparse, 1
  dense; the demo's own expert width)."""
  keep = [o for o in train_setup.tiny_overrides(data, steps)
          if not o.startswith(("model.num_layers=", "model.intermediate_size="))]
  return keep + [f"run.output_dir={run_dir}", "model.num_layers=2"]


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
