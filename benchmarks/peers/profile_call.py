"""Where one sampling call of a side spends its time: JAX's profiler around a uniform-length
call (peers.py's first workload), then the events summed per thread of the trace.

    python benchmarks/peers/profile_call.py ours /tmp/jaxrl_peers/qwen3_8_512_32768_f32
    /work/peers-venv/bin/python benchmarks/peers/profile_call.py tunix CHECKPOINT

Prints the call's time unprofiled, then per trace line (the Python thread, each XLA worker
thread) its summed event time and its longest events: on a CPU, how much of the call the
Python thread spends waiting for results (`device_get`) against running host code.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]  # peers.py by package, peer_sides.py as the sides load it

import peer_sides  # noqa: E402  pylint: disable=wrong-import-position


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("side", choices=sorted(peer_sides.SIDES))
  p.add_argument("model", help="the Hugging Face checkpoint peers.py wrote or was given")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--decode-chunk", type=int, default=16, help="ours only")
  args = p.parse_args(argv)
  import jax  # pylint: disable=g-import-not-at-top
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  from benchmarks.peers import peers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(args.model, "config.json")) as f:
    vocab = __import__("json").load(f)["vocab_size"]
  work = peers.sample_workloads(vocab, peers.parse_args(["--batches", str(args.batch)]))[0]
  side = peer_sides.SIDES[args.side]()
  side.load(args.model)
  kw = dict(prompts=work["prompts"], max_new=128, eos=[], slots=args.batch,
            buckets=work["buckets"])
  if args.side == "ours":
    kw["decode_chunk"] = args.decode_chunk
  side.sample(**kw)  # compiles
  print(f"{args.side}: {side.sample(**kw)['seconds']:.2f} s unprofiled")
  out = tempfile.mkdtemp()
  with jax.profiler.trace(out):
    start = time.perf_counter()
    side.sample(**kw)
    wall = time.perf_counter() - start
  trace = ProfileData.from_file(glob.glob(out + "/**/*.xplane.pb", recursive=True)[0])
  for plane in trace.planes:
    for line in plane.lines:
      total, count = collections.Counter(), collections.Counter()
      for ev in line.events:
        total[ev.name] += ev.duration_ns
        count[ev.name] += 1
      if not total:
        continue
      print(f"{plane.name} {line.name}: {sum(count.values())} events (profiled call {wall:.2f} s)")
      for name, ns in total.most_common(6):  # nested events: these sums overlap
        print(f"  {ns / 1e9:7.3f} s  x{count[name]:<5} {name[:90]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
