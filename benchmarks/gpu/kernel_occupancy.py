"""The Triton decode kernel on an H100 without one: registers, spills, shared memory and
programs per SM of every configuration the GPU suite's sweep times.

    python benchmarks/gpu/kernel_occupancy.py  # batch 256, Qwen3-0.6B's shape
    python benchmarks/gpu/kernel_occupancy.py --batch 64 --json PATH

Each configuration of `paged_decode_check.sweep_configs` (KV positions a step, warps,
pipeline stages, split target) is compiled for an H100 as `plan` compiles (JAX's CUDA
plugin, a deviceless topology; Triton to PTX), at Qwen3-0.6B's decode attention shape (16
query heads of 128 over 8 kv heads, pages of 16, bfloat16, 640 positions a row), with XLA
dumping its output to a temporary folder. The launch (grid, threads a program, dynamic
shared memory) is read from XLA's thunk sequence; registers and spills from CUDA's
`ptxas -v` on the PTX XLA wrote ($PTXAS, else ptxas on the PATH, else
/usr/local/cuda/bin/ptxas). Programs per SM: the fewest that the registers, the shared
memory and the threads allow (an H100 SM: 65,536 registers allocated 256 a warp, 228 KiB of
shared memory with 1 KiB reserved a program, 2,048 threads, 32 programs), and the waves the
grid takes over 132 SMs. In a memory-bound kernel the programs in flight are what hides
HBM's latency; this bounds them and says nothing of speed, which the sweep measures on a
GPU (`paged_decode_check.py --sweep`).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# An H100 SM (compute capability 9.0) and the chip.
SM_REGISTERS = 65536
REGISTER_GRANULE = 256  # registers are allocated per warp in units of 256
SM_SHARED_BYTES = 228 * 1024
RESERVED_SHARED_BYTES = 1024  # the CUDA runtime's, per program
SM_THREADS = 2048
SM_PROGRAMS = 32
SMS = 132

_LAUNCH = re.compile(r"(paged_decode_attention\w*) grid: \[(\d+), (\d+), (\d+)\] "
                     r"threads: \[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes")


def programs_per_sm(registers: int, threads: int, shared_bytes: int) -> dict:
  """How many programs of `threads` threads using `registers` a thread and `shared_bytes`
  of dynamic shared memory fit one SM at once, and what limits it."""
  warps = -(-threads // 32)
  per_warp = -(-registers * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
  limits = {
      "registers": SM_REGISTERS // (per_warp * warps),
      "shared memory": SM_SHARED_BYTES // (shared_bytes + RESERVED_SHARED_BYTES),
      "threads": SM_THREADS // threads,
      "programs": SM_PROGRAMS,
  }
  fit = min(limits.values())
  return dict(programs_per_sm=fit, limited_by=min(limits, key=limits.get),
              warps_per_sm=fit * warps)


def parse_launch(thunks: str) -> dict | None:
  """The decode kernel's launch in an XLA thunk sequence dump (None when absent)."""
  m = _LAUNCH.search(thunks)
  if not m:
    return None
  name, *dims = m.groups()
  grid, threads = [int(x) for x in dims[:3]], [int(x) for x in dims[3:6]]
  return dict(name=name, programs=math.prod(grid), threads=math.prod(threads),
              shared_bytes=int(dims[6]))


def parse_ptxas(text: str) -> dict:
  """Registers and spill bytes from `ptxas -v` output (one kernel)."""
  regs = re.search(r"Used (\d+) registers", text)
  spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
  if not regs:
    raise ValueError(f"no register count in ptxas' output: {text.strip()[:200]!r}")
  return dict(registers=int(regs.group(1)),
              spill_bytes=int(spill.group(1)) + int(spill.group(2)) if spill else 0)


def find_ptxas() -> str | None:
  for path in (os.environ.get("PTXAS"), shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
    if path and os.path.exists(path):
      return path
  return None


def _newest_module(dump: str, done: set[str]) -> str:
  """The dump's module written by the last compile (its file prefix)."""
  prefixes = {p.split(".thunk_sequence.txt")[0]
              for p in glob.glob(os.path.join(dump, "module_*.thunk_sequence.txt"))} - done
  if len(prefixes) != 1:
    raise RuntimeError(f"expected one new compiled module in {dump}, found {len(prefixes)}")
  return prefixes.pop()


def compile_for_h100(batch: int):
  """`compile(**cfg)`: compiles `triton_decode_attention` with `cfg` for an
  H100 without one (`plan`'s deviceless target) at Qwen3-0.6B's decode attention shape (16
  query heads of 128 over 8 kv heads, pages of 16, bfloat16, 40 pages a row) for `batch`
  rows. Shared with the test that every sweep configuration compiles."""
  import functools  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.models import paged_triton  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import chips  # pylint: disable=g-import-not-at-top

  mesh = Mesh(np.array(chips.topology_devices(chips.resolve("h100"))[:1]), ("x",))
  rep = NamedSharding(mesh, PartitionSpec())
  width = 40  # 640 positions of 16
  args = [jax.ShapeDtypeStruct(shape, dtype, sharding=rep) for shape, dtype in (
      ((batch, 16, 128), jnp.bfloat16), ((batch * width + 1, 16, 16, 128), jnp.bfloat16),
      ((batch, width), jnp.int32), ((batch,), jnp.int32))]

  def compile_one(**cfg):
    fn = jax.jit(functools.partial(paged_triton.triton_decode_attention, **cfg))
    with jax.set_mesh(mesh):
      return fn.lower(*args).compile()

  return compile_one


def measure(configs: list[dict], batch: int, ptxas: str, dump: str,
            log=print) -> list[dict]:
  """Compiles each configuration for an H100 (XLA dumping to `dump`, set before jax
  started) and reads its launch, registers and occupancy."""
  import jax  # pylint: disable=g-import-not-at-top

  compile_one = compile_for_h100(batch)
  rows, done = [], set()
  for cfg in configs:
    row = dict(batch=batch, **cfg)
    compile_one(**cfg)
    module = _newest_module(dump, done)
    done.add(module)
    with open(module + ".thunk_sequence.txt", encoding="utf-8") as f:
      launch = parse_launch(f.read())
    ptx = [p for p in glob.glob(module + ".*.ptx")
           if ".entry paged_decode_attention" in open(p, encoding="utf-8").read()]
    if not glob.glob(module + ".*.ptx"):
      raise RuntimeError(f"XLA wrote no PTX under --xla_dump_to with jax {jax.__version__} "
                         "(0.10.2, our pin, does)")
    if launch is None or len(ptx) != 1:
      raise RuntimeError(f"{cfg}: the kernel's launch or PTX not found in {module}.*")
    out = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx[0], "-o", os.devnull],
                         capture_output=True, text=True, check=True)
    row.update(launch, **parse_ptxas(out.stdout + out.stderr))
    row.update(programs_per_sm(row["registers"], row["threads"], row["shared_bytes"]))
    row["waves"] = round(row["programs"] / (SMS * row["programs_per_sm"]), 2)
    log(f"  {cfg['kv_tokens_per_block']:3d} pos, {cfg['num_warps']} warps, "
        f"{cfg['num_stages']} stages, target {cfg['target_programs']:4d}: "
        f"{row['programs']:5d} programs x {row['threads']} threads, {row['registers']} registers"
        f"{' (spills ' + str(row['spill_bytes']) + ' B)' if row['spill_bytes'] else ''}, "
        f"{row['shared_bytes'] / 1024:.0f} KiB shared -> {row['programs_per_sm']} a SM "
        f"({row['warps_per_sm']} warps; {row['limited_by']}), {row['waves']} waves")
    rows.append(row)
  return rows


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--batch", type=int, default=256, help="decoding rows (the suite's: 64, 256)")
  p.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON")
  args = p.parse_args(argv)
  ptxas = find_ptxas()
  if ptxas is None:
    print("kernel_occupancy: CUDA's ptxas not found (set $PTXAS, or install the CUDA toolkit "
          "or the nvidia-cuda-nvcc-cu12 wheel)", file=sys.stderr)
    return 2
  dump = tempfile.mkdtemp(prefix="kernel_occupancy_")
  # Before jax starts: XLA reads its flags once.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree
  from benchmarks.gpu import paged_decode_check  # pylint: disable=g-import-not-at-top

  try:
    configs = paged_decode_check.sweep_configs(16)
    print(f"kernel_occupancy: {len(configs)} configurations at batch {args.batch}, compiled "
          f"for an H100 (no GPU), ptxas {ptxas}", flush=True)
    rows = measure(configs, args.batch, ptxas, dump)
  except RuntimeError as e:
    print(f"kernel_occupancy: {e}", file=sys.stderr)
    return 2
  finally:
    shutil.rmtree(dump, ignore_errors=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"gpu": "h100", "batch": args.batch, "runs": rows}, f, indent=1)
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
