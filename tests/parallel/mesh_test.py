import jax
import pytest

from jaxrl_scale import config
from jaxrl_scale.errors import UserError
from jaxrl_scale.parallel import mesh


def test_split_fractions_gives_disjoint_slices():
  cfg = config.MeshConfig(trainer_devices=0.25, generator_devices=0.75, generator_tp=2)
  slices = mesh.make_slices(cfg)
  train_ids = {d.id for d in slices.trainer.devices.flat}
  gen_ids = {d.id for d in slices.generator.devices.flat}
  assert len(train_ids) == 2 and len(gen_ids) == 6
  assert not train_ids & gen_ids
  assert dict(slices.trainer.shape) == {"fsdp": 2, "tp": 1}
  assert dict(slices.generator.shape) == {"data": 3, "tp": 2}
  assert "trainer: 2 devices" in slices.describe()


def test_split_counts_and_colocated():
  slices = mesh.make_slices(config.MeshConfig(trainer_devices=4, generator_devices=4, trainer_tp=2))
  assert dict(slices.trainer.shape) == {"fsdp": 2, "tp": 2}
  colo = mesh.make_slices(config.MeshConfig(colocated=True))
  assert colo.trainer.devices.size == len(jax.devices()) == colo.generator.devices.size
  assert colo.describe().startswith("colocated")


@pytest.mark.parametrize("kwargs, match", [
    (dict(trainer_devices=6, generator_devices=4), "only 8 exist"),
    (dict(trainer_devices=9, generator_devices=1), "mesh.trainer_devices"),
    (dict(trainer_devices=3, generator_devices=4, trainer_tp=2), "mesh.trainer_tp"),
])
def test_bad_splits_name_the_key(kwargs, match):
  with pytest.raises(UserError, match=match):
    mesh.make_slices(config.MeshConfig(**kwargs))


def test_single_device_needs_colocated():
  with pytest.raises(UserError, match="colocated"):
    mesh.split_devices(config.MeshConfig(), devices=jax.devices()[:1])


# ---- simulated Cloud TPU topologies (libtpu, no TPU attached) ------------------------------

import functools  # noqa: E402
import os  # noqa: E402

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402


@functools.lru_cache(maxsize=None)
def _tpu_devices(name: str) -> tuple:
  pytest.importorskip("libtpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return tuple(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)


def _compile_over(mesh: jax.sharding.Mesh) -> None:
  """Compiles a matmul with a cross-device reduction over both axes of `mesh`."""
  rows, cols = mesh.axis_names
  n_rows, n_cols = mesh.shape[rows], mesh.shape[cols]
  x = jax.ShapeDtypeStruct((8 * n_rows, 128), np.float32,
                           sharding=NamedSharding(mesh, PartitionSpec(rows, None)))
  w = jax.ShapeDtypeStruct((128, 128 * n_cols), np.float32,
                           sharding=NamedSharding(mesh, PartitionSpec(None, cols)))
  out = NamedSharding(mesh, PartitionSpec())
  compiled = jax.jit(lambda x, w: (x @ w).sum(0), out_shardings=out).lower(x, w).compile()
  assert compiled.memory_analysis() is not None


def _hosts(devices) -> dict:
  by = {}
  for d in devices:
    by.setdefault(d.process_index, set()).add(d.id)
  return by


SCALERL = dict(trainer_devices=0.25, generator_devices=0.75, trainer_tp=1, generator_tp=2)


@pytest.mark.parametrize("topology, kwargs, per_host", [
    # 16 hosts of 4 chips: the docs' 16/48 split is 1 trainer + 3 generator chips per host.
    ("v5p:4x4x4", dict(trainer_devices=16, generator_devices=48), (1, 3)),
    ("v5p:4x4x4", dict(SCALERL, generator_tp=1), (1, 3)),
    ("v5p:4x4x4", dict(trainer_devices=32, generator_devices=32, generator_tp=2), (2, 2)),
    ("v5e:2x2", dict(SCALERL, generator_tp=1), (1, 3)),
    ("v5p:2x2x1", dict(trainer_devices=2, generator_devices=2, generator_tp=2), (2, 2)),
    ("v4:2x2x2", dict(trainer_devices=0.5, generator_devices=0.5, generator_tp=2), (4, 4)),
])
def test_split_builds_and_compiles_on_tpu_topologies(topology, kwargs, per_host):
  devices = _tpu_devices(topology)
  hosts = _hosts(devices)
  cfg = config.MeshConfig(**kwargs)
  seen_generators = set()
  for p in sorted({0, len(hosts) - 1}):
    slices = mesh.make_slices(cfg, devices, process_index=p)
    trainer = [d for d in slices.trainer.devices.flat]
    generator = [d for d in slices.generator.devices.flat]
    assert slices.num_processes == slices.generator_groups == len(hosts)
    assert slices.process_index == p
    # Every host gives the same block to the trainer; the generator is this host's only.
    assert {h: sum(d.process_index == h for d in trainer) for h in hosts} == {
        h: per_host[0] for h in hosts}
    assert {d.process_index for d in generator} == {p} and len(generator) == per_host[1]
    assert not {d.id for d in trainer} & {d.id for d in generator}
    assert slices.num_devices == len(hosts) * sum(per_host)
    seen_generators |= {d.id for d in generator}
    _compile_over(slices.trainer)
    _compile_over(slices.generator)
  assert len(seen_generators) == per_host[1] * len({0, len(hosts) - 1})


def test_multi_core_chips_stay_whole_in_a_block():
  # v4:2x2x2 shows each TensorCore as a device: a host's block holds both cores of a chip.
  slices = mesh.make_slices(config.MeshConfig(trainer_devices=4, generator_devices=12),
                            _tpu_devices("v4:2x2x2"), process_index=1)
  chips = [tuple(d.coords) for d in slices.trainer.devices.flat]
  assert len(set(chips)) == 2 and all(chips.count(c) == 2 for c in chips)


@pytest.mark.parametrize("topology", ["v5p:4x4x4", "v6e:8x8", "v5e:4x4", "v5e:2x2", "v5p:2x2x1"])
def test_colocated_builds_and_compiles_on_tpu_topologies(topology):
  devices = _tpu_devices(topology)
  slices = mesh.make_slices(config.MeshConfig(colocated=True, generator_tp=2), devices,
                            process_index=0)
  assert slices.trainer.devices.size == len(devices)
  assert {d.process_index for d in slices.generator.devices.flat} == {0}
  _compile_over(slices.trainer)
  _compile_over(slices.generator)


@pytest.mark.parametrize("topology, kwargs, fragments", [
    # The recipe configs' section: 3 generator chips per host cannot hold tp=2.
    ("v5p:4x4x4", SCALERL, ["'mesh.generator_tp': tp=2 does not divide the slice's 3 devices "
                            "of each host", "16 hosts of 4 devices", "1 to the trainer"]),
    # v5e / v6e compile a multi-host program only on whole hosts: a split cannot build.
    ("v6e:8x8", dict(trainer_devices=16, generator_devices=48),
     ["'mesh.colocated'", "TPU v6 lite: 16 hosts of 4 devices", "set mesh.colocated=true"]),
    ("v5e:4x4", dict(trainer_devices=0.5, generator_devices=0.5),
     ["'mesh.colocated'", "TPU v5 lite: 4 hosts of 4 devices"]),
    ("v5e:2x2", SCALERL, ["'mesh.generator_tp'", "1 host of 4 devices"]),
    ("v5p:4x4x4", dict(trainer_devices=8, generator_devices=48),
     ["'mesh.trainer_devices': 8 devices do not split evenly over 16 processes",
      "use a multiple of 16"]),
    ("v5p:4x4x4", dict(trainer_devices=32, generator_devices=48),
     ["ask each of the 16 processes for 2 + 3 devices but each has 4"]),
    ("v5p:2x2x1", dict(trainer_devices=16, generator_devices=48), ["only 4 exist"]),
])
def test_impossible_splits_give_one_line_errors(topology, kwargs, fragments):
  with pytest.raises(UserError) as info:
    mesh.make_slices(config.MeshConfig(**kwargs), _tpu_devices(topology), process_index=0)
  message = str(info.value)
  assert "\n" not in message
  for fragment in fragments:
    assert fragment in message, message


def test_slots_split_over_generator_groups():
  slices = mesh.make_slices(config.MeshConfig(trainer_devices=16, generator_devices=48),
                            _tpu_devices("v5p:4x4x4"), process_index=3)
  assert slices.slots_per_group(768) == 48
  with pytest.raises(UserError, match="'sampler.num_slots': 100 .* 16 generator groups"):
    slices.slots_per_group(100)
  assert mesh.make_slices(config.MeshConfig()).slots_per_group(100) == 100


# ---- one accelerator: colocated by default -------------------------------------------------

import types  # noqa: E402


def _fake(platform, i=0):
  return types.SimpleNamespace(platform=platform, id=i, process_index=0)


@pytest.mark.parametrize("devices, want", [
    ([_fake("gpu")], "gpu"),
    ([_fake("tpu")], "tpu"),
    ([_fake("gpu"), _fake("gpu", 1)], ""),  # two GPUs split as configured
    ([_fake("cpu")], ""),  # one CPU device keeps its error (simulate more)
    ([], ""),
])
def test_single_accelerator(devices, want):
  assert mesh.single_accelerator(devices) == want


def test_one_gpu_runs_colocated_with_a_note(monkeypatch):
  """The default config (colocated false) on one GPU builds colocated slices instead of
  refusing; the CPU device stands in for the GPU (nothing compiles)."""
  one = jax.devices()[:1]
  with pytest.raises(UserError, match="colocated"):
    mesh.make_slices(config.MeshConfig(), one)
  monkeypatch.setattr(mesh, "single_accelerator", lambda devices: "gpu")
  slices = mesh.make_slices(config.MeshConfig(), one)
  assert slices.colocated and slices.trainer.devices.size == slices.generator.devices.size == 1
  text = slices.describe()
  assert text.startswith("colocated") and "note: one gpu device" in text
  assert len(text.splitlines()) == 2  # the layout line, then the one-line note
  # Said colocated by the config: nothing to note.
  assert not mesh.make_slices(config.MeshConfig(colocated=True), one).note
