"""Where the trainer's arrays live: the batch's data axes, the parameters' shardings, the
float32 masters made from the model's weights and the dtypes of their compute copy, host
batches placed across processes, and how the step runs its layers on the mesh's platform.
Used by `train_step.Trainer` (and re-exported there)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "fsdp"  # batch rows are split over the trainer mesh's fsdp axis


def _data_spec(example_shape: tuple[int, ...], mesh: Mesh) -> tuple[str | None, ...]:
  """Which example axis of a micro-batch goes over 'fsdp': the first one it divides.

  When none divides (tiny test batches) the batch is replicated and only the parameters
  are sharded.
  """
  axes = _data_axes(mesh)
  n = data_shards(mesh)
  for i, size in enumerate(example_shape):
    if size % n == 0:
      return (None,) * i + (axes if len(axes) > 1 else DATA_AXIS,)
  return ()


def data_shards(mesh: Mesh) -> int:
  """How many ways the trainer splits a micro-batch's rows: the size of its data axes."""
  return math.prod(mesh.shape[a] for a in _data_axes(mesh))


def shardable_micro_batches(examples: int, rows_per_example: int, micro_batches: int,
                            mesh: Mesh) -> int:
  """The micro-batch count a step over `examples` uses: `micro_batches`, or the largest
  smaller one whose micro-batches' rows split evenly over the data-parallel chips.

  A micro-batch whose rows do not divide `data_shards(mesh)` cannot be split by rows, so
  every chip would compute all of it: with 1 prompt of 16 rows per micro-batch on 32
  trainer chips that is 16 rows a chip instead of 1 (the paper recipe's train step on a
  v5p-256: 667.70 GiB of temporaries a chip instead of 61.81). Fewer, larger micro-batches
  keep the rows a chip computes at the fewest that split. Where no count divides (the
  whole batch has fewer rows than chips, as in tiny tests), `micro_batches` is returned
  unchanged.

  Args:
    examples: the batch's leading axis (prompts for RL, sequences for SFT).
    rows_per_example: model rows per example (G completions per prompt for RL, 1 for SFT).
    micro_batches: the count the config asks for; it must divide `examples`.
    mesh: the trainer mesh.
  """
  n = data_shards(mesh)
  for m in range(micro_batches, 0, -1):
    if examples % m == 0 and (examples // m * rows_per_example) % n == 0:
      return m
  return micro_batches


def micro_batch_note(key: str, examples: int, rows_per_example: int, asked: int, used: int,
                     mesh: Mesh) -> str | None:
  """One line saying that `used` micro-batches replace the `asked` ones, or None."""
  if asked == used:
    return None
  rows = examples // used * rows_per_example
  n = data_shards(mesh)
  return (f"{key} {examples // asked} -> {examples // used} per micro-batch: "
          f"{examples // asked * rows_per_example} rows do not split over the trainer's {n} "
          f"data-parallel chips, {rows} do ({rows // n} a chip)")


def _data_axes(mesh: Mesh) -> tuple[str, ...]:
  """'fsdp', and the expert axis with it where the mesh has one (mesh.trainer_ep): outside
  the MoE layers it is data parallelism too, or every expert group would repeat its rows."""
  return (DATA_AXIS, "expert") if "expert" in mesh.shape else (DATA_AXIS,)


def _array_shardings(tree, mesh: Mesh):
  """The shardings arrays (or abstract structs) already have; anything not on `mesh` is an
  error (the caller must place the model on the trainer mesh first)."""

  def one(x):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
      return sharding
    if isinstance(sharding, NamedSharding) or mesh.devices.size > 1:
      raise ValueError("model parameters (or abstract ShapeDtypeStructs' `sharding`) must be "
                       "on the trainer mesh (see models.sharding) before building a Trainer")
    return NamedSharding(mesh, PartitionSpec())

  return jax.tree.map(one, tree)


def _is_abstract(tree) -> bool:
  """Whether every leaf is a `jax.ShapeDtypeStruct` (an abstract model: no memory)."""
  leaves = jax.tree.leaves(tree)
  abstract = [isinstance(x, jax.ShapeDtypeStruct) for x in leaves]
  if any(abstract) and not all(abstract):
    raise ValueError("the model mixes abstract (ShapeDtypeStruct) and concrete parameters")
  return bool(leaves) and all(abstract)


def master_dtype(dtype) -> jnp.dtype:
  """The trainer's dtype for a parameter: float32 for any float, else unchanged."""
  dtype = jnp.dtype(dtype)
  return jnp.dtype(jnp.float32) if jnp.issubdtype(dtype, jnp.floating) else dtype


def _structs(tree, shardings):
  """ShapeDtypeStructs (canonical dtypes) of `tree`'s leaves carrying `shardings`."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, jax.dtypes.canonicalize_dtype(x.dtype),
                                        sharding=s), tree, shardings)


def _to_master(params, shardings):
  """Places `params` on `shardings` as float32 master copies (cast under jit, so each
  device only converts its own shard). The caller's buffers are donated (the Trainer's
  contract): where a cast made new ones, the old are freed here, or a param_dtype copy of
  the trainer's share would stay beside the masters for the whole run (the caller's model
  object lives on; 1 GiB per chip for Qwen3-8B on 16 chips)."""
  placed = jax.device_put(params, shardings)
  if all(x.dtype == master_dtype(x.dtype) for x in jax.tree.leaves(placed)):
    return placed
  cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(master_dtype(x.dtype)), p),
                 out_shardings=shardings)
  masters = cast(placed)
  for src, moved in zip(jax.tree.leaves(params), jax.tree.leaves(placed)):
    for x in (src, moved):
      if isinstance(x, jax.Array) and not x.is_deleted():
        x.delete()
  return masters


def _has_router(params) -> bool:
  """Whether the param tree holds an MoE router (some sparse layer)."""
  return any(getattr(k, "key", None) == "router"
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0] for k in path)


def put_global(tree, shardings):
  """`jax.device_put` of host arrays that also works when `shardings` span processes.

  Each process must pass the same global values; it transfers only the slices its own
  devices hold (`jax.make_array_from_callback`). Arrays already on device, and shardings
  within this process, go through `jax.device_put`.
  """
  leaves, treedef = jax.tree.flatten(tree)
  targets = jax.tree.leaves(shardings)
  if len(targets) != len(leaves) or all(s.is_fully_addressable for s in targets):
    return jax.device_put(tree, shardings)

  def one(x, sharding):
    if isinstance(x, jax.Array):
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.unflatten(treedef, [one(x, s) for x, s in zip(leaves, targets)])


def cpu_program(mesh: Mesh) -> bool:
  """Whether the step on `mesh` is built for XLA:CPU, which takes two choices there:
  - the layers unrolled (`Transformer.hidden_states(unroll_layers=True)`): the layer scan's
    backward pass spent 15-25% of the step copying weights and residuals in and out of the
    layer stacks (benchmarks/peers/profile_loop.py, 2026-12-07);
  - the projections as 2-D matmuls (`layers.flat_projections`): their backward pass ran
    2.3x faster on [B*T, D] than on [B, T, D].
  On TPUs and GPUs (and for `plan`'s compiles for them) one scanned body keeps compiles
  short and the program the size of one layer, and the [B, T, D] projections are what
  XLA:TPU lays out without copies."""
  if isinstance(mesh, jax.sharding.AbstractMesh):  # no devices (it raises on .devices)
    return False
  return all(d.platform == "cpu" for d in np.ravel(mesh.devices))


def _compute_dtypes(params: nnx.State, compute_dtype: Any) -> list[Any]:
  """Per leaf of `params` (as `jax.tree.leaves` orders them): the dtype of the trainer's
  compute copy of that master, or None to read the float32 master itself. A copy is made
  of a float parameter held in the model's compute dtype (so its master is wider) and not
  marked `float32_grad` (`models.layers.param`)."""
  variables = jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, nnx.Variable))
  if len(variables) != len(jax.tree.leaves(params)):
    raise ValueError("every parameter must be an nnx.Variable holding one array")
  out = []
  for var in variables:
    dtype = jnp.dtype(var.get_value().dtype)
    copy = (compute_dtype is not None and dtype == jnp.dtype(compute_dtype)
            and master_dtype(dtype) != dtype
            and not var.get_metadata().get("float32_grad", False))
    out.append(dtype if copy else None)
  return out
