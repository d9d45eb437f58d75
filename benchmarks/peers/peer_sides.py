"""One side of `peers.py` in a process of its own: ours, Tunix or TRL.

    python benchmarks/peer_sides.py ours  # our venv (imports jaxrl_scale)
    /work/peers-venv/bin/python benchmarks/peer_sides.py tunix

peers.py starts one per side, each in the Python that has that side's packages (Tunix and
TRL pin other transformers / safetensors versions than ours), and alternates timed calls
between them, so only one side computes at a time. The protocol is one JSON object per line:
a request on stdin, the answer on stdout (the library's own prints go to stderr). Every
answer has "ok"; a failure is {"ok": false, "error": one line}. The timings are taken here,
around the library call alone (tokenising in and out included where the library's API
takes text, as Tunix's sampler does).

This file imports only the standard library and NumPy at the top: each side imports its
own stack when it loads, so the Tunix process never imports jaxrl_scale, nor ours Tunix.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
import traceback

import numpy as np

# The packages whose versions each side reports (absent ones are left out).
VERSIONED = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers",
             "safetensors", "google-tunix", "trl", "accelerate", "datasets", "tokenizers",
             "jaxrl-scale")

# The package each side needs, by import name and distribution name.
NEEDS = {"ours": ("jaxrl_scale", "jaxrl-scale"), "tunix": ("tunix", "google-tunix"),
         "trl": ("trl", "trl")}


def versions() -> dict[str, str]:
  out = {"python": sys.version.split()[0]}
  for name in VERSIONED:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def all_packages() -> dict[str, str]:
  """Every distribution installed in this Python, name to version (a venv's pip freeze)."""
  return dict(sorted((d.metadata["Name"].lower(), d.version)
                     for d in importlib.metadata.distributions() if d.metadata["Name"]))


def hf_config(path: str) -> dict:
  with open(os.path.join(path, "config.json")) as f:
    return json.load(f)


def rope_theta(cfg: dict) -> float:
  """config.json's RoPE base: transformers 5 writes it under rope_parameters."""
  return float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta",
                                                                               10000.0)))


class IdTokenizer:
  """Tunix's sampler takes text: a "tokenizer" whose text is the token ids written out
  ("17 4 912"), so prompts of random ids go in and come out unchanged. No BOS (bos_id 0 is
  falsy to Tunix), pad 0 as the checkpoint's pad_token_id."""

  def __init__(self, eos_id: int, pad_id: int = 0):
    self._eos, self._pad = eos_id, pad_id

  def encode(self, text: str, **_) -> list[int]:
    return [int(x) for x in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0

  def eos_id(self) -> int:
    return self._eos

  def pad_id(self) -> int:
    return self._pad


# ---------------------------------------------------------------------------------- ours


class Ours:
  """jaxrl_scale's sampler (continuous batching, paged KV) and trainer."""

  name = "ours"

  def __init__(self):
    self.model = self.model_cfg = None
    self.samplers: dict = {}

  def load(self, model: str, dtype: str = "float32") -> dict:
    from jaxrl_scale.models import hf_io

    self.path = model
    self.model, self.model_cfg = hf_io.load_hf_model(model, param_dtype=dtype)
    return {}

  def sample(self, prompts, max_new: int, eos, slots: int, buckets,
             decode_chunk: int = 16) -> dict:
    """Greedy completions of `prompts` (lists of ids) with `slots` concurrent sequences;
    a finished sequence's slot takes the next prompt at once (continuous batching)."""
    from jaxrl_scale import config
    from jaxrl_scale.generation import engine, records

    key = (slots, max_new, tuple(eos), tuple(buckets), decode_chunk)
    if key not in self.samplers:
      cfg = config.SamplerConfig(num_slots=slots, max_new_tokens=max_new, temperature=0.0,
                                 top_k=0, top_p=1.0, decode_chunk=decode_chunk,
                                 prompt_buckets=tuple(buckets))
      self.samplers[key] = engine.Sampler(self.model, cfg, eos_ids=tuple(eos))
    sampler = self.samplers[key]
    reqs = [records.Request(list(p), prompt_id=i) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    outs = sampler.generate(reqs)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": [o.tokens.tolist() for o in outs]}

  def floor(self, rows: int, prompt_len: int, steps: int) -> dict:
    """A uniform-length sampling call's weight matmuls alone, timed: the prompts' and then
    `steps` decode steps' (benchmarks/sampler's `floor_program`, at this model's shapes and
    dtype), what no sampler on XLA:CPU's matmuls can beat."""
    import jax  # pylint: disable=g-import-not-at-top

    from benchmarks.sampler import sampler_bench  # pylint: disable=g-import-not-at-top

    key = ("floor", rows, prompt_len, steps)
    if key not in self.samplers:
      run, args = sampler_bench.floor_program(self.model_cfg, rows, self.model_cfg.dtype,
                                              steps=steps, prompt_len=prompt_len)
      jax.block_until_ready(run(*args))  # compiles
      self.samplers[key] = run, args
    run, args = self.samplers[key]
    start = time.perf_counter()
    jax.block_until_ready(run(*args))
    return {"seconds": time.perf_counter() - start, "tokens": rows * steps}

  def train(self, batch: dict, steps: int, lr: float, remat: str = "none",
            dtype: str = "float32") -> dict:
    """`steps` GRPO updates (no KL, sample average) on one batch through `rl.train_step.
    Trainer`, from the checkpoint's weights each call: the losses and each step's time
    (the first includes the compile)."""
    import jax
    from jaxrl_scale import config
    from jaxrl_scale.models import hf_io
    from jaxrl_scale.rl import batch as batch_lib
    from jaxrl_scale.rl import train_step

    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model, _ = hf_io.load_hf_model(self.path, mesh, param_dtype=dtype)
    host = batch_lib.pack_rl(batch["prompts"], batch["completions"], batch["gen_logp"],
                             np.asarray(batch["advantages"], np.float32),
                             seq_len=batch["prompt_len"] + batch["completion_len"])
    rl = config.RLConfig(loss="grpo", aggregation="sample_avg", clip_low=0.2,
                         generations_per_prompt=len(batch["completions"][0]))
    optim = config.OptimConfig(lr=lr, warmup_steps=0, remat=remat)
    trainer = train_step.Trainer(model, mesh, optim,
                                 train_step.RLObjective(rl, temperature=1.0))
    placed = trainer.shard_batch(host)
    losses, seconds = [], []
    for _ in range(steps):
      start = time.perf_counter()
      loss = trainer.step(placed)["loss"]
      losses.append(float(loss))  # waits for the step
      seconds.append(time.perf_counter() - start)
    return {"losses": losses, "seconds": seconds}


# --------------------------------------------------------------------------------- tunix


class Tunix:
  """Tunix's vanilla JAX sampler (static batch, dense KV cache of prompt + budget)."""

  name = "tunix"

  def __init__(self):
    self.model = None
    self.samplers: dict = {}

  def load(self, model: str, dtype: str = "float32") -> dict:
    import jax
    import jax.numpy as jnp
    from tunix.models.qwen3 import model as qwen3
    from tunix.models.qwen3 import params as qwen3_params

    c = hf_config(model)
    self.path, self.hf = model, c
    self.cfg = qwen3.ModelConfig(
        num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"],
        embed_dim=c["hidden_size"], hidden_dim=c["intermediate_size"],
        num_heads=c["num_attention_heads"], head_dim=c["head_dim"],
        num_kv_heads=c["num_key_value_heads"], rope_theta=int(rope_theta(c)),
        norm_eps=c["rms_norm_eps"], use_tied_embedding=c["tie_word_embeddings"],
        dtype=getattr(jnp, dtype), param_dtype=getattr(jnp, dtype))
    # Auto axes: Tunix's model code shards by annotation (jax's default is Explicit now).
    self.mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                              axis_types=(jax.sharding.AxisType.Auto,) * 2)
    self.model = qwen3_params.create_model_from_safe_tensors(model, self.cfg, self.mesh,
                                                             dtype=getattr(jnp, dtype))
    return {}

  def sample(self, prompts, max_new: int, eos, slots: int, buckets) -> dict:
    """The prompts in batches of `slots` rows, each batch one call of Tunix's sampler
    (left-padded to the largest bucket, decoding until every row ended or the budget)."""
    import jax
    from tunix.generate import sampler as sampler_lib

    bucket = max(buckets)
    eos_ids = [int(e) for e in eos] or [-1]  # -1: no token ends a row (EOS off)
    # One sampler per EOS set: Tunix's jitted decode reads `sampler.eos_ids` when it
    # traces, so a later call with other ids would reuse the first ones.
    key = (bucket, max_new, tuple(eos_ids))
    if key not in self.samplers:
      cache = sampler_lib.CacheConfig(cache_size=bucket + max_new,
                                      num_layers=self.cfg.num_layers,
                                      num_kv_heads=self.cfg.num_kv_heads,
                                      head_dim=self.cfg.head_dim)
      self.samplers[key] = sampler_lib.Sampler(self.model, IdTokenizer(max(eos_ids[0], 0)),
                                               cache)
    sampler = self.samplers[key]
    texts = [" ".join(str(int(t)) for t in p) for p in prompts]
    tokens = []
    start = time.perf_counter()
    with jax.set_mesh(self.mesh):
      for i in range(0, len(texts), slots):
        out = sampler(texts[i:i + slots], max_generation_steps=max_new,
                      max_prompt_length=bucket, eos_tokens=eos_ids, temperature=0.0,
                      echo=False)
        tokens.extend(np.asarray(t).tolist() for t in out.tokens)
    seconds = time.perf_counter() - start
    # Tunix cuts a row before its EOS (and does not say which id it was); ours keeps it:
    # -1 stands for the EOS here, and peers.py writes ours' final EOS as -1 too.
    tokens = [t + [-1] if eos and len(t) < max_new else t for t in tokens]
    return {"seconds": seconds, "tokens": tokens}

  def train(self, batch: dict, steps: int, lr: float, remat: str = "none",
            dtype: str = "float32") -> dict:
    """`steps` updates on one batch with Tunix's registered "grpo" policy loss (beta 0: no
    KL, as ours; sequence-mean-token-mean = our sample average) in Tunix's RL trainer
    (`tunix.rl.trainer.Trainer`, the PeftTrainer subclass its GRPO learner trains the
    actor with), from the checkpoint's weights each call. The same AdamW as ours."""
    del remat  # Tunix's default RematConfig.NONE; ours runs with remat "none" to match
    import jax
    import jax.numpy as jnp
    import optax
    from tunix.rl import algo_core, common
    from tunix.rl import trainer as rl_trainer
    from tunix.rl.grpo import grpo_learner
    from tunix.sft import peft_trainer
    from tunix.models.qwen3 import params as qwen3_params

    model = qwen3_params.create_model_from_safe_tensors(self.path, self.cfg, self.mesh,
                                                        dtype=getattr(jnp, dtype))
    lp, lc = batch["prompt_len"], batch["completion_len"]
    prompt_ids, comp_ids, comp_mask, old_logp, adv = [], [], [], [], []
    for i, prompt in enumerate(batch["prompts"]):
      for j, comp in enumerate(batch["completions"][i]):
        prompt_ids.append([0] * (lp - len(prompt)) + list(prompt))  # left-padded
        comp_ids.append(list(comp) + [0] * (lc - len(comp)))
        comp_mask.append([1] * len(comp) + [0] * (lc - len(comp)))
        old_logp.append(list(batch["gen_logp"][i][j]) + [0.0] * (lc - len(comp)))
        adv.append(batch["advantages"][i][j])
    example = common.TrainExample(
        prompt_ids=jnp.asarray(prompt_ids, jnp.int32),
        prompt_mask=jnp.asarray(np.asarray(prompt_ids) != 0, jnp.int32),
        completion_ids=jnp.asarray(comp_ids, jnp.int32),
        completion_mask=jnp.asarray(comp_mask, jnp.int32),
        advantages=jnp.asarray(adv, jnp.float32), ref_per_token_logps=None,
        old_per_token_logps=jnp.asarray(old_logp, jnp.float32))
    algo = grpo_learner.GRPOConfig(num_generations=len(batch["completions"][0]), beta=0.0,
                                   epsilon=0.2, loss_agg_mode="sequence-mean-token-mean")
    algo.temperature = 1.0  # what GRPOLearner sets from the rollout config
    eos_id = int(self.hf.get("eos_token_id") or 0)
    # Our optimizer: AdamW with eps 1e-15 and decay on matrices only (rl/optimizer.py).
    tx = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-15, weight_decay=0.01,
                     mask=lambda p: jax.tree.map(lambda x: jnp.ndim(x) >= 2, p))
    with jax.set_mesh(self.mesh):
      trainer = rl_trainer.Trainer(model, tx, peft_trainer.TrainingConfig(
          eval_every_n_steps=10**9), custom_checkpoint_metadata_fn=dict)
      trainer.with_loss_fn(
          lambda model, train_example: algo_core.grpo_loss_fn(
              model, train_example, algo_config=algo, pad_id=0, eos_id=eos_id),
          has_aux=True)
      trainer.with_gen_model_input_fn(lambda x: {"train_example": x})
      step_fn, _ = trainer.jit_train_and_eval_step()
      losses, seconds = [], []
      for _ in range(steps):
        start = time.perf_counter()
        loss, _, _ = step_fn(example)
        losses.append(float(loss))
        seconds.append(time.perf_counter() - start)
    return {"losses": losses, "seconds": seconds}


# ----------------------------------------------------------------------------------- TRL


def cut_at_eos(row: list[int], eos: set[int]) -> list[int]:
  """A generated row up to and with its first EOS (generate pads the rows that ended
  before the batch did; GRPOTrainer masks after the first EOS the same way)."""
  cut = next((k for k, t in enumerate(row) if t in eos), None)
  return row if cut is None else row[:cut + 1]


def id_tokenizer_hf(vocab: int, eos_id: int, pad_id: int = 0):
  """The IdTokenizer as a transformers tokenizer (TRL's trainer takes one): a word-level
  vocabulary "0".."vocab-1" split on whitespace, so text of ids maps to the same ids."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.WordLevel({str(i): i for i in range(vocab)}, unk_token=str(pad_id)))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=str(pad_id),
                                 eos_token=str(eos_id), padding_side="left")


class Trl:
  """TRL's paths without vLLM: sampling is transformers' `generate` as GRPOTrainer calls it
  (`_generate_single_turn`: a left-padded batch, its GenerationConfig, no compile), the
  train step GRPOTrainer's own `compute_loss` on a batch in its layout, then backward and
  the optimizer the trainer builds (torch AdamW)."""

  name = "trl"

  def __init__(self):
    self.model = None

  def load(self, model: str, dtype: str = "float32") -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    self.path, self.hf, self.dtype = model, hf_config(model), getattr(torch, dtype)
    self.model = AutoModelForCausalLM.from_pretrained(model, dtype=self.dtype).eval()
    return {"threads": torch.get_num_threads()}

  def sample(self, prompts, max_new: int, eos, slots: int, buckets) -> dict:
    """The prompts in batches of `slots` rows, each one `generate` call, left-padded to the
    batch's longest prompt (TRL's tokenizer padding), greedy, stopping at `eos` (none: EOS
    off); cut after the first EOS as GRPOTrainer does, the EOS kept."""
    del buckets
    import torch
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, pad_token_id=0,
                           bos_token_id=None, eos_token_id=[int(e) for e in eos] or None,
                           disable_compile=True)
    eos_set = {int(e) for e in eos}
    tokens = []
    start = time.perf_counter()
    with torch.no_grad():
      for i in range(0, len(prompts), slots):
        rows = prompts[i:i + slots]
        width = max(len(p) for p in rows)
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in rows])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        tokens.extend(cut_at_eos(row, eos_set) for row in out[:, width:].tolist())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens}

  def trainer(self, rows: int, group: int, completion_len: int, lr: float,
              dtype: str = "float32", **config):
    """A GRPOTrainer on a fresh copy of the checkpoint: loss "grpo" (a sequence's token
    mean, averaged: our sample average), beta 0, epsilon 0.2, float32 (bf16 off: TRL's
    default is on), the optimizer with eps 1e-15 and decay 0.01, a constant rate."""
    import tempfile
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, dtype))
    tok = id_tokenizer_hf(self.hf["vocab_size"], int(self.hf.get("eos_token_id") or 2))
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_side_"), report_to=[], use_cpu=True,
        bf16=False, loss_type="grpo", beta=0.0, epsilon=0.2, learning_rate=lr,
        adam_epsilon=1e-15, weight_decay=0.01, lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=None, per_device_train_batch_size=rows,
        num_generations=group, max_completion_length=completion_len, logging_steps=1,
        save_strategy="no", **config)
    data = Dataset.from_dict({"prompt": ["3 4 5"] * rows})
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(
        completions), args=args, train_dataset=data, processing_class=tok)

  def train(self, batch: dict, steps: int, lr: float, remat: str = "none",
            dtype: str = "float32") -> dict:
    """`steps` updates on one batch: GRPOTrainer.compute_loss (its loss "grpo", the
    recorded log-probs as old_per_token_logps), backward, optimizer step, from the
    checkpoint's weights each call. No gradient clipping (TRL's default clips at 1.0; ours
    and Tunix's do not)."""
    del remat  # gradient checkpointing off: TRL's default
    import torch

    lp, lc = batch["prompt_len"], batch["completion_len"]
    group = len(batch["completions"][0])
    rows = len(batch["prompts"]) * group
    trainer = self.trainer(rows, group, lc, lr, dtype)
    pids, pmask, cids, cmask, old, adv = [], [], [], [], [], []
    for i, prompt in enumerate(batch["prompts"]):
      for j, comp in enumerate(batch["completions"][i]):
        pids.append([0] * (lp - len(prompt)) + list(prompt))  # left-padded, as TRL's
        pmask.append([0] * (lp - len(prompt)) + [1] * len(prompt))
        cids.append(list(comp) + [0] * (lc - len(comp)))
        cmask.append([1] * len(comp) + [0] * (lc - len(comp)))
        old.append(list(batch["gen_logp"][i][j]) + [0.0] * (lc - len(comp)))
        adv.append(batch["advantages"][i][j])
    inputs = {"prompt_ids": torch.tensor(pids), "prompt_mask": torch.tensor(pmask),
              "completion_ids": torch.tensor(cids), "completion_mask": torch.tensor(cmask),
              "old_per_token_logps": torch.tensor(old, dtype=trainer.model.dtype),
              "advantages": torch.tensor(adv, dtype=torch.float32)}
    model = trainer.model
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    opt = trainer.optimizer
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets per step
    model.train()
    losses, seconds = [], []
    for _ in range(steps):
      start = time.perf_counter()
      loss = trainer.compute_loss(model, inputs)
      trainer.accelerator.backward(loss)
      opt.step()
      trainer.lr_scheduler.step()
      opt.zero_grad(set_to_none=True)
      losses.append(float(loss))
      seconds.append(time.perf_counter() - start)
    return {"losses": losses, "seconds": seconds}


SIDES = {"ours": Ours, "tunix": Tunix, "trl": Trl}


def absent(name: str) -> str | None:
  """Why side `name` cannot run in this Python (one line), or None when it can."""
  module, dist = NEEDS[name]
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec(module) is None:
    return f"{dist} is not installed in {sys.executable}"
  return None


def serve(side) -> None:
  """Answers requests from stdin until EOF. stdout carries only the answers: whatever the
  libraries print goes to stderr."""
  out = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  for line in sys.stdin:
    if not line.strip():
      continue
    req = json.loads(line)
    cmd = req.pop("cmd")
    try:
      if cmd == "hello":
        answer = {"versions": versions(), "packages": all_packages(), "pid": os.getpid(),
                  "absent": absent(side.name), "python": sys.executable}
      else:
        answer = getattr(side, cmd)(**req)
      answer["ok"] = True
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      text = str(e).strip().splitlines()
      answer = {"ok": False, "error": f"{type(e).__name__}: {text[0][:300] if text else ''}"}
    out.write(json.dumps(answer) + "\n")
    out.flush()


def main() -> int:
  if len(sys.argv) != 2 or sys.argv[1] not in SIDES:
    print(f"usage: peer_sides.py {{{','.join(SIDES)}}}", file=sys.stderr)
    return 2
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if sys.argv[1] == "ours":  # the repository root: jaxrl_scale and benchmarks.* by package
    sys.path.insert(0, root)
  serve(SIDES[sys.argv[1]]())
  return 0


if __name__ == "__main__":
  sys.exit(main())
