"""Slice names -> libtpu topologies and chip figures."""

import pytest

from jaxrl_scale.errors import UserError
from jaxrl_scale.plan import chips


@pytest.mark.parametrize("name, topology, count", [
    ("v5p-128", "v5p:4x4x4", 64),  # v5p-N counts TensorCores: 2 per chip
    ("v5p-8", "v5p:2x2x1", 4),
    ("v5p-512", "v5p:4x8x8", 256),
    ("v6e-64", "v6e:8x8", 64),  # v6e-N counts chips
    ("v6e-8", "v6e:2x4", 8),
    ("v5litepod-256", "v5e:16x16", 256),
    ("v5e-256", "v5e:16x16", 256),
    ("v4-64", "v4:2x4x4", 32),
    ("v5p:4x4x4", "v5p:4x4x4", 64),
    ("v6e:2x2", "v6e:2x2", 4),
])
def test_resolve(name, topology, count):
  sl = chips.resolve(name)
  assert (sl.topology, sl.chips) == (topology, count)


@pytest.mark.parametrize("name, words", [
    ("v7x-64", "unknown TPU generation"),
    ("v5p-7", "must be even"),
    ("v5p-96", "no v5p slice of that size"),
    ("v6e:4x4x4", "2 dimensions"),
    ("tpu", "expected an accelerator type"),
])
def test_resolve_errors(name, words):
  with pytest.raises(UserError, match=words):
    chips.resolve(name)


def test_chip_table_is_per_device():
  # v4's simulated topology lists both TensorCores of a chip: figures are per core.
  assert chips.CHIPS["v4"].peak_flops == pytest.approx(275e12 / 2)
  assert chips.CHIPS["v5p"].hbm_bytes == 95 * 2**30


def test_topology_devices_match_the_name():
  pytest.importorskip("libtpu")
  sl = chips.resolve("v5p-128")
  devices = chips.topology_devices(sl)
  assert len(devices) == 64
  assert {d.process_index for d in devices} == set(range(16))  # 16 hosts of 4 chips
  assert chips.chip_for_device(devices[0]) is chips.CHIPS["v5p"]


@pytest.mark.parametrize("name, hosts", [
    ("v5e-8", 1), ("v6e-8", 1), ("v5e:2x4", 1),  # Cloud TPU: one host of 8 chips
    ("v5e-4", 1), ("v6e-16", 4), ("v5e-256", 64),  # larger v5e / v6e: 4 chips per host
    ("v5p-8", 1), ("v5p-16", 2), ("v5p-128", 16),  # v5p: 4 chips per host
])
def test_slices_have_the_hosts_cloud_tpu_gives(name, hosts):
  pytest.importorskip("libtpu")
  sl = chips.resolve(name)
  devices = chips.topology_devices(sl)
  assert len(devices) == sl.devices
  assert len({d.process_index for d in devices}) == hosts
  assert sl.chips_per_host * hosts == sl.chips


@pytest.mark.parametrize("kind, part, tflops, gbps", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM5 80 GB", 989, 3350),
    ("NVIDIA H100 PCIe", "H100 PCIe 80 GB", 756, 2000),  # not the SXM's peaks
    ("NVIDIA H100 NVL", "H100 NVL 94 GB", 835, 3900),
    ("NVIDIA H200", "H200 SXM 141 GB", 989, 4800),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80 GB", 312, 2039),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40 GB", 312, 1555),
    ("TPU v5 lite", "TPU v5e", 197, 819),
    ("TPU v5", "TPU v5p", 459, 2765),
    ("TPU v6 lite", "TPU v6e", 918, 1640),
])
def test_device_peaks_by_exact_kind(kind, part, tflops, gbps):
  peaks = chips.device_peaks(kind)
  assert (peaks.part, peaks.bf16_flops / 1e12, peaks.hbm_bandwidth / 1e9) == pytest.approx(
      (part, tflops, gbps))


@pytest.mark.parametrize("kind", ["cpu", "NVIDIA H100", "NVIDIA H100 80GB HBM3e", "H100",
                                  "NVIDIA GeForce RTX 4090", "TPU v7", ""])
def test_an_unknown_device_has_no_peaks(kind):
  """A name that only contains a known part's name gets None, not that part's peaks."""
  assert chips.device_peaks(kind) is None


def test_plan_chips_and_device_peaks_agree():
  """The plan's chip tables and the measurement table hold one figure per part."""
  for chip in (*chips.CHIPS.values(), *chips.GPUS.values()):
    peaks = chips.device_peaks(chip.device_kind)
    assert peaks is not None, chip.device_kind
    assert peaks.bf16_flops == pytest.approx(chip.peak_flops * chip.devices_per_chip)
    assert peaks.hbm_bandwidth == pytest.approx(chip.hbm_bandwidth * chip.devices_per_chip)
