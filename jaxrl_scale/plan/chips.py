"""Cloud TPU chips and slice names: peak FLOP/s, HBM, bandwidth, and what a name counts.

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
"""

from __future__ import annotations

import dataclasses
import math
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
  dims: int  # topology rank: 3 (v4, v5p) or 2 (v5e, v6e)


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "TPU v4", 275e12 / 2, 16 * GIB, 1200e9 / 2, 2, True, 3),
    "v5e": Chip("v5e", "TPU v5 lite", 197e12, 16 * GIB, 819e9, 1, False, 2),
    "v5p": Chip("v5p", "TPU v5", 459e12, 95 * GIB, 2765e9, 1, True, 3),
    "v6e": Chip("v6e", "TPU v6 lite", 918e12, 32 * GIB, 1640e9, 1, False, 2),
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
    dims = [int(x) for x in self.topology.split(":")[1].split("x")]
    if self.chip.dims == 2 and self.chips == 8:  # v5e-8 / v6e-8: one host of 8 chips
      return (dims[0], dims[1], 1)
    return None

  @property
  def chips_per_host(self) -> int:
    bounds = self.host_bounds
    return math.prod(bounds) if bounds else min(self.chips, 4)


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
                    "v6e-64, v5litepod-256, v4-64, or a chip topology like v5p:4x4x4")
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
  for chip in CHIPS.values():
    if device.device_kind == chip.device_kind:
      return chip
  raise UserError(f"no chip figures for device kind {device.device_kind!r}")


def topology_devices(sl: Slice) -> list:
  """The slice's devices from libtpu, compiled for without a TPU attached.

  Needs the `libtpu` package (`pip install -e ".[tpu]"`); JAX_PLATFORMS=cpu keeps the
  default backend on the CPU meanwhile.
  """
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
