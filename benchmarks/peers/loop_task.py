"""The whole-loop comparison's task: one checkpoint and one prompt stream every side loads.

    python benchmarks/peers/loop_task.py /tmp/jaxrl_peers/loop_qwen3   # builds it (~1 min)

The checkpoint is a small Qwen3 (`SHAPE`, vocabulary 264: 256 bytes and two special
tokens) with a byte-level `tokenizer.json` built with the `tokenizers` library, so our
`model.tokenizer`, transformers' AutoTokenizer (TRL) and Tunix's Hugging Face tokenizer
adapter all read the same ids. No BOS (as Qwen's), `<|endoftext|>` ends a completion,
`<|pad|>` pads. A random model never writes a correct sum, so every group's rewards would
be equal and no side would have a gradient worth computing (ours would skip the step:
zero-variance filter). The random weights (`random_checkpoint.write_qwen3`, torch seed 0)
are therefore warm-started here with a short supervised run in torch on `arithmetic/add2`
("12+34=" -> "46<|endoftext|>", loss on the answer), stopped once sampling at
temperature 1 passes `stop_pass_rate` of held-out problems (like configs/cpu_tiny.yaml's
SFT warm start): groups of 8 then mostly hold both right and wrong answers.

The prompts of each step come from our own prompt source (`data.sources.from_config` on
the run's data config): the peers get them in the order our loop admits them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

EOS, PAD = "<|endoftext|>", "<|pad|>"
EOS_ID, PAD_ID = 256, 257
SHAPE = dict(vocab_size=264, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=64, tie_word_embeddings=True, rope_theta=10000.0,
             bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
             initializer_range=0.1)
TASK = "arithmetic/add2"


def write_tokenizer(directory: str) -> None:
  """A byte-level BPE without merges: ids 0..255 are the bytes, then EOS and PAD."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers

  from jaxrl_scale.models import tokenizer as tokenizer_lib

  tok = tokenizers.Tokenizer(models.BPE(vocab=tokenizer_lib.byte_level_vocab(), merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([EOS, PAD])
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS,
               "pad_token": PAD, "bos_token": None, "padding_side": "left"}, f)


def task_records(n: int, seed: int) -> list[dict[str, str]]:
  from jaxrl_scale.data import tasks

  name, _, params = tasks.parse_task(TASK)
  return tasks.generate(name, n, seed, **params)


def warm_start(model, records: list[dict], *, steps: int = 1500, batch: int = 128,
               lr: float = 3e-3, check_every: int = 25, stop_pass_rate: float = 0.35,
               dev: int = 128, log=print) -> dict:
  """Supervised steps on prompt + answer + EOS (loss on answer + EOS) until sampling at
  temperature 1 passes `stop_pass_rate` of `dev` held-out records, or `steps` ran."""
  import numpy as np
  import torch

  from jaxrl_scale.rewards import registry

  verdict = registry.get_reward("arithmetic")
  train, held = records[dev:], records[:dev]
  rng = np.random.default_rng(0)
  opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
  enc = [(list(r["prompt"].encode()), list(r["answer"].encode()) + [EOS_ID]) for r in train]
  width = max(len(p) + len(a) for p, a in enc)
  pass_rate, step, start = 0.0, 0, time.perf_counter()
  for step in range(1, steps + 1):
    model.train()
    rows = [enc[i] for i in rng.integers(0, len(enc), batch)]
    ids = torch.full((batch, width), PAD_ID)
    labels = torch.full((batch, width), -100)
    for k, (p, a) in enumerate(rows):
      ids[k, :len(p) + len(a)] = torch.tensor(p + a)
      labels[k, len(p):len(p) + len(a)] = torch.tensor(a)
    # transformers shifts the labels itself: position t predicts labels[t + 1].
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % check_every == 0:
      pass_rate = sampled_pass_rate(model, held, verdict)
      log(f"  warm start step {step}: loss {loss.item():.3f}, sampled pass rate "
          f"{pass_rate:.2f}")
      if pass_rate >= stop_pass_rate:
        break
  model.eval()
  return {"steps": step, "pass_rate": pass_rate, "dev_prompts": dev,
          "seconds": round(time.perf_counter() - start, 1)}


def sampled_pass_rate(model, records: list[dict], verdict) -> float:
  """The fraction of `records` one sample at temperature 1 answers right."""
  import torch

  model.eval()
  width = max(len(r["prompt"]) for r in records)
  ids = torch.tensor([[PAD_ID] * (width - len(r["prompt"])) + list(r["prompt"].encode())
                      for r in records])
  with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=(ids != PAD_ID).long(),
                         do_sample=True, temperature=1.0, top_k=0, max_new_tokens=6,
                         eos_token_id=EOS_ID, pad_token_id=PAD_ID)
  right = 0
  for r, row in zip(records, out[:, width:].tolist()):
    text = bytes(t for t in row if t < 256).decode("utf-8", "replace")
    right += bool(getattr(verdict(text, r["answer"]), "correct", False))
  return right / len(records)


def build_checkpoint(path: str, log=print, shape: dict | None = None, **warm) -> dict:
  """Writes the task's checkpoint (`shape`, default SHAPE; `warm` goes to warm_start) to
  `path` through PATH.partial (a build killed midway leaves nothing that looks whole),
  unless it is there. Returns what the build did (also in PATH/loop_task.json)."""
  if os.path.isfile(os.path.join(path, "loop_task.json")):
    with open(os.path.join(path, "loop_task.json")) as f:
      return json.load(f)
  import torch
  import transformers

  from benchmarks.common import random_checkpoint

  partial = path + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  # One thread: a 0.8M-parameter model gains nothing from more, and on a shared 2-core
  # machine two threads against other work took 431 s instead of 51 s (2026-12-06).
  torch.set_num_threads(1)
  torch.manual_seed(0)
  shape = dict(SHAPE, **(shape or {}))
  log(f"=== the loop task's checkpoint: random Qwen3 "
      f"({random_checkpoint.write_qwen3(partial, 'float32', **shape)})")
  model = transformers.AutoModelForCausalLM.from_pretrained(partial, dtype=torch.float32)
  torch.manual_seed(0)
  info = {"shape": shape, "task": TASK,
          "warm_start": warm_start(model, task_records(8100, seed=1), log=log, **warm)}
  model.save_pretrained(partial)
  write_tokenizer(partial)
  with open(os.path.join(partial, "loop_task.json"), "w") as f:
    json.dump(info, f, indent=1)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(partial, path)
  return info


def step_prompts(data_cfg, tokenizer_dir: str, steps: int, per_step: int) -> list[list[dict]]:
  """The prompts of each step, in the order our prompt source yields them (the order our
  loop admits them): `steps` lists of `per_step` {"prompt", "answer", "id"}."""
  from jaxrl_scale.data import sources
  from jaxrl_scale.models import tokenizer as tokenizer_lib

  source = sources.from_config(data_cfg, tokenizer_lib.load_tokenizer(tokenizer_dir))
  flat = [{"prompt": p.text, "answer": p.answer, "id": p.id}
          for p in source.take(steps * per_step)]
  return [flat[i * per_step:(i + 1) * per_step] for i in range(steps)]


if __name__ == "__main__":
  if len(sys.argv) != 2:
    print("usage: loop_task.py DIR", file=sys.stderr)
    sys.exit(2)
  print(json.dumps(build_checkpoint(sys.argv[1]), indent=1))
