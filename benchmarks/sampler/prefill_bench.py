"""Chunked prefill mixed with decode: how long live sequences stall while long prompts are
admitted, whole-prompt prefill vs `sampler.prefill_chunk`, measured in one run.

    python benchmarks/sampler/prefill_bench.py          # text report
    python benchmarks/sampler/prefill_bench.py --json   # one JSON line on stdout
    python benchmarks/sampler/prefill_bench.py --quick  # small shapes, seconds

A random Qwen3 checkpoint (the shape of benchmarks/sampler/sampler_bench.py: 41.7M params, float32)
is written with transformers and loaded once. The workload: --requests requests, each with
its own prompt of --prompt-len / 2 .. --prompt-len tokens and a token budget spread over 10x
up to --new-tokens (no early stop), through --slots slots. As sequences finish, new long
prompts are admitted while the other slots are mid-generation, so every admission's prefill
runs between two decode chunks of the live sequences.

Two samplers, identical but for `prefill_chunk` (0: whole prompts; --prefill-chunk c: c
positions per engine iteration), run the same workload in turn; each is warmed up on it
first (compiles excluded), and the best of --repeats runs is kept. Reported per side:
tokens/s, and the gaps between consecutive decode-chunk read-backs (the time a live
sequence waits for its next tokens): max and 95th percentile. The ratios: max stall whole /
chunked, and tokens/s chunked / whole. Both sides must produce the same tokens (greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true", help="small shapes for a fast check")
  p.add_argument("--prompt-len", type=int, default=512, help="longest prompt (tokens)")
  p.add_argument("--new-tokens", type=int, default=128, help="largest token budget")
  p.add_argument("--slots", type=int, default=16)
  p.add_argument("--requests", type=int, default=48)
  p.add_argument("--chunk", type=int, default=16, help="decode steps per jitted chunk")
  p.add_argument("--prefill-chunk", type=int, default=64,
                 help="positions per prefill piece on the chunked side")
  p.add_argument("--repeats", type=int, default=2, help="timed runs per side; best is kept")
  p.add_argument("--json", action="store_true",
                 help="print one JSON line on stdout (the report goes to stderr)")
  args = p.parse_args()
  args.hidden, args.layers, args.heads, args.kv_heads = 512, 4, 8, 2
  args.intermediate, args.vocab = 1024, 32000
  if args.quick:
    args.hidden, args.layers, args.vocab, args.intermediate = 128, 2, 2048, 256
    args.heads, args.kv_heads = 4, 2
    args.prompt_len, args.new_tokens, args.slots, args.requests = 128, 32, 4, 12
    args.chunk, args.prefill_chunk, args.repeats = 8, 32, 1
  if not 0 < args.prefill_chunk < args.prompt_len:
    p.error("--prefill-chunk must be in (0, --prompt-len)")
  return args


def _run(sampler, work, repeats: int) -> tuple[float, list[float], list]:
  """Best wall time over `repeats`, that run's gaps between chunk read-backs, outputs."""
  best, best_gaps, outs = float("inf"), [], None
  for _ in range(repeats):
    stamps: list[float] = []
    sampler.reset_stats()
    start = time.perf_counter()
    outs = sampler.generate(work, on_chunk=lambda s, i: stamps.append(time.perf_counter()))
    seconds = time.perf_counter() - start
    if seconds < best:
      best, best_gaps = seconds, np.diff([start] + stamps).tolist()
  return best, best_gaps, outs


def main() -> int:
  args = _parse()
  sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree
  import jax

  from benchmarks.sampler.sampler_bench import _write_checkpoint

  from jaxrl_scale.config import SamplerConfig
  from jaxrl_scale.generation import engine, records
  from jaxrl_scale.models import hf_io

  log_file = sys.stderr if args.json else sys.stdout

  def log(line: str) -> None:
    print(line, file=log_file, flush=True)

  path = tempfile.mkdtemp(prefix="prefill_bench_")
  _write_checkpoint(args, path)
  model, model_cfg = hf_io.load_hf_model(path, param_dtype="float32")
  rng = np.random.default_rng(0)
  lengths = rng.integers(args.prompt_len // 2, args.prompt_len + 1, size=args.requests)
  budgets = np.exp(rng.uniform(np.log(max(1, args.new_tokens // 10)), np.log(args.new_tokens),
                               size=args.requests)).astype(int)
  work = [records.Request(rng.integers(3, model_cfg.vocab_size, size=n).tolist(), prompt_id=i,
                          max_new_tokens=int(b))
          for i, (n, b) in enumerate(zip(lengths, budgets))]
  device = f"{jax.devices()[0].device_kind} x{len(jax.devices())}"
  log(f"device: {device}; {model_cfg.num_params() / 1e6:.1f}M params float32; "
      f"{args.requests} requests, prompts {lengths.min()}..{lengths.max()} tokens, budgets "
      f"{budgets.min()}..{budgets.max()}, {args.slots} slots, decode chunk {args.chunk}")

  report: dict = {"device": device, "cpu_cores": os.cpu_count(), "prompt_len": args.prompt_len,
                  "slots": args.slots, "requests": args.requests,
                  "prefill_chunk": args.prefill_chunk}
  sides = {}
  for name, piece in (("whole", 0), ("chunked", args.prefill_chunk)):
    cfg = SamplerConfig(num_slots=args.slots, max_new_tokens=args.new_tokens, temperature=0.0,
                        decode_chunk=args.chunk, prompt_buckets=(args.prompt_len,),
                        prefill_chunk=piece)
    sampler = engine.Sampler(model, cfg, eos_ids=())
    sampler.generate(work)  # compile every program this workload uses
    seconds, gaps, outs = _run(sampler, work, args.repeats)
    tokens = sum(o.num_tokens for o in outs)
    assert tokens == int(budgets.sum())
    sides[name] = dict(seconds=seconds, gaps=gaps, outs=outs, tok_s=tokens / seconds,
                       pieces=sampler.stats.prefill_pieces, mixed=sampler.stats.mixed_chunks)
    log(f"[{name}] prefill_chunk={piece}: {seconds:.2f} s = {tokens / seconds:.0f} tokens/s; "
        f"gap between decode chunks: max {max(gaps) * 1e3:.0f} ms, p95 "
        f"{np.percentile(gaps, 95) * 1e3:.0f} ms, median {np.median(gaps) * 1e3:.0f} ms; "
        f"{sampler.stats.prefill_pieces} prefill programs, {sampler.stats.mixed_chunks} "
        f"decode chunks beside an unfinished prefill")
  same = all(a.tokens.tolist() == b.tokens.tolist()
             for a, b in zip(sides["whole"]["outs"], sides["chunked"]["outs"]))
  whole, chunked = sides["whole"], sides["chunked"]
  stall = max(whole["gaps"]) / max(chunked["gaps"])
  speed = chunked["tok_s"] / whole["tok_s"]
  log(f"RATIO max stall whole / chunked = {stall:.2f}x; tokens/s chunked / whole = {speed:.2f}x; "
      f"same tokens: {same}")
  for name, side in sides.items():
    report[f"{name}_tok_s"] = round(side["tok_s"], 1)
    report[f"{name}_max_gap_ms"] = round(max(side["gaps"]) * 1e3, 1)
    report[f"{name}_p95_gap_ms"] = round(float(np.percentile(side["gaps"], 95)) * 1e3, 1)
  report.update(stall_ratio=round(stall, 3), throughput_ratio=round(speed, 3),
                same_tokens=same, chunked_mixed_chunks=chunked["mixed"])
  if args.json:
    print(json.dumps(report), flush=True)
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
