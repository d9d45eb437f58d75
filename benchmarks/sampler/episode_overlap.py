"""Does decoding go on while a tool runs? Generated tokens per second of multi-turn episodes
whose tool sleeps, against the same episodes with an instant tool, in one process.

    python benchmarks/sampler/episode_overlap.py          # sleep 0.5 s per call
    python benchmarks/sampler/episode_overlap.py --sleep 0.5 --sequences 256 --slots 16 --json
    python benchmarks/sampler/episode_overlap.py --quick  # a tiny run, for the tests

The real Sampler (generation/engine.py) runs episodes of a scripted tool on a random model
(a models/config.py preset, default `tiny_llama`, near-uniform logits): each model turn
ends on one of `--eos` ids (turn lengths vary, as a policy's do), the tool sleeps
`--sleep` seconds, appends four tokens and lets the policy go on, and the episode ends
after `--turns` model turns. The same requests (the same per-sequence seeds, so the same
tokens) run with the tool instant and with it sleeping, alternating `--repeats` times after
a compile run of each; the figure is the model's generated tokens (environment tokens not counted)
per second of wall time. Printed:

  - ratio = tok/s with the sleep / tok/s without (issue 65: >= 0.7 at 0.5 s);
  - serial bound = the ratio if every tool call stopped the decode loop for its sleep
    (wall = the instant run's + calls x sleep): what the ratio would be without the
    overlap, so the two lines side by side say how much of the sleep was hidden.

An episode whose tool runs leaves its slot to the next waiting sequence and keeps its pages
(generation/episodes.py), so the slots stay busy while there are sequences to admit. Two
things bound the overlap, both printed per run: the environment threads (`--workers`: at
most that many calls at once) and the page pool (`--kv-cache-tokens`: parked caches take
pages; when the live sequences need them the parked ones are evicted and prefill their
history again). Both must hold the calls in flight, about (turns ended per second) x
(seconds a call takes): a faster decode needs more of each.

    python benchmarks/sampler/episode_overlap.py --sequences 256 --workers 256 \
        --kv-cache-tokens 140000 --json   # threads and pages for every call in flight
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

TOOL_TOKENS = (40, 41, 42, 43)  # what the scripted tool appends after a turn
TARGET_RATIO = 0.7


class SleepyTool:
  """A records.Episode: after each model turn but the last, sleeps, then appends
  TOOL_TOKENS; ends after `turns` model turns."""

  def __init__(self, turns: int, sleep_s: float):
    self.turns, self.sleep_s = turns, sleep_s
    self.calls = 0
    self.tool_s = 0.0

  def step(self, turn):
    from jaxrl_scale.generation import records  # pylint: disable=g-import-not-at-top
    if turn.index + 1 >= self.turns:
      return records.EnvStep(done=True, reward=0.0, correct=False)
    start = time.perf_counter()
    if self.sleep_s:
      time.sleep(self.sleep_s)
    self.tool_s += time.perf_counter() - start
    self.calls += 1
    return records.EnvStep(tokens=TOOL_TOKENS)

  def summary(self):
    return {"tool_calls": float(self.calls), "tool_s": self.tool_s}


class Counter:
  """Episode makers that count the tool calls of one generate (thread-safe)."""

  def __init__(self, turns: int, sleep_s: float):
    self.turns, self.sleep_s = turns, sleep_s
    self.made: list[SleepyTool] = []
    self.lock = threading.Lock()

  def __call__(self) -> SleepyTool:
    tool = SleepyTool(self.turns, self.sleep_s)
    with self.lock:
      self.made.append(tool)
    return tool

  def calls(self) -> int:
    return sum(t.calls for t in self.made)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", default="tiny_llama", help="a models/config.py preset")
  p.add_argument("--sleep", type=float, default=0.5, help="seconds per tool call (default 0.5)")
  p.add_argument("--turns", type=int, default=3, help="model turns per episode (default 3)")
  p.add_argument("--sequences", type=int, default=256,
                 help="episodes per generate (default 256: others to decode while tools run)")
  p.add_argument("--slots", type=int, default=16, help="sampler slots (default 16)")
  p.add_argument("--max-new-tokens", type=int, default=512)
  p.add_argument("--eos", type=int, default=2,
                 help="how many ids end a turn (of the vocabulary; default 2: turns of "
                      "about vocab/2 tokens at near-uniform logits)")
  p.add_argument("--chunk", type=int, default=8, help="decode chunk (default 8)")
  p.add_argument("--repeats", type=int, default=2, help="timed runs of each (default 2)")
  p.add_argument("--workers", type=int, default=64, help="environment threads (default 64)")
  p.add_argument("--kv-cache-tokens", type=int, default=0,
                 help="sampler.kv_cache_tokens: the page pool's positions (default 0: one "
                      "full-length sequence per slot)")
  p.add_argument("--quick", action="store_true",
                 help="a tiny run (4 episodes, 0.05 s sleeps, 1 repeat) that only shows it works")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  args = p.parse_args(argv)
  if args.quick:
    args.sequences, args.slots, args.max_new_tokens = 4, 4, 64
    args.sleep, args.repeats, args.eos = 0.05, 1, 16
  for key in ("turns", "sequences", "slots", "max_new_tokens", "eos", "chunk", "repeats",
              "workers"):
    if getattr(args, key) < 1:
      p.error(f"--{key.replace('_', '-')} must be >= 1")
  if args.sleep < 0:
    p.error("--sleep must be >= 0")
  if args.kv_cache_tokens < 0:
    p.error("--kv-cache-tokens must be >= 0")
  return args


def run(args) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.config import SamplerConfig  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.generation import engine, records  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import config as model_config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import transformer  # pylint: disable=g-import-not-at-top

  try:
    mcfg = model_config.preset(args.preset)
  except ValueError as e:
    sys.exit(f"--preset: {e}")
  model = transformer.create_model(mcfg, seed=0)
  vocab = mcfg.vocab_size
  if args.eos >= vocab:
    sys.exit(f"--eos: {args.eos} ids would leave none of the {vocab} to write")
  eos = tuple(range(vocab - args.eos, vocab))
  cfg = SamplerConfig(num_slots=args.slots, max_new_tokens=args.max_new_tokens,
                      temperature=1.0, decode_chunk=args.chunk, prompt_buckets=(16,),
                      kv_cache_tokens=args.kv_cache_tokens)
  sampler = engine.Sampler(model, cfg, eos_ids=eos, env_workers=args.workers)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, vocab - args.eos, int(n)).tolist()
             for n in rng.integers(4, 16, args.sequences)]

  def one(sleep_s: float) -> dict:
    maker = Counter(args.turns, sleep_s)
    reqs = [records.Request(p, prompt_id=i, sample_index=0, episode=maker)
            for i, p in enumerate(prompts)]
    sampler.reset_stats()
    t0 = time.perf_counter()
    outs = sampler.generate(reqs)
    wall = time.perf_counter() - t0
    st = sampler.stats
    model_tokens = sum(int((~o.env_mask).sum()) if o.env_mask is not None else len(o.tokens)
                       for o in outs)
    return {"sleep_s": sleep_s, "wall_s": wall, "model_tokens": model_tokens,
            "tok_s": model_tokens / wall, "tool_calls": maker.calls(),
            "turns_mean": statistics.fmean(o.turns for o in outs),
            "truncated": sum(bool(o.truncated) for o in outs),
            "slot_utilisation": st.slot_utilisation, "moved_resumes": st.moved_resumes,
            "evictions": st.evictions, "reprefill_tokens": st.reprefill_tokens,
            "preemptions": st.preemptions,
            "tokens": [o.tokens.tolist() for o in outs]}

  one(0.0)  # compiles: admission, decode, the continuation pieces
  one(args.sleep)  # and the pieces of any other order the sleeping run admits in
  runs = []
  for _ in range(args.repeats):
    runs.append(one(0.0))
    runs.append(one(args.sleep))
  fast = [r for r in runs if r["sleep_s"] == 0.0]
  slow = [r for r in runs if r["sleep_s"] == args.sleep] if args.sleep else fast
  same = all(r["tokens"] == fast[0]["tokens"] for r in runs)
  tps_fast = statistics.median(r["tok_s"] for r in fast)
  tps_slow = statistics.median(r["tok_s"] for r in slow)
  calls = statistics.median(r["tool_calls"] for r in slow)
  wall_fast = statistics.median(r["wall_s"] for r in fast)
  tokens = statistics.median(r["model_tokens"] for r in slow)
  serial = tokens / (wall_fast + calls * args.sleep) / tps_fast
  for r in runs:
    del r["tokens"]
  return {"preset": args.preset, "sleep_s": args.sleep, "turns": args.turns,
          "sequences": args.sequences, "slots": args.slots, "max_new_tokens": args.max_new_tokens,
          "eos_ids": len(eos), "chunk": args.chunk, "workers": args.workers,
          "kv_cache_tokens": args.kv_cache_tokens, "runs": runs,
          "tok_s_instant": tps_fast, "tok_s_sleeping": tps_slow,
          "ratio": tps_slow / tps_fast, "serial_bound": serial,
          "same_tokens": same, "target": f"ratio >= {TARGET_RATIO} at a 0.5 s sleep"}


def render(res: dict) -> str:
  lines = [f"{res['sequences']} episodes of {res['turns']} turns in {res['slots']} slots, "
           f"preset {res['preset']}, tool sleep {res['sleep_s']:g} s, {res['workers']} "
           f"environment threads, kv_cache_tokens {res['kv_cache_tokens']}"]
  for r in res["runs"]:
    lines.append(f"  sleep {r['sleep_s']:<5g} {r['model_tokens']:>6} model tokens in "
                 f"{r['wall_s']:6.2f} s = {r['tok_s']:8.0f} tok/s | {r['tool_calls']} tool "
                 f"calls | slots busy {r['slot_utilisation']:.0%} | moved {r['moved_resumes']}"
                 f" | evicted {r['evictions']} | preempted {r['preemptions']}")
  lines.append(f"ratio (sleeping / instant): {res['ratio']:.2f}   serial bound (no overlap): "
               f"{res['serial_bound']:.2f}   same tokens both ways: {res['same_tokens']}")
  if res["sleep_s"] == 0.5:
    ok = res["ratio"] >= TARGET_RATIO
    lines.append(f"[{'met' if ok else 'MISSED'}] issue 65: {res['target']}")
  return "\n".join(lines)


def main(argv=None) -> int:
  args = parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  res = run(args)
  print(json.dumps(res, indent=1) if args.json else render(res))
  return 0


if __name__ == "__main__":
  sys.exit(main())
