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
by itself when given such arrays, a group of leaves at a time (`staging_groups`): each
group's local copy is moved and waited for before the next is gathered, so the trainer chips
hold at most `STAGING_BYTES` of it instead of a whole param_dtype copy of the model (16 GB
of Qwen3-8B on a host with one trainer chip). A leaf larger than that (a stacked [L, ...]
layer weight) goes in pieces of a few layers, written into its target array in place. It is a
collective: every process must call it, in the same order, from the same (main) thread.
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


# The most bytes per device of the process-local copy that `reshard` stages at once.
STAGING_BYTES = 1 << 30

# A part of a leaf staged by itself: (axis, start, stop), or None for the whole leaf.
Piece = tuple[int, int, int] | None


def _local_bytes(x: Any, dtype: jnp.dtype, per_process: int, piece: Piece = None) -> float:
  """Bytes per device of `x`'s process-local copy in `dtype` (`_local_spec`'s split), or of
  the `piece` of it."""
  spec = _local_spec(x, per_process)
  shape = [n // per_process if i < len(spec) and spec[i] else n for i, n in enumerate(x.shape)]
  if piece is not None:
    axis, start, stop = piece
    shape[axis] = stop - start
  return float(np.prod(shape, dtype=np.float64)) * dtype.itemsize


def _pieces(x: Any, dtype: jnp.dtype, per_process: int, max_bytes: float) -> list[Piece]:
  """`x` whole when its local copy fits `max_bytes`, else split along an axis the local copy
  does not split (the leading one first: a stacked [L, ...] layer weight goes a few layers at
  a time) into equal-sized pieces that each fit, or into single rows when none would."""
  whole = _local_bytes(x, dtype, per_process)
  if whole <= max_bytes:
    return [None]
  spec = _local_spec(x, per_process)
  free = [i for i in range(x.ndim) if x.shape[i] > 1 and not (i < len(spec) and spec[i])]
  if not free:
    return [None]
  axis = free[0]
  n = x.shape[axis]
  per = max(1, int(n * max_bytes // whole))  # rows of `axis` per piece
  return [(axis, a, min(a + per, n)) for a in range(0, n, per)]


def staging_groups(leaves: list, dtypes: list, per_process: int,
                   max_bytes: float = STAGING_BYTES) -> list[list[tuple[int, Piece]]]:
  """(leaf index, piece) pairs in consecutive groups whose process-local copies (in `dtypes`)
  take at most `max_bytes` per device. A leaf larger than that is split into pieces along an
  axis its local copy does not split (`_pieces`), each a group of its own; only a leaf with no
  such axis (or a single row over the budget) exceeds it."""
  groups: list[list[tuple[int, Piece]]] = []
  size = 0.0
  for i, (x, d) in enumerate(zip(leaves, dtypes)):
    for piece in _pieces(x, jnp.dtype(d), per_process, max_bytes):
      b = _local_bytes(x, jnp.dtype(d), per_process, piece)
      if groups and size + b <= max_bytes:
        groups[-1].append((i, piece))
        size += b
      else:
        groups.append([(i, piece)])
        size = b
  return groups


def local_copy_bytes_per_device(leaves: Any, dtypes: Any,
                                max_bytes: float = STAGING_BYTES) -> float:
  """Peak bytes per device of the copy `reshard` stages on each process's devices of the
  leaves' device set (arrays or sharded ShapeDtypeStructs, on several processes), in
  `dtypes`, one `staging_groups` group at a time: `jaxrl-scale plan` counts it beside the
  trainer's state."""
  leaves = jax.tree.leaves(leaves)
  want = [jnp.dtype(getattr(w, "dtype", w)) for w in jax.tree.leaves(dtypes)]
  grid = _by_process(leaves[0].sharding._device_assignment)  # pylint: disable=protected-access
  per_process = grid.shape[1]
  return max(sum(_local_bytes(leaves[i], want[i], per_process, piece) for i, piece in group)
             for group in staging_groups(leaves, want, per_process, max_bytes))


def _take(x: jax.Array, piece: Piece) -> jax.Array:
  if piece is None:
    return x
  axis, start, stop = piece
  return jax.lax.slice_in_dim(x, start, stop, axis=axis)


@functools.lru_cache(maxsize=16)
def _gather_fn(out_shardings: tuple, dtypes: tuple, pieces: tuple):
  # The slice is inside the gather's program: only the piece is ever laid out locally.
  return jax.jit(lambda xs: tuple(_take(x, p).astype(d) for x, d, p in zip(xs, dtypes, pieces)),
                 out_shardings=out_shardings)


def to_local(tree: Any, dtypes: Any | None = None, pieces: list[Piece] | None = None) -> Any:
  """A process-local copy of `tree`, whose arrays may span several processes.

  Arrays that are already fully addressable pass through (cast if asked). The others must
  all live on one device set (e.g. the trainer mesh) with the same number of devices in
  every process; each comes back as an array on this process's devices of that set.

  Args:
    tree: a pytree of jax.Arrays (e.g. the trainer's params).
    dtypes: optional tree with the target dtype of every leaf.
    pieces: optional, one `Piece` per leaf: only that part of a cross-process leaf is
      gathered (fully addressable leaves pass whole).

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
  cut = tuple(pieces[i] if pieces is not None else None for i in remote)
  gathered = _gather_fn(out_shardings, tuple(want[i] for i in remote), cut)(
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
    return _reshard_staged(tree, shardings, dtypes, may_alias, STAGING_BYTES)
  if dtypes is not None:
    tree = _cast(tree, dtypes)
  return jax.device_put(tree, shardings, may_alias=may_alias)


def _reshard_staged(tree: Any, shardings: Any, dtypes: Any | None, may_alias: Any,
                    max_bytes: float) -> Any:
  """`reshard` of cross-process arrays onto this process's devices, one `staging_groups`
  group at a time: gather (`to_local`), move, wait, so that one group's local copy is alive
  on the source devices at a time. A leaf staged in pieces is written piece by piece into
  its target array (allocated once, updated in place)."""
  leaves, treedef = jax.tree.flatten(tree)
  # `shardings` may be a prefix of the tree: one target per leaf.
  targets = jax.tree.leaves(jax.tree.map(lambda s, sub: jax.tree.map(lambda _: s, sub),
                                         shardings, tree))
  want = (jax.tree.leaves(dtypes) if dtypes is not None else [x.dtype for x in leaves])
  # One bool per leaf (a None inside a list would read as an empty subtree): False where
  # `copy` forbids returning the caller's buffer, else True (JAX's default).
  aliases = ([a is not False for a in jax.tree.leaves(may_alias, is_leaf=lambda x: x is None)]
             if may_alias is not None else [True] * len(leaves))
  remote = [x for x in leaves if isinstance(x, jax.Array) and not x.is_fully_addressable]
  per_process = _by_process(remote[0].sharding._device_assignment).shape[1]  # pylint: disable=protected-access
  out: list[Any] = [None] * len(leaves)
  for group in staging_groups(leaves, want, per_process, max_bytes):
    idx = [i for i, _ in group]
    pieces = [piece for _, piece in group]
    local = to_local([leaves[i] for i in idx], [want[i] for i in idx], pieces)
    placed = jax.device_put(local, [targets[i] if p is None else _piece_sharding(targets[i], p)
                                    for i, p in zip(idx, pieces)],
                            may_alias=[aliases[i] for i in idx])
    del local
    for i, piece, y in zip(idx, pieces, placed):
      if piece is None:
        out[i] = y
        continue
      if out[i] is None:
        out[i] = jax.jit(lambda: jnp.zeros(leaves[i].shape, want[i]),  # pylint: disable=cell-var-from-loop
                         out_shardings=targets[i])()
      out[i] = _write_piece(piece[0], targets[i])(out[i], y, piece[1])
    # Wait before gathering the next group: its local copy is freed once the move is done.
    jax.block_until_ready([out[i] for i in idx])
  return jax.tree.unflatten(treedef, out)


def _piece_sharding(target: NamedSharding, piece: tuple[int, int, int]) -> NamedSharding:
  """`target` with the piece's axis unsplit (a piece's length need not divide its mesh axis)."""
  axis = piece[0]
  spec = list(target.spec) + [None] * (axis + 1 - len(target.spec))
  spec[axis] = None
  return NamedSharding(target.mesh, PartitionSpec(*spec))


@functools.lru_cache(maxsize=64)
def _write_piece(axis: int, target: NamedSharding):
  """jit(buffer, piece, start -> buffer with the piece written at `start` along `axis`), the
  buffer donated so that it is updated in place."""
  return jax.jit(lambda buf, y, start: jax.lax.dynamic_update_slice_in_dim(buf, y, start, axis),
                 out_shardings=target, donate_argnums=0)


def same_placement(tree: Any, shardings: Any) -> bool:
  """Whether every leaf of `tree` already sits on the matching sharding."""
  leaves = jax.tree.leaves(tree)
  targets = jax.tree.leaves(shardings)
  if len(leaves) != len(targets):
    return False
  return all(getattr(x, "sharding", None) is not None and x.sharding.is_equivalent_to(s, x.ndim)
             for x, s in zip(leaves, targets))
