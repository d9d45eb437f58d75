"""The CPU decode chunk's dense views: `paged_attention.paged_view` against whole pages.

    python benchmarks/sampler/view_bench.py                 # 64 rows x 192 positions
    python benchmarks/sampler/view_bench.py --rows 16 --positions 128
    python benchmarks/sampler/view_bench.py --quick --json  # small shapes, one JSON line

On XLA:CPU a decode chunk starts by copying every layer's keys and values of the rows' pages
into dense views (keys [B, K, H, S], values [B, K, S, H]) that its steps read and append to.
`paged_view` takes the keys and values apart before it gathers them. The reference here is
the way it was built before (2026-12-07): gather the whole pages [B, V, C, 2K, H], then
split and transpose them. Both run jitted over every layer of one pool, alternating,
`--rounds` times each; the script checks that they give the same arrays and prints the
median time of each and their ratio. Shapes default to benchmarks/peers' random Qwen3
(8 layers, 4 kv heads of 64, float32, pages of 16 positions).
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


def whole_pages_view(kv_LDPCXH, layer: int, table_BM, view_pages: int):
  """The reference: the rows' whole pages gathered, then split into keys and values."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b = table_BM.shape[0]
  d = kv_LDPCXH.shape[1]
  shard_B = jnp.arange(b, dtype=jnp.int32) // (b // d)
  pages_BVCXH = kv_LDPCXH[layer][shard_B[:, None], table_BM[:, :view_pages]]
  _, v, c, x, h = pages_BVCXH.shape
  kv_B2KSH = pages_BVCXH.reshape(b, v * c, x // 2, 2, h).transpose(0, 3, 2, 1, 4)
  return kv_B2KSH[:, 0].swapaxes(2, 3), kv_B2KSH[:, 1]


def run(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.models import paged_attention  # pylint: disable=g-import-not-at-top

  if args.positions % args.page_size:
    raise SystemExit(f"view_bench: --positions {args.positions} is not a multiple of "
                     f"--page-size {args.page_size}")
  view_pages = args.positions // args.page_size
  pages = args.rows * view_pages + 8  # every row's own pages, and a few spare
  rng = np.random.default_rng(0)
  pool = jnp.asarray(rng.standard_normal(
      (args.layers, 1, pages + 1, args.page_size, 2 * args.kv_heads, args.head_dim),
      dtype=np.float32))
  table = jnp.asarray(rng.permutation(pages)[:args.rows * view_pages]
                      .reshape(args.rows, view_pages).astype(np.int32))
  sides = {
      "paged_view": jax.jit(lambda p, t: [paged_attention.paged_view(p, i, t, view_pages)
                                          for i in range(args.layers)]),
      "whole_pages": jax.jit(lambda p, t: [whole_pages_view(p, i, t, view_pages)
                                           for i in range(args.layers)]),
  }
  out = {n: jax.block_until_ready(f(pool, table)) for n, f in sides.items()}  # compiles
  for (k, v), (k_ref, v_ref) in zip(out["paged_view"], out["whole_pages"]):
    if not (np.array_equal(k, k_ref) and np.array_equal(v, v_ref)):
      raise SystemExit("view_bench: paged_view and the whole-pages reference differ")
  times = {n: [] for n in sides}
  for _ in range(args.rounds):
    for n, f in sides.items():
      start = time.perf_counter()
      jax.block_until_ready(f(pool, table))
      times[n].append(time.perf_counter() - start)
  med = {n: statistics.median(t) for n, t in times.items()}
  view_mb = 2 * args.rows * args.kv_heads * args.head_dim * args.positions * 4 / 1e6
  return {"shape": {k: getattr(args, k) for k in (
              "layers", "rows", "positions", "page_size", "kv_heads", "head_dim")},
          "view_mb_per_layer": view_mb, "equal": True, "seconds": times,
          "median_s": med, "speedup": med["whole_pages"] / med["paged_view"],
          "jax": jax.__version__, "device": str(jax.devices()[0].device_kind),
          "cpu_cores": os.cpu_count()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--layers", type=int, default=8)
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--positions", type=int, default=192, help="view positions per row")
  p.add_argument("--page-size", type=int, default=16)
  p.add_argument("--kv-heads", type=int, default=4)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--json", action="store_true", help="one JSON line on stdout")
  p.add_argument("--quick", action="store_true", help="small shapes, 3 rounds")
  args = p.parse_args(argv)
  if args.quick:
    args.layers, args.rows, args.positions, args.rounds = 2, 4, 32, 3
  if min(args.layers, args.rows, args.positions, args.page_size, args.kv_heads,
         args.head_dim, args.rounds) < 1:
    p.error("every size and --rounds must be >= 1")
  res = run(args)
  if args.json:
    print(json.dumps(res))
    return 0
  s = res["shape"]
  print(f"{s['layers']} layers' views of {s['rows']} rows x {s['positions']} positions "
        f"({res['view_mb_per_layer']:.1f} MB a layer), {res['device']}, jax {res['jax']}: "
        f"paged_view {res['median_s']['paged_view'] * 1e3:.1f} ms, whole pages "
        f"{res['median_s']['whole_pages'] * 1e3:.1f} ms: {res['speedup']:.2f}x "
        f"(same arrays)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
