"""Every shipped config loads, and each recipe differs from ScaleRL where it says it does."""

import pathlib

import pytest

from jaxrl_scale import config

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
NAMES = sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def _flat(cfg) -> dict:
  out = {}
  for section, values in config.to_dict(cfg).items():
    for key, value in values.items():
      out[f"{section}.{key}"] = value
  return out


def _diff(name: str) -> dict:
  base = _flat(config.load(CONFIGS / "scalerl_qwen3_8b.yaml"))
  other = _flat(config.load(CONFIGS / f"{name}.yaml"))
  return {k: other[k] for k in base if base[k] != other[k] and k not in ("run.name",
                                                                        "run.output_dir")}


@pytest.mark.parametrize("name", NAMES)
def test_config_loads(name):
  cfg = config.load(CONFIGS / f"{name}.yaml")
  assert cfg.run.name == name


def test_expected_configs_exist():
  expected = {"cpu_tiny", "scalerl_qwen3_8b", "deepseek_grpo", "qwen_dapo", "magistral",
              "minimax", "loo_plan", "loo_lp", "loo_batch", "loo_8op", "loo_fp32", "loo_savg",
              "loo_dapo"}
  assert expected <= set(NAMES)


@pytest.mark.parametrize("name, changed", [
    ("loo_plan", {"rl.advantage_norm": "prompt"}),
    ("loo_batch", {"rl.zero_variance_filter": False}),
    ("loo_8op", {"pipeline.mode": "ppo_offpolicy"}),
    ("loo_fp32", {"model.lm_head_fp32": False}),
    ("loo_savg", {"rl.aggregation": "sample_avg"}),
    ("loo_dapo", {"rl.loss": "dapo"}),
    ("loo_lp", {"sampler.interrupt": False, "rl.length_penalty": True,
                "rl.length_penalty_max": 14336, "rl.length_penalty_cache": 2048}),
])
def test_leave_one_out_changes_one_choice(name, changed):
  assert _diff(name) == changed


# Scout's bf16 weights are 100.4 GiB over 2 chips, so its recipe runs both roles on every
# chip (mesh.colocated) with one weight buffer and a KV pool of 24 x 8k positions per
# generator group (configs/scalerl_scout_shaped.yaml): the sampler settings memory forces.
_SCOUT_SAMPLER = {"sampler.weight_buffers": 1, "sampler.kv_cache_tokens": 196608}
# Qwen3-30B-A3B's prefill of 48 whole 2k-token prompts leaves 8% of a generator chip free;
# in pieces of 512 positions, 14% (configs/scalerl_qwen3_30b_a3b.yaml).
_30B_SAMPLER = {"sampler.prefill_chunk": 512}


@pytest.mark.parametrize("name, preset, ep, sampler", [
    ("scalerl_qwen3_30b_a3b", "qwen3_30b_a3b", 2, _30B_SAMPLER),
    ("scalerl_scout_shaped", "llama4_scout_shaped", 4, _SCOUT_SAMPLER)])
def test_moe_recipes_change_only_the_model_mesh_and_memory(name, preset, ep, sampler):
  diff = _diff(name)
  assert diff.pop("model.preset") == preset and diff.pop("mesh.trainer_ep") == ep
  assert diff.pop("model.routing") == "replay"
  assert {k: diff.pop(k) for k in list(diff) if k.startswith("sampler.")} == sampler
  # Everything else is the 8B recipe: the loss, data, schedule, pipeline and eval, and the
  # model's dtypes and FP32 head; only where the weights live and the train step's memory.
  assert {k.split(".")[0] for k in diff} <= {"model", "mesh", "optim"}
  assert set(k for k in diff if k.startswith("model.")) <= {"model.path"}
  assert set(k for k in diff if k.startswith("optim.")) <= {
      "optim.remat", "optim.micro_batch_prompts", "optim.sequence_parallel"}


def test_scalerl_is_the_paper_recipe():
  cfg = config.load(CONFIGS / "scalerl_qwen3_8b.yaml")
  assert (cfg.rl.loss, cfg.rl.eps_max, cfg.rl.aggregation, cfg.rl.advantage_norm) == (
      "cispo", 5.0, "prompt_avg", "batch")
  assert (cfg.rl.prompts_per_step, cfg.rl.generations_per_prompt) == (48, 16)
  assert (cfg.pipeline.mode, cfg.pipeline.max_staleness) == ("pipeline", 8)
  assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.eps, cfg.optim.weight_decay) == (
      5e-7, 100, 1e-15, 0.01)
  assert cfg.model.lm_head_fp32 and cfg.rl.zero_variance_filter and cfg.rl.no_positive_resampling
  assert (cfg.sampler.interrupt, cfg.sampler.interrupt_min, cfg.sampler.interrupt_max) == (
      True, 10240, 12288)
  assert (cfg.eval.every, cfg.eval.samples_per_prompt, cfg.data.num_validation) == (100, 16, 1000)


def test_baselines():
  grpo = config.load(CONFIGS / "deepseek_grpo.yaml")
  assert (grpo.rl.loss, grpo.rl.clip_low, grpo.rl.aggregation, grpo.pipeline.mode) == (
      "grpo", 0.2, "sample_avg", "ppo_offpolicy")
  dapo = config.load(CONFIGS / "qwen_dapo.yaml")
  assert (dapo.rl.loss, dapo.rl.clip_high, dapo.rl.prompts_per_step) == ("dapo", 0.26, 80)
  assert config.load(CONFIGS / "magistral.yaml").pipeline.mode == "pipeline"
  minimax = config.load(CONFIGS / "minimax.yaml")
  assert (minimax.rl.loss, minimax.model.lm_head_fp32, minimax.pipeline.mode) == (
      "cispo", True, "ppo_offpolicy")


def test_cpu_demo_is_small_and_split():
  cfg = config.load(CONFIGS / "cpu_tiny.yaml")
  assert cfg.mesh.simulated_cpu_devices == 8 and not cfg.mesh.colocated
  assert cfg.sft.steps > 0 and cfg.model.path is None and cfg.model.tokenizer == "byte"
  assert (cfg.rl.loss, cfg.rl.aggregation, cfg.rl.advantage_norm) == (
      "cispo", "prompt_avg", "batch")


def test_math_code_configs_mix_two_domains():
  demo = config.load(CONFIGS / "cpu_math_code.yaml")
  assert [(s.domain, s.source, s.weight, s.sft_weight) for s in demo.data.sources] == [
      ("math", "arithmetic/add2", 2.0, 8.0), ("code", "code/fn", 1.0, 1.0)]
  paper = config.load(CONFIGS / "scalerl_qwen3_8b_math_code.yaml")
  assert [(s.domain, s.task, s.weight, s.num_validation) for s in paper.data.sources] == [
      ("math", "math", 1.0, 1000), ("code", "code", 1.0, 1000)]
  # The paper's math+code run is the ScaleRL recipe with other data, nothing else.
  assert set(_diff("scalerl_qwen3_8b_math_code")) == {"data.source", "data.num_validation",
                                                       "data.sources"}
