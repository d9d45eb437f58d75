"""Tiny random Hugging Face checkpoints (Qwen2 with q/k/v bias, Llama, Qwen3) with a
byte-level tokenizer.json.

Every engine test uses these directories and one sampler shape (SAMPLER below), so the
jitted prefill and decode programs compile once per family and are shared across tests.
"""

import json
import os
import types

import numpy as np
import pytest

from tests.hf_random import random_hf_model

VOCAB = 272  # 256 byte tokens + specials, rounded up
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=257, pad_token_id=258)
SPECS = {
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "llama": dict(model_type="llama", tie_word_embeddings=False, rope_theta=10000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=16)),
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=False, rope_theta=1e6, head_dim=8),
}
SPECIALS = ["<s>", "</s>", "<pad>", "<think>", "</think>"]


def make_hf_model(spec: dict, seed: int):
  """A float32 eval-mode transformers model whose weights are all random and O(0.3)."""
  return random_hf_model(spec, _COMMON, seed, scale=0.3)


def write_byte_tokenizer(directory: str) -> None:
  """A byte-level BPE without merges: ids 0..255 are bytes, then the special tokens."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers

  from jaxrl_scale.models import tokenizer as tokenizer_lib

  tok = tokenizers.Tokenizer(models.BPE(vocab=tokenizer_lib.byte_level_vocab(), merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(SPECIALS[:3])
  tok.add_tokens(SPECIALS[3:])
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
               "eos_token": "</s>", "pad_token": "<pad>"}, f)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """family -> SimpleNamespace(path, hf_model) for every entry of SPECS."""
  out = {}
  for i, (name, spec) in enumerate(SPECS.items()):
    hf_model = make_hf_model(spec, seed=10 + i)
    path = str(tmp_path_factory.mktemp(f"gen_{name}"))
    hf_model.save_pretrained(path)
    write_byte_tokenizer(path)
    out[name] = types.SimpleNamespace(path=path, hf_model=hf_model)
  return out


@pytest.fixture(scope="session")
def loaded(hf_checkpoints):
  """family -> (our model, tokenizer), each loaded once per session when first used."""
  from jaxrl_scale.models import hf_io
  from jaxrl_scale.models import tokenizer as tokenizer_lib

  class Loaded(dict):
    def __missing__(self, name):
      ck = hf_checkpoints[name]
      self[name] = (hf_io.load_hf_model(ck.path)[0], tokenizer_lib.load_tokenizer(ck.path))
      return self[name]

  return Loaded()


@pytest.fixture(scope="session")
def prompts():
  """Eight prompts of different lengths (1..14 tokens), bytes only."""
  rng = np.random.default_rng(0)
  return [rng.integers(0, 256, n).tolist() for n in (3, 11, 6, 1, 14, 8, 2, 9)]
