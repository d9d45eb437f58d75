"""Trainer -> generator weight transfer: reshard a param tree onto the generator's shardings.

The trainer keeps params on its ('fsdp', 'tp') mesh; the sampler needs them on the
generator's ('data', 'tp') mesh, possibly on other devices and in another dtype. The cast
runs first, on the trainer's devices and in the trainer's sharding, so a float32 -> bfloat16
policy moves half the bytes across; the move itself is one `jax.device_put` of the whole
tree, which lets the runtime schedule all array copies together.

Across hosts (several JAX processes): the trainer's params are sharded over devices of
every process, while each process's generator mesh holds only its own devices, and
`jax.device_put` cannot move an array off devices this process does not own. `to_local`
first re-lays each array out on the trainer's devices so that every process holds one
complete copy on its own trainer devices (sharded over them, replicated across processes:
an all-gather over hosts, cast fused in), then reassembles those local shards into a
process-local array; the move onto the generator mesh is then local. `reshard` does this
by itself when given such arrays. It is a collective: every process must call it, in the
same order, from the same (main) thread.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def _cast(tree: Any, dtypes: Any) -> Any:
  """Casts each leaf of `tree` to the matching dtype; a jit keeps the source sharding."""
  leaves, treedef = jax.tree.flatten(tree)
  want = jax.tree.leaves(dtypes)
  if len(want) != len(leaves):
    raise ValueError(f"dtype tree has {len(want)} leaves, params have {len(leaves)}")
  if all(jnp.dtype(w) == x.dtype for w, x in zip(want, leaves)):
    return tree
  targets = tuple(jnp.dtype(w) for w in want)
  return jax.tree.unflatten(treedef, list(cast_program(targets)(tuple(leaves))))


@functools.lru_cache(maxsize=16)
def cast_program(dtypes: tuple) -> Any:
  """jit(cast each leaf of a tuple to `dtypes`): runs where its inputs are, keeping their
  sharding (the trainer-side half of a float32 -> bf16 weight transfer)."""
  return jax.jit(lambda xs: tuple(x.astype(d) for x, d in zip(xs, dtypes)))


def _by_process(devices) -> np.ndarray:
  """[processes, devices per process] of `devices`, each row in the given order."""
  rows: dict[int, list] = {}
  for d in devices:
    rows.setdefault(d.process_index, []).append(d)
  sizes = {len(r) for r in rows.values()}
  if len(sizes) != 1:
    raise ValueError(f"to_local: processes hold different numbers of the array's devices "
                     f"({sorted(len(r) for r in rows.values())})")
  return np.array([rows[p] for p in sorted(rows)])


def _local_spec(x: jax.Array, per_process: int) -> PartitionSpec:
  """Which axis of `x` to split over a process's local devices: an axis the source already
  splits (so the move is an all-gather over processes, not a full reshuffle), else the
  first one `per_process` divides; replicated when none does."""
  spec = getattr(x.sharding, "spec", None) or ()
  mesh_shape = getattr(getattr(x.sharding, "mesh", None), "shape", {})

  def ways(entry) -> int:  # devices the source splits one axis over
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh_shape.get(n, 1) for n in names if n is not None)

  sharded = sorted((i for i, entry in enumerate(spec) if ways(entry) > 1),
                   key=lambda i: -ways(spec[i]))
  for i in sharded + list(range(x.ndim)):
    if x.shape[i] % per_process == 0:
      return PartitionSpec(*((None,) * i + ("local",)))
  return PartitionSpec()


def local_copy_bytes_per_device(leaves: Any, dtypes: Any) -> float:
  """Bytes per device of the copy `to_local` gathers onto each process's devices of the
  leaves' device set (arrays or sharded ShapeDtypeStructs, on several processes), in
  `dtypes`: `jaxrl-scale plan` counts it beside the trainer's state."""
  leaves = jax.tree.leaves(leaves)
  want = [jnp.dtype(getattr(w, "dtype", w)) for w in jax.tree.leaves(dtypes)]
  grid = _by_process(leaves[0].sharding._device_assignment)  # pylint: disable=protected-access
  per_process = grid.shape[1]
  total = 0.0
  for x, dtype in zip(leaves, want):
    spec = _local_spec(x, per_process)
    shape = [n // per_process if i < len(spec) and spec[i] else n
             for i, n in enumerate(x.shape)]
    total += float(np.prod(shape, dtype=np.float64)) * dtype.itemsize
  return total


@functools.lru_cache(maxsize=16)
def _gather_fn(out_shardings: tuple, dtypes: tuple):
  return jax.jit(lambda xs: tuple(x.astype(d) for x, d in zip(xs, dtypes)),
                 out_shardings=out_shardings)


def to_local(tree: Any, dtypes: Any | None = None) -> Any:
  """A process-local copy of `tree`, whose arrays may span several processes.

  Arrays that are already fully addressable pass through (cast if asked). The others must
  all live on one device set (e.g. the trainer mesh) with the same number of devices in
  every process; each comes back as an array on this process's devices of that set.

  Args:
    tree: a pytree of jax.Arrays (e.g. the trainer's params).
    dtypes: optional tree with the target dtype of every leaf.

  Returns:
    The same structure; every leaf fully addressable. A collective when any leaf is not
    (see the module docstring).
  """
  leaves, treedef = jax.tree.flatten(tree)
  want = ([jnp.dtype(getattr(w, "dtype", w)) for w in jax.tree.leaves(dtypes)]
          if dtypes is not None else [x.dtype for x in leaves])
  if len(want) != len(leaves):
    raise ValueError(f"dtype tree has {len(want)} leaves, params have {len(leaves)}")
  remote = [i for i, x in enumerate(leaves)
            if isinstance(x, jax.Array) and not x.is_fully_addressable]
  if not remote:
    if dtypes is None:
      return tree
    return _cast(tree, jax.tree.unflatten(treedef, want))
  device_sets = {tuple(leaves[i].sharding._device_assignment) for i in remote}  # pylint: disable=protected-access
  if len(device_sets) != 1:
    raise ValueError("to_local: the cross-process arrays live on different device sets")
  grid = _by_process(next(iter(device_sets)))
  gather_mesh = Mesh(grid, ("process", "local"))
  me = jax.process_index()
  row = next(r for r in grid if r[0].process_index == me)
  local_mesh = Mesh(np.array(row), ("local",))
  specs = [_local_spec(leaves[i], grid.shape[1]) for i in remote]
  out_shardings = tuple(NamedSharding(gather_mesh, spec) for spec in specs)
  gathered = _gather_fn(out_shardings, tuple(want[i] for i in remote))(
      tuple(leaves[i] for i in remote))
  out = list(leaves)
  for i, y, spec in zip(remote, gathered, specs):
    by_device = {s.device: s.data for s in y.addressable_shards}
    out[i] = jax.make_array_from_single_device_arrays(
        y.shape, NamedSharding(local_mesh, spec), [by_device[d] for d in row])
  for i, x in enumerate(leaves):
    if i not in remote and x.dtype != want[i]:
      out[i] = x.astype(want[i])
  return jax.tree.unflatten(treedef, out)


def reshard(tree: Any, shardings: Any, dtypes: Any | None = None, *, copy: bool = False
            ) -> Any:
  """Places `tree` on `shardings` (a matching tree, or a prefix of it), casting first.

  Args:
    tree: params as they come from the trainer (any placement, e.g. an nnx.State).
    shardings: target NamedShardings, e.g. `models.sharding.state_shardings(...)` on the
      generator mesh.
    dtypes: optional tree with the target dtype of every leaf (arrays, ShapeDtypeStructs or
      dtypes), e.g. the sampler's current params. None keeps the incoming dtypes.
    copy: never return a buffer of `tree` itself. Without it, a leaf already on its target
      sharding in its target dtype comes back as the same buffer (`jax.device_put` is then
      a no-op); with colocated roles that buffer is the trainer's, which its next step
      donates, and the sampler would decode with a deleted buffer.

  Returns:
    The same tree structure, on the target shardings. Source arrays are left untouched.
    Source arrays spread over several processes are first gathered to a local copy
    (`to_local`, a collective) when the targets are this process's devices only.
  """
  if dtypes is not None:
    dtypes = jax.tree.map(lambda x: getattr(x, "dtype", x), dtypes)
  may_alias = None
  if copy:
    # Only leaves the cast leaves in their dtype can come back as the caller's buffers.
    leaves = jax.tree.leaves(tree)
    want = jax.tree.leaves(dtypes) if dtypes is not None else [x.dtype for x in leaves]
    may_alias = jax.tree.unflatten(jax.tree.structure(tree), [
        False if jnp.dtype(w) == x.dtype else None for w, x in zip(want, leaves)])
  targets = jax.tree.leaves(shardings)
  if jax.process_count() > 1 and targets and all(
      getattr(s, "is_fully_addressable", False) for s in targets) and any(
          isinstance(x, jax.Array) and not x.is_fully_addressable
          for x in jax.tree.leaves(tree)):
    return jax.device_put(to_local(tree, dtypes), shardings, may_alias=may_alias)
  if dtypes is not None:
    tree = _cast(tree, dtypes)
  return jax.device_put(tree, shardings, may_alias=may_alias)


def same_placement(tree: Any, shardings: Any) -> bool:
  """Whether every leaf of `tree` already sits on the matching sharding."""
  leaves = jax.tree.leaves(tree)
  targets = jax.tree.leaves(shardings)
  if len(leaves) != len(targets):
    return False
  return all(getattr(x, "sharding", None) is not None and x.sharding.is_equivalent_to(s, x.ndim)
             for x, s in zip(leaves, targets))
