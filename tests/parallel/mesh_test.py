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
