"""Trainer -> generator weight transfer: reshard a param tree onto the generator's shardings.

The trainer keeps params on its ('fsdp', 'tp') mesh; the sampler needs them on the
generator's ('data', 'tp') mesh, possibly on other devices and in another dtype. The cast
runs first, on the trainer's devices and in the trainer's sharding, so a float32 -> bfloat16
policy moves half the bytes across; the move itself is one `jax.device_put` of the whole
tree, which lets the runtime schedule all array copies together.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _cast(tree: Any, dtypes: Any) -> Any:
  """Casts each leaf of `tree` to the matching dtype; a jit keeps the source sharding."""
  leaves, treedef = jax.tree.flatten(tree)
  want = jax.tree.leaves(dtypes)
  if len(want) != len(leaves):
    raise ValueError(f"dtype tree has {len(want)} leaves, params have {len(leaves)}")
  if all(jnp.dtype(w) == x.dtype for w, x in zip(want, leaves)):
    return tree
  targets = tuple(jnp.dtype(w) for w in want)
  cast = jax.jit(lambda xs: tuple(x.astype(d) for x, d in zip(xs, targets)))
  return jax.tree.unflatten(treedef, list(cast(tuple(leaves))))


def reshard(tree: Any, shardings: Any, dtypes: Any | None = None) -> Any:
  """Places `tree` on `shardings` (a matching tree, or a prefix of it), casting first.

  Args:
    tree: params as they come from the trainer (any placement, e.g. an nnx.State).
    shardings: target NamedShardings, e.g. `models.sharding.state_shardings(...)` on the
      generator mesh.
    dtypes: optional tree with the target dtype of every leaf (arrays, ShapeDtypeStructs or
      dtypes), e.g. the sampler's current params. None keeps the incoming dtypes.

  Returns:
    The same tree structure, on the target shardings. Source arrays are left untouched.
  """
  if dtypes is not None:
    dtypes = jax.tree.map(lambda x: getattr(x, "dtype", x), dtypes)
    tree = _cast(tree, dtypes)
  return jax.device_put(tree, shardings)


def same_placement(tree: Any, shardings: Any) -> bool:
  """Whether every leaf of `tree` already sits on the matching sharding."""
  leaves = jax.tree.leaves(tree)
  targets = jax.tree.leaves(shardings)
  if len(leaves) != len(targets):
    return False
  return all(getattr(x, "sharding", None) is not None and x.sharding.is_equivalent_to(s, x.ndim)
             for x, s in zip(leaves, targets))
