"""transfer.reshard across processes stages the process-local copy a group at a time: 2 JAX
processes x 4 CPU devices (tests/parallel/staged_transfer_child.py)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_scale.parallel import transfer

CHILD = pathlib.Path(__file__).with_name("staged_transfer_child.py")


def test_staging_groups_pack_consecutive_leaves_up_to_the_budget():
  import jax  # pylint: disable=g-import-not-at-top
  m = jax.make_mesh((8,), ("x",), devices=jax.devices()[:8])
  arr = lambda n: jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(
      m, PartitionSpec("x")))
  leaves = [arr(800), arr(800), arr(8000), arr(80), arr(80)]
  dtypes = [jnp.dtype(jnp.bfloat16)] * len(leaves)
  # Per device of one process holding all 8 devices: 800 -> 100 elements -> 200 bytes.
  idx = lambda groups: [[i for i, _ in g] for g in groups]
  # Leaf 2 (2000 B) has no axis its local copy leaves whole: it cannot be split.
  assert idx(transfer.staging_groups(leaves, dtypes, 8, max_bytes=400)) == [[0, 1], [2], [3, 4]]
  assert idx(transfer.staging_groups(leaves, dtypes, 8, max_bytes=1e9)) == [[0, 1, 2, 3, 4]]
  assert transfer.local_copy_bytes_per_device(leaves, dtypes, max_bytes=400) == 2000
  assert transfer.local_copy_bytes_per_device(leaves, dtypes, max_bytes=1e9) == 2440


def test_a_leaf_over_the_budget_is_staged_a_few_layers_at_a_time():
  import jax  # pylint: disable=g-import-not-at-top
  m = jax.make_mesh((8,), ("x",), devices=jax.devices()[:8])
  # A stacked [L=10, 64, 8] weight split over its second axis: 10 x 8 x 8 x 2 = 1280 B per
  # device in bf16; with a 300 B budget it goes 2 layers (256 B) at a time.
  stacked = jax.ShapeDtypeStruct((10, 64, 8), jnp.float32, sharding=NamedSharding(
      m, PartitionSpec(None, "x")))
  small = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=NamedSharding(m, PartitionSpec("x")))
  dtypes = [jnp.dtype(jnp.bfloat16)] * 2
  groups = transfer.staging_groups([stacked, small], dtypes, 8, max_bytes=300)
  assert groups[:4] == [[(0, (0, a, a + 2))] for a in range(0, 8, 2)]
  assert groups[4:] == [[(0, (0, 8, 10)), (1, None)]]  # 256 + 16 B share a group
  assert transfer.local_copy_bytes_per_device([stacked, small], dtypes, max_bytes=300) == 272
  # 7 layers do not divide evenly: pieces of 2, the last of 1; nothing lost or repeated.
  odd = jax.ShapeDtypeStruct((7, 64, 8), jnp.float32, sharding=stacked.sharding)
  rows = [p for g in transfer.staging_groups([odd], dtypes[:1], 8, max_bytes=300)
          for _, p in g]
  assert rows == [(0, 0, 2), (0, 2, 4), (0, 4, 6), (0, 6, 7)]


@pytest.mark.multihost
def test_two_processes_reshard_stages_one_group_at_a_time():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  # a: 64 x 32 in bf16 is 4 KiB per process, 2 KiB on each of its 2 trainer devices; the
  # stacked f: 24 x 64 x 32, 48 KiB on each, over the budget by itself.
  budget = 4096
  procs = [subprocess.Popen([sys.executable, str(CHILD), f"127.0.0.1:{port}", str(pid),
                             str(budget)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for pid in range(2)]
  outs = []
  for p in procs:
    try:
      out, _ = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail("the two processes did not finish in 180 s")
    outs.append(out)
  assert [p.returncode for p in procs] == [0, 0], outs
  for out in outs:
    res = json.loads(out.strip().splitlines()[-1])
    assert res["ok"], res
    assert res["groups"] >= 3 + 12, res  # "f" alone goes in 12 pieces
    # Per trainer device, the whole local copy would be res["whole"] bytes (56 KiB); staged,
    # at most the largest group's (<= the budget) is alive at once on the 2 trainer devices,
    # including while "f" (48 KiB per device) is gathered 2 layers at a time.
    assert res["staged_bound"] <= budget < res["whole"], res
    assert max(res["peaks"]) <= 2 * res["staged_bound"], res
