"""A batch's tail on fewer rows: the sampler with `sampler.decode_row_buckets` against all
slots every chunk, on benchmarks/peers' RL-lengths workload, in one process.

    python benchmarks/sampler/rows_bench.py                  # batch 16 and 64, 2 rounds
    python benchmarks/sampler/rows_bench.py --batches 64 --json
    python benchmarks/sampler/rows_bench.py --quick --json   # a tiny checkpoint, one JSON line

The workload is peers.py's `rl_b{batch}` (`peers.sample_workloads`: 3 x batch prompts of
16..64 ids, EOS on, 128 new tokens at most, greedy) on its random Qwen3 checkpoint (built in
--cache when missing). Each side is a fresh `engine.Sampler` of `batch` slots with one
warm-up call (the compiles), then `--rounds` timed calls, alternating: `rows` the default
buckets (CPU: batch, batch/2, ... down to 4 rows), `all_slots` `decode_row_buckets` 1. The
script checks that both give the same tokens and prints each side's median tokens/s, their
ratio, and how many chunks ran on fewer rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

SIDES = {"rows": None, "all_slots": 1}  # side -> sampler.decode_row_buckets


def run(args) -> dict:
  from benchmarks.peers import peers  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.generation import engine, records  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import hf_io  # pylint: disable=g-import-not-at-top

  pargs = peers.parse_args(["--batches", args.batches, "--cache", args.cache]
                           + (["--quick"] if args.quick else [])
                           + (["--model", args.model] if args.model else []))
  if args.quick:  # 8 slots (buckets 8, 4), long enough for a tail
    pargs.batch_sizes, pargs.new, pargs.decode_chunk = [8], 32, 4
  path = peers.checkpoint(pargs, lambda m: print(m, file=sys.stderr))
  model, model_cfg = hf_io.load_hf_model(path, param_dtype="float32")
  out = {"checkpoint": path, "workloads": {}}
  for w in peers.sample_workloads(model_cfg.vocab_size, pargs):
    if w["kind"] != "rl":
      continue
    samplers, times, tokens, row_chunks = {}, {k: [] for k in SIDES}, {}, {}
    for side, buckets in SIDES.items():
      cfg = config.SamplerConfig(num_slots=w["batch"], max_new_tokens=pargs.new,
                                 temperature=0.0,
                                 decode_chunk=getattr(pargs, "decode_chunk", args.decode_chunk),
                                 prompt_buckets=tuple(w["buckets"]),
                                 decode_row_buckets=buckets)
      samplers[side] = engine.Sampler(model, cfg, eos_ids=tuple(w["eos"]))

    def call(side):
      reqs = [records.Request(list(p), prompt_id=i) for i, p in enumerate(w["prompts"])]
      samplers[side].reset_stats()
      start = time.perf_counter()
      outs = samplers[side].generate(reqs)
      return time.perf_counter() - start, [o.tokens.tolist() for o in outs]

    for side in SIDES:  # warm-up: every program either side needs
      call(side)
    for r in range(args.rounds):
      for side in SIDES:
        seconds, tokens[side] = call(side)
        times[side].append(seconds)
        row_chunks[side] = (samplers[side].stats.row_chunks, samplers[side].stats.chunks)
        print(f"  {w['name']} round {r + 1} {side}: {sum(map(len, tokens[side]))} tokens in "
              f"{seconds:.2f} s", file=sys.stderr)
    n = sum(map(len, tokens["rows"]))
    med = {side: statistics.median(t) for side, t in times.items()}
    out["workloads"][w["name"]] = {
        "batch": w["batch"], "tokens": n, "median_s": med,
        "tok_per_s": {side: n / s for side, s in med.items()},
        "speedup": med["all_slots"] / med["rows"],
        "same_tokens": tokens["rows"] == tokens["all_slots"],
        "row_buckets": list(samplers["rows"]._row_buckets),  # pylint: disable=protected-access
        "chunks_on_fewer_rows": row_chunks["rows"]}
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batches", default="16,64", help="slots (peers.py's batch sizes)")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--decode-chunk", type=int, default=16, help="as benchmarks/peers' side")
  p.add_argument("--model", default=None, help="a Hugging Face directory (default: built)")
  p.add_argument("--cache", default="/tmp/jaxrl_peers", help="where the checkpoint goes")
  p.add_argument("--quick", action="store_true",
                 help="peers.py's tiny checkpoint, 8 slots, 32 new tokens, chunks of 4, 1 round")
  p.add_argument("--json", action="store_true", help="print the result as one JSON line")
  args = p.parse_args(argv)
  if args.quick:
    args.rounds = 1
  if args.rounds < 1 or args.decode_chunk < 1:
    p.error("--rounds and --decode-chunk must be >= 1")
  res = run(args)
  if args.json:
    print(json.dumps(res))
    return 0
  for name, w in res["workloads"].items():
    print(f"{name}: rows {w['tok_per_s']['rows']:.1f} tok/s, all slots "
          f"{w['tok_per_s']['all_slots']:.1f} tok/s: {w['speedup']:.2f}x; buckets "
          f"{w['row_buckets']}, {w['chunks_on_fewer_rows'][0]} of "
          f"{w['chunks_on_fewer_rows'][1]} chunks on fewer rows; same tokens: "
          f"{w['same_tokens']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
