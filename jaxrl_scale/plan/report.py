"""Compile each program for the topology; HBM per chip, FLOPs, roofline; table and JSON.

Per program and per chip:
  hbm_bytes_per_chip   arguments + outputs - aliased (donated) + temporaries + code, from the
                       compiler's memory analysis, plus buffers that stay allocated beside it
                       (the optimizer state during the weight cast)
  compiled_flops       dots and convolutions of the compiled program, loop bodies times their
                       trip counts (`hlo_cost`); float32 dots at HIGHEST precision run as six
                       bf16 passes on a TPU's MXU and are charged so in `bound_seconds`
  model_flops          6N per trained token, 2N per generated token, attention counted
  bound_seconds        max(FLOPs / peak, bytes / HBM bandwidth): the roofline time of one call
  mfu_bound            model FLOPs / (peak x bound_seconds): the best MFU the program allows
  kernel_bound_seconds every kernel's own roofline, summed (`hlo_cost`: a memory-bound kernel
                       cannot lend its idle compute to a compute-bound one): a tighter lower
                       bound on the call's time; mfu_kernel_bound the MFU it allows
  tokens_per_second    tokens one call processes / bound_seconds, job-wide and per chip (for
                       decode: the roofline of reading the weights and the live KV each step)
  min_bytes_per_chip   (decode) the least a call must read: the weights once per step and
                       every slot's KV at the plan's mean context; bytes_over_min =
                       bytes_accessed / that
Collectives between chips are not in the roofline (ICI bandwidth is not modelled); the
kernel-by-kernel sum leaves them and asynchronous copies out. `collective_bytes_per_chip`
adds up the largest array of every collective a call runs (`hlo_cost`).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable

import jax

from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.plan import chips as chips_lib
from jaxrl_scale.plan import hlo_cost, hlo_text
from jaxrl_scale.plan import programs as programs_lib

GIB = 2**30
PROGRAMS = ("train_step", "sft_step", "weight_cast", "prefill", "decode", "resume")
# Free HBM below which a program that fits is flagged tight: XLA's own estimate leaves out
# allocator fragmentation and the runtime's buffers.
HEADROOM = 0.10
# On a GPU the estimate is also made without the GPU: at the two shapes measured on an H200
# it came out 5% and 20% below what the device reported (docs/gpu.md), so more is kept free.
HEADROOM_GPU = 0.20


def _hbm(stats: Any) -> float:
  return float(stats.argument_size_in_bytes + stats.output_size_in_bytes
               - stats.alias_size_in_bytes + stats.temp_size_in_bytes
               + stats.generated_code_size_in_bytes)


def _shortfall(message: str) -> tuple[float | None, str]:
  """(bytes needed if the compiler said, first line) of an out-of-memory compile error."""
  first = message.strip().splitlines()[0] if message.strip() else message
  m = re.search(r"([\d.]+)([KMGT])\) exceeds available HBM", message)
  scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  need = float(m.group(1)) * scale[m.group(2)] if m else None
  return need, first[:300]


_NO_TILES = "Couldn't find output tile sizes"


def measure(program: programs_lib.Program, sl: chips_lib.Slice) -> dict[str, Any]:
  """Lowers and compiles one program; returns its row of the plan."""
  chip = sl.chip
  capacity = sl.usable_bytes
  chips = program.mesh.devices.size
  row: dict[str, Any] = {
      "chips": int(chips), "hbm_capacity_bytes": int(capacity),
      "mesh": {k: int(v) for k, v in program.mesh.shape.items()},
      "groups": program.groups, "tokens_per_call": int(program.tokens),
      "model_flops_per_chip": program.model_flops / chips,
      "resident_bytes_per_chip": {k: int(v) for k, v in program.resident.items()},
  }
  if program.micro_rows is not None:
    row.update(micro_batch_rows=program.micro_rows, data_parallel=program.data_parallel,
               micro_batch_rows_per_chip=program.micro_rows_per_chip)
  if program.notes:
    row["notes"] = list(program.notes)
  t0 = time.perf_counter()
  try:
    with jax.set_mesh(program.mesh):
      lowered = program.lower()
      try:
        compiled = lowered.compile()
      except Exception as e:  # pylint: disable=broad-except
        if _NO_TILES not in str(e) or chip.platform != "gpu":
          raise
        # XLA:GPU compiling without a device (no autotuning) found no Triton tiling for a
        # small float32 matmul (the CPU demo's hidden 64 model); on the GPU the autotuner
        # picks. Planned with cuBLAS for the matmuls instead, and said so.
        compiled = lowered.compile({"xla_gpu_enable_triton_gemm": False})
        row.setdefault("notes", []).append(
            "compiled with xla_gpu_enable_triton_gemm=false: without a GPU to autotune on, "
            "XLA found no Triton tiling for one of its matmuls")
  except Exception as e:  # pylint: disable=broad-except
    need, first = _shortfall(str(e))
    first = first or type(e).__name__  # an assertion inside a kernel says nothing else
    row.update(compile_seconds=time.perf_counter() - t0, fits=False, error=first,
               hbm_bytes_per_chip=int(need) if need is not None else None,
               compiled_flops_per_chip=None, bytes_accessed_per_chip=None,
               bound_seconds=None, mfu_bound=None, kernel_bound_seconds=None,
               kernel_bound_seconds_by_family=None, mfu_kernel_bound=None)
    return row
  row["compile_seconds"] = time.perf_counter() - t0
  stats = compiled.memory_analysis()
  hbm = _hbm(stats) + program.also_resident
  text = compiled.as_text()
  cost = hlo_cost.analyze(text, paged_layers=program.paged_layers,
                          expert_shards=int(program.mesh.shape.get(mesh_lib.EXPERT_AXIS, 1)),
                          f32_cost=chip.f32_cost,
                          rates=(chip.peak_flops, chip.hbm_bandwidth))
  t_flops = cost.weighted_flops / chip.peak_flops
  t_bytes = cost.bytes / chip.hbm_bandwidth
  bound = max(t_flops, t_bytes)
  row.update(
      hbm_bytes_per_chip=int(hbm), fits=bool(hbm <= capacity),
      headroom=1.0 - hbm / capacity,
      temporaries_bytes_per_chip=int(stats.temp_size_in_bytes),
      arguments_bytes_per_chip=int(stats.argument_size_in_bytes),
      also_resident_bytes_per_chip=int(program.also_resident),
      compiled_flops_per_chip=cost.flops, bytes_accessed_per_chip=cost.bytes,
      flops_ratio=(cost.flops / row["model_flops_per_chip"]
                   if row["model_flops_per_chip"] else None),
      bound_seconds=bound, bound_by="compute" if t_flops >= t_bytes else "memory",
      mfu_bound=(row["model_flops_per_chip"] / (chip.peak_flops * bound)
                 if bound > 0 and program.model_flops else None),
      kernel_bound_seconds=cost.kernel_seconds,
      kernel_bound_seconds_by_family={
          f: cost.family_seconds[f] for f in hlo_cost.FAMILIES if f in cost.family_seconds},
      collective_bytes_per_chip=cost.collective_bytes,
      mfu_kernel_bound=(row["model_flops_per_chip"] / (chip.peak_flops * cost.kernel_seconds)
                        if cost.kernel_seconds > 0 and program.model_flops else None),
      tokens_per_second=(program.tokens * program.groups / bound
                         if bound > 0 and program.tokens else None),
      tokens_per_second_per_chip=(program.tokens / bound / chips
                                  if bound > 0 and program.tokens else None),
      unknown_loops=cost.unknown_loops,
      xla_rematerialized=hlo_text.rematerialized(text))
  if program.min_bytes:
    least = sum(program.min_bytes.values())
    row.update(min_bytes_per_chip=least, bytes_over_min=cost.bytes / least,
               min_bytes_per_chip_by_kind={k: float(v) for k, v in program.min_bytes.items()})
  return row


def run_plan(cfg: Any, mcfg: Any, sl: chips_lib.Slice,
             progress: Callable[[str], None] = lambda s: None,
             only: list[str] | None = None) -> dict[str, Any]:
  """Builds the run's programs for the slice and compiles each (or those named in `only`);
  the plan as a dict."""
  devices = chips_lib.topology_devices(sl)
  slices, programs = programs_lib.build(cfg, mcfg, devices)
  if only is not None:
    programs = [p for p in programs if p.name in only]
  out: dict[str, Any] = {
      "topology": sl.topology, "name": sl.label, "chip": sl.chip.name, "chips": sl.chips,
      "devices": len(devices), "hosts": len({d.process_index for d in devices}),
      "layout": slices.describe(), "model_params": int(mcfg.num_params()),
      "platform": sl.chip.platform,
      "chip_spec": {"peak_flops": sl.chip.peak_flops, "hbm_bytes": sl.chip.hbm_bytes,
                    "usable_bytes": sl.usable_bytes, "hbm_bandwidth": sl.chip.hbm_bandwidth},
      # What the train step keeps for its backward pass, printed with the plan because it
      # sets both the step's HBM and its compiled / model FLOPs.
      "trainer": {"remat": cfg.optim.remat, "logits_chunk": cfg.optim.logits_chunk,
                  "micro_batch_prompts": cfg.optim.micro_batch_prompts,
                  "sequence_parallel": cfg.optim.sequence_parallel},
      "programs": {},
  }
  for program in programs:
    for note in program.notes:
      progress(f"  note: {note}")
    progress(f"  compiling {program.name} on {program.mesh.devices.size} devices ...")
    row = measure(program, sl)
    out["programs"][program.name] = row
    progress("    " + _line(program.name, row))
  out["fits"] = all(r["fits"] for r in out["programs"].values())
  return out


_REMAT_NOTE = ("XLA recomputes {n} values where they are used instead of keeping them "
               "(its rematerialization: the program's peak was above the compiler's memory "
               "limit); the FLOPs and bounds above include that work. {fix} leave it less "
               "to do")
_REMAT_FIX = ("Fewer rows per micro-batch (optim.micro_batch_prompts) or a remat policy that "
              "keeps less (optim.remat)")
# At one row a chip, fewer prompts per micro-batch would only leave chips idle.
_REMAT_FIX_ONE_ROW = "A remat policy that keeps less (optim.remat) would"
# The sampler's programs: the optim keys do not reach them; the pool is their argument.
_REMAT_FIX_SAMPLER = {
    "prefill": "A chunked prefill (sampler.prefill_chunk) or a smaller page pool "
               "(sampler.kv_cache_tokens)",
    "resume": "A smaller page pool (sampler.kv_cache_tokens) would",
    "decode": "Fewer slots (sampler.num_slots) or a smaller page pool "
              "(sampler.kv_cache_tokens)"}
_REMAT_GPU = ("; the limit on a GPU is JAX's share of its memory "
              "(XLA_PYTHON_CLIENT_MEM_FRACTION) less the program's arguments and outputs, "
              "times --xla_gpu_memory_limit_slop_factor (95%)")


def _gib(n: float | None) -> str:
  return "?" if n is None else f"{n / GIB:.2f} GiB"


def _line(name: str, r: dict[str, Any]) -> str:
  if r.get("error"):
    return f"{name}: does not compile: {r['error']}"
  mfu = "-" if r.get("mfu_bound") is None else f"{r['mfu_bound']:.2f}"
  if r.get("mfu_kernel_bound") is not None:
    mfu += f" ({r['mfu_kernel_bound']:.2f} kernel by kernel)"
  ratio = "-" if r.get("flops_ratio") is None else f"{r['flops_ratio']:.2f}x"
  return (f"{name}: {_gib(r['hbm_bytes_per_chip'])} of {_gib(r['hbm_capacity_bytes'])} "
          f"({'fits' if r['fits'] else 'DOES NOT FIT'}), compiled/model FLOPs {ratio}, "
          f"bound {r['bound_seconds']:.3g} s ({r['bound_by']}; "
          f"{r['kernel_bound_seconds']:.3g} s kernel by kernel), MFU bound {mfu}, "
          f"collectives {_gib(r.get('collective_bytes_per_chip'))} a call, "
          f"compile {r['compile_seconds']:.0f} s")


def table(plan: dict[str, Any]) -> str:
  """The human-readable report."""
  lines = [f"plan for {plan['name']} ({plan['topology']}: {plan['chips']} chips, "
           f"{plan['hosts']} hosts) | {plan['model_params'] / 1e9:.2f}B params",
           f"  {plan['layout']}"]
  if plan.get("platform") == "gpu":
    spec = plan["chip_spec"]
    lines.append(f"  GPU memory: JAX preallocates {spec['usable_bytes'] / spec['hbm_bytes']:.0%} "
                 f"(XLA_PYTHON_CLIENT_MEM_FRACTION) of {spec['hbm_bytes'] / GIB:.2f} GiB: "
                 f"{spec['usable_bytes'] / GIB:.2f} GiB per GPU; compiled without a GPU, so "
                 "without autotuning (XLA's default matmul tiles)")
  if plan.get("trainer"):
    t = plan["trainer"]
    lines.append(f"  train step: optim.remat {t['remat']}, optim.micro_batch_prompts "
                 f"{t['micro_batch_prompts']}, optim.logits_chunk {t['logits_chunk']}"
                 + (", optim.sequence_parallel" if t.get("sequence_parallel") else ""))
  head = (f"  {'program':<12}{'chips':>6}{'HBM/chip':>12}{'of':>10}{'headroom':>10}"
          f"{'params':>10}{'optim':>10}{'kv':>10}{'temp':>10}{'FLOPs x':>9}{'bound s':>10}"
          f"{'kernels s':>10}"
          f"{'MFU<=':>7}{'tok/s':>11}{'compile':>9}")
  lines.append(head)
  for name, r in plan["programs"].items():
    res = r.get("resident_bytes_per_chip", {})
    if r.get("error"):
      lines.append(f"  {name:<12}{r['chips']:>6}  does not compile: {r['error']}")
      continue
    headroom = 1 - r["hbm_bytes_per_chip"] / r["hbm_capacity_bytes"]
    g = lambda n: "-" if not n else f"{n / GIB:.2f}"  # noqa: E731
    lines.append(
        f"  {name:<12}{r['chips']:>6}{g(r['hbm_bytes_per_chip']):>12}"
        f"{g(r['hbm_capacity_bytes']):>10}{headroom:>10.0%}{g(res.get('params')):>10}"
        f"{g(res.get('optimizer', 0) + r.get('also_resident_bytes_per_chip', 0)):>10}"
        f"{g(res.get('kv_cache')):>10}{g(r.get('temporaries_bytes_per_chip')):>10}"
        f"{'-' if r.get('flops_ratio') is None else format(r['flops_ratio'], '.2f'):>9}"
        f"{r['bound_seconds']:>10.3g}{r['kernel_bound_seconds']:>10.3g}"
        f"{'-' if r.get('mfu_bound') is None else format(r['mfu_bound'], '.2f'):>7}"
        f"{'-' if not r.get('tokens_per_second') else format(r['tokens_per_second'], '.3g'):>11}"
        f"{r['compile_seconds']:>8.0f}s")
  lines.append("  (GiB per chip; 'optim' includes buffers resident beside the program; "
               "bound s: the whole program's roofline, kernels s: each kernel's summed, the "
               "tighter; MFU<= and tok/s job-wide at 'bound s')")
  for name, r in plan["programs"].items():
    fam = r.get("kernel_bound_seconds_by_family")
    if fam and r.get("kernel_bound_seconds"):
      lines.append(f"  {name} kernels s by family: " + ", ".join(
          f"{f} {t:.3g} ({t / r['kernel_bound_seconds']:.0%})" for f, t in fam.items()))
  for name, r in plan["programs"].items():
    lines.extend(f"  {name}: {note}" for note in r.get("notes", []))
  for name, r in plan["programs"].items():
    if r.get("xla_rematerialized"):
      fix = _REMAT_FIX_SAMPLER.get(name) or (
          _REMAT_FIX_ONE_ROW if r.get("micro_batch_rows_per_chip") == 1 else _REMAT_FIX)
      note = _REMAT_NOTE.format(n=r["xla_rematerialized"], fix=fix)
      lines.append(f"  {name}: {note}"
                   + (_REMAT_GPU if plan.get("platform") == "gpu" else ""))
  dec = plan["programs"].get("decode", {})
  if dec.get("tokens_per_second_per_chip"):
    lines.append(f"  decode roofline: {dec['tokens_per_second_per_chip']:,.0f} tok/s per chip "
                 f"(weights + every slot's KV at the pool's average length, read once per "
                 f"step, over HBM bandwidth)")
  if dec.get("bytes_over_min"):
    kind = dec["min_bytes_per_chip_by_kind"]
    lines.append(f"  decode bytes: {dec['bytes_over_min']:.2f}x the minimum per chip "
                 f"({dec['bytes_accessed_per_chip'] / GIB:.4g} GiB read a call against "
                 f"{kind['weights'] / GIB:.4g} GiB of weights + {kind['kv_cache'] / GIB:.4g} "
                 f"GiB of live KV)")
  keep = HEADROOM_GPU if plan.get("platform") == "gpu" else HEADROOM
  tight = [n for n, r in plan["programs"].items()
           if r.get("fits") and r.get("headroom", 1.0) < keep]
  if tight:
    lines.append(f"  tight: {', '.join(tight)} leave less than {keep:.0%} of HBM free; "
                 "allocator fragmentation and runtime buffers may not fit in that"
                 + ("; the GPU estimate has come out up to 20% low" if keep == HEADROOM_GPU
                    else ""))
  if plan.get("platform") == "gpu":
    lines.append(measured_note())
  lines.append("fits: yes" if plan["fits"] else "fits: NO")
  return "\n".join(lines)


def measured_note() -> str:
  """Under a GPU plan: what the bounds became on a real H100 (`chips.H100_MEASURED`)."""
  m = chips_lib.H100_MEASURED
  train = " and ".join(f"{r:.2f}x ({shape})" for shape, r in m["train_step_over_kernel_bound"])
  decode = " and ".join(f"{f:.0%} (batch {b})" for b, f in m["decode_fraction_of_roofline"])
  return (f"  measured on one H100 ({m['date']}, docs/gpu.md): the train steps took {train} "
          f"their 'kernels s' bound; decode read HBM at {decode} of its roofline. Expect a "
          f"step about that far from the bounds above, not at them")


def _train_step_fix(r: dict[str, Any]) -> str:
  """What to change when the train step does not fit, by how its micro-batch splits."""
  rest = ("use optim.remat=full (the least activation memory), lower optim.logits_chunk, set "
          "optim.sequence_parallel=true (with mesh.trainer_tp > 1), or give the trainer more "
          "devices (mesh.trainer_devices)")
  rows, n = r.get("micro_batch_rows"), r.get("data_parallel")
  if rows is not None and n and rows % n:
    # Every chip computes the whole micro-batch: no other knob helps as much.
    return (f"a micro-batch's {rows} rows do not split over the trainer's {n} data-parallel "
            f"chips, so each computes all of them: make rl.prompts_per_step x "
            f"rl.generations_per_prompt (or sft.batch_size) a multiple of {n}, or give the "
            f"trainer {n // math.gcd(rows, n)}x fewer devices (mesh.trainer_devices)")
  if r.get("micro_batch_rows_per_chip") == 1:
    # One row a chip already: fewer prompts per micro-batch would leave chips idle.
    return rest
  return "lower optim.micro_batch_prompts (fewer rows per micro-batch), " + rest


def advice(plan: dict[str, Any]) -> str | None:
  """One line naming the first program that does not fit, its shortfall and what to change."""
  for name, r in plan["programs"].items():
    if r["fits"]:
      continue
    need = r.get("hbm_bytes_per_chip")
    if r.get("error") and not need and "RESOURCE_EXHAUSTED" not in r["error"]:
      # Not a memory shortfall: the compiler refused the program.
      return f"{name} does not compile for {plan['name']}: {r['error']}"
    short = (f"needs {_gib(need)} of {_gib(r['hbm_capacity_bytes'])} per chip"
             if need else r.get("error", "does not compile"))
    fix = {
        "train_step": _train_step_fix(r),
        "sft_step": "set sft.micro_batch_size, or give the trainer more devices",
        "weight_cast": "give the trainer more devices (mesh.trainer_devices)",
        "prefill": "set sampler.prefill_chunk (prefill in pieces), lower sampler.num_slots "
                   "or the largest sampler.prompt_buckets, or raise mesh.generator_tp",
        "decode": "lower sampler.num_slots or sampler.max_new_tokens, or raise "
                  "mesh.generator_tp / mesh.generator_devices",
    }.get(name, "change the config")
    beside = r.get("also_resident_bytes_per_chip") or 0
    if name in ("train_step", "sft_step") and beside:
      # Colocated roles: the sampler's state is on the same chips for the whole step.
      fix += (f"; {_gib(beside)} of the sampler's weights and KV cache stay beside it "
              "(colocated): free them while it steps (sampler.sleep_while_training=true "
              "with pipeline.mode colocated or sync), or lower sampler.kv_cache_tokens or "
              "sampler.num_slots")
    if plan.get("platform") == "gpu" and need:
      fix = "raise XLA_PYTHON_CLIENT_MEM_FRACTION (e.g. 0.9), or " + fix
    return f"{name} does not fit on {plan['name']}: {short}; {fix}"
  return None
