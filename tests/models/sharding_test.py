"""Logical-axis rules, sharded creation and sharded caches on 8 simulated CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxrl_scale.models import config, kv_cache, sharding


def _mesh(shape, axes=("fsdp", "tp")):
  return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:shape[0] * shape[1]])


def test_logical_to_spec_maps_and_falls_back():
  mesh = _mesh((4, 2))
  axes = ("embed", "kv_heads", "head_dim")
  assert sharding.logical_to_spec(axes, (64, 2, 16), mesh) == P("fsdp", "tp", None)
  # 3 kv heads do not split over tp=2; 6 rows do not split over fsdp=4.
  assert sharding.logical_to_spec(axes, (6, 3, 16), mesh) == P(None, None, None)
  # A mesh without 'fsdp' (the generator's) replicates that dim.
  gen = _mesh((4, 2), ("data", "tp"))
  assert sharding.logical_to_spec(("vocab", "embed"), (512, 64), gen) == P("tp", None)
  # A mesh axis is used at most once per array.
  rules = {"a": "tp", "b": "tp"}
  assert sharding.logical_to_spec(("a", "b"), (4, 4), mesh, rules) == P("tp", None)


def test_create_sharded_model_places_and_matches_unsharded(tiny_model):
  cfg = config.tiny_qwen3()
  mesh = _mesh((4, 2))
  model = sharding.create_sharded_model(cfg, mesh, seed=0)
  q = model.layers.self_attn.q_proj.kernel[...]
  assert q.sharding.spec == P(None, "fsdp", "tp", None)
  assert q.addressable_shards[0].data.shape == (2, 16, 2, 32)  # [2, 64, 4, 32] / (1, 4, 2)
  assert model.embed_tokens.embedding[...].sharding.spec == P("tp", "fsdp")
  assert model.layers.mlp.down_proj.kernel[...].sharding.spec == P(None, "tp", "fsdp")
  assert model.norm.scale[...].sharding.spec == P(None)

  # Same seed as the eagerly created single-device model; jit and eager random draws differ
  # only in the last float bits.
  reference = tiny_model("tiny_qwen3")
  for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)),
                            nnx.to_flat_state(nnx.state(reference))):
    np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()),
                               atol=1e-7, rtol=0, err_msg=str(p))


def test_sharded_paged_decode_matches_full_forward(tiny_model):
  cfg = config.tiny_llama()
  mesh = _mesh((2, 2), ("data", "tp"))
  model = sharding.shard_model(tiny_model("tiny_llama"), mesh)
  shardings = sharding.cache_shardings(cfg, mesh)
  cache = jax.jit(lambda: kv_cache.init_pages(cfg, shards=2, pages=3, page_size=2),
                  out_shardings=shardings)()
  assert cache.kv.shape == (cfg.num_layers, 2, 4, 2, 2 * cfg.num_kv_heads, cfg.head_dim)
  assert cache.kv.sharding.spec == P(None, "data", None, None, "tp", None)
  # Rows 0 and 1 sit on data shards 0 and 1; both hold local pages [2, 0] of their shard.
  table = jax.device_put(np.array([[2, 0], [2, 0]], np.int32),
                         NamedSharding(mesh, P("data", None)))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 4)), jnp.int32)
  step = nnx.jit(lambda m, t, p, c: m.decode(t, p, jnp.ones((2,), bool), c, table,
                                             view_pages=2))
  got = []
  for n in range(4):
    logits, cache = step(model, tokens[:, n:n + 1], jnp.full((2,), n, jnp.int32), cache)
    got.append(np.asarray(logits)[:, 0])
  pos, mask = jnp.broadcast_to(jnp.arange(4), (2, 4)), jnp.ones((2, 4), bool)
  full = nnx.jit(lambda m, t, p, k: m(t, p, k))(model, tokens, pos, mask)
  np.testing.assert_allclose(np.stack(got, axis=1), np.asarray(full), atol=1e-5, rtol=0)
  assert cache.kv.sharding.is_equivalent_to(shardings.kv, 6)


def test_shard_model_moves_params_onto_a_mesh(tiny_model):
  model = sharding.shard_model(tiny_model("tiny_qwen2"), _mesh((2, 4)))
  bias = model.layers.self_attn.q_proj.bias[...]
  assert bias.sharding.spec == P(None, "tp", None)  # 4 query heads over tp=4
  # 2 kv heads do not split over tp=4: replicated on that dim.
  assert model.layers.self_attn.k_proj.kernel[...].sharding.spec == P(None, "fsdp", None, None)


@pytest.mark.parametrize("name", sorted(config.PRESETS))
def test_every_preset_builds_abstractly(name):
  cfg = config.preset(name)
  _, state = sharding.abstract_model(cfg)
  sparse = cfg.moe_layers()
  unused = 0  # an interleaved model's layers hold both MLPs (`decoder.DecoderLayer`)
  if any(sparse) and not all(sparse):
    d = cfg.hidden_size
    moe = d * cfg.num_experts * (1 + 3 * cfg.moe_intermediate_size) + 3 * d * cfg.shared_expert_size
    unused = sum(3 * d * cfg.intermediate_size if s else moe for s in sparse)
  assert sharding.param_count(state) == cfg.num_params() + unused
