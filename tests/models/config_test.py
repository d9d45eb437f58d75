"""ModelConfig validation, presets and Hugging Face config conversion."""

import dataclasses

import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config


@pytest.mark.parametrize("name,billions", [
    ("qwen3_0p6b", 0.596), ("qwen3_1p7b", 1.721), ("qwen3_8b", 8.191),
    ("qwen2p5_1p5b", 1.544), ("qwen2p5_7b", 7.616), ("llama3p1_8b", 8.030)])
def test_real_presets_have_published_sizes(name, billions):
  # Sizes as reported for the published checkpoints (embeddings included).
  assert config.preset(name).num_params() / 1e9 == pytest.approx(billions, abs=0.002)


def test_small_preset_is_about_50m():
  assert 45e6 < config.small().num_params() < 55e6


def test_presets_round_trip_through_hf_config():
  for name, make in config.PRESETS.items():
    cfg = make()
    if name == "llama4_scout_shaped":  # shapes only: no Hugging Face form
      with pytest.raises(UserError, match="has no Hugging Face form"):
        config.to_hf_config(cfg)
      continue
    assert config.from_hf_config(config.to_hf_config(cfg)) == cfg, name


def test_from_hf_config_reads_new_style_rope_parameters():
  hf = config.to_hf_config(config.llama3p1_8b())
  scaling = hf.pop("rope_scaling")
  hf["rope_parameters"] = {**scaling, "rope_theta": hf.pop("rope_theta")}
  hf["dtype"] = hf.pop("torch_dtype")
  assert config.from_hf_config(hf) == config.llama3p1_8b()


def test_from_hf_config_overrides_and_dtypes():
  hf = config.to_hf_config(config.qwen3_0p6b())
  hf["torch_dtype"] = "bfloat16"
  cfg = config.from_hf_config(hf)
  assert (cfg.param_dtype, cfg.dtype) == ("bfloat16", "bfloat16")
  cfg = config.from_hf_config(hf, dtype="float32", lm_head_fp32=False)
  assert (cfg.param_dtype, cfg.dtype, cfg.lm_head_fp32) == ("bfloat16", "float32", False)


@pytest.mark.parametrize("change,match", [
    ({"model_type": "gpt2"}, "'model_type'"),
    ({"hidden_act": "gelu"}, "'hidden_act'"),
    ({"attention_bias": True}, "'attention_bias'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"torch_dtype": "int8"}, "'torch_dtype'"),
    ({"hidden_size": None}, "'hidden_size'"),
])
def test_from_hf_config_rejects_unsupported(change, match):
  hf = {**config.to_hf_config(config.tiny_llama()), **change}
  with pytest.raises(UserError, match=match) as e:
    config.from_hf_config(hf, source="/m/config.json")
  assert "/m/config.json" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("change,field", [
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(head_dim=15), "head_dim"),
    (dict(dtype="float16"), "dtype"),
    (dict(family="gpt"), "family"),
    (dict(qkv_bias=True), "qkv_bias"),
    (dict(num_layers=0), "num_layers"),
    (dict(eos_token_ids=(600,)), "eos_token_ids"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (dict(attention_impl="flash3"), "attention_impl"),
])
def test_invalid_fields_name_the_field(change, field):
  with pytest.raises(UserError, match=f"ModelConfig.{field}:"):
    dataclasses.replace(config.tiny_llama(), **change)


def test_rope_scaling_validation_and_unknown_preset():
  with pytest.raises(UserError, match="high_freq_factor"):
    config.RopeScaling(low_freq_factor=4.0, high_freq_factor=1.0)
  with pytest.raises(UserError, match="tiny_llama"):
    config.preset("tiny_lama")


def test_attention_impls_are_the_attention_modules():
  from jaxrl_scale.models import attention

  assert config.ATTENTION_IMPLS == attention.IMPLS
