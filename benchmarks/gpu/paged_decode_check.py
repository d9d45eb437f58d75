"""Decode attention on this machine's device: the Triton paged kernel against the gather.

    python benchmarks/gpu/paged_decode_check.py --json           # on a GPU: compiled Triton
    python benchmarks/gpu/paged_decode_check.py --sweep --json   # its block sizes timed instead
    python benchmarks/gpu/paged_decode_check.py --quick --sweep  # CPU: interpret mode, tiny

One layer's decode write and read (`paged_attention.paged_attention`) at Qwen3-0.6B's
attention shape (16 query heads of 128 over 8 kv heads, pages of 16) for a batch of rows
whose lengths spread over 1..640 positions (one inactive row), in bfloat16 and in float32:
the largest difference of impl="triton" (`paged_triton`) from impl="gather" and of both
from a float32 XLA attention over the same pages, and the time of each read. The tests
check the kernel in interpret mode on CPU; this is the same check compiled for the GPU,
where the tests cannot run.

A read is timed as --reps reads chained inside one jitted loop (each read's queries are the
last one's output, so none can be skipped or hoisted), median of --repeats calls after a
first, divided by --reps: one read alone would time the dispatch, not a kernel of tens of
microseconds. Beside each time: the live keys and values the read must load (each row's
positions, every kv head) over that time, in GB/s and as a fraction of the device's HBM
bandwidth (sampler_bench's table; CPU: none).

--sweep, instead of the above: the bf16 Triton read at each batch of --sweep-batches
(default 64 and 256, the GPU suite's decode batches) for every block configuration in
`sweep_configs` (KV positions per kernel step, Triton warps and pipeline stages, how far a
row's pages split), each compiled once, one read checked against a float32 attention, then
timed as above; the fastest per batch ("best") is printed and kept in the JSON, next to the
module's defaults (`paged_triton.KV_TOKENS_PER_BLOCK`, `NUM_WARPS`, `NUM_STAGES`,
`TARGET_PROGRAMS`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree


# Configurations (KV positions a step, warps, stages) the sweep leaves out. Compiled for an
# H100 (`kernel_occupancy.py`: ptxas -v on the PTX XLA writes, no GPU), 256 positions at 4
# warps and one stage spill registers (255 a thread, 376-424 bytes of spills at batch 64 and
# 256); on the H100 of 2026-11-27 it took 1.26x (batch 64) and 1.35x (batch 256) the
# defaults' time.
LEFT_OUT = {(256, 4, 1)}


def default_config() -> dict:
  """`paged_triton`'s block configuration as it stands (what the decode runs untold)."""
  from jaxrl_scale.models import paged_triton  # pylint: disable=g-import-not-at-top

  return dict(kv_tokens_per_block=paged_triton.KV_TOKENS_PER_BLOCK,
              num_warps=paged_triton.NUM_WARPS, num_stages=paged_triton.NUM_STAGES,
              target_programs=paged_triton.TARGET_PROGRAMS)


def sweep_configs(page: int) -> list[dict]:
  """The block configurations --sweep times: `paged_triton`'s defaults first; then 2, 4, 8
  and 16 pages per kernel step with 4 and 8 warps and 1 and 2 software-pipeline stages
  (each stage holds a block of keys and one of values in shared memory) but `LEFT_OUT`;
  then the default block with no split at all and with splits up to a grid 4x the
  default's target."""
  from jaxrl_scale.models import paged_triton  # pylint: disable=g-import-not-at-top

  target = paged_triton.TARGET_PROGRAMS
  warps, stages = paged_triton.NUM_WARPS, paged_triton.NUM_STAGES
  block = paged_triton.KV_TOKENS_PER_BLOCK
  out = [default_config()]
  out += [dict(kv_tokens_per_block=page * n, num_warps=w, num_stages=st,
               target_programs=target)
          for n in (2, 4, 8, 16) for w in (4, 8) for st in (1, 2)
          if (page * n, w, st) != (block, warps, stages) and (page * n, w, st) not in LEFT_OUT]
  out += [dict(kv_tokens_per_block=block, num_warps=warps, num_stages=stages,
               target_programs=t) for t in (1, 4 * target)]
  return out


def chained(step):
  """jit of (carry, n, *consts) -> carry: `step(carry, *consts) -> carry` n times in one
  loop (n traced: one compile for any count). The carry is donated: a pool written in the
  loop is updated in place, not copied per call."""
  import jax  # pylint: disable=g-import-not-at-top

  def loop(carry, n, *consts):
    return jax.lax.fori_loop(0, n, lambda i, c: step(c, *consts), carry)

  return jax.jit(loop, donate_argnums=0)


def read_seconds(fn, carry, consts: tuple, reps: int, repeats: int) -> tuple[float, object]:
  """(seconds per step of `fn = chained(step)`, the last carry): `reps` steps a call, median
  of `repeats` calls after a first (the compile, if any), over reps. The carry is handed
  from call to call; the caller's `carry` is consumed."""
  import jax  # pylint: disable=g-import-not-at-top

  carry = jax.block_until_ready(fn(carry, reps, *consts))
  seconds = []
  for _ in range(repeats):
    t = time.perf_counter()
    carry = jax.block_until_ready(fn(carry, reps, *consts))
    seconds.append(time.perf_counter() - t)
  return statistics.median(seconds) / reps, carry


def peak_gbps(kind: str, platform: str) -> float | None:
  """The device's HBM bandwidth in GB/s (by exact device kind), None on CPU or unknown."""
  from benchmarks.sampler import sampler_bench  # pylint: disable=g-import-not-at-top

  if platform == "cpu":
    return None
  return sampler_bench.peak_gbps(kind)


def bandwidth(nbytes: float, seconds: float, peak: float | None) -> dict:
  gbps = nbytes / seconds / 1e9
  return dict(gbps=round(gbps, 1), of_peak=round(gbps / peak, 4) if peak else None)


def pool_for(rng, batch: int, max_len: int, page: int, k: int, h: int, dtype):
  """(pool [1, 1, P, C, 2K, H], page table, positions, write mask): `batch` rows over
  random pages, row 0 at the longest length, the last row inactive."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  width = -(-max_len // page)
  pages = batch * width + 1  # the last one the null page
  pos = rng.integers(0, max_len, batch).astype(np.int32)
  pos[0] = max_len - 1
  write = np.ones(batch, bool)
  write[-1] = False
  table = rng.permutation(pages - 1)[:batch * width].reshape(batch, width).astype(np.int32)
  pool = jnp.asarray(rng.normal(size=(1, 1, pages, page, 2 * k, h)), dtype)
  return pool, table, pos, write


def sweep(rng, batches: list[int], max_len: int, shape: tuple, reps: int, repeats: int,
          peak: float | None, interpret: bool, configs: list[dict] | None = None) -> dict:
  """--sweep: the bf16 Triton read per block configuration (`configs`, default
  `sweep_configs`; see the module docstring). Each configuration compiles once: one read
  is checked against a float32 attention, then `reps` chained reads are timed. "best" is the
  fastest per batch."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  # pylint: disable-next=g-import-not-at-top
  from jaxrl_scale.models import paged_attention, paged_triton

  n, k, h, page = shape
  rows, best = [], {}
  for batch in batches:
    pool, table, pos, _ = pool_for(rng, batch, max_len, page, k, h, jnp.bfloat16)
    pages_QCXH = pool[0, 0]
    lens = jnp.asarray(pos + 1)
    q = jnp.asarray(rng.normal(size=(batch, n, h)), jnp.bfloat16)
    live = float((pos + 1).sum()) * 2 * k * h * 2  # bf16 keys and values of live positions
    ref = np.asarray(paged_attention.gather_decode_attention(
        q.astype(jnp.float32), pages_QCXH[jnp.asarray(table)].astype(jnp.float32), lens))
    consts = (pages_QCXH, jnp.asarray(table), lens)
    for cfg in configs or sweep_configs(page):
      read = functools.partial(paged_triton.triton_decode_attention, interpret=interpret,
                               **cfg)
      row = dict(batch=batch, **cfg)
      try:
        fn = chained(lambda q, *rest, read=read: read(q, *rest).astype(q.dtype))
        out = fn(jnp.array(q), 1, *consts)  # one read
        row["max_abs_vs_f32"] = float(np.abs(np.asarray(out.astype(jnp.float32)) - ref).max())
        sec, _ = read_seconds(fn, jnp.array(q), consts, reps, repeats)
        row.update(us=round(sec * 1e6, 2), **bandwidth(live, sec, peak))
      except Exception as e:  # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
      rows.append(row)
      print(f"  sweep batch {batch}: {cfg} -> " + (
          f"{row['us']:.1f} us, {row['gbps']:.0f} GB/s"
          + (f" ({row['of_peak']:.1%} of HBM)" if row.get("of_peak") else "")
          + f", max |out - f32| {row['max_abs_vs_f32']:.3g}" if "us" in row
          else row["error"]), flush=True)
    timed = [r for r in rows if r["batch"] == batch and "us" in r]
    if timed:
      best[str(batch)] = min(timed, key=lambda r: r["us"])
      print(f"  fastest at batch {batch}: {best[str(batch)]}", flush=True)
  return dict(defaults=default_config(), reps=reps, runs=rows, best=best)


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--max-len", type=int, default=640)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--reps", type=int, default=None,
                 help="reads chained per timed call (default 50; --quick 2)")
  p.add_argument("--sweep", action="store_true",
                 help="instead: time the bf16 Triton read per block configuration")
  p.add_argument("--sweep-batches", default="64,256",
                 help="comma-separated batches for --sweep (--quick: 4)")
  p.add_argument("--quick", action="store_true", help="tiny shapes (CPU: interpret mode)")
  p.add_argument("--json", action="store_true", help="print one JSON line last")
  args = p.parse_args()
  try:
    batches = [int(x) for x in args.sweep_batches.split(",") if x]
  except ValueError:
    p.error(f"--sweep-batches {args.sweep_batches!r}: give comma-separated integers")
  import jax
  import jax.numpy as jnp

  from jaxrl_scale.models import paged_attention

  n, k, h, page = (4, 2, 16, 4) if args.quick else (16, 8, 128, 16)
  batch, max_len = (4, 24) if args.quick else (args.batch, args.max_len)
  reps = args.reps or (2 if args.quick else 50)
  device = jax.devices()[0]
  peak = peak_gbps(device.device_kind, device.platform)
  rng = np.random.default_rng(0)
  width = -(-max_len // page)
  report = dict(device=device.device_kind, batch=batch, max_len=max_len,
                heads=n, kv_heads=k, head_dim=h, page_size=page, reps=reps, hbm_gbps=peak)
  for dtype in () if args.sweep else ("bfloat16", "float32"):
    pool, table, pos, write = pool_for(rng, batch, max_len, page, k, h, dtype)
    q = jnp.asarray(rng.normal(size=(batch, 1, n, h)), dtype)
    k_new = jnp.asarray(rng.normal(size=(batch, 1, k, h)), dtype)
    v_new = jnp.asarray(rng.normal(size=(batch, 1, k, h)), dtype)
    outs, times = {}, {}
    for impl in ("gather", "triton"):
      fn = jax.jit(functools.partial(paged_attention.paged_attention, view_pages=width,
                                     impl=impl))
      out, new_pool, _ = fn(q, k_new, v_new, pool, jnp.int32(0), table, pos, write)
      outs[impl] = np.asarray(out.astype(jnp.float32))[write, 0]

      def step(carry, table, pos, write, fn=fn):  # the layer's write and read, chained
        out, pool, _ = fn(carry[0], k_new, v_new, carry[1], jnp.int32(0), table, pos, write)
        return out.astype(carry[0].dtype), pool

      times[impl], _ = read_seconds(chained(step), (jnp.array(q), jnp.array(pool)),
                                 (jnp.asarray(table), jnp.asarray(pos), jnp.asarray(write)),
                                 reps, args.repeats)
    # A float32 reference over the written pool (the gather's write; the same for both).
    ref = np.asarray(paged_attention.gather_decode_attention(
        q[:, 0].astype(jnp.float32),
        new_pool[0, 0][jnp.asarray(table)].astype(jnp.float32),
        jnp.asarray(pos + 1)))[write]
    live = float((pos + 1)[write].sum()) * 2 * k * h * jnp.dtype(dtype).itemsize
    report[dtype] = dict(
        triton_vs_gather=float(np.abs(outs["triton"] - outs["gather"]).max()),
        triton_vs_f32=float(np.abs(outs["triton"] - ref).max()),
        gather_vs_f32=float(np.abs(outs["gather"] - ref).max()),
        gather_us=round(times["gather"] * 1e6, 2), triton_us=round(times["triton"] * 1e6, 2),
        gather=bandwidth(live, times["gather"], peak),
        triton=bandwidth(live, times["triton"], peak))
    r = report[dtype]
    print(f"{dtype}: max |triton - gather| {r['triton_vs_gather']:.3g}, |triton - f32| "
          f"{r['triton_vs_f32']:.3g}, |gather - f32| {r['gather_vs_f32']:.3g}; one write + "
          f"read: gather {r['gather_us']:.1f} us ({r['gather']['gbps']:.0f} GB/s of live KV), "
          f"triton {r['triton_us']:.1f} us ({r['triton']['gbps']:.0f} GB/s)"
          + (f"; HBM {peak:.0f} GB/s" if peak else ""), flush=True)
  if args.sweep:
    report["sweep"] = sweep(rng, [4] if args.quick else batches, max_len, (n, k, h, page),
                            reps, args.repeats, peak, interpret=device.platform != "gpu")
  if args.json:
    print(json.dumps(report), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
