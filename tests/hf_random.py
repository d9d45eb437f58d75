"""Tiny random transformers models for the parity tests (tests/models, tests/generation)."""


def random_hf_model(spec: dict, common: dict, seed: int, scale: float):
  """A float32 eval-mode transformers model of `spec` (with `model_type`) over `common`.

  Every weight is random: norm scales 1 + 0.1 N(0, 1), everything else (biases included)
  `scale` N(0, 1), so that every tensor matters to the output.
  """
  import torch
  import transformers

  torch.set_default_dtype(torch.float32)
  spec = dict(spec)
  config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                "qwen3": transformers.Qwen3Config,
                "qwen3_moe": transformers.Qwen3MoeConfig}[spec.pop("model_type")]
  hf_cfg = config_cls(**{**common, **spec})
  hf_cfg._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else scale * noise)
  return model.eval()
