"""Cloud TPU chips, NVIDIA GPUs and slice names: peak FLOP/s, HBM, bandwidth, what a name counts.

A slice is named two ways: by accelerator type as `gcloud` and tpu_scripts/create.sh take
it (`v5p-128`, `v6e-64`, `v5litepod-256` / `v5e-256`, `v4-64`) or by chip topology as
libtpu takes it (`v5p:4x4x4`, `v6e:8x8`). The number in an accelerator type counts
TensorCores on v4 and v5p (two per chip) and chips on v5e and v6e, so v5p-128 and v6e-64
are both 64 chips. `resolve` turns either spelling into the libtpu topology name.

Hosts: a slice is built with the hosts Cloud TPU gives it, since the mesh split and what the
compiler accepts depend on them. v5e-8 and v6e-8 (2x4) are one host of 8 chips; larger v5e
and v6e slices, and every v5p and v4 slice, have 4 chips (a 2x2 or 2x2x1 box) per host.
libtpu's default puts at most 4 chips on a host, so the one-host-of-8 slices ask for it
(`chips_per_host_bounds`).

Per-chip figures (bf16 dense peak, HBM capacity, HBM bandwidth) are Google's published
numbers, from the Cloud TPU system-architecture pages:
  v4   https://cloud.google.com/tpu/docs/v4       275 TFLOP/s, 32 GiB, 1,200 GB/s
  v5e  https://cloud.google.com/tpu/docs/v5e      197 TFLOP/s, 16 GiB,   819 GB/s
  v5p  https://cloud.google.com/tpu/docs/v5p      459 TFLOP/s, 95 GiB, 2,765 GB/s
  v6e  https://cloud.google.com/tpu/docs/v6e      918 TFLOP/s, 32 GiB, 1,640 GB/s
libtpu's simulated v4 topology lists each of a chip's two TensorCores as its own device
(no megacore), so v4 figures are given per device: half a chip.

NVIDIA GPUs are named `h100`, `h200`, `a100` (one GPU) or `h100-8`, `h100-16` (GPUs in all;
above 8, hosts of 8). XLA compiles for them without a GPU attached (JAX's CUDA plugin, a
deviceless topology and a target description: `gpu_target`), with no autotuning: matmul
tile choices are XLA's defaults, while fusion, memory and the kernels picked (cuDNN
attention, the Triton paged decode kernel) are the device's. Figures (dense bf16 tensor-core
peak, float32 CUDA-core peak, HBM bandwidth) from NVIDIA's datasheets for the SXM parts
(a plan names the SXM part; a measured run is scored by its exact device kind,
`DEVICE_PEAKS`, which also holds the PCIe and NVL parts):
  H100 SXM5 80 GB   989 TFLOP/s bf16, 67 TFLOP/s fp32, 3.35 TB/s
  H200 SXM 141 GB   989 TFLOP/s bf16, 67 TFLOP/s fp32, 4.8 TB/s
  A100 SXM4 80 GB   312 TFLOP/s bf16, 19.5 TFLOP/s fp32, 2.04 TB/s
and device memory as the driver reports it. JAX preallocates XLA_PYTHON_CLIENT_MEM_FRACTION
(default 0.75) of it, which is what a program can use (`usable_bytes`), and compiles every
program on a GPU against that allocator's size: XLA keeps a program's peak under it, less
the program's arguments and outputs, times --xla_gpu_memory_limit_slop_factor (95%), by
recomputing values instead of keeping them (its rematerialization pass) where the peak is
above. The deviceless compile has no allocator, and XLA takes 80% of the target's device
memory instead: `gpu_target` states the memory so that those 80% are the allocator's size
at this process's XLA_PYTHON_CLIENT_MEM_FRACTION, the device's limit.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

from jaxrl_scale.errors import UserError

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per JAX device (a chip, or a TensorCore on v4)."""

  name: str  # v4, v5e, v5p, v6e
  device_kind: str  # jax Device.device_kind
  peak_flops: float  # dense bf16 FLOP/s per device
  hbm_bytes: int  # HBM capacity per device
  hbm_bandwidth: float  # bytes/s per device
  devices_per_chip: int  # JAX devices per chip in libtpu's topology
  name_counts_cores: bool  # accelerator type number counts TensorCores (2 per chip)
  dims: int  # topology rank: 3 (v4, v5p) or 2 (v5e, v6e); 1 for GPUs (a count)
  platform: str = "tpu"  # "tpu" or "gpu"
  # Relative cost of a float32 dot by precision (default, high, highest), in bf16-peak
  # units: a TPU runs HIGHEST as 6 bf16 MXU passes and HIGH as 3; a GPU runs DEFAULT as
  # TF32 (half the bf16 rate), HIGH as 3 bf16 passes, HIGHEST on CUDA cores.
  f32_cost: tuple[float, float, float] = (1.0, 3.0, 6.0)
  # GPUs: what XLA needs to compile for the part without it (gpu_device_info fields).
  target: tuple[tuple[str, float], ...] = ()


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "TPU v4", 275e12 / 2, 16 * GIB, 1200e9 / 2, 2, True, 3),
    "v5e": Chip("v5e", "TPU v5 lite", 197e12, 16 * GIB, 819e9, 1, False, 2),
    "v5p": Chip("v5p", "TPU v5", 459e12, 95 * GIB, 2765e9, 1, True, 3),
    "v6e": Chip("v6e", "TPU v6 lite", 918e12, 32 * GIB, 1640e9, 1, False, 2),
}

_HOPPER = (("core_count", 132), ("clock_rate_ghz", 1.98), ("l2_cache_size", 50 * 2**20),
           ("shared_memory_per_core", 228 * 2**10), ("shared_memory_per_block_optin", 227 * 2**10),
           ("compute_capability", 9.0))
GPUS: dict[str, Chip] = {
    "h100": Chip("h100", "NVIDIA H100 80GB HBM3", 989e12, 84_929_347_584, 3.35e12, 1, False, 1,
                 "gpu", (2.0, 3.0, 989 / 67), _HOPPER + (("memory_bandwidth", 3.35e12),)),
    "h200": Chip("h200", "NVIDIA H200", 989e12, 143_771 * 2**20, 4.8e12, 1, False, 1,
                 "gpu", (2.0, 3.0, 989 / 67), _HOPPER + (("memory_bandwidth", 4.8e12),)),
    "a100": Chip("a100", "NVIDIA A100-SXM4-80GB", 312e12, 81_920 * 2**20, 2.039e12, 1, False, 1,
                 "gpu", (2.0, 3.0, 312 / 19.5),
                 (("core_count", 108), ("clock_rate_ghz", 1.41), ("l2_cache_size", 40 * 2**20),
                  ("shared_memory_per_core", 164 * 2**10),
                  ("shared_memory_per_block_optin", 163 * 2**10), ("compute_capability", 8.0),
                  ("memory_bandwidth", 2.039e12))),
}
GPUS_PER_HOST = 8  # an HGX / DGX node; larger counts are hosts of 8


@dataclasses.dataclass(frozen=True)
class Peaks:
  """A part's datasheet peaks, per JAX device, for scoring a measured run."""

  part: str  # the part, e.g. "H100 PCIe 80 GB"
  bf16_flops: float  # dense bf16 (tensor core / MXU) FLOP/s, no sparsity
  hbm_bandwidth: float  # bytes/s


# jax Device.device_kind -> its part's peaks, matched EXACTLY: parts that share a name
# prefix differ (an H100 PCIe has 76% of the SXM's bf16 peak and 60% of its bandwidth), so a
# substring match would score one against another. A kind not here has no peak-based
# fraction (`device_peaks` returns None) rather than a wrong one. NVIDIA's datasheets (dense
# figures: the sparse ones halved); the TPU rows are Google's per-chip figures above (a
# real v4 runs megacore: one device per chip, unlike libtpu's simulated v4 topology).
DEVICE_PEAKS: dict[str, Peaks] = {
    "NVIDIA H100 80GB HBM3": Peaks("H100 SXM5 80 GB", 989e12, 3.35e12),
    "NVIDIA H100 PCIe": Peaks("H100 PCIe 80 GB", 756e12, 2.0e12),
    "NVIDIA H100 NVL": Peaks("H100 NVL 94 GB", 835e12, 3.9e12),
    "NVIDIA H200": Peaks("H200 SXM 141 GB", 989e12, 4.8e12),
    "NVIDIA H200 NVL": Peaks("H200 NVL 141 GB", 835e12, 4.8e12),
    "NVIDIA A100-SXM4-80GB": Peaks("A100 SXM4 80 GB", 312e12, 2.039e12),
    "NVIDIA A100-SXM4-40GB": Peaks("A100 SXM4 40 GB", 312e12, 1.555e12),
    "NVIDIA A100 80GB PCIe": Peaks("A100 PCIe 80 GB", 312e12, 1.935e12),
    "NVIDIA A100-PCIE-40GB": Peaks("A100 PCIe 40 GB", 312e12, 1.555e12),
    "NVIDIA L40S": Peaks("L40S 48 GB", 362e12, 0.864e12),
    "TPU v4": Peaks("TPU v4", 275e12, 1200e9),
    "TPU v5 lite": Peaks("TPU v5e", 197e12, 819e9),
    "TPU v5": Peaks("TPU v5p", 459e12, 2765e9),
    "TPU v6 lite": Peaks("TPU v6e", 918e12, 1640e9),
}


def device_peaks(device_kind: str) -> Peaks | None:
  """The datasheet peaks of a device by its exact `device_kind`; None when unknown (CPU,
  or a part not in DEVICE_PEAKS): report no peak-based fraction then, not a guess."""
  return DEVICE_PEAKS.get(device_kind.strip())

# What one NVIDIA H100 measured against these bounds (jax 0.11.2, 2026-11-28; the GPU
# suite's summaries and decode reports in benchmarks/results/gpu_h100_2026-11-28*/, docs/gpu.md):
# each train step's time over its kernel-by-kernel bound ("kernels s", which XLA's own
# kernels reach only so far: tile shapes, launch and tail effects, the matmuls at the 670-690
# TFLOP/s a bf16 matmul reached rather than the 989 spec), and decode's fraction of its HBM
# roofline (weights and live KV read once a step). A GPU plan prints them beside its
# bounds: the step to expect is the bound times about that ratio.
H100_MEASURED = {
    "date": "2026-11-28",
    "train_step_over_kernel_bound": (("qwen3_1p7b 16 x 4096", 1.631),
                                     ("qwen3_0p6b 32 x 2048", 1.687)),
    "decode_fraction_of_roofline": ((256, 0.5399), (64, 0.4228)),
}

_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e"}

# Accelerator type -> topology, for the sizes Cloud TPU sells (from the same pages).
_SHAPES_3D = {1: "1x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16",
              4096: "16x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
              256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A resolved slice: its chip, libtpu topology name and size."""

  chip: Chip
  topology: str  # libtpu name, e.g. "v5p:4x4x4"
  chips: int
  label: str  # what the user typed

  @property
  def devices(self) -> int:
    return self.chips * self.chip.devices_per_chip

  @property
  def host_bounds(self) -> tuple[int, int, int] | None:
    """libtpu's chips_per_host_bounds for this slice; None: libtpu's default (4 per host)."""
    if self.chip.platform == "gpu":
      return None
    dims = [int(x) for x in self.topology.split(":")[1].split("x")]
    if self.chip.dims == 2 and self.chips == 8:  # v5e-8 / v6e-8: one host of 8 chips
      return (dims[0], dims[1], 1)
    return None

  @property
  def chips_per_host(self) -> int:
    if self.chip.platform == "gpu":
      return min(self.chips, GPUS_PER_HOST)
    bounds = self.host_bounds
    return math.prod(bounds) if bounds else min(self.chips, 4)

  @property
  def usable_bytes(self) -> int:
    """HBM a program can use per device: all of a TPU's; on a GPU the share JAX's allocator
    takes (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75)."""
    return int(self.chip.hbm_bytes * mem_fraction()) if self.chip.platform == "gpu" \
        else self.chip.hbm_bytes


def mem_fraction() -> float:
  """The share of a GPU's memory JAX preallocates for XLA (its default 0.75, or the
  XLA_PYTHON_CLIENT_MEM_FRACTION this process was given)."""
  text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
  if not text:
    return 0.75
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not 0 < value <= 1:
    raise UserError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={text!r}: expected a number in (0, 1]")
  return value


def _gpu(name: str) -> Slice | None:
  """`h100`, `h100-8`, `h200-16`, `a100-4` -> Slice; None if the name is not a GPU's."""
  m = re.fullmatch(r"([a-zA-Z]\d+)(?:-(\d+))?", name.strip())
  if not m or m.group(1).lower() not in GPUS:
    return None
  chip = GPUS[m.group(1).lower()]
  count = int(m.group(2) or 1)
  if count < 1 or (count > GPUS_PER_HOST and count % GPUS_PER_HOST) or (
      count < GPUS_PER_HOST and GPUS_PER_HOST % count):
    raise UserError(f"--topology {name!r}: {count} GPUs; use 1, 2, 4, 8 or a multiple of "
                    f"{GPUS_PER_HOST} (hosts of {GPUS_PER_HOST})")
  per_host = min(count, GPUS_PER_HOST)
  return Slice(chip, f"{chip.name}:1x{count // per_host}x{per_host}", count, name)


def _chip(generation: str, source: str) -> Chip:
  key = _ALIASES.get(generation.lower(), generation.lower())
  if key not in CHIPS:
    raise UserError(f"--topology {source!r}: unknown TPU generation {generation!r} "
                    f"(known: {', '.join(sorted(CHIPS))})")
  return CHIPS[key]


def resolve(name: str) -> Slice:
  """`v5p-128`, `v5e-256`, `v5litepod-16`, `v6e-64`, `v4-64` or `v5p:4x4x4` -> Slice.

  Raises:
    UserError: an unknown generation, a size Cloud TPU does not sell, or a malformed name.
  """
  text = name.strip()
  gpu = _gpu(text)
  if gpu is not None:
    return gpu
  m = re.fullmatch(r"([a-zA-Z0-9]+):(\d+(?:x\d+)+)", text)
  if m:
    chip = _chip(m.group(1), name)
    dims = [int(x) for x in m.group(2).split("x")]
    if len(dims) != chip.dims:
      raise UserError(f"--topology {name!r}: {chip.name} topologies have {chip.dims} "
                      f"dimensions, e.g. {chip.name}:{_example(chip)}")
    return Slice(chip, f"{chip.name}:{m.group(2)}", math.prod(dims), name)
  m = re.fullmatch(r"([a-zA-Z0-9]+)-(\d+)", text)
  if not m:
    raise UserError(f"--topology {name!r}: expected an accelerator type like v5p-128, "
                    "v6e-64, v5litepod-256, v4-64, a chip topology like v5p:4x4x4, or "
                    f"NVIDIA GPUs like h100, h100-8 ({', '.join(GPUS)})")
  chip = _chip(m.group(1), name)
  count = int(m.group(2))
  chips = count // 2 if chip.name_counts_cores else count
  if chip.name_counts_cores and count % 2:
    raise UserError(f"--topology {name!r}: {chip.name}-N counts TensorCores (2 per chip); "
                    "N must be even")
  shapes = _SHAPES_3D if chip.dims == 3 else _SHAPES_2D
  if chips not in shapes:
    sizes = sorted(k * (2 if chip.name_counts_cores else 1) for k in shapes)
    raise UserError(f"--topology {name!r}: no {chip.name} slice of that size "
                    f"(sizes: {', '.join(str(s) for s in sizes)}); or name a chip topology "
                    f"like {chip.name}:{_example(chip)}")
  return Slice(chip, f"{chip.name}:{shapes[chips]}", chips, name)


def _example(chip: Chip) -> str:
  return "4x4x4" if chip.dims == 3 else "8x8"


def chip_for_device(device) -> Chip:
  """The Chip of a JAX device (by device_kind)."""
  for chip in (*CHIPS.values(), *GPUS.values()):
    if device.device_kind == chip.device_kind:
      return chip
  raise UserError(f"no chip figures for device kind {device.device_kind!r}")


def topology_devices(sl: Slice) -> list:
  """The slice's devices from libtpu, compiled for without a TPU attached.

  Needs the `libtpu` package (`pip install -e ".[tpu]"`); JAX_PLATFORMS=cpu keeps the
  default backend on the CPU meanwhile. GPUs: `gpu_topology_devices`.
  """
  if sl.chip.platform == "gpu":
    return gpu_topology_devices(sl)
  try:
    import libtpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError("planning for a TPU needs libtpu: pip install -e \".[tpu]\"") from None
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  kwargs = {} if sl.host_bounds is None else {"chips_per_host_bounds": list(sl.host_bounds)}
  try:
    topo = topologies.get_topology_desc(topology_name=sl.topology, platform="tpu", **kwargs)
  except Exception as e:  # libtpu's errors are long multi-line status strings
    first = str(e).strip().splitlines()[0][:200]
    raise UserError(f"--topology {sl.label!r}: libtpu refused topology {sl.topology}: "
                    f"{first}") from None
  return list(topo.devices)


def gpu_target(chip: Chip, cudnn: tuple[int, int], usable_bytes: int | None = None) -> str:
  """XLA's GPU target description (a GpuTargetConfigProto in text form) for `chip`: the
  device's limits as the CUDA driver reports them for the part, the cuDNN version the
  compiler may use, and the CUDA runtime JAX's CUDA 12 plugin is built for.

  `usable_bytes`: what JAX's allocator holds on the device (`Slice.usable_bytes`). On a GPU,
  JAX compiles with that as the module's memory size, against which XLA's scheduler and
  rematerialization keep the program's peak; without a device XLA takes 80% of the
  target's memory instead, so the target states usable_bytes / 0.8 (rounded up): the same
  limit as on the device."""
  t = dict(chip.target)
  memory = chip.hbm_bytes if usable_bytes is None else -(-usable_bytes * 100 // 80)
  major, minor = divmod(round(t["compute_capability"] * 10), 10)
  return "\n".join([
      "gpu_device_info {",
      "  threads_per_block_limit: 1024", "  threads_per_warp: 32",
      "  shared_memory_per_block: 49152",
      f"  shared_memory_per_core: {int(t['shared_memory_per_core'])}",
      "  threads_per_core_limit: 2048",
      f"  core_count: {int(t['core_count'])}", "  fpus_per_core: 128",
      "  block_dim_limit_x: 2147483647", "  block_dim_limit_y: 65535",
      "  block_dim_limit_z: 65535",
      f"  memory_bandwidth: {int(t['memory_bandwidth'])}",
      f"  l2_cache_size: {int(t['l2_cache_size'])}",
      f"  clock_rate_ghz: {t['clock_rate_ghz']}",
      f"  device_memory_size: {memory}",
      f"  shared_memory_per_block_optin: {int(t['shared_memory_per_block_optin'])}",
      f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
      "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536",
      "}",
      'platform_name: "CUDA"',
      f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}",
      "runtime_version { major: 12 minor: 9 }",
      f'device_description_str: "{chip.device_kind}"',
  ])


_CUDA_PLAN = ("planning for an NVIDIA GPU needs JAX's CUDA plugin and cuDNN (no GPU): "
              "pip install -e \".[plan-gpu]\" (Linux)")


def gpu_topology_devices(sl: Slice) -> list:
  """The GPUs of `sl` from JAX's CUDA plugin, compiled for without a GPU attached.

  JAX lowers cuDNN attention only after asking the local cuDNN library its version, so
  planning needs the cuDNN wheel as well as the plugin; the target description carries the
  same version.
  """
  if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
    raise UserError(_CUDA_PLAN)
  from jax._src.lib import cuda_versions  # pylint: disable=g-import-not-at-top
  try:
    version = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
  except RuntimeError:
    version = None
  if not version:
    raise UserError(_CUDA_PLAN)
  cudnn = (version // 10000, version % 10000 // 100)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  hosts, per_host = (int(x) for x in sl.topology.split(":")[1].split("x")[1:])
  try:
    topo = topologies.get_topology_desc(
        platform="cuda", target_config=gpu_target(sl.chip, cudnn, sl.usable_bytes),
        topology=f"1x{hosts}x{per_host}")
  except Exception as e:  # pylint: disable=broad-except
    first = str(e).strip().splitlines()[0][:200]
    raise UserError(f"--topology {sl.label!r}: JAX's CUDA plugin refused {sl.topology}: "
                    f"{first}") from None
  return list(topo.devices)
