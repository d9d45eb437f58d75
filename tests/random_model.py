"""A random model of any config, built in NumPy, in fresh buffers on a mesh (the train-step
and sampler tests that compare layouts need the same weights on every mesh)."""

import jax
import numpy as np
from flax import nnx

from jaxrl_scale.models import sharding


def random_state(cfg, scale: float, seed: int = 0):
  """(graphdef, state): norm scales 1, every other weight `scale` N(0, 1), float32."""
  graphdef, abstract = sharding.abstract_model(cfg)
  rng = np.random.default_rng(seed)

  def one(path, x):
    shape = x.get_value().shape
    if getattr(path[-1], "key", None) == "scale":
      return x.replace(np.ones(shape, np.float32))
    return x.replace((scale * rng.standard_normal(shape)).astype(np.float32))

  return graphdef, jax.tree.map_with_path(one, abstract,
                                          is_leaf=lambda v: isinstance(v, nnx.Variable))


def place(graphdef, state, mesh):
  """The model of (graphdef, state) with its params in fresh buffers on `mesh`."""
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def random_model(cfg, mesh, scale: float, seed: int = 0):
  """`random_state` placed on `mesh`."""
  return place(*random_state(cfg, scale, seed), mesh)
