"""Trainer -> generator weight transfer across disjoint mesh slices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.config import MeshConfig
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import sharding
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.parallel import transfer


@pytest.fixture(scope="module")
def trainer_params():
  """(slices, tiny Llama params born sharded on the trainer slice)."""
  slices = mesh_lib.make_slices(MeshConfig(trainer_devices=4, generator_devices=4, trainer_tp=2,
                                           generator_tp=2))
  _, abstract = sharding.abstract_model(model_config.tiny_llama())
  rng = np.random.default_rng(0)  # NumPy values: no init program to compile
  values = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), abstract)
  return slices, jax.device_put(values, sharding.state_shardings(abstract, slices.trainer))


def test_reshard_moves_params_onto_generator_shardings(trainer_params):
  slices, params = trainer_params
  target = sharding.state_shardings(params, slices.generator)
  assert transfer.same_placement(params, sharding.state_shardings(params, slices.trainer))
  assert not transfer.same_placement(params, target)

  moved = transfer.reshard(params, target)
  assert transfer.same_placement(moved, target)
  gen_devices = set(slices.generator.devices.flat)
  for src, dst in zip(jax.tree.leaves(params), jax.tree.leaves(moved)):
    assert set(dst.devices()) == gen_devices
    np.testing.assert_array_equal(np.asarray(src), np.asarray(dst))
  # Weights really are split over the generator's 'tp' axis.
  q = moved["layers"]["self_attn"]["q_proj"]["kernel"][...]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, None, "tp", None)


def test_reshard_casts_to_target_dtypes_before_moving(trainer_params):
  slices, params = trainer_params
  target = sharding.state_shardings(params, slices.generator)
  dtypes = jax.tree.map(lambda x: jnp.bfloat16, params)
  moved = transfer.reshard(params, target, dtypes)
  for src, dst in zip(jax.tree.leaves(params), jax.tree.leaves(moved)):
    assert dst.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(dst),
                                  np.asarray(src).astype(jnp.bfloat16))
  assert transfer.same_placement(moved, target)
  # Nothing to cast: the input tree comes back placed, values untouched.
  same = transfer.reshard(params, target, params)
  assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(same)))
