"""Where a GPU's time goes in one profiled run: the busy share of the wall time and the
kernels that took it (sampler_bench.py and train_step_bench.py with --profile).

JAX's profiler (`jax.profiler.trace`) writes an .xplane.pb; on a GPU its device planes have
one "Stream" line per CUDA stream whose events are the kernels as they ran. The profiler's
other lines on the plane ("XLA Ops", "XLA Modules", ...) repeat the same time, so only the
stream lines are read. On a CPU there are no device planes: the numbers come back empty.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time

# Kernel families by name, first match wins: the question each profile answers is how much
# of the time is matmuls, attention, and everything else (elementwise fusions, copies).
FAMILIES = (
    ("attention", re.compile(r"fmha|sdpa|flash|cudnn|paged|attention|splash", re.I)),
    ("matmul", re.compile(r"gemm|xmma|cutlass|cublas|matmul|dot|wgmma|sm\d+_", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|transpose|gather|scatter|dynamic.update", re.I)),
)


def busy_ns(intervals: list[tuple[float, float]]) -> float:
  """Length of the union of [start, end) intervals (kernels on several streams overlap)."""
  total, reach = 0.0, float("-inf")
  for start, end in sorted(intervals):
    if end > reach:
      total += end - max(start, reach)
      reach = end
  return total


def kernels(xplane_path: str) -> list[tuple[str, float, float]]:
  """(name, start ns, end ns) of every kernel on a GPU stream in a profile."""
  from jax.profiler import ProfileData

  out = []
  for plane in ProfileData.from_file(xplane_path).planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      if line.name.startswith("Stream"):
        out.extend((e.name, e.start_ns, e.end_ns) for e in line.events)
  return out


# The kernels a profile keeps (by total time; the JSON) and prints (the log).
TOP = 40
LOGGED = 15


def family(name: str) -> str:
  return next((f for f, pattern in FAMILIES if pattern.search(name)), "other")


def summarize(events: list[tuple[str, float, float]], wall_s: float, steps: int,
              top: int = TOP) -> dict:
  """The busy share of `wall_s`, ms per step by kernel family and the `top` kernels by
  total time (summed durations: kernels on different streams may overlap, so the families
  can add up to more than the busy time)."""
  steps = max(steps, 1)
  busy_s = busy_ns([(s, e) for _, s, e in events]) / 1e9
  by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  by_family: dict[str, float] = collections.defaultdict(float)
  for name, start, end in events:
    by_name[name][0] += end - start
    by_name[name][1] += 1
    by_family[family(name)] += end - start
  ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
  return dict(
      profile_wall_s=round(wall_s, 4), gpu_busy_s=round(busy_s, 4),
      gpu_busy_fraction=round(busy_s / wall_s, 4) if wall_s > 0 else None,
      gpu_busy_ms_per_step=round(busy_s / steps * 1e3, 4),
      wall_ms_per_step=round(wall_s / steps * 1e3, 4), kernels=len(events),
      family_ms_per_step={f: round(ns / 1e6 / steps, 4)
                          for f, ns in sorted(by_family.items(), key=lambda kv: -kv[1])},
      top_kernels=[dict(name=name[:160], ms_per_step=round(ns / 1e6 / steps, 4), calls=n,
                        family=family(name)) for name, (ns, n) in ranked])


def profile(fn, steps, log, label: str, unit: str = "step") -> dict:
  """Runs `fn()` (which must block until its work is done) once under the profiler and
  summarizes the GPU kernels per `unit`, `steps()` of which the run held (asked after it);
  {"profile_error": ...} if the profiler fails, and only the wall time where the profile
  holds no GPU kernel (a CPU run)."""
  import jax

  trace_dir = tempfile.mkdtemp(prefix=f"{label}_profile_")
  try:
    with jax.profiler.trace(trace_dir):
      start = time.perf_counter()
      fn()
      wall_s = time.perf_counter() - start
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    events = kernels(paths[0]) if paths else []
  except Exception as e:  # noqa: BLE001  (the numbers measured before it still get reported)
    log(f"[profile] failed: {type(e).__name__}: {e}")
    return {"profile_error": f"{type(e).__name__}: {e}"[:500]}
  if not events:
    log(f"[profile] no GPU kernels in the profile ({trace_dir}); wall {wall_s:.2f} s")
    return {"profile_wall_s": round(wall_s, 4)}
  n = steps()
  out = summarize(events, wall_s, n)
  log(f"[profile] GPU busy {out['gpu_busy_s']:.3f} s of the run's {wall_s:.3f} s wall = "
      f"{out['gpu_busy_fraction']:.1%} ({out['gpu_busy_ms_per_step']:.3f} of "
      f"{out['wall_ms_per_step']:.3f} ms per {unit}, {n} of them; {len(events)} kernels; "
      f"trace in {trace_dir})")
  log(f"[profile] ms per {unit} by kernel family: " + ", ".join(
      f"{f} {ms:.3f}" for f, ms in out["family_ms_per_step"].items()))
  for k in out["top_kernels"][:LOGGED]:
    log(f"[profile]   {k['ms_per_step']:9.3f} ms  x{k['calls']:<6d} {k['family']:9s} "
        f"{k['name'][:100]}")
  return out
