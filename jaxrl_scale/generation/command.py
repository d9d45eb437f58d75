"""`jaxrl-scale generate`: sample from a Hugging Face-format checkpoint directory.

    jaxrl-scale generate --model DIR --prompt "What is 2+3?" --n 4 --temperature 0.7
    jaxrl-scale generate --model DIR --prompts-file prompts.jsonl --greedy --json

Prompts go through the checkpoint's chat template when it has one (--no-chat-template
sends the raw text). A .jsonl prompts file holds one object per line with a "prompt" string;
any other file holds one prompt per non-empty line. Throughput is printed twice: over the
whole run (compilation included) and from the first decode chunk on (steady state). A run
longer than 30 s prints "generated D/T samples (N tokens)" on stderr every 30 s.

Only stdlib imports at module level: the CLI builds every command's parser at start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_scale import errors
from jaxrl_scale.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--model", required=True, metavar="DIR",
                      help="Hugging Face directory: config.json, safetensors, tokenizer.json")
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--prompt", metavar="TEXT", help="one prompt")
  source.add_argument("--prompts-file", metavar="F",
                      help="prompts: .jsonl with a 'prompt' field, else one per line")
  parser.add_argument("--n", type=int, default=1, help="samples per prompt (default 1)")
  parser.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
  parser.add_argument("--top-p", type=float, default=1.0, help="default 1.0 (off)")
  parser.add_argument("--top-k", type=int, default=0, help="default 0 (off)")
  parser.add_argument("--max-new-tokens", type=int, default=128, help="default 128")
  parser.add_argument("--greedy", action="store_true", help="argmax decoding (temperature 0)")
  parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                      help="text that ends a sample (repeatable; an environment's own, such "
                           "as python_tool's </python>, is added by --env)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--slots", type=int, default=64,
                      help="most sequences decoded at once (default 64)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                      help="parameter/activation dtype (default: the checkpoint's)")
  parser.add_argument("--no-chat-template", action="store_true",
                      help="tokenize prompts as raw text")
  parser.add_argument("--json", action="store_true",
                      help="print one JSON object (completions and throughput)")


def read_prompts(args: argparse.Namespace) -> list[str]:
  """The prompt texts named by --prompt or --prompts-file."""
  if args.prompt is not None:
    return [args.prompt]
  path = args.prompts_file
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"--prompts-file {path}: cannot read ({e.__class__.__name__})") from None
  prompts = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    if path.endswith(".jsonl"):
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{path} line {number}: invalid JSON ({e.msg})") from None
      if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise UserError(f"{path} line {number}: expected an object with a string 'prompt'")
      prompts.append(row["prompt"])
    else:
      prompts.append(line)
  if not prompts:
    raise UserError(f"--prompts-file {path}: no prompts")
  return prompts


def check_model_dir(path: str) -> None:
  """UserError unless `path` is a directory; a training run's gets the command it needs."""
  if not os.path.isdir(path):
    raise UserError(f"--model {path}: not a directory")
  if (os.path.isfile(os.path.join(path, "config.yaml"))
      and not os.path.isfile(os.path.join(path, "config.json"))):
    raise UserError(f"--model {path}: a training run's directory, not a Hugging Face one; "
                    f"`jaxrl-scale export {path} OUT_DIR` writes its policy as one")


def _check_args(args: argparse.Namespace) -> None:
  check_model_dir(args.model)
  errors.check_flags((("--n", args.n, args.n >= 1),
                      ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1),
                      ("--slots", args.slots, args.slots >= 1),
                      ("--temperature", args.temperature, args.temperature >= 0),
                      ("--top-p", args.top_p, 0 < args.top_p <= 1),
                      ("--top-k", args.top_k, args.top_k >= 0)))


def load_model(model_dir: str, dtype: str | None = None) -> tuple[Any, Any, Any]:
  """(model, model config, mesh): a Hugging Face checkpoint on a (data, tp) mesh of all devices.

  Args:
    model_dir: the checkpoint directory (config.json + safetensors).
    dtype: "float32" / "bfloat16" parameter dtype; None keeps the checkpoint's.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.models import hf_io  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  mesh = jax.make_mesh((len(devices), 1), ("data", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)
  model, model_cfg = hf_io.load_hf_model(model_dir, mesh=mesh, param_dtype=dtype)
  return model, model_cfg, mesh


def make_sampler(model: Any, model_cfg: Any, mesh: Any, tokenizer: Any, *,
                 num_sequences: int, longest_prompt: int, max_new_tokens: int,
                 slots: int = 64, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, stop_strings: Sequence[str] = ()) -> Any:
  """An `engine.Sampler` sized for `num_sequences` prompts of at most `longest_prompt` tokens.

  Slots are at most `slots` (fewer when there are fewer sequences), rounded up to a
  multiple of the device count; a warning goes to stderr when prompt + new tokens exceed
  the model's max_position_embeddings.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.config import SamplerConfig  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top

  devices = len(jax.devices())
  num_slots = min(slots, num_sequences)
  num_slots = -(-num_slots // devices) * devices  # slots split evenly over devices
  buckets = tuple(sorted({*SamplerConfig().prompt_buckets,
                          1 << (longest_prompt - 1).bit_length()}))
  cfg = SamplerConfig(num_slots=num_slots, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, top_k=top_k,
                      prompt_buckets=buckets, stop_strings=tuple(stop_strings))
  if longest_prompt + max_new_tokens > model_cfg.max_position_embeddings:
    print(f"warning: prompt + new tokens ({longest_prompt} + {max_new_tokens}) exceed the "
          f"model's max_position_embeddings ({model_cfg.max_position_embeddings})",
          file=sys.stderr)
  return engine.Sampler(model, cfg, mesh=mesh, tokenizer=tokenizer, seed=seed,
                        max_prompt_len=longest_prompt)


def report_progress(say: Callable[[str], None], sampler: Any, *, first_s: float,
                    every_s: float = 30.0, clock: Callable[[], float] | None = None,
                    ) -> Callable[[int, int], None]:
  """`on_progress` for `Sampler.generate`: "generated D/T samples (N tokens)" through `say`,
  first after `first_s` seconds, then every `every_s`; not at the end (callers say that)."""
  from jaxrl_scale.generation import records  # pylint: disable=g-import-not-at-top

  return records.throttled(
      lambda done, total, _: say(f"generated {done}/{total} samples "
                                 f"({sampler.stats.tokens} tokens)"),
      first_s=first_s, every_s=every_s, clock=clock)


def turns(c: Any, decode: Callable[[list[int]], str]) -> list[tuple[str, str]]:
  """A completion as (who, text) pieces in order: "model" for what the policy wrote,
  "env" for what an environment appended (`Completion.env_mask`); one model piece for a
  single-turn completion."""
  tokens = [int(t) for t in c.tokens]
  if c.env_mask is None or not len(tokens):
    return [("model", c.text if c.text is not None else decode(tokens))]
  out, start = [], 0
  mask = [bool(m) for m in c.env_mask]
  for i in range(1, len(tokens) + 1):
    if i == len(tokens) or mask[i] != mask[start]:
      out.append(("env" if mask[start] else "model", decode(tokens[start:i])))
      start = i
  return out


def run(args: argparse.Namespace, episode_for: Callable[[int, list[int], Any], Any] | None = None
        ) -> int:
  """Generates and prints; `episode_for(prompt_index, prompt_ids, tokenizer)` gives each
  prompt's episode maker (`records.Request.episode`) for multi-turn episodes."""
  _check_args(args)
  texts = read_prompts(args)

  from jaxrl_scale.generation import engine, records  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  tokenizer = tokenizer_lib.load_tokenizer(args.model)
  if args.no_chat_template or tokenizer.chat_template is None:
    prompt_ids = [tokenizer.encode(t, add_special_tokens=True) for t in texts]
  else:
    prompt_ids = [tokenizer.apply_chat_template(t, tokenize=True) for t in texts]
  for i, ids in enumerate(prompt_ids):
    if not ids:
      raise UserError(f"prompt {i}: tokenizes to no tokens")

  model, model_cfg, mesh = load_model(args.model, args.dtype)
  sampler = make_sampler(model, model_cfg, mesh, tokenizer,
                         num_sequences=len(prompt_ids) * args.n,
                         longest_prompt=max(len(ids) for ids in prompt_ids),
                         max_new_tokens=args.max_new_tokens, slots=args.slots,
                         temperature=0.0 if args.greedy else args.temperature,
                         top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                         stop_strings=args.stop)
  slots = sampler.cfg.num_slots
  makers = [episode_for(i, ids, tokenizer) if episode_for is not None else None
            for i, ids in enumerate(prompt_ids)]
  requests = [records.Request(ids, prompt_id=i, sample_index=j, episode=makers[i])
              for i, ids in enumerate(prompt_ids) for j in range(args.n)]

  mark: dict[str, float] = {}

  def on_chunk(s: engine.Sampler, index: int) -> None:
    if index == 0:  # compilation is behind us once the first chunk is read back
      mark["time"], mark["tokens"] = time.perf_counter(), s.stats.tokens

  start = time.perf_counter()

  def say(line: str) -> None:  # a long run's progress, on stderr (stdout is the output)
    print(f"generate [{time.perf_counter() - start:6.1f}s] {line}", file=sys.stderr, flush=True)

  completions = sampler.generate(requests, on_chunk=on_chunk,
                                 on_progress=report_progress(say, sampler, first_s=30.0))
  seconds = time.perf_counter() - start
  tokens = sum(c.num_tokens for c in completions)
  steady_s = time.perf_counter() - mark.get("time", start)
  steady_tokens = tokens - mark.get("tokens", 0)
  rate = tokens / seconds if seconds > 0 else 0.0
  # None when every token came in the first chunk, which holds the compiles.
  steady = (steady_tokens / steady_s if "time" in mark and steady_tokens > 0 and steady_s > 0
            else None)

  if args.json:
    print(json.dumps({
        "completions": [{"prompt_index": c.prompt_id, "sample_index": c.sample_index,
                         "text": c.text, "tokens": c.tokens.tolist(),
                         "logprobs": [round(float(x), 6) for x in c.logprobs],
                         "finish_reason": c.finish_reason, "num_tokens": c.num_tokens,
                         **({"turns": [{"role": who, "text": text}
                                       for who, text in turns(c, tokenizer.decode)],
                             "env_mask": [bool(m) for m in c.env_mask],
                             "reward": c.reward, "correct": c.correct,
                             "env_stats": c.env_stats} if episode_for is not None else {})}
                        for c in completions],
        "tokens": tokens, "seconds": round(seconds, 4), "tokens_per_second": round(rate, 2),
        "steady_tokens_per_second": None if steady is None else round(steady, 2)}))
    return 0
  for c in completions:
    print(f"--- prompt {c.prompt_id} sample {c.sample_index} "
          f"({c.num_tokens} tokens, {c.finish_reason})")
    if episode_for is None:
      print(c.text)
      continue
    for who, text in turns(c, tokenizer.decode):
      print(f"[{who}]", text, sep="\n")
    stats = ", ".join(f"{key} {value:g}" for key, value in sorted(c.env_stats.items()) if value)
    reward = "from the task's verifier" if c.reward is None else f"{c.reward:g}"
    print(f"[end] {c.turns} turn(s), reward {reward}" + (f"; {stats}" if stats else ""))
  after = ("every token came in the first chunk, which holds the compiles" if steady is None
           else f"{steady:.1f} tokens/s after compilation")
  print(f"{tokens} tokens in {seconds:.2f} s: {rate:.1f} tokens/s ({after}, {slots} slots)")
  return 0
