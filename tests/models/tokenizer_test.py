"""Tokenizer tests: byte round trips, and parity with transformers on a real tokenizer.json."""

import json
import os

import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib

_CHATML = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "{% if loop.first %}{{ bos_token }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}")

_CORPUS = [
    "What is 12 + 34? The answer is 46.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many.",
    "Let me think step by step. 3 * 7 = 21, so the answer is \\boxed{21}.",
    "Using the numbers [3, 5, 2], create an equation that equals 16.",
] * 4

_TEXTS = [
    "What is 12 + 34?",
    "Unseen wörds and émojis 🙂 still round-trip.",
    "  leading spaces, tabs\tand\nnewlines  ",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]

_CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 7*6=? "}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
     {"role": "user", "content": "sum 3 5"}],
]


def _write_tokenizer_dir(directory, chat_template=_CHATML, **config_overrides):
  """Trains a tiny byte-level BPE with the `tokenizers` library and saves an HF directory."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  specials = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS, trainer=trainer)
  tok.add_tokens(["<think>", "</think>"])
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
            "eos_token": "</s>", "pad_token": "<pad>", "clean_up_tokenization_spaces": False}
  if chat_template is not None:
    config["chat_template"] = chat_template
  config.update(config_overrides)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  return directory


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return _write_tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def reference(hf_dir):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(hf_dir)


# ----------------------------------------------------------------------------------------
# Byte tokenizer.


def test_byte_round_trip_and_ids():
  tok = tokenizer_lib.load_tokenizer("byte")
  assert isinstance(tok, tokenizer_lib.Tokenizer)
  for text in _TEXTS + ["<think>x</think>y", "ü<|eos|>"]:
    assert tok.decode(tok.encode(text)) == text
  assert tok.encode("ab") == [97, 98]
  assert tok.encode("ab", add_special_tokens=True) == [tok.bos_id, 97, 98]
  assert tok.encode("<think>é</think>") == [tok.THINK, 0xC3, 0xA9, tok.END_THINK]
  assert tok.vocab_size == 264 and tok.vocab_size % 8 == 0
  assert max(tok.SPECIAL_TOKENS.values()) < tok.vocab_size
  assert len({tok.pad_id, tok.bos_id, tok.eos_id, tok.THINK, tok.END_THINK}) == 5


def test_byte_decode_specials_and_invalid_bytes():
  tok = tokenizer_lib.ByteTokenizer()
  ids = [tok.BOS, *b"4", tok.THINK, *b"6", tok.EOS, tok.PAD, 262]
  assert tok.decode(ids) == "<|bos|>4<think>6<|eos|><|pad|>"
  assert tok.decode(ids, skip_special_tokens=True) == "4<think>6"
  # A sampled partial UTF-8 character must not raise.
  assert tok.decode([0xC3]) == "\ufffd"
  assert tok.token_to_id("</think>") == tok.END_THINK
  assert tok.token_to_id("a") == 97 and tok.token_to_id("ab") is None


def test_byte_plain_template():
  tok = tokenizer_lib.ByteTokenizer()
  assert tok.apply_chat_template("12+34=") == "12+34="
  assert tok.apply_chat_template("7-2=", tokenize=True) == [tok.BOS, *b"7-2="]
  text = tok.apply_chat_template(_CONVERSATIONS[1])
  assert text == "System: Be brief.\n\nUser:  7*6=? \n\nAssistant:"


def test_byte_decode_joins_the_bytes_around_a_skipped_token():
  tok = tokenizer_lib.ByteTokenizer()
  # "é" is C3 A9: a PAD (skipped) or an unused id between its bytes leaves no mark, as in
  # tokenizers' decode; a kept special token splits it into two replacement characters.
  assert tok.decode([0xC3, tok.PAD, 0xA9], skip_special_tokens=True) == "é"
  assert tok.decode([0xC3, 262, 0xA9]) == "é"
  assert tok.decode([0xC3, tok.PAD, 0xA9]) == "\ufffd<|pad|>\ufffd"


def test_byte_tokenizer_as_hf_files_encodes_and_decodes_the_same(tmp_path):
  # The files `export` writes for a byte-tokenizer run, read by transformers and by our
  # HFTokenizer (the `tokenizers` library), must give the ids the policy was trained on.
  transformers = pytest.importorskip("transformers")
  import random

  byte = tokenizer_lib.ByteTokenizer()
  byte.write_hf_files(str(tmp_path))
  ours = tokenizer_lib.load_tokenizer(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert (ours.bos_id, ours.eos_ids, ours.pad_id) == (257, (258,), 256)
  assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (257, 258, 256)
  assert ours.chat_template is None
  gen_config = transformers.GenerationConfig.from_pretrained(str(tmp_path))
  assert (gen_config.eos_token_id, gen_config.pad_token_id) == (258, 256)
  assert byte.encode("ab\x00 é🙂") == [97, 98, 0, 32, 0xC3, 0xA9, 0xF0, 0x9F, 0x99, 0x82]

  rng = random.Random(0)
  pool = [*"0123456789+-*= abcXYZ\n\t\x00\x7f\x85\xa0\xad", "é", "ß", "日", "🙂", "\u0100",
          "<think>", "</think>", "<|eos|>", "<|pad|>", "<|bos|>", "<|", "|>", "<thin"]
  texts = _TEXTS + ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 30)))
                    for _ in range(300)]
  for text in texts:
    for special in (False, True):
      want = byte.encode(text, add_special_tokens=special)
      assert ours.encode(text, add_special_tokens=special) == want, text
      assert theirs(text, add_special_tokens=special).input_ids == want, text
  for conversation in ["12+34=", *_CONVERSATIONS]:
    assert ours.apply_chat_template(conversation, tokenize=True) == byte.apply_chat_template(
        conversation, tokenize=True)
  for _ in range(2000):  # any ids a policy can sample, partial UTF-8 characters included
    ids = [rng.randrange(byte.vocab_size) for _ in range(rng.randrange(1, 12))]
    for skip in (False, True):
      want = byte.decode(ids, skip_special_tokens=skip)
      assert ours.decode(ids, skip_special_tokens=skip) == want, ids
      assert theirs.decode(ids, skip_special_tokens=skip) == want, ids


# ----------------------------------------------------------------------------------------
# Hugging Face tokenizer: parity with transformers on the same directory.


def test_hf_encode_decode_match_transformers(hf_dir, reference):
  tok = tokenizer_lib.load_tokenizer(hf_dir)
  assert isinstance(tok, tokenizer_lib.HFTokenizer)
  assert tok.vocab_size == len(reference)
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (
      reference.bos_token_id, reference.eos_token_id, reference.pad_token_id)
  for text in _TEXTS:
    for special in (False, True):
      ids = tok.encode(text, add_special_tokens=special)
      assert ids == reference.encode(text, add_special_tokens=special), (text, special)
      for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == reference.decode(
            ids, skip_special_tokens=skip), (text, skip)
  assert tok.encode_batch(_TEXTS) == [reference.encode(t, add_special_tokens=False)
                                      for t in _TEXTS]
  assert tok.token_to_id("<think>") == reference.convert_tokens_to_ids("<think>")
  # Byte-level BPE round-trips unseen text exactly: the data layer relies on it.
  assert tok.decode(tok.encode(_TEXTS[1])) == _TEXTS[1]


def test_hf_chat_template_matches_transformers(hf_dir, reference):
  tok = tokenizer_lib.load_tokenizer(hf_dir)
  for conversation in _CONVERSATIONS:
    for add_generation_prompt in (False, True):
      ours = tok.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
      theirs = reference.apply_chat_template(
          conversation, add_generation_prompt=add_generation_prompt, tokenize=False)
      assert ours == theirs
    ours_ids = tok.apply_chat_template(conversation, tokenize=True)
    theirs_ids = reference.apply_chat_template(conversation, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    assert ours_ids == list(theirs_ids)
  kwargs = {"enable_thinking": False}
  assert tok.apply_chat_template("2+2?", **kwargs) == reference.apply_chat_template(
      [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False,
      **kwargs)
  assert "<think>\n\n</think>" in tok.apply_chat_template("2+2?", **kwargs)


def test_hf_template_files_and_eos(tmp_path):
  d = _write_tokenizer_dir(str(tmp_path / "t"), chat_template=None)
  tok = tokenizer_lib.load_tokenizer(d)
  assert tok.chat_template is None
  assert tok.apply_chat_template("plain prompt") == "plain prompt"
  assert tok.apply_chat_template("x", tokenize=True) == tok.encode("x", add_special_tokens=True)
  # chat_template.jinja (transformers >= 4.43 layout) and generation_config.json eos ids.
  with open(os.path.join(d, "chat_template.jinja"), "w") as f:
    f.write("{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
            "{% generation %}{% if add_generation_prompt %}>{% endif %}{% endgeneration %}")
  im_end = tok.token_to_id("<|im_end|>")
  with open(os.path.join(d, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [tok.eos_id, im_end]}, f)
  tok = tokenizer_lib.load_tokenizer(os.path.join(d, "tokenizer.json"))
  assert tok.apply_chat_template("q") == "[q]>"
  assert tok.eos_ids == (tok.eos_id, im_end)


def test_hf_config_without_pad_uses_eos(tmp_path):
  d = _write_tokenizer_dir(str(tmp_path / "t"), pad_token=None, bos_token=None)
  tok = tokenizer_lib.load_tokenizer(d)
  assert tok.bos_id is None and tok.pad_id == tok.eos_id


def test_template_sandbox_and_raise_exception(tmp_path):
  tok = tokenizer_lib.load_tokenizer(_write_tokenizer_dir(str(tmp_path / "a")))
  with pytest.raises(UserError, match="unknown role tool"):
    tok.apply_chat_template([{"role": "tool", "content": "x"}])
  escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
  tok = tokenizer_lib.load_tokenizer(_write_tokenizer_dir(str(tmp_path / "b"),
                                                          chat_template=escape))
  with pytest.raises(UserError, match="chat template"):
    tok.apply_chat_template("x")
  tok = tokenizer_lib.load_tokenizer(_write_tokenizer_dir(str(tmp_path / "c"),
                                                          chat_template="{% for %}"))
  with pytest.raises(UserError, match=r"tokenizer_config.json: chat_template line 1"):
    tok.apply_chat_template("x")


def test_load_errors_are_one_line(tmp_path):
  with pytest.raises(UserError, match="no such file or directory") as e:
    tokenizer_lib.load_tokenizer(str(tmp_path / "missing"))
  assert "\n" not in str(e.value)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(UserError, match=r"empty/tokenizer.json: not found"):
    tokenizer_lib.load_tokenizer(str(empty))
  (empty / "tokenizer.json").write_text("{not json")
  with pytest.raises(UserError, match=r"tokenizer.json: not a readable tokenizer.json"):
    tokenizer_lib.load_tokenizer(str(empty))
  d = _write_tokenizer_dir(str(tmp_path / "bad_cfg"))
  with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
    f.write('{"eos_token": "</s>",\n "bos_token": }')
  with pytest.raises(UserError, match=r"tokenizer_config.json: invalid JSON at line 2"):
    tokenizer_lib.load_tokenizer(d)
  d = _write_tokenizer_dir(str(tmp_path / "bad_bos"), bos_token="<nope>")
  with pytest.raises(UserError, match=r"bos_token '<nope>' is not in the vocabulary"):
    tokenizer_lib.load_tokenizer(d)
