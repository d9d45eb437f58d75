"""`jaxrl-scale eval`: mean@k and unbiased pass@k of a policy on benchmark files.

    jaxrl-scale eval --model DIR --benchmark aime24.jsonl --benchmark lcb.jsonl:lcb \\
        --samples 16 --k 1,4,16 --temperature 0.6 --max-new-tokens 4096 [--json]

The policy is a Hugging Face-format directory, loaded as `jaxrl-scale generate` loads it.
File layouts, the estimator and how invalid samples count: downstream/benchmarks.py.
Progress lines go to stderr; the results to stdout (one JSON object with --json).

Only stdlib imports at module level: the CLI builds every command's parser at start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from jaxrl_scale import errors
from jaxrl_scale.envs import command as env_command
from jaxrl_scale.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--model", required=True, metavar="DIR",
                      help="Hugging Face directory: config.json, safetensors, tokenizer.json")
  parser.add_argument("--benchmark", required=True, action="append", metavar="PATH[:NAME]",
                      help="benchmark .jsonl/.parquet file (repeatable); NAME defaults to "
                           "the file's stem")
  parser.add_argument("--task", choices=("math", "code"), default=None,
                      help="layout of every benchmark file (default: detected from its fields)")
  parser.add_argument("--samples", type=int, default=16, help="n samples per problem (default 16)")
  parser.add_argument("--k", default=None, metavar="K[,K...]",
                      help="the k of pass@k, each <= --samples (default: 1 and n)")
  parser.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
  parser.add_argument("--max-new-tokens", type=int, default=1024, help="default 1024")
  parser.add_argument("--limit", type=int, default=0,
                      help="evaluate the first N problems of each benchmark (0 = all)")
  parser.add_argument("--seed", type=int, default=0, help="base of the per-sample seeds")
  parser.add_argument("--slots", type=int, default=64,
                      help="most sequences decoded at once (default 64)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                      help="parameter/activation dtype (default: the checkpoint's)")
  parser.add_argument("--no-chat-template", action="store_true",
                      help="tokenize problems as raw text")
  parser.add_argument("--system-prompt", default=None, metavar="TEXT",
                      help="a system message (chat template) or first paragraph (raw text)")
  parser.add_argument("--reward-timeout", type=float, default=10.0,
                      help="verifier deadline per sample in seconds; past it the sample is "
                           "invalid (default 10; the code sandbox's own limit is 4 s)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(stop=[])
  env_command.add_env_arguments(parser)


def _check_args(args: argparse.Namespace) -> None:
  from jaxrl_scale.generation import command as gen_command  # pylint: disable=g-import-not-at-top
  gen_command.check_model_dir(args.model)
  errors.check_flags((("--samples", args.samples, args.samples >= 1),
                      ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1),
                      ("--slots", args.slots, args.slots >= 1),
                      ("--limit", args.limit, args.limit >= 0),
                      ("--temperature", args.temperature, args.temperature >= 0),
                      ("--reward-timeout", args.reward_timeout, args.reward_timeout > 0)))
  if args.env:  # an unknown environment or option: one line, before anything loads
    args.episode_setup = env_command.env_setup(args)


def run(args: argparse.Namespace) -> int:
  """Reads the benchmarks, samples, scores, prints one result per benchmark."""
  _check_args(args)
  from jaxrl_scale.data import templates  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.downstream import benchmarks as bench_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.generation import command as gen_command  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  start = time.perf_counter()

  def say(line: str) -> None:
    print(f"eval [{time.perf_counter() - start:6.1f}s] {line}", file=sys.stderr, flush=True)

  # Every input is checked before the model loads: a typo costs seconds, not minutes.
  ks = bench_lib.parse_ks(args.k, args.samples)
  benches = [bench_lib.read_benchmark(spec, task=args.task, limit=args.limit)
             for spec in args.benchmark]
  names = [b.name for b in benches]
  repeated = sorted({n for n in names if names.count(n) > 1})
  if repeated:
    raise UserError(f"--benchmark: name {repeated[0]!r} given twice (name them PATH:NAME)")
  tokenizer = tokenizer_lib.load_tokenizer(args.model)
  template = templates.PromptTemplate(use_chat_template=not args.no_chat_template,
                                      system_prompt=args.system_prompt)
  longest = max(len(ids) for b in benches for ids in bench_lib.prompt_ids(tokenizer, b, template))
  total = sum(len(b.records) for b in benches) * args.samples
  say(f"{len(benches)} benchmark(s), {total // args.samples} problems x {args.samples} "
      f"samples = {total} samples; loading {args.model}")

  model, model_cfg, mesh = gen_command.load_model(args.model, args.dtype)
  sampler = gen_command.make_sampler(model, model_cfg, mesh, tokenizer, num_sequences=total,
                                     longest_prompt=longest, max_new_tokens=args.max_new_tokens,
                                     slots=args.slots, temperature=args.temperature,
                                     seed=args.seed, stop_strings=args.stop)
  episode_for = None
  if args.env:
    from jaxrl_scale.envs import registry  # pylint: disable=g-import-not-at-top
    limits, options = args.episode_setup

    def episode_for(bench, record, ids):
      env_record = {**record, "task": bench.task, "reward": bench.task}
      return registry.episode_maker(args.env, env_record, ids, tokenizer, limits, **options)

  def generate(requests):
    sampler.reset_stats()
    # A line once the first chunk is back (compiled), then every 30 s.
    out = sampler.generate(requests, on_progress=gen_command.report_progress(
        say, sampler, first_s=0.0))
    say(f"generated {total}/{total} samples ({sampler.stats.tokens} tokens)")
    return out

  results = bench_lib.evaluate(generate, tokenizer, benches, samples=args.samples, ks=ks,
                               temperature=args.temperature, seed=args.seed,
                               template=template, timeout_s=args.reward_timeout,
                               num_threads=max(os.cpu_count() or 1, 1), progress=say,
                               episode_for=episode_for)
  seconds = time.perf_counter() - start
  if args.json:
    print(json.dumps({"model": args.model, "samples_per_problem": args.samples, "k": ks,
                      "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                      "seed": args.seed, "seconds": round(seconds, 2),
                      **({"env": args.env, "max_turns": args.max_turns} if args.env else {}),
                      "benchmarks": results}))
    return 0
  for result in results:
    print(bench_lib.format_result(result))
  print(f"{total} samples in {seconds:.1f} s (temperature {args.temperature:g}, "
        f"max {args.max_new_tokens} new tokens)")
  return 0
