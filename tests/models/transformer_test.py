"""The paged decode path reproduces the full-sequence forward; dtype policy; log-probs."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.models import config, kv_cache, transformer

# Every test uses the same shapes (sequences of L, pools of ROWS rows, prefill buckets of
# BUCKET) so that each model compiles each path once.
L, ROWS, BUCKET = 12, 3, 8


@nnx.jit
def _full(model, tokens, positions, mask):
  return model(tokens, positions, mask)


def _full_logits(model, seq: np.ndarray) -> np.ndarray:
  """Logits of one unpadded sequence of length L, [L, V]."""
  assert len(seq) == L
  return np.asarray(_full(model, jnp.asarray(seq)[None], jnp.arange(L)[None],
                          jnp.ones((1, L), bool)))[0]


PAGE, PAGES = 4, 16  # L = 12 positions take 3 pages per row


@nnx.jit
def _decode(model, tokens_B1, pos_B, active_B, cache, table_BM):
  return model.decode(tokens_B1, pos_B, active_B, cache, table_BM, view_pages=L // PAGE)


@nnx.jit
def _prefill(model, tokens_BT, lengths_B):
  t = tokens_BT.shape[1]
  pos_BT = jnp.broadcast_to(jnp.arange(t), tokens_BT.shape)
  return model.prefill(tokens_BT, pos_BT, pos_BT < lengths_B[:, None])


class Pages:
  """A one-shard page pool fed the way the sampler feeds it: prompts through `prefill`
  (their keys/values scattered into each row's pages on the host), then one token per row
  and call through `decode`. Rows hold shuffled, non-contiguous pages."""

  def __init__(self, model, cfg, seed=0):
    self.model = model
    self.cache = kv_cache.init_pages(cfg, shards=1, pages=PAGES, page_size=PAGE)
    order = np.random.default_rng(seed).permutation(PAGES)
    self.table = order[:ROWS * (L // PAGE)].reshape(ROWS, L // PAGE).astype(np.int32)

  def prefill(self, tokens_BT: np.ndarray, lengths: list[int]):
    """Writes positions [0, length) of each row; returns the prefill's logits [B, T, V]."""
    h, k_LBTKH, v_LBTKH = _prefill(self.model, jnp.asarray(tokens_BT), jnp.asarray(lengths))
    kv = np.array(self.cache.kv)  # [L, 1, P, C, 2K, H]: keys at even heads, values at odd
    for b, n in enumerate(lengths):
      for t in range(n):
        page, off = self.table[b, t // PAGE], t % PAGE
        kv[:, 0, page, off, 0::2] = np.asarray(k_LBTKH)[:, b, t]
        kv[:, 0, page, off, 1::2] = np.asarray(v_LBTKH)[:, b, t]
    self.cache = kv_cache.PagedKVCache(kv=jnp.asarray(kv))
    return np.asarray(nnx.jit(lambda m, x: m.logits(x))(self.model, h))

  def decode(self, rows: dict[int, tuple[int, int]]) -> np.ndarray:
    """rows: b -> (token, position); other rows are inactive. Returns logits [B, V]."""
    tok = np.zeros((ROWS, 1), np.int32)
    pos = np.zeros((ROWS,), np.int32)
    active = np.zeros((ROWS,), bool)
    for b, (t, p) in rows.items():
      tok[b, 0], pos[b], active[b] = t, p, True
    logits, self.cache = _decode(self.model, jnp.asarray(tok), jnp.asarray(pos),
                                 jnp.asarray(active), self.cache, jnp.asarray(self.table))
    return np.asarray(logits)[:, 0]


@pytest.fixture(params=["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def model_cfg(request, tiny_model):
  return tiny_model(request.param), config.preset(request.param)


@pytest.fixture
def qwen3_model_cfg(tiny_model):
  # The scheduling tests exercise the cache bookkeeping, which all families share.
  return tiny_model("tiny_qwen3"), config.tiny_qwen3()


def _seqs(cfg, n, length, seed=0):
  return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(n, length)).astype(np.int32)


def test_prefill_then_paged_decode_matches_full_forward(model_cfg):
  model, cfg = model_cfg
  seqs = _seqs(cfg, ROWS, L)
  prompt_lens = [5, 3, 8]
  full = [_full_logits(model, s) for s in seqs]
  pages = Pages(model, cfg)
  # Like the sampler: prompt positions [0, P - 1) by prefill, position P - 1 by decode.
  out = pages.prefill(seqs[:, :BUCKET], [n - 1 for n in prompt_lens])
  for b, n in enumerate(prompt_lens):
    np.testing.assert_allclose(out[b, :n - 1], full[b][:n - 1], atol=1e-5, rtol=0)
  for step in range(L - min(prompt_lens) + 1):
    active = {b: (seqs[b, n], n) for b in range(ROWS) if (n := prompt_lens[b] - 1 + step) < L}
    out = pages.decode(active)
    for b, (_, n) in active.items():
      np.testing.assert_allclose(out[b], full[b][n], atol=1e-5, rtol=0)


def test_reused_pages_and_inactive_rows(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  a, c, new = _seqs(cfg, 3, L, seed=1)
  full_a, full_c, full_new = (_full_logits(model, s) for s in (a, c, new))
  pages = Pages(model, cfg, seed=3)
  # Row 0 fills all its pages by decoding alone; rows 1 and 2 are inactive and write nothing.
  before = np.array(pages.cache.kv)
  for n in range(L):
    np.testing.assert_allclose(pages.decode({0: (a[n], n)})[0], full_a[n], atol=1e-5, rtol=0)
  after = np.array(pages.cache.kv)
  mine = np.zeros(PAGES + 1, bool)
  mine[pages.table[0]] = True
  assert (after[:, :, ~mine] == before[:, :, ~mine]).all()  # no other page was touched
  assert (after[:, :, mine] != 0).any()
  # Row 1 takes over row 0's pages (stale keys of `a` everywhere) for a new sequence, while
  # row 2 decodes `c` in its own pages: the stale positions past row 1's head stay unseen.
  pages.table[1] = pages.table[0]
  pages.table[0] = PAGES  # the null page: row 0 holds nothing now
  for n in range(L):
    out = pages.decode({1: (new[n], n), 2: (c[n], n)})
    np.testing.assert_allclose(out[1], full_new[n], atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[2], full_c[n], atol=1e-5, rtol=0)


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


@pytest.mark.slow  # 29 s on 2 cores; tests/models/gpu_attention_test.py lowers the cuDNN path
def test_rows_right_aligned_for_cudnn_give_the_same_states_and_grads(qwen3_model_cfg,
                                                                     monkeypatch):
  """Where the attention is cuDNN's (right padding only) `hidden_states` rotates left-padded
  rows to start at 0 and the states back (`Transformer._aligns_rows`), and the attention
  skips its own left-padding shift. Forced here on CPU, the attention being the cuDNN
  path's code through JAX's XLA implementation (`attention.fused_attention`): left, right
  and both-sides padded rows give the same hidden states at their real tokens, and the
  same gradients, as the unaligned model, whose attention shifts left-padded rows itself.
  Without the rotation (or rotated back wrongly) the left-padded rows fail it."""
  model, cfg = qwen3_model_cfg
  from jaxrl_scale.models import attention  # pylint: disable=g-import-not-at-top
  fused = attention.fused_attention
  monkeypatch.setattr(attention, "causal_attention",
                      lambda q, k, v, m, impl, sharding, right_padded: fused(
                          q, k, v, m, implementation="xla", right_padded=right_padded))
  rng = np.random.default_rng(8)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (3, L)), jnp.int32)
  mask = np.zeros((3, L), bool)
  mask[0, 4:] = True  # left-padded
  mask[1, :7] = True  # right-padded
  mask[2, 2:10] = True  # both
  pos = jnp.asarray(np.maximum(np.cumsum(mask, axis=1) - 1, 0), jnp.int32)
  mask = jnp.asarray(mask)
  graphdef, state = nnx.split(model)
  probe = jnp.asarray(rng.normal(size=(3, L, cfg.hidden_size)), jnp.float32)

  def run(aligned: bool):
    monkeypatch.setattr(transformer.Transformer, "_aligns_rows", lambda self, s: aligned)

    def loss(st):
      h = nnx.merge(graphdef, st).hidden_states(tokens, pos, mask)
      return jnp.sum(jnp.where(mask[:, :, None], h.astype(jnp.float32) * probe, 0.0)), h
    (_, h), grads = jax.value_and_grad(loss, has_aux=True)(state)
    return np.asarray(h, np.float32), grads

  h_plain, g_plain = run(False)
  h_aligned, g_aligned = run(True)
  real = np.asarray(mask)
  np.testing.assert_allclose(h_aligned[real], h_plain[real], atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_aligned), jax.tree.leaves(g_plain)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


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


@pytest.mark.parametrize("policy", ["full", pytest.param("dots", marks=pytest.mark.slow)])
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
  with pytest.raises(ValueError, match="unknown remat policy 'some'; expected one of .*'full'"):
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


# The MoE case without gradients (their compile took 18 s on 2 cores): its router stats are
# what it adds.
@pytest.mark.parametrize("name,grads", [("tiny_llama", True), ("tiny_qwen3_moe", False)])
def test_unrolled_layers_give_the_scans_states_gradients_and_router_stats(tiny_model, name,
                                                                           grads):
  """`unroll_layers` (what the trainer runs on CPU) is the scan's computation layer by
  layer: the same hidden states, gradients and (MoE) router stats. A loop that fed every
  layer the same slice of the stacks, or dropped a layer's stats, fails it."""
  model = tiny_model(name)
  cfg = model.cfg
  tokens = jnp.asarray(_seqs(cfg, 3, 8))
  mask = jnp.asarray(np.arange(8)[None] >= np.array([[0], [3], [5]]))  # left padding
  pos = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  probe = jnp.asarray(np.random.default_rng(3).normal(size=(3, 8, cfg.hidden_size)),
                      jnp.float32)
  graphdef, state = nnx.split(model)

  def run(unroll):
    def loss(st):
      h, stats = nnx.merge(graphdef, st).hidden_states_with_stats(
          tokens, pos, mask, remat="full", unroll_layers=unroll)
      value = jnp.sum(jnp.where(mask[:, :, None], h.astype(jnp.float32) * probe, 0.0))
      return value, (h, stats)
    if not grads:
      return jax.jit(loss)(state)[1], {}
    (_, aux), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
    return aux, g

  (h_scan, stats_scan), g_scan = run(False)
  (h_loop, stats_loop), g_loop = run(True)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(h_loop)[real], np.asarray(h_scan)[real], atol=1e-5,
                             rtol=1e-5)
  assert (stats_scan is None) == (stats_loop is None) == (not any(cfg.moe_layers()))
  for a, b in zip(jax.tree.leaves(stats_loop), jax.tree.leaves(stats_scan)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_loop), jax.tree.leaves(g_scan)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
  # The unrolled program holds each layer's matmuls (the scan one body: the test above).
  lowered = jax.jit(lambda st: nnx.merge(graphdef, st).hidden_states(
      tokens, pos, mask, unroll_layers=True)).lower(state).as_text()
  assert "while" not in lowered.replace("while_", "")


def _fsdp_mesh():
  return jax.make_mesh((4, 2), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


@pytest.mark.slow  # 50 s on 2 cores; the memory test below compiles the same sharded programs
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


def test_prefill_returns_what_decoding_writes_into_the_pages(qwen3_model_cfg):
  model, cfg = qwen3_model_cfg
  seqs = _seqs(cfg, ROWS, L, seed=6)
  _, k_LBTKH, v_LBTKH = _prefill(model, jnp.asarray(seqs), jnp.full((ROWS,), L))
  pages = Pages(model, cfg, seed=7)
  for n in range(L):
    pages.decode({b: (seqs[b, n], n) for b in range(ROWS)})
  assert k_LBTKH.shape == (cfg.num_layers, ROWS, L, cfg.num_kv_heads, cfg.head_dim)
  for got, heads in ((k_LBTKH, slice(0, None, 2)), (v_LBTKH, slice(1, None, 2))):
    for b in range(ROWS):
      # [L, 3 pages, C, K, H] in table order -> [L, 12 positions, K, H]
      written = np.asarray(pages.cache.kv)[:, 0, pages.table[b], :, heads].reshape(
          cfg.num_layers, L, cfg.num_kv_heads, cfg.head_dim)
      np.testing.assert_allclose(np.asarray(got)[:, b], written, atol=1e-5, rtol=0)


# in_loop=True is slow-only (15-22 s a model): the same pieces, written from a loop.
@pytest.mark.parametrize("in_loop", [pytest.param(True, marks=pytest.mark.slow), False])
def test_prefill_into_continues_a_prefix_in_the_pages(model_cfg, in_loop):
  """Chunked prefill at model level: positions [0, 8) of each row go in as one piece, then
  [8, 12) as a second piece that attends to them through the pages. The second piece's
  hidden states and the keys/values both pieces wrote equal one full-sequence `prefill`."""
  model, cfg = model_cfg
  seqs = _seqs(cfg, ROWS, L, seed=3)
  h_full, k_full, v_full = _prefill(model, jnp.asarray(seqs), jnp.full((ROWS,), L))
  table = Pages(model, cfg, seed=4).table  # shuffled, non-contiguous pages per row

  def write_at(start):
    def write(pool, layer, k_BTKH, v_BTKH):
      t_T = start + jnp.arange(k_BTKH.shape[1])
      page_BT = jnp.asarray(table)[:, t_T // PAGE]
      at = (layer, 0, page_BT[:, :, None], (t_T % PAGE)[None, :, None],
            2 * jnp.arange(cfg.num_kv_heads)[None, None, :])
      pool = pool.at[at].set(k_BTKH)
      return pool.at[at[:4] + (at[4] + 1,)].set(v_BTKH)
    return write

  @functools.partial(nnx.jit, static_argnums=(2, 3))
  def piece(model, pool, start, length):
    pos_BT = jnp.broadcast_to(start + jnp.arange(length), (ROWS, length))
    prefix = None
    if start:
      prefix = kv_cache.PromptPrefix(
          shard_B=jnp.zeros((ROWS,), jnp.int32), pages_BM=jnp.asarray(table)[:, :start // PAGE],
          length=jnp.int32(start))
    return model.prefill_into(jnp.asarray(seqs)[:, start:start + length], pos_BT,
                              jnp.ones((ROWS, length), bool), pool, write_at(start),
                              prefix=prefix, prefix_in_loop=in_loop)

  pool = kv_cache.init_pages(cfg, shards=1, pages=PAGES, page_size=PAGE).kv
  h_first, pool = piece(model, pool, 0, 8)
  h_second, pool = piece(model, pool, 8, L - 8)
  np.testing.assert_allclose(h_first, np.asarray(h_full)[:, :8], atol=1e-5, rtol=0)
  np.testing.assert_allclose(h_second, np.asarray(h_full)[:, 8:], atol=1e-5, rtol=0)
  for got, heads in ((k_full, slice(0, None, 2)), (v_full, slice(1, None, 2))):
    for b in range(ROWS):
      written = np.asarray(pool)[:, 0, table[b], :, heads].reshape(
          cfg.num_layers, L, cfg.num_kv_heads, cfg.head_dim)
      np.testing.assert_allclose(written, np.asarray(got)[:, b], atol=1e-5, rtol=0)
