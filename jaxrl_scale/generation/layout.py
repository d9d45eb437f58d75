"""What a Sampler allocates on its generator mesh, as sharded ShapeDtypeStructs.

`engine.Sampler.__init__` takes its geometry and shardings from `layout(...)`, and
`jaxrl-scale plan` builds the sampler's programs and counts its memory from the same object,
so the plan cannot drift from what the engine holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import decode
from jaxrl_scale.generation import pages as pages_lib
from jaxrl_scale.models import sharding
from jaxrl_scale.parallel import mesh as mesh_lib


def paths_and_leaves(tree: Any) -> tuple[list[str], list[Any]]:
  """Leaf paths (nnx Variable wrappers dropped, so pure dicts match States) and leaves."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [jax.tree_util.keystr(p).removesuffix(".value") for p, _ in flat]
  return paths, [x for _, x in flat]


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a Sampler allocates on its generator mesh, as sharded ShapeDtypeStructs.

  `Sampler.__init__` takes its geometry and shardings from here, and `jaxrl-scale plan`
  builds the sampler's programs and counts its memory from the same object.

  Attributes:
    num_slots: this group's slots. data: the mesh's data axis.
    buckets, max_len: prompt buckets in use and KV cache length per slot.
    page_size, pages: the page pool (pages per data shard).
    param_shardings: the weights' shardings (a tree like the model's params).
    params: the weights as held (param_dtype, sharded): one copy.
    layer_copies: whether every layer's weights are also held as arrays of their own (CPU,
      GPU: `decode.layers_program`).
    weight_buffers: copies of the weights held across an update (`sampler.weight_buffers`):
      2 = the posted update beside the live weights, 1 = the live ones freed first.
    state_shardings, state: the slot state and page pool.
    table: the page table.
  """

  num_slots: int
  data: int
  buckets: list[int]
  max_len: int
  page_size: int
  pages: int
  param_shardings: Any
  params: Any
  layer_copies: bool
  weight_buffers: int
  state_shardings: decode.SlotState
  state: decode.SlotState
  table: jax.ShapeDtypeStruct

  @property
  def width(self) -> int:
    """Page-table columns: pages of one full-length sequence."""
    return -(-self.max_len // self.page_size)

  def held_bytes_per_device(self) -> dict[str, float]:
    """Bytes one generator device holds at the Sampler's peak, by kind.

    With weight_buffers 2 (the double buffer) a posted update (`update_params`) is a
    second copy of the weights beside the live one until the swap; with layer copies, the
    live weights' per-layer copies stay beside both. (Re-posting the weights already posted
    is a no-op, so an eval adds no third copy.) With weight_buffers 1 the live weights and
    their layer copies are freed before the update is placed: no pending copy.
    """
    params = bytes_per_device(self.params)
    layers = 0.0
    if self.layer_copies:
      paths, leaves = paths_and_leaves(self.params)
      layers = bytes_per_device([x for p, x in zip(paths, leaves)
                                  if p.startswith("['layers']")])
    cache = bytes_per_device(self.state.cache)
    pending = params if self.weight_buffers == 2 else 0.0
    return {"params": params, "pending_params": pending, "layer_copies": layers,
            "kv_cache": cache,
            "slot_state": bytes_per_device(self.state) - cache + bytes_per_device(self.table)}


def bytes_per_device(tree: Any) -> float:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs or arrays (the largest
  share)."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += float(np.prod(shape, dtype=np.float64)) * np.dtype(x.dtype).itemsize
  return total


def layout(model_cfg: Any, params: Any, cfg: SamplerConfig, mesh: Mesh, *,
           generator_groups: int = 1, max_prompt_len: int | None = None,
           cache_dtype: str | None = None) -> Layout:
  """The Layout of a Sampler for `params` (arrays or ShapeDtypeStructs, the model's tree).

  Raises:
    UserError: the group's slots do not split over the mesh's data axis, or prompts longer
      than the largest bucket.
  """
  data = mesh.shape.get("data", 1)
  local = mesh_lib.slots_per_group(cfg.num_slots, generator_groups)
  if local % data:
    per = f" ({local} per each of {generator_groups} generator groups)" if (
        generator_groups > 1) else ""
    raise UserError(f"config key 'sampler.num_slots': {cfg.num_slots}{per} is not a multiple "
                    f"of the generator mesh's data axis ({data} devices)")
  buckets, max_len = pages_lib.cache_geometry(cfg, max_prompt_len)
  param_shardings = sharding.state_shardings(params, mesh)
  # Floating weights are held in the model config's param_dtype, whatever the given model
  # holds (e.g. the trainer's float32 masters): update_params casts to these too.
  held = jax.numpy.dtype(model_cfg.param_dtype)

  def struct(x, s):
    value = x.get_value() if isinstance(x, nnx.Variable) else x
    dtype = held if jax.numpy.issubdtype(value.dtype, jax.numpy.floating) else value.dtype
    out = jax.ShapeDtypeStruct(value.shape, dtype, sharding=s)
    return x.replace(out) if isinstance(x, nnx.Variable) else out

  structs = jax.tree.map(struct, params, param_shardings,
                         is_leaf=lambda x: isinstance(x, nnx.Variable))
  page_size, pages = pages_lib.pool_geometry(cfg, local, data, max_len)
  state_shardings = decode.state_shardings(model_cfg, mesh, local)
  state = jax.eval_shape(
      lambda: decode.empty_state(model_cfg, local, data, pages, page_size, cache_dtype))
  state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                       state, state_shardings)
  table = jax.ShapeDtypeStruct((local, -(-max_len // page_size)), np.int32,
                               sharding=decode.table_sharding(mesh))
  return Layout(num_slots=local, data=data, buckets=buckets, max_len=max_len,
                page_size=page_size, pages=pages, param_shardings=param_shardings,
                params=structs,
                layer_copies=bool(cfg.layer_weight_copies and decode.splits_layers(mesh)),
                weight_buffers=cfg.weight_buffers,
                state_shardings=state_shardings, state=state, table=table)
