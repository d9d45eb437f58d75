"""One process of `staged_transfer_test`: 2 processes x 4 CPU devices. The 'trainer' array
set spans 2 devices of each process; each process reshards it onto its other 2 (the
generator's situation) with a small staging budget, and checks values, dtypes and how much of the
process-local copy was alive on its devices at once. Prints one JSON line."""

import json
import sys

from jaxrl_scale.parallel import distributed

distributed.maybe_initialize(sys.argv[1], 2, int(sys.argv[2]))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,wrong-import-position

from jaxrl_scale.parallel import transfer  # pylint: disable=g-import-not-at-top,wrong-import-position

budget = int(sys.argv[3])
# The trainer holds 2 devices of each process; this process's other 2 are its generator.
by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(2)]
trainer = Mesh(np.array([row[:2] for row in by_process]), ("fsdp", "tp"))
local = Mesh(np.array(by_process[jax.process_index()][2:]), ("data",))
shapes = {"a": (64, 32), "b": (8, 128), "c": (256, 16), "d": (16,), "e": (32, 32),
          "f": (24, 64, 32)}
specs = {"a": P("fsdp", "tp"), "b": P(None, ("fsdp", "tp")), "c": P("fsdp", None),
         "d": P(), "e": P("tp", "fsdp"), "f": P(None, "fsdp", "tp")}
want = {k: np.arange(np.prod(s), dtype=np.float32).reshape(s) / 7 for k, s in shapes.items()}
tree = {k: jax.make_array_from_callback(shapes[k], NamedSharding(trainer, specs[k]),
                                        lambda idx, k=k: want[k][idx]) for k in shapes}
targets = {k: NamedSharding(local, P()) for k in shapes}
targets["f"] = NamedSharding(local, P("data"))  # split on the axis it is staged along
dtypes = {k: jnp.bfloat16 for k in shapes}

local_ids = {d.id for d in by_process[jax.process_index()][:2]}  # this process's trainer


def live_bytes() -> int:
  """Bytes of distinct buffers on this process's trainer devices (a shard's `.data` is a
  new array over the same buffer: counted once, by its address)."""
  seen = {}
  for x in jax.live_arrays():
    for s in x.addressable_shards:
      if s.device.id in local_ids:
        seen[(s.device.id, s.data.unsafe_buffer_pointer())] = s.data.nbytes
  return sum(seen.values())


base = live_bytes()
peaks = []
real_to_local = transfer.to_local


def watched(leaves, dt=None, pieces=None):
  out = real_to_local(leaves, dt, pieces)
  peaks.append(live_bytes() - base)  # this group's local copy, on the trainer devices
  return out


transfer.to_local = watched
transfer.STAGING_BYTES = budget
moved = transfer.reshard(tree, targets, dtypes, copy=True)
transfer.to_local = real_to_local
ok = all(moved[k].dtype == jnp.bfloat16 and moved[k].is_fully_addressable and
         np.array_equal(np.asarray(moved[k], np.float32),
                        want[k].astype(jnp.bfloat16).astype(np.float32)) for k in shapes)
leaves = jax.tree.leaves(tree)
groups = transfer.staging_groups(leaves, [jnp.dtype(jnp.bfloat16)] * len(leaves), 2, budget)
print(json.dumps({"ok": ok, "groups": len(groups), "peaks": peaks,
                  "staged_bound": transfer.local_copy_bytes_per_device(
                      leaves, [jnp.bfloat16] * len(leaves), budget),
                  "whole": transfer.local_copy_bytes_per_device(
                      leaves, [jnp.bfloat16] * len(leaves), 1e12)}))
