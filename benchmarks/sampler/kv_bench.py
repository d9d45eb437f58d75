"""KV-cache memory and prefill work on a mixed-length RL workload (issue 13).

    python benchmarks/sampler/kv_bench.py          # 48 prompts x 16 completions, text report
    python benchmarks/sampler/kv_bench.py --json   # one JSON line on stdout
    python benchmarks/sampler/kv_bench.py --quick  # 8 prompts x 4, seconds

The workload is one RL step's generation: P prompts x G completions, all admitted at once
(num_slots = P x G), with per-completion token budgets spread 10x (max/10 + 0.9 max x
Beta(1, 5), mean max/4) and no EOS, on a tiny random model (what is measured is memory and
work, not speed). Printed, all from this run:

1. Prefill: prompt positions the prefill programs computed (padded rows included) against
   what one prefill per completion computes (the sampler's Stats). Goal <= 1/12.
2. KV memory: bytes of the page pool the sampler holds (`--pool-fraction` of a dense cache
   that reserves bucket + max_new_tokens for every slot, the pre-paging layout) and the
   most pages it had in use, against that dense size; and the peak of what the live tokens
   need (each sequence's prompt + generated tokens, each prompt once), the floor. The run
   must finish every completion at its budget (preemptions, if the pool is too small, are
   counted). Goal: held <= 0.5x dense.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--prompts", type=int, default=48)
  p.add_argument("--samples", type=int, default=16, help="completions per prompt")
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--max-new", type=int, default=512)
  p.add_argument("--chunk", type=int, default=32)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--pool-fraction", type=float, default=0.25,
                 help="page pool size as a fraction of the dense cache (default 0.25)")
  p.add_argument("--page-size", type=int, default=16)
  p.add_argument("--json", action="store_true", help="one JSON line on stdout")
  p.add_argument("--quick", action="store_true")
  args = p.parse_args()
  if args.quick:
    args.prompts, args.samples, args.max_new, args.chunk = 8, 4, 64, 16
  return args


def main() -> int:
  args = _parse()
  sys.path.insert(0, ROOT)  # jaxrl_scale from this tree
  import jax

  from jaxrl_scale.config import SamplerConfig
  from jaxrl_scale.generation import engine, records
  from jaxrl_scale.models import config, transformer

  log_file = sys.stderr if args.json else sys.stdout

  def log(line: str) -> None:
    print(line, file=log_file, flush=True)

  cfg = dataclasses.replace(config.tiny_qwen3(), dtype="float32", param_dtype="float32")
  model = transformer.create_model(cfg, seed=args.seed)
  rng = np.random.default_rng(args.seed)
  n = args.prompts * args.samples
  prompts = rng.integers(3, cfg.vocab_size, size=(args.prompts, args.prompt_len)).tolist()
  lengths = (args.max_new / 10 + 0.9 * args.max_new * rng.beta(1.0, 5.0, size=n)).astype(int)
  lengths = np.clip(lengths, 1, args.max_new)
  reqs = [records.Request(prompts[i // args.samples], prompt_id=i // args.samples,
                          sample_index=i % args.samples, max_new_tokens=int(lengths[i]))
          for i in range(n)]
  bucket = 1 << (args.prompt_len - 1).bit_length()
  dense_positions = n * (bucket + args.max_new)
  scfg = SamplerConfig(num_slots=n, max_new_tokens=args.max_new, temperature=1.0,
                       decode_chunk=args.chunk, prompt_buckets=(bucket,),
                       page_size=args.page_size,
                       kv_cache_tokens=int(args.pool_fraction * dense_positions))
  sampler = engine.Sampler(model, scfg, eos_ids=())
  start = time.perf_counter()
  outs = sampler.generate(reqs)
  seconds = time.perf_counter() - start
  assert [o.num_tokens for o in outs] == lengths.tolist(), "a completion missed its budget"

  st = sampler.stats
  held = sampler._state.cache.kv.nbytes
  per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # float32 k and v
  dense = dense_positions * per_token
  peak_used = sampler._pool.peak_pages * args.page_size * per_token
  # Live tokens after decode step t: every prompt once (shared by its G completions) plus
  # each completion's generated tokens, for the completions still running or just ended.
  steps = np.arange(1, args.max_new + 1)
  generated = np.minimum(lengths[None, :], steps[:, None])
  running = lengths[None, :] >= steps[:, None]
  # A completion that ended frees its tokens; the prompts are counted for the whole run.
  live = (generated * running).sum(axis=1) + args.prompts * args.prompt_len
  live_peak = int(live.max()) * per_token
  report = dict(
      device=str(jax.devices()[0].device_kind), prompts=args.prompts, samples=args.samples,
      prompt_len=args.prompt_len, max_new=args.max_new, mean_len=float(lengths.mean()),
      prefill_tokens=st.prefill_tokens, unshared_prefill_tokens=st.unshared_prefill_tokens,
      prefill_ratio=round(st.prefill_tokens / st.unshared_prefill_tokens, 4),
      kv_bytes_dense=int(dense), kv_bytes_held=int(held), kv_bytes_peak_used=int(peak_used),
      kv_bytes_live_peak=int(live_peak), kv_held_over_dense=round(held / dense, 4),
      kv_peak_used_over_dense=round(peak_used / dense, 4),
      kv_live_peak_over_dense=round(live_peak / dense, 4), preemptions=st.preemptions,
      seconds=round(seconds, 1))
  log(f"workload: {args.prompts} prompts x {args.samples} completions, prompts "
      f"{args.prompt_len} tokens, budgets {lengths.min()}..{lengths.max()} "
      f"(mean {lengths.mean():.0f} = {lengths.mean() / args.max_new:.2f} of max "
      f"{args.max_new}); {seconds:.1f} s on {report['device']}")
  log(f"[prefill] computed {st.prefill_tokens} prompt positions; one prefill per completion: "
      f"{st.unshared_prefill_tokens}; RATIO {report['prefill_ratio']:.4f} "
      f"(goal <= {1 / 12:.4f})")
  log(f"[kv] dense cache ({sampler.max_len} positions per slot): {dense / 2**20:.1f} MiB; page "
      f"pool held: {held / 2**20:.1f} MiB = {report['kv_held_over_dense']:.3f}x (goal <= 0.5); "
      f"peak in use {peak_used / 2**20:.1f} MiB = {report['kv_peak_used_over_dense']:.3f}x; "
      f"live tokens at their peak {report['kv_live_peak_over_dense']:.3f}x; "
      f"{st.preemptions} preemptions")
  if args.json:
    print(json.dumps(report), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
