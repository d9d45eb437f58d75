"""Decode attention on this machine's device: the Triton paged kernel against the gather.

    python benchmarks/paged_decode_check.py --json        # on a GPU: compiled Triton
    python benchmarks/paged_decode_check.py --quick       # CPU: interpret mode, tiny

One layer's decode write and read (`paged_attention.paged_attention`) at Qwen3-0.6B's
attention shape (16 query heads of 128 over 8 kv heads, pages of 16) for a batch of rows
whose lengths spread over 1..640 positions (one inactive row), in bfloat16 and in float32:
the largest difference of impl="triton" from impl="gather" and from a float32 XLA attention
over the same pages, and the time of each read (median of --repeats, after a compile). The
tests check the kernel in interpret mode on CPU; this is the same check compiled for the
GPU, where the tests cannot run.
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


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--max-len", type=int, default=640)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--quick", action="store_true", help="tiny shapes (CPU: interpret mode)")
  p.add_argument("--json", action="store_true", help="print one JSON line last")
  args = p.parse_args()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import jax.numpy as jnp

  from jaxrl_scale.models import paged_attention

  n, k, h, page = (4, 2, 16, 4) if args.quick else (16, 8, 128, 16)
  batch, max_len = (4, 24) if args.quick else (args.batch, args.max_len)
  width = -(-max_len // page)
  pages = batch * width + 1  # the last one the null page
  rng = np.random.default_rng(0)
  pos = rng.integers(0, max_len, batch).astype(np.int32)
  pos[0] = max_len - 1
  write = np.ones(batch, bool)
  write[-1] = False
  table = rng.permutation(pages - 1)[:batch * width].reshape(batch, width).astype(np.int32)
  report = dict(device=jax.devices()[0].device_kind, batch=batch, max_len=max_len,
                heads=n, kv_heads=k, head_dim=h, page_size=page)
  for dtype in ("bfloat16", "float32"):
    pool = jnp.asarray(rng.normal(size=(1, 1, pages, page, 2 * k, h)), dtype)
    q = jnp.asarray(rng.normal(size=(batch, 1, n, h)), dtype)
    k_new = jnp.asarray(rng.normal(size=(batch, 1, k, h)), dtype)
    v_new = jnp.asarray(rng.normal(size=(batch, 1, k, h)), dtype)
    outs, times = {}, {}
    for impl in ("gather", "triton"):
      fn = jax.jit(functools.partial(paged_attention.paged_attention, view_pages=width,
                                     impl=impl))
      call = lambda: fn(q, k_new, v_new, pool, jnp.int32(0), table, pos, write)  # noqa: E731
      out, new_pool, _ = call()
      jax.block_until_ready(out)
      seconds = []
      for _ in range(args.repeats):
        t = time.perf_counter()
        jax.block_until_ready(call()[0])
        seconds.append(time.perf_counter() - t)
      outs[impl] = np.asarray(out.astype(jnp.float32))[write, 0]
      times[impl] = statistics.median(seconds)
    # A float32 reference over the written pool (the gather's write; the same for both).
    ref = np.asarray(paged_attention.gather_decode_attention(
        q[:, 0].astype(jnp.float32),
        new_pool[0, 0][jnp.asarray(table)].astype(jnp.float32),
        jnp.asarray(pos + 1)))[write]
    report[dtype] = dict(
        triton_vs_gather=float(np.abs(outs["triton"] - outs["gather"]).max()),
        triton_vs_f32=float(np.abs(outs["triton"] - ref).max()),
        gather_vs_f32=float(np.abs(outs["gather"] - ref).max()),
        gather_ms=round(times["gather"] * 1e3, 4), triton_ms=round(times["triton"] * 1e3, 4))
    print(f"{dtype}: max |triton - gather| {report[dtype]['triton_vs_gather']:.3g}, "
          f"|triton - f32| {report[dtype]['triton_vs_f32']:.3g}, |gather - f32| "
          f"{report[dtype]['gather_vs_f32']:.3g}; one read+write: gather "
          f"{report[dtype]['gather_ms']:.3f} ms, triton {report[dtype]['triton_ms']:.3f} ms",
          flush=True)
  if args.json:
    print(json.dumps(report), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
