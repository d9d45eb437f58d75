"""configs/gpu_small.yaml (issue 62 item 4): a Qwen3-shaped policy of at least 50M parameters,
warm-started by SFT from scratch on worked long multiplication, then ScaleRL with the live forecast, on one GPU.

The run itself needs a GPU (docs/gpu.md: "One GPU / one node, end to end"); here the same
config runs end to end on CPU at a reduced size: the Qwen3 preset with a narrow hidden size
and two layers, a few SFT and RL steps. Nothing about its speed or its pass rate is asserted,
only that every part of the run happens: the warm start, the evals, the live forecast's fit
and the plot at the end.
"""

import json
import pathlib

import pytest

from jaxrl_scale import config
from jaxrl_scale import metrics
from jaxrl_scale.models import config as model_config
from jaxrl_scale.pipeline import wiring

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "gpu_small.yaml"
STEPS, EVERY, SFT_STEPS = 4, 1, 8
# The config shrunk for 2 CPU cores: the preset's heads and head_dim kept, hidden 64 and two
# layers (0.48M parameters), 8 prompts x 4 samples, 8 SFT steps without the stop target (a
# policy this small and this short does not reach it), 32 validation prompts, an eval every
# step (the live forecast fits from 4 points). A policy that short passes nothing, so every
# group would be filtered for zero variance and no step would train: the filter is off.
SHRUNK = ["model.hidden_size=64", "model.num_layers=2", "model.intermediate_size=192",
          "model.dtype=float32", "model.param_dtype=float32",
          "rl.prompts_per_step=8", "rl.generations_per_prompt=4", "sampler.num_slots=32",
          "rl.zero_variance_filter=false", "data.num_train=200", "data.num_validation=32",
          f"sft.steps={SFT_STEPS}", "sft.batch_size=16", "run.sft_stop_pass_rate=null",
          f"run.steps={STEPS}", f"eval.every={EVERY}", "forecast.n_boot=10",
          "run.progress=false", "run.tensorboard=false"]


def test_the_policy_is_qwen3_shaped_and_at_least_50m():
  cfg = config.load(CONFIG)
  model = model_config.preset(cfg.model.preset)
  assert model.family == "qwen3" and model.qk_norm and model.tie_embeddings
  assert model.num_heads * model.head_dim != model.hidden_size  # Qwen3's free head_dim
  assert model.num_params() >= 50e6


def test_the_config_is_the_recipe_colocated_on_one_gpu():
  cfg = config.load(CONFIG)
  assert cfg.mesh.colocated and cfg.pipeline.mode == "colocated"
  assert (cfg.mesh.trainer_devices, cfg.mesh.generator_devices) == (1, 1)
  assert cfg.sampler.num_slots == cfg.rl.prompts_per_step * cfg.rl.generations_per_prompt
  assert (cfg.rl.loss, cfg.rl.aggregation, cfg.rl.advantage_norm) == (
      "cispo", "prompt_avg", "batch")
  assert cfg.rl.zero_variance_filter and cfg.rl.no_positive_resampling
  assert cfg.model.lm_head_fp32 and cfg.optim.schedule == "constant"
  assert cfg.sft.steps > 0 and cfg.run.sft_stop_pass_rate is not None
  assert cfg.forecast.enabled and cfg.forecast.plot
  assert cfg.data.source.startswith("multiply/")  # harder than the demo's add2


# 38-57 s on the 2-core CPU machine as other work comes and goes (most of it compiling the
# SFT step, prefill, decode and the train step), so slow-only; the tests above hold the
# config itself.
@pytest.mark.slow
def test_the_config_runs_end_to_end_shrunk_on_cpu(tmp_path):
  run_dir = tmp_path / "run"
  cfg = config.load(CONFIG, SHRUNK + [f"run.output_dir={run_dir}"])
  outcome = wiring.train(cfg, run_dir)
  assert outcome.reason == "done" and outcome.step == STEPS
  sft_rows = (run_dir / "sft.jsonl").read_text().splitlines()
  assert len(sft_rows) == SFT_STEPS and "loss" in json.loads(sft_rows[-1])
  rows = metrics.read_metrics(run_dir / "metrics.jsonl")
  evals = {r["step"]: r["val/pass_rate"] for r in rows if "val/pass_rate" in r}
  assert sorted(evals) == list(range(0, STEPS + 1, EVERY))
  assert all(0.0 <= v <= 1.0 for v in evals.values())
  assert len([r for r in rows if "train/loss" in r]) == STEPS
  fitted = [r for r in rows if "forecast/A" in r]
  assert fitted and fitted[-1]["step"] == STEPS
  assert 0.0 <= fitted[-1]["forecast/A"] <= 1.0
  assert (run_dir / "forecast.png").stat().st_size > 0
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["outcome"] == "done" and summary["start_pass_rate"] == evals[0]
  assert summary["final_forecast"]["A"] == pytest.approx(fitted[-1]["forecast/A"])
  assert summary["forecast_plot"] == str(run_dir / "forecast.png")


@pytest.mark.parametrize("override,match", [
    ("model.preset=small_qwen4", "small_qwen3"),
    ("data.source=multiply/d9x9", "no preset 'd9x9'"),
])
def test_a_bad_override_is_one_line(override, match):
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserError, match=match):
    cfg = config.load(CONFIG, [override])
    model_config.preset(cfg.model.preset)
    from jaxrl_scale.data import tasks  # pylint: disable=g-import-not-at-top
    tasks.parse_task(cfg.data.source)


# 60-120 s on the 2-core CPU (the four programs compiled for an H100, no GPU needed).
@pytest.mark.slow
def test_the_config_fits_one_h100_colocated(capsys, monkeypatch):
  """`jaxrl-scale plan configs/gpu_small.yaml --topology h100`: every program, the SFT step
  among them, fits in JAX's 75% of the GPU beside the other role's state, with room."""
  import argparse  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top

  if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    pytest.skip("JAX's CUDA plugin is not installed (pip install -e '.[plan-gpu]')")
  from jaxrl_scale.plan import command  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  parser = argparse.ArgumentParser()
  command.add_arguments(parser)
  assert command.run(parser.parse_args([str(CONFIG), "--topology", "h100", "--json"])) == 0
  plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert plan["fits"] and plan["devices"] == 1
  assert set(plan["programs"]) == {"train_step", "sft_step", "weight_cast", "prefill", "decode"}
  for row in plan["programs"].values():
    assert row["fits"] and row["hbm_bytes_per_chip"] < 0.8 * row["hbm_capacity_bytes"]
