"""Where one sampling call of a side spends its time: JAX's profiler around a uniform-length
call (peers.py's first workload; `--workload rl`: its RL-lengths call), then the call's wall time split over the compiled ops.

    python benchmarks/peers/profile_call.py ours /tmp/jaxrl_peers/qwen3_8_512_32768_f32
    /work/peers-venv/bin/python benchmarks/peers/profile_call.py tunix CHECKPOINT

Prints the call's time unprofiled and profiled, then the wall time per compiled program
(XLA's program id: a side's prefill and each decode program) and per op kind and JAX
source op (the HLO's op_name, read from an HLO dump the script turns on): every instant
of the call is shared among the ops running on XLA's threads then, and an instant when
none runs is "idle" (host work, waits). Summing each thread's events instead misleads on
XLA:CPU: a YNNPACK matmul's helper threads record no events of their own, so a two-core
op looks single-threaded.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]  # peers.py by package, peer_sides.py as the sides load it

import peer_sides  # noqa: E402  pylint: disable=wrong-import-position


DUMP = tempfile.mkdtemp(prefix="profile_call_hlo_")
# Events that are no op's work: the executor's own spans, thread-pool bookkeeping.
_NOT_OPS = ("ThunkExecutor", "SlinkyThreadPool::Await", "ThreadpoolListener", "end: ")


def hlo_op_names(dump: str) -> dict[tuple[str, str], str]:
  """(program id, HLO instruction) -> its JAX op_name, from the optimised HLO dumped."""
  out = {}
  for path in glob.glob(os.path.join(dump, "module_*.cpu_after_optimizations.txt")):
    program = str(int(re.search(r"module_(\d+)", path).group(1)))
    with open(path) as f:
      for m in re.finditer(r"%(\S+) = \S+ [\w-]+\([^\n]*?op_name=\"([^\"]+)\"", f.read()):
        out[(program, m.group(1))] = re.sub(r"^jit\([^)]*\)/", "", m.group(2))
  return out


def wall_split(trace, names: dict[tuple[str, str], str], top: int) -> list[str]:
  """The table `main` prints: wall seconds per program and per (program, op kind, op_name).

  The ops are the events of XLA's threads (not the Python thread's); at each instant the
  wall time is shared equally among the ops running then."""
  events = []  # (start, end, (program, instruction))
  for plane in trace.planes:
    for line in plane.lines:
      if "XLAEigen" not in line.name and "PjRt" not in line.name:
        continue
      for ev in line.events:
        if ev.duration_ns > 0 and not ev.name.startswith(_NOT_OPS + ("while",)):
          events.append((ev.start_ns, ev.start_ns + ev.duration_ns,
                         (str(dict(ev.stats).get("program_id", "")), ev.name)))
  if not events:
    return ["no XLA op events in the trace"]
  edges = sorted([(a, 1, k) for a, _, k in events] + [(b, -1, k) for _, b, k in events])
  running, share = collections.Counter(), collections.Counter()
  idle, last = 0, edges[0][0]
  for at, step, key in edges:
    if at > last:
      n = sum(running.values())
      if not n:
        idle += at - last
      for k, c in running.items():
        share[k] += (at - last) * c / n
    last = at
    running[key] += step
    if not running[key]:
      del running[key]
  count = collections.Counter(k for _, _, k in events)
  programs, rows, calls = collections.Counter(), collections.Counter(), collections.Counter()
  for (program, op), ns in share.items():
    programs[program] += ns
    kind = re.sub(r"\.\d+$", "", op)
    row = (program, kind, re.sub(r"\d+", "#", names.get((program, op), kind))[-60:])
    rows[row] += ns
    calls[row] += count[(program, op)]
  span = (edges[-1][0] - edges[0][0]) / 1e9
  out = [f"span {span:.2f} s, idle (no op running) {idle / 1e9:.2f} s; per program: "
         + ", ".join(f"{p} {ns / 1e9:.2f} s" for p, ns in programs.most_common())]
  out += [f"{ns / 1e9:7.3f} s  x{calls[r]:<6d} program {r[0]:<3s} {r[1][:26]:<26s} {r[2]}"
          for r, ns in rows.most_common(top)]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("side", choices=sorted(peer_sides.SIDES))
  p.add_argument("model", help="the Hugging Face checkpoint peers.py wrote or was given")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--decode-chunk", type=int, default=16, help="ours only")
  p.add_argument("--top", type=int, default=25, help="rows of the op table (default 25)")
  p.add_argument("--workload", choices=("uniform", "rl"), default="uniform",
                 help="peers.py's uniform-length call (default) or its RL-lengths one")
  args = p.parse_args(argv)
  # The HLO after optimisation names each op's JAX source (op_name); before jax loads.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_dump_to={DUMP} --xla_dump_hlo_pass_re=NONE").strip()
  import jax  # pylint: disable=g-import-not-at-top
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  from benchmarks.peers import peers  # pylint: disable=g-import-not-at-top

  with open(os.path.join(args.model, "config.json")) as f:
    vocab = __import__("json").load(f)["vocab_size"]
  works = peers.sample_workloads(vocab, peers.parse_args(["--batches", str(args.batch)]))
  work = next(w for w in works if w["kind"] == args.workload)
  side = peer_sides.SIDES[args.side]()
  side.load(args.model)
  kw = dict(prompts=work["prompts"], max_new=128, eos=work["eos"], slots=args.batch,
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
  print(f"{args.side}: {wall:.2f} s profiled")
  trace = ProfileData.from_file(glob.glob(out + "/**/*.xplane.pb", recursive=True)[0])
  for line in wall_split(trace, hlo_op_names(DUMP), args.top):
    print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
