"""Tokenizers with a chat template that has a tool role, built offline with `tokenizers`,
and a tiny random Qwen2 checkpoint whose vocabulary matches one of them."""

import json
import os

import pytest

# ChatML with a tool role; content is rendered as is (no trim), so a model turn's text is
# its content exactly. Unknown roles raise, as many Hub templates do.
CHATML_TOOL = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "{% if loop.first %}{{ bos_token }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# The tiny model of tests/generation/conftest.py (256 bytes + specials, rounded up).
_COMMON = dict(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               rms_norm_eps=1e-5, bos_token_id=256, eos_token_id=260, pad_token_id=258)
QWEN2 = dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6)

SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
_CORPUS = ["What is 12 * 34? Let me compute it with the tool.", "print(123 * 4567)",
           "The answer is 561741.", "That is not correct; try again."] * 4


def _write_config(directory, tok):
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
               "eos_token": "<|im_end|>", "pad_token": "<pad>",
               "chat_template": CHATML_TOOL}, f)
  from jaxrl_scale.models import tokenizer as tokenizer_lib
  return tokenizer_lib.load_tokenizer(directory)


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
  """A trained byte-level BPE (merges: a word may have several tokenizations) with the
  ChatML tool template; eos <|im_end|>."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS, trainer=trainer)
  return _write_config(str(tmp_path_factory.mktemp("chat_tok")), tok)


def _byte_chat_tokenizer(directory):
  """Ids 0..255 are bytes, 256.. SPECIALS: fits the tiny model's 272-entry vocabulary."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers

  from jaxrl_scale.models import tokenizer as tokenizer_lib

  tok = tokenizers.Tokenizer(models.BPE(vocab=tokenizer_lib.byte_level_vocab(), merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(SPECIALS)
  return _write_config(directory, tok)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
  """(our tiny random Qwen2, its byte-level chat tokenizer)."""
  from jaxrl_scale.models import hf_io
  from tests.hf_random import random_hf_model

  path = str(tmp_path_factory.mktemp("env_qwen2"))
  random_hf_model(QWEN2, _COMMON, seed=10, scale=0.3).save_pretrained(path)
  tok = _byte_chat_tokenizer(path)
  return hf_io.load_hf_model(path)[0], tok
