"""Logical-axis -> mesh-axis rules, sharded model creation and sharded KV caches.

Params carry logical axis names (`layers.param`); `DEFAULT_RULES` maps each to a mesh axis:
the "parallel" dim of every matrix (vocab, heads, mlp) goes over 'tp' and the model dim over
'fsdp'. A rule naming an axis the mesh lacks (e.g. 'fsdp' on the generator's ('data', 'tp')
mesh) or a dim that the axis size does not divide falls back to replication for that dim, so
one rule set serves every mesh.

A rule may name several axes, e.g. ('fsdp', 'expert'): the dim splits over all of them that
the mesh has, the array's other dims have not taken and whose sizes divide it, but only when
the mesh has the first (the generator's mesh has no 'fsdp', so its copy of a weight stays
whole on the model dim even where it has an expert axis).

Meshes are expected to use `AxisType.Auto`: shardings are fixed at the jit boundary and the
compiler propagates them through the model.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_scale.models import kv_cache, transformer
from jaxrl_scale.models.config import ModelConfig

Rules = Mapping[str, str | tuple[str, ...] | None]

DEFAULT_RULES: Rules = {
    # The stacked layer axis: the layer scan slices it, so it stays whole on every chip.
    "layers": None,
    "vocab": "tp",
    # FSDP over every axis that splits the trainer's batch: with an expert axis the dense
    # weights shard over it too (an expert weight's E dim has taken it first).
    "embed": ("fsdp", "expert"),
    "q_heads": "tp",
    "kv_heads": "tp",
    "head_dim": None,
    "mlp": "tp",
    "norm": None,
    # Mixture-of-experts weights [E, D, F]: E over the expert axis (mesh.trainer_ep /
    # generator_ep; without one the experts are whole on every (fsdp, tp) shard), D as any
    # model dim, F over 'tp' like a dense MLP's.
    "expert": "expert",
    "moe_mlp": "tp",
}


def logical_to_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh,
                    rules: Rules = DEFAULT_RULES) -> PartitionSpec:
  """PartitionSpec for an array with logical `axes`; see the module docstring for fallbacks."""
  spec: list[str | tuple[str, ...] | None] = []
  used: set[str] = set()
  for name, dim in zip(axes, shape):
    rule = rules.get(name) if name is not None else None
    wanted = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
    chosen: list[str] = []
    if wanted and wanted[0] in mesh.shape:
      size = 1
      for axis in wanted:
        if axis in mesh.shape and axis not in used and dim % (size * mesh.shape[axis]) == 0:
          chosen.append(axis)
          size *= mesh.shape[axis]
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """NamedShardings for a tree of nnx Variables (concrete or abstract), same structure.

  Variables without logical axes (e.g. optimizer step counters) are replicated.
  """

  def one(x: Any) -> NamedSharding:
    if _is_var(x):
      axes = x.get_metadata().get("out_sharding") or ()
      shape = x.get_value().shape
    else:
      axes, shape = (), getattr(x, "shape", ())
    if len(axes) != len(shape):
      axes = (None,) * len(shape)
    return NamedSharding(mesh, logical_to_spec(tuple(axes), tuple(shape), mesh, rules))

  return jax.tree.map(one, state, is_leaf=_is_var)


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, abstract state) of a model: shapes and metadata, no memory."""
  abs_model = nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(abs_model)


def create_sharded_model(cfg: ModelConfig, mesh: Mesh, seed: int = 0,
                         rules: Rules = DEFAULT_RULES) -> transformer.Transformer:
  """A randomly initialised model whose params are born sharded on `mesh`.

  The init runs under jit with out_shardings, so no device ever holds an unsharded copy.
  """
  graphdef, abs_state = abstract_model(cfg)
  shardings = state_shardings(abs_state, mesh, rules)

  def init() -> nnx.State:
    return nnx.state(transformer.Transformer(cfg, rngs=nnx.Rngs(seed)))

  state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def shard_model(model: transformer.Transformer, mesh: Mesh,
                rules: Rules = DEFAULT_RULES) -> transformer.Transformer:
  """Moves an existing model's params onto `mesh` (e.g. for the generator slice)."""
  graphdef, state = nnx.split(model)
  state = jax.device_put(state, state_shardings(state, mesh, rules))
  return nnx.merge(graphdef, state)


def cache_shardings(cfg: ModelConfig, mesh: Mesh) -> kv_cache.PagedKVCache:
  """Shardings for a page pool [L, D, P + 1, C, 2K, H] on `mesh`: its D shards over 'data'
  (D is the data axis size), kv heads over 'tp' (when it divides them; each device then
  holds whole key/value pairs)."""
  data = mesh.shape.get("data", 1)
  head_axis = "tp" if "tp" in mesh.shape and cfg.num_kv_heads % mesh.shape["tp"] == 0 else None
  kv = NamedSharding(mesh, PartitionSpec(None, "data" if data > 1 else None, None, None,
                                         head_axis, None))
  return kv_cache.PagedKVCache(kv=kv)


def param_count(state: Any) -> int:
  """Number of scalars in a state tree."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))
