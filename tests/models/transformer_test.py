"""The KV-cache path reproduces the full-sequence forward; dtype policy; log-probs."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.models import config, transformer

S_MAX = 16
# Every test uses the same shapes (sequences of L, caches of ROWS rows, prefill buckets of
# BUCKET) so that each model compiles each path once.
L, ROWS, BUCKET = 12, 3, 8


@nnx.jit
def _full(model, tokens, positions, mask):
  return model(tokens, positions, mask)


@nnx.jit
def _cached(model, tokens, positions, mask, cache, index):
  return model(tokens, positions, mask, cache=cache, cache_index_B=index)


def _full_logits(model, seq: np.ndarray) -> np.ndarray:
  """Logits of one unpadded sequence of length L, [L, V]."""
  assert len(seq) == L
  return np.asarray(_full(model, jnp.asarray(seq)[None], jnp.arange(L)[None],
                          jnp.ones((1, L), bool)))[0]


class Driver:
  """Feeds rows of a cache the way a continuous-batching sampler does."""

  def __init__(self, model, cfg):
    self.model, self.batch = model, ROWS
    self.cache = transformer.init_cache(cfg, ROWS, S_MAX)

  def call(self, rows: dict[int, tuple[list[int], list[int], int, list[bool]]], width: int):
    """rows: b -> (tokens, positions, start slot, mask); absent rows are left untouched."""
    assert width in (1, BUCKET)
    tok = np.zeros((self.batch, width), np.int32)
    pos = np.zeros((self.batch, width), np.int32)
    mask = np.zeros((self.batch, width), bool)
    idx = np.full((self.batch,), S_MAX, np.int32)  # past the end: writes are dropped
    for b, (t, p, start, m) in rows.items():
      tok[b], pos[b], mask[b], idx[b] = t, p, m, start
    logits, self.cache = _cached(self.model, jnp.asarray(tok), jnp.asarray(pos),
                                 jnp.asarray(mask), self.cache, jnp.asarray(idx))
    return np.asarray(logits)


@pytest.fixture(params=["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def model_cfg(request, tiny_model):
  return tiny_model(request.param), config.preset(request.param)


@pytest.fixture
def qwen3_model_cfg(tiny_model):
  # The scheduling tests exercise the cache bookkeeping, which all families share.
  return tiny_model("tiny_qwen3"), config.tiny_qwen3()


def _seqs(cfg, n, length, seed=0):
  return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(n, length)).astype(np.int32)


def test_prefill_then_decode_matches_full_forward(model_cfg):
  model, cfg = model_cfg
  seqs = _seqs(cfg, ROWS, L)
  prompt_lens, bucket = [5, 3, 8], BUCKET
  full = [_full_logits(model, s) for s in seqs]
  drv = Driver(model, cfg)
  out = drv.call({b: (seqs[b, :bucket], list(range(bucket)), 0,
                      [j < prompt_lens[b] for j in range(bucket)]) for b in range(3)}, bucket)
  for b in range(3):
    np.testing.assert_allclose(out[b, :prompt_lens[b]], full[b][:prompt_lens[b]], atol=1e-5,
                               rtol=0)
  for step in range(12 - min(prompt_lens)):
    active = {b: (seqs[b, [n]], [n], n, [True]) for b in range(3)
              if (n := prompt_lens[b] + step) < 12}
    out = drv.call(active, 1)
    for b, (_, (n,), _, _) in active.items():
      np.testing.assert_allclose(out[b, 0], full[b][n], atol=1e-5, rtol=0)


def test_rows_prefill_while_others_decode_and_rows_are_reused(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  a, c, new = _seqs(cfg, 3, L, seed=1)
  full_a, full_c, full_new = (_full_logits(model, s) for s in (a, c, new))
  drv = Driver(model, cfg)
  pad = lambda toks: list(toks) + [0] * (BUCKET - len(toks))  # noqa: E731
  real = lambda n: [True] * n + [False] * (BUCKET - n)  # noqa: E731
  # Row 0 fills most of its cache (a long sequence the row is later reused after).
  out = drv.call({0: (a[:BUCKET], list(range(BUCKET)), 0, real(6))}, BUCKET)
  np.testing.assert_allclose(out[0, :6], full_a[:6], atol=1e-5, rtol=0)
  for n in range(6, 9):
    out = drv.call({0: (a[[n]], [n], n, [True])}, 1)
    np.testing.assert_allclose(out[0, 0], full_a[n], atol=1e-5, rtol=0)
  # Row 1 prefills (4 real tokens) while row 0 is mid-sequence.
  out = drv.call({1: (pad(c[:4]), list(range(BUCKET)), 0, real(4))}, BUCKET)
  np.testing.assert_allclose(out[1, :4], full_c[:4], atol=1e-5, rtol=0)
  for step in range(3):  # joint decode, each row at its own slot
    n0, n1 = 9 + step, 4 + step
    out = drv.call({0: (a[[n0]], [n0], n0, [True]), 1: (c[[n1]], [n1], n1, [True])}, 1)
    np.testing.assert_allclose(out[0, 0], full_a[n0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[1, 0], full_c[n1], atol=1e-5, rtol=0)
  # Row 0 restarts with a new sequence from slot 0 (its stale slots 3..11 must stay
  # invisible) in the same call that extends row 1 by 5 tokens from slot 7.
  out = drv.call({0: (pad(new[:3]), list(range(BUCKET)), 0, real(3)),
                  1: (pad(c[7:12]), list(range(7, 7 + BUCKET)), 7, real(5))}, BUCKET)
  np.testing.assert_allclose(out[0, :3], full_new[:3], atol=1e-5, rtol=0)
  np.testing.assert_allclose(out[1, :5], full_c[7:12], atol=1e-5, rtol=0)
  for n in range(3, 6):
    out = drv.call({0: (new[[n]], [n], n, [True])}, 1)
    np.testing.assert_allclose(out[0, 0], full_new[n], atol=1e-5, rtol=0)


def test_left_padded_prefill_then_decode(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  seq = _seqs(cfg, 1, L, seed=2)[0]
  full = _full_logits(model, seq)
  drv = Driver(model, cfg)
  # 5 prompt tokens left padded to 8: pads take slots 0..2, positions come from the mask.
  out = drv.call({0: ([0, 0, 0] + seq[:5].tolist(), [0, 0, 0, 0, 1, 2, 3, 4], 0,
                      [False] * 3 + [True] * 5)}, BUCKET)
  np.testing.assert_allclose(out[0, 3:], full[:5], atol=1e-5, rtol=0)
  for k in range(4):  # slots continue at 8, positions at 5
    out = drv.call({0: (seq[[5 + k]], [5 + k], 8 + k, [True])}, 1)
    np.testing.assert_allclose(out[0, 0], full[5 + k], atol=1e-5, rtol=0)


def test_padding_does_not_leak_into_real_tokens(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  seq, garbage = _seqs(cfg, 1, 9, seed=4)[0], _seqs(cfg, 1, 3, seed=5)[0]
  ref = _full_logits(model, np.concatenate([seq, garbage]))[:9]  # causal: prefix logits
  # Left and right padding with arbitrary pad tokens give the unpadded logits.
  left = np.concatenate([garbage, seq])[None]
  right = np.concatenate([seq, garbage])[None]
  mask_l = np.array([[False] * 3 + [True] * 9])
  mask_r = mask_l[:, ::-1].copy()
  pos_l = np.maximum(np.cumsum(mask_l, axis=1) - 1, 0)
  out_l = np.asarray(_full(model, jnp.asarray(left), jnp.asarray(pos_l), jnp.asarray(mask_l)))
  out_r = np.asarray(_full(model, jnp.asarray(right), jnp.arange(L)[None], jnp.asarray(mask_r)))
  np.testing.assert_allclose(out_l[0, 3:], ref, atol=1e-5, rtol=0)
  np.testing.assert_allclose(out_r[0, :9], ref, atol=1e-5, rtol=0)
  # ...and the mask matters: without it the pads change the left-padded result.
  out_nomask = np.asarray(_full(model, jnp.asarray(left), jnp.asarray(pos_l),
                                jnp.ones_like(jnp.asarray(mask_l))))
  assert np.abs(out_nomask[0, 3:] - ref).max() > 1e-3


def test_clear_rows_hides_a_rows_slots():
  cfg = config.tiny_llama()
  cache = transformer.init_cache(cfg, 2, 4)
  cache = dataclasses.replace(cache, valid_BS=jnp.ones((2, 4), bool))
  cleared = transformer.clear_rows(cache, jnp.array([True, False]))
  np.testing.assert_array_equal(np.asarray(cleared.valid_BS), [[False] * 4, [True] * 4])


def test_dtype_policy_and_fp32_logits(tiny_model):
  base = config.tiny_qwen3()
  tokens = jnp.asarray(_seqs(base, 1, L))
  pos, mask = jnp.arange(L)[None], jnp.ones((1, L), bool)
  model32 = tiny_model("tiny_qwen3")
  bf16 = dataclasses.replace(base, dtype="bfloat16", param_dtype="bfloat16")

  def with_weights(cfg):  # the fp32 model's weights rounded to bfloat16
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: transformer.create_model(cfg)))
    return nnx.merge(graphdef, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                            nnx.state(model32)))

  model = with_weights(bf16)
  assert model.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
  h = nnx.eval_shape(lambda m: m.hidden_states(tokens, pos, mask), model)
  assert h.dtype == jnp.bfloat16
  logits = _full(model, tokens, pos, mask)
  assert logits.dtype == jnp.float32  # lm_head_fp32 defaults to True
  low = with_weights(dataclasses.replace(bf16, lm_head_fp32=False))
  assert nnx.eval_shape(lambda m: m(tokens, pos, mask), low).dtype == jnp.bfloat16
  # bf16 activations stay close to the fp32 model: a few bf16 ulps of logits of size ~1.
  ref = np.asarray(_full(model32, tokens, pos, mask))
  diff = np.abs(np.asarray(logits) - ref)
  assert diff.max() < 0.05 * np.abs(ref).max(), (diff.max(), np.abs(ref).max())


def test_token_log_probs_match_log_softmax(tiny_model):
  cfg = config.tiny_llama()
  model = tiny_model("tiny_llama")
  tokens = jnp.asarray(_seqs(cfg, 2, 5))
  pos, mask = jnp.broadcast_to(jnp.arange(5), (2, 5)), jnp.ones((2, 5), bool)

  @nnx.jit
  def both(m):
    h = m.hidden_states(tokens, pos, mask)
    return m.token_log_probs(h, tokens), jax.nn.log_softmax(m.logits(h), axis=-1)

  logp, ref = (np.asarray(x) for x in both(model))
  expected = np.take_along_axis(ref, np.asarray(tokens)[:, :, None], axis=-1)[:, :, 0]
  np.testing.assert_allclose(logp, expected, atol=1e-6, rtol=0)
  assert logp.dtype == np.float32 and (logp < 0).all()


@pytest.mark.parametrize("policy", ["full", "dots"])
def test_remat_and_chunked_log_probs_give_the_same_loss_and_grads(tiny_model, policy):
  cfg = config.tiny_qwen2()
  model = tiny_model("tiny_qwen2")
  tokens = jnp.asarray(_seqs(cfg, 2, 8))
  pos, mask = jnp.broadcast_to(jnp.arange(8), (2, 8)), jnp.ones((2, 8), bool)

  @nnx.jit
  def both(m):
    def loss(m, remat, chunk):
      h = m.hidden_states(tokens, pos, mask, remat=remat)
      return m.token_log_probs(h, tokens, chunk_size=chunk).sum()
    return (nnx.value_and_grad(loss)(m, "none", None), nnx.value_and_grad(loss)(m, policy, 4))

  (loss_ref, grads_ref), (loss_new, grads_new) = both(model)
  np.testing.assert_allclose(float(loss_new), float(loss_ref), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_new), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match="must divide"):
    model.token_log_probs(jnp.zeros((2, 8, cfg.hidden_size)), tokens, chunk_size=3)


def test_remat_policies_change_what_the_backward_pass_keeps(tiny_model):
  cfg = config.tiny_llama()
  model = tiny_model("tiny_llama")
  tokens = jnp.asarray(_seqs(cfg, 2, 8))
  pos, mask = jnp.broadcast_to(jnp.arange(8), (2, 8)), jnp.ones((2, 8), bool)

  def saved(remat):  # residuals the forward pass keeps for the backward pass
    graphdef, state = nnx.split(model)
    f = lambda st: nnx.merge(graphdef, st).hidden_states(tokens, pos, mask,  # noqa: E731
                                                         remat=remat).sum()
    # The vjp closure's leaves are exactly what the forward pass keeps.
    kept = jax.eval_shape(lambda st: jax.tree.leaves(jax.vjp(f, st)[1]), state)
    return sum(np.prod(x.shape) for x in kept)

  sizes = {name: saved(name) for name in ("none", "dots", "full")}
  assert sizes["full"] < sizes["dots"] < sizes["none"], sizes
  with pytest.raises(ValueError, match="'dots', 'full', 'none'"):
    model.hidden_states(tokens, pos, mask, remat="some")


def _count_dots(cfg: config.ModelConfig, remat: str) -> int:
  """dot_general ops in the lowered forward+backward program of a `cfg` model."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: transformer.create_model(cfg)))
  tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  mask = jax.ShapeDtypeStruct((2, 8), jnp.bool_)

  def loss(st, t, m):
    h = nnx.merge(graphdef, st).hidden_states(t, t, m, remat=remat)
    return h.astype(jnp.float32).sum()

  text = jax.jit(jax.grad(loss)).lower(state, tokens, mask).as_text()
  return text.count("dot_general")


@pytest.mark.parametrize("remat", ["none", "full"])
def test_the_layer_scan_compiles_one_layer_body(remat):
  two = dataclasses.replace(config.tiny_llama(), attention_impl="einsum")
  six = dataclasses.replace(two, num_layers=6)
  # An unrolled loop would give three times the matmuls; a scan has one body whatever L is.
  assert _count_dots(two, remat) == _count_dots(six, remat) > 0


def _fsdp_mesh():
  return jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_activation_sharding_keeps_numbers_and_pins_rows(tiny_model):
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jaxrl_scale.models import sharding

  cfg = config.tiny_qwen3()
  mesh = _fsdp_mesh()
  model = sharding.shard_model(tiny_model("tiny_qwen3"), mesh)
  act = NamedSharding(mesh, P("fsdp", None, None))
  tokens = jnp.asarray(_seqs(cfg, 8, L))
  pos, mask = jnp.broadcast_to(jnp.arange(L), (8, L)), jnp.ones((8, L), bool)

  @functools.partial(nnx.jit, static_argnums=1)
  def grads(m, pinned):
    def loss(m):
      h = m.hidden_states(tokens, pos, mask, remat="full",
                          activation_sharding=act if pinned else None)
      return m.token_log_probs(h, tokens).sum(), h
    return nnx.value_and_grad(loss, has_aux=True)(m)

  (loss_ref, h_ref), g_ref = grads(model, False)
  (loss_pin, h_pin), g_pin = grads(model, True)
  assert h_pin.sharding.is_equivalent_to(act, 3)
  np.testing.assert_allclose(float(loss_pin), float(loss_ref), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(h_pin), np.asarray(h_ref), atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(g_pin), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def test_activation_sharding_cuts_the_train_programs_memory():
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jaxrl_scale.models import sharding

  cfg = dataclasses.replace(config.tiny_qwen3(), attention_impl="einsum")
  mesh = _fsdp_mesh()
  graphdef, abs_state = sharding.abstract_model(cfg)
  shardings = sharding.state_shardings(abs_state, mesh)
  state = jax.tree.map(
      lambda v, s: v.replace(jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype,
                                                  sharding=s)),
      abs_state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
  rows = NamedSharding(mesh, P("fsdp", None))
  tokens = jax.ShapeDtypeStruct((32, 256), jnp.int32, sharding=rows)
  mask = jax.ShapeDtypeStruct((32, 256), jnp.bool_, sharding=rows)
  act = NamedSharding(mesh, P("fsdp", None, None))

  def compiled(pin):
    def loss(st, t, m):
      model = nnx.merge(graphdef, st)
      h = model.hidden_states(t, t, m, remat="full", activation_sharding=pin)
      return model.token_log_probs(h, t).sum(), h
    return jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(state, tokens, mask).compile()

  free, pinned = compiled(None), compiled(act)
  # Left alone, the compiler splits the activations by the fsdp-sharded weights' D axis and
  # gathers rows around every matmul; pinned, each device keeps only its rows.
  assert pinned.output_shardings[0][1].is_equivalent_to(act, 3)
  assert not free.output_shardings[0][1].is_equivalent_to(act, 3)
  assert (pinned.memory_analysis().temp_size_in_bytes
          < 0.8 * free.memory_analysis().temp_size_in_bytes)


def test_prefill_returns_the_cache_paths_keys_and_values(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  tokens = jnp.asarray(_seqs(cfg, ROWS, BUCKET, seed=6))
  mask = jnp.asarray(np.arange(BUCKET)[None, :] < np.array([5, 8, 1])[:, None])
  pos = jnp.broadcast_to(jnp.arange(BUCKET), (ROWS, BUCKET))
  h, k_LBTKH, v_LBTKH = nnx.jit(lambda m: m.prefill(tokens, pos, mask))(model)
  cache = transformer.init_cache(cfg, ROWS, S_MAX)
  h_ref, cache = _cached(model, tokens, pos, mask, cache, jnp.zeros((ROWS,), jnp.int32))
  m = np.asarray(mask)
  assert k_LBTKH.shape == (cfg.num_layers, ROWS, BUCKET, cfg.num_kv_heads, cfg.head_dim)
  for got, ref in ((k_LBTKH, cache.k), (v_LBTKH, cache.v)):
    np.testing.assert_allclose(np.asarray(got)[:, m], np.swapaxes(np.asarray(ref), 2, 3)[:, :, :BUCKET][:, m],
                               atol=1e-5, rtol=0)
  logits = np.asarray(nnx.jit(lambda m_, x: m_.logits(x))(model, h))
  np.testing.assert_allclose(logits[m], np.asarray(h_ref)[m], atol=1e-5, rtol=0)


def test_cache_arguments_go_together(tiny_model):
  cfg = config.tiny_llama()
  model = tiny_model("tiny_llama")
  with pytest.raises(ValueError, match="together"):
    model(jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2), bool),
          cache=transformer.init_cache(cfg, 1, 4))
