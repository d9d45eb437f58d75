"""PromptSource: seeded validation split, length filter, templates, exact resume, keep hook."""

import dataclasses
import json
import os
import random

import pytest

from jaxrl_scale import config
from jaxrl_scale.data import sources
from jaxrl_scale.data import tasks
from jaxrl_scale.data import templates
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib

_BYTE = tokenizer_lib.ByteTokenizer()
_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
             "{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=290, special_tokens=["<s>", "</s>", "<|im_start|>",
                                                               "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([r["prompt"] for r in tasks.arithmetic(200, 0, style="instruct")],
                          trainer=trainer)
  tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                     special_tokens=[("<s>", 0)])
  directory = str(tmp_path_factory.mktemp("hf"))
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
               "eos_token": "</s>", "chat_template": _TEMPLATE}, f)
  return directory


def _source(recs, **kw):
  kw.setdefault("max_prompt_tokens", 64)
  return sources.PromptSource(recs, _BYTE, **kw)


def test_validation_split_is_seeded_and_order_independent():
  recs = tasks.arithmetic(120, 0)
  a = _source(recs, num_validation=15, seed=3)
  shuffled = list(recs)
  random.Random(0).shuffle(shuffled)
  b = _source(shuffled, num_validation=15, seed=3)
  val_a = [p.id for p in a.validation()]
  assert val_a == [p.id for p in b.validation()] and len(val_a) == 15
  train_a = {p.id for p in a.take(a.num_train)}
  assert train_a == {p.id for p in b.take(b.num_train)}
  assert not train_a & set(val_a) and len(train_a | set(val_a)) == 120
  assert set(val_a) != {p.id for p in _source(recs, num_validation=15, seed=4).validation()}
  assert a.stats()["records"] == 120 and a.num_train == 105


def test_length_limit_drops_and_counts():
  # Byte tokenizer + plain template: BOS + the prompt's bytes. d2 prompts are 7 tokens,
  # d3 prompts 9 tokens.
  recs = tasks.arithmetic(30, 0, digits=2) + tasks.arithmetic(20, 0, digits=3)
  src = _source(recs, max_prompt_tokens=7, num_validation=10, seed=0)
  stats = src.stats()
  assert stats["dropped_too_long"] + stats["validation_dropped_too_long"] == 20
  assert src.num_train == 40 - stats["dropped_too_long"]  # 50 records, 10 held out
  assert src.num_validation == 10 - stats["validation_dropped_too_long"]
  assert src.num_train + src.num_validation == 30
  for p in src.take(src.num_train) + src.validation():
    assert len(p.token_ids) == 7 and p.token_ids[0] == _BYTE.bos_id
    assert _BYTE.decode(p.token_ids, skip_special_tokens=True) == p.prompt == p.text
  with pytest.raises(UserError, match=r"prompts: no training prompt fits max_prompt_tokens=3"):
    _source(recs, max_prompt_tokens=3)


def test_epochs_reshuffle_deterministically():
  recs = tasks.countdown(40, 1)
  src = _source(recs, num_validation=5, seed=9)
  epoch0 = [p.id for p in src.take(35)]
  epoch1 = [p.id for p in src.take(35)]
  assert sorted(epoch0) == sorted(epoch1) and len(set(epoch0)) == 35
  assert epoch0 != epoch1
  assert src.stats()["epoch"] == 1
  again = _source(recs, num_validation=5, seed=9)
  assert [p.id for p in again.take(70)] == epoch0 + epoch1


@pytest.mark.parametrize("first", [0, 7, 33, 35, 50])
def test_resume_continues_exactly(first):
  recs = tasks.arithmetic(40, 2)
  dropped = {r["id"] for r in recs[::4]}
  keep = lambda prompt_id: prompt_id not in dropped  # noqa: E731
  src = _source(recs, num_validation=5, seed=1, keep=keep)
  src.take(first)
  state = json.loads(json.dumps(src.state_dict()))  # checkpoints store plain JSON
  expected = src.take(45)  # crosses at least one epoch boundary
  resumed = _source(recs, num_validation=5, seed=1, keep=keep)
  resumed.load_state_dict(state)
  assert resumed.take(45) == expected
  assert not dropped & {p.id for p in expected}
  assert src.stats()["filtered"] > 0


def test_keep_hook_exhaustion_and_set_keep():
  src = _source(tasks.arithmetic(10, 0), num_validation=2)
  src.set_keep(lambda prompt_id: False)
  with pytest.raises(sources.PromptsExhausted, match="dropped all 8 training prompts"):
    next(src)
  src.set_keep(None)
  assert next(src).id


def test_load_state_dict_rejects_mismatches():
  src = _source(tasks.arithmetic(20, 0), num_validation=4, seed=5)
  good = src.state_dict()
  for bad, match in [({**good, "seed": 6}, r"seed 6 differs .* seed 5 \(data.seed\)"),
                     ({**good, "num_train": 17}, r"num_train 17 differs from 16"),
                     ({**good, "index": 17}, r"index 17 out of range"),
                     ({**good, "epoch": True}, r"'epoch' is missing or not an integer"),
                     ({k: v for k, v in good.items() if k != "index"}, r"'index' is missing")]:
    with pytest.raises(UserError, match=match):
      src.load_state_dict(bad)


def test_bad_records_and_sizes():
  recs = tasks.arithmetic(5, 0)
  broken = recs[:2] + [{k: v for k, v in recs[2].items() if k != "answer"}] + recs[3:]
  with pytest.raises(UserError, match=r"my.jsonl: record 2: field 'answer' is missing"):
    sources.PromptSource(broken, _BYTE, max_prompt_tokens=64, origin="my.jsonl")
  with pytest.raises(UserError, match=r"num_validation=5 must be in \[0, 5\)"):
    _source(recs, num_validation=5)


def test_chat_template_matches_transformers(hf_dir):
  transformers = pytest.importorskip("transformers")
  reference = transformers.AutoTokenizer.from_pretrained(hf_dir)
  tok = tokenizer_lib.load_tokenizer(hf_dir)
  recs = tasks.arithmetic(12, 0, style="instruct")
  src = sources.PromptSource(recs, tok, max_prompt_tokens=256, num_validation=2)
  for p in src.take(10) + src.validation():
    messages = [{"role": "user", "content": p.prompt}]
    assert p.text == reference.apply_chat_template(messages, add_generation_prompt=True,
                                                   tokenize=False)
    assert list(p.token_ids) == list(reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert p.text.startswith("<s><|im_start|>user\nCompute ")
  plain = templates.PromptTemplate(use_chat_template=False, plain_format="Q: {prompt}\nA:",
                                   system_prompt="Answer briefly.")
  src = sources.PromptSource(recs, tok, max_prompt_tokens=256, template=plain)
  p = next(src)
  assert p.text == f"Answer briefly.\n\nQ: {p.prompt}\nA:"
  assert list(p.token_ids) == reference.encode(p.text)  # plain: tokenizer adds its BOS
  with pytest.raises(UserError, match="no '{prompt}' placeholder"):
    templates.PromptTemplate(plain_format="Q:")


def _data_cfg(**kw):
  return config.DataConfig(**{"num_train": 30, "num_validation": 6, **kw})


def test_from_config_builtin_in_memory_and_tfds_agree(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  memory = sources.from_config(_data_cfg(source="countdown/n4"), _BYTE)
  prepared = sources.from_config(_data_cfg(source="countdown/n4", data_dir=str(tmp_path)),
                                 _BYTE)
  assert memory.num_train == prepared.num_train == 30
  assert [p.id for p in memory.validation()] == [p.id for p in prepared.validation()]
  assert ({p.id: p for p in memory.take(30)} == {p.id: p for p in prepared.take(30)})
  assert len(json.loads(next(memory).answer)["numbers"]) == 4


def test_from_config_local_files(tmp_path):
  path = tmp_path / "qa.jsonl"
  path.write_text("".join(json.dumps({"q": f"{i}+{i}=", "a": 2 * i}) + "\n" for i in range(12)))
  cfg = _data_cfg(source=str(path), prompt_field="q", answer_field="a", num_validation=2)
  src = sources.from_config(cfg, _BYTE)
  assert src.num_train == 10 and src.origin == str(path)
  p = next(src)
  assert p.task == "math" and p.answer == str(2 * int(p.prompt.split("+")[0]))
  assert p.id.startswith("qa-")
  pytest.importorskip("tensorflow_datasets")
  via_tfds = sources.from_config(dataclasses.replace(cfg, data_dir=str(tmp_path / "t")), _BYTE)
  assert [p.id for p in via_tfds.validation()] == [p.id for p in src.validation()]
  with pytest.raises(UserError, match=r"qa.jsonl: row 1: no field 'question'"):
    sources.from_config(dataclasses.replace(cfg, prompt_field="question"), _BYTE)


def test_from_config_bad_source():
  with pytest.raises(UserError, match=r"data.source: 'sudoku' is not a built-in task"):
    sources.from_config(_data_cfg(source="sudoku"), _BYTE)
  with pytest.raises(UserError, match=r"arithmetic: no preset 'd9'"):
    sources.from_config(_data_cfg(source="arithmetic/d9"), _BYTE)
