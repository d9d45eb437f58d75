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
