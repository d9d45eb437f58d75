"""Tiny random Hugging Face checkpoints of each supported family, written with transformers."""

import numpy as np
import pytest

from tests.hf_random import random_hf_model

# family -> transformers config kwargs. Shapes stay tiny (hidden 64, 2 layers) for speed.
_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
HF_SPECS = {
    # llama3 scaling with a short original context, so most frequencies are rescaled.
    "llama": dict(model_type="llama", tie_word_embeddings=False, rope_theta=10000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=16)),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    # head_dim 32 != 64 / 4, as in real Qwen3.
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=False, head_dim=32, rope_theta=1e6),
    "qwen3_tied": dict(model_type="qwen3", tie_word_embeddings=True, head_dim=32),
    # Qwen3-MoE: the middle of 3 layers dense (mlp_only_layers), top-2 of 8 renormalised.
    "qwen3_moe": dict(model_type="qwen3_moe", tie_word_embeddings=False, head_dim=32,
                      rope_theta=1e6, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
    # Every second layer sparse (decoder_sparse_step), top-3 of 4 not renormalised, tied.
    "qwen3_moe_step2": dict(model_type="qwen3_moe", tie_word_embeddings=True, head_dim=32,
                            num_hidden_layers=4, num_experts=4, num_experts_per_tok=3,
                            moe_intermediate_size=24, norm_topk_prob=False,
                            decoder_sparse_step=2),
}
# HF_SPECS key -> our ModelConfig.family.
FAMILY_OF = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_tied": "qwen3",
             "qwen3_moe": "qwen3_moe", "qwen3_moe_step2": "qwen3_moe"}


def make_hf_model(spec: dict, seed: int = 0):
  """A float32 eval-mode transformers model with every weight (biases, norms too) random."""
  return random_hf_model(spec, _COMMON, seed, scale=0.15)


def hf_logits(model, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions),
                attention_mask=torch.tensor(mask.astype(np.int64)))
  return out.logits.float().numpy()


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """family -> (directory, transformers model) for every entry of HF_SPECS."""
  out = {}
  for i, (name, spec) in enumerate(HF_SPECS.items()):
    model = make_hf_model(spec, seed=i)
    path = tmp_path_factory.mktemp(f"hf_{name}")
    model.save_pretrained(str(path))
    out[name] = (str(path), model)
  return out


def padded_batch(vocab: int, lengths: list[int], total: int, left: bool, seed: int = 0):
  """(tokens, positions, mask) with real tokens of the given lengths padded to `total`."""
  rng = np.random.default_rng(seed)
  b = len(lengths)
  tokens = rng.integers(3, vocab, size=(b, total)).astype(np.int32)
  mask = np.zeros((b, total), bool)
  for r, n in enumerate(lengths):
    if left:
      mask[r, total - n:] = True
    else:
      mask[r, :n] = True
  tokens = np.where(mask, tokens, 0).astype(np.int32)
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return tokens, positions, mask


@pytest.fixture(scope="session")
def hf_helpers():
  """The helpers above, for test modules (importlib mode cannot import conftest)."""
  import types

  return types.SimpleNamespace(make_hf_model=make_hf_model, hf_logits=hf_logits,
                               padded_batch=padded_batch, specs=HF_SPECS, family_of=FAMILY_OF)


@pytest.fixture(scope="session")
def tiny_model():
  """name -> randomly initialised (seed 0) preset model, built once per session.

  Eager creation compiles each random op once, so sharing the models keeps the suite fast.
  Tests must not mutate them.
  """
  from jaxrl_scale.models import config, transformer

  built = {}

  def get(name: str):
    if name not in built:
      built[name] = transformer.create_model(config.preset(name), seed=0)
    return built[name]

  return get
