"""The sampler's admission program: prefill through the full-sequence attention kernel."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_scale.generation import decode
from jaxrl_scale.models import config, sharding


def _admission(n: int, t: int) -> decode.Admission:
  i32 = jax.ShapeDtypeStruct((n,), jnp.int32)
  f32 = jax.ShapeDtypeStruct((n,), jnp.float32)
  return decode.Admission(
      tokens_uT=jax.ShapeDtypeStruct((n, t), jnp.int32), length_u=i32, source_n=i32,
      slot_n=i32, src_slot_u=i32,
      activate_n=jax.ShapeDtypeStruct((n,), jnp.bool_), last_n=i32, seed_n=i32,
      temperature_n=f32, top_k_n=i32, top_p_n=f32, limit_n=i32, force_at_n=i32,
      answer_budget_n=i32)


def test_admit_prefills_with_the_tpu_kernel_on_a_tpu_generator_mesh():
  pytest.importorskip("libtpu", reason="pip install -e '.[test]' brings libtpu (jax[tpu])")
  from jax.experimental import topologies

  cfg = dataclasses.replace(config.tiny_qwen3(), dtype="bfloat16", param_dtype="bfloat16")
  devices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
  mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ("data", "tp"),
                           axis_types=(jax.sharding.AxisType.Auto,) * 2)
  graphdef, abs_state = sharding.abstract_model(cfg)
  param_leaves, treedef = jax.tree.flatten(abs_state)
  params = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s) for x, s in
            zip(param_leaves, jax.tree.leaves(sharding.state_shardings(abs_state, mesh)))]
  slots, max_len, page = 8, 1024, 16
  shardings = decode.state_shardings(cfg, mesh, slots)
  state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      jax.eval_shape(lambda: decode.empty_state(cfg, slots, 2, 4 * max_len // page, page, None)),
      shardings)
  table = jax.ShapeDtypeStruct((slots, max_len // page), jnp.int32,
                               sharding=decode.table_sharding(mesh))
  program = decode.admit_program(graphdef, treedef, shardings)
  with jax.set_mesh(mesh):
    lowered = program.lower(params, state, _admission(4, 512), table)
    compiled = lowered.compile()
  # The prefill's attention is the Pallas kernel (a Mosaic custom call), not the dense
  # einsum over the bucket; the page pool keeps its sharding.
  assert "tpu_custom_call" in lowered.as_text()
  assert compiled.memory_analysis() is not None
  assert compiled.output_shardings.cache.kv.is_equivalent_to(shardings.cache.kv, 6)

  # A later piece of a chunked prefill (positions [256, 512) after 256 in the pages) reads
  # the earlier pieces from the sharded pool and compiles for the same mesh.
  piece = decode.admit_program(graphdef, treedef, shardings, 256)
  with jax.set_mesh(mesh):
    compiled = piece.lower(params, state, _admission(4, 256), table).compile()
  assert compiled.memory_analysis() is not None
  assert compiled.output_shardings.cache.kv.is_equivalent_to(shardings.cache.kv, 6)
