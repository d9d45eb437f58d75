"""causal_attention against a hand-written numpy reference, and the TPU kernel path."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jaxrl_scale.models import attention, paged_attention


def reference_attention(q_BTNH, k_BTKH, v_BTKH, mask_BT):
  """Dense float64 attention written out loop by loop from the definition."""
  q, k, v = (np.asarray(x, np.float64) for x in (q_BTNH, k_BTKH, v_BTKH))
  b, t, n, h = q.shape
  group = n // k.shape[2]
  out = np.zeros((b, t, n, h))
  for r in range(b):
    for head in range(n):
      kv = head // group
      for i in range(t):
        visible = np.array([s for s in range(t) if s <= i and mask_BT[r, s]], int)
        if not visible.size:
          continue
        scores = k[r, visible, kv] @ q[r, i, head] / np.sqrt(h)
        p = np.exp(scores - scores.max())
        out[r, i, head] = (p / p.sum()) @ v[r, visible, kv]
  return out


def visible_BT(mask_BT):
  """Queries with at least one visible key (the rest are garbage by contract)."""
  return np.cumsum(mask_BT, axis=1) > 0


def padded_mask(lengths, total, left):
  mask = np.zeros((len(lengths), total), bool)
  for r, n in enumerate(lengths):
    if left:
      mask[r, total - n:] = True
    else:
      mask[r, :n] = True
  return mask


def random_qkv(b, t, n, k, h, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, n, h)).astype(np.float32)
  kk = rng.normal(size=(b, t, k, h)).astype(np.float32)
  v = rng.normal(size=(b, t, k, h)).astype(np.float32)
  return tuple(jnp.asarray(x, dtype) for x in (q, kk, v))


# Rows: full, shorter, length 1, and (left padding) a row whose first queries see nothing.
LENGTHS = [12, 7, 1, 4]


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_einsum_matches_reference(left, dtype, tol):
  q, k, v = random_qkv(4, 12, 6, 2, 8, dtype)
  mask = padded_mask(LENGTHS, 12, left)
  out = attention.causal_attention(q, k, v, jnp.asarray(mask), impl="einsum")
  assert out.dtype == dtype and out.shape == q.shape
  assert np.isfinite(np.asarray(out, np.float32)).all()
  # Reference on the same (rounded) inputs, so bf16 error is the kernel's own arithmetic.
  ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                            v.astype(jnp.float32), mask)
  vis = visible_BT(mask)
  np.testing.assert_allclose(np.asarray(out, np.float32)[vis], ref[vis], atol=tol, rtol=tol)


def test_einsum_query_chunks_match_reference():
  """The chunked (lax.map + remat) path gives the reference values and unchunked gradients."""
  q, k, v = random_qkv(2, 16, 4, 2, 8, jnp.float32, seed=1)
  mask = jnp.asarray(padded_mask([16, 9], 16, left=True))
  vis = visible_BT(np.asarray(mask))

  def out_and_grads(chunk):
    def loss(q, k, v):
      out = attention.einsum_attention(q, k, v, mask, query_chunk=chunk)
      return jnp.sum(jnp.where(jnp.asarray(vis)[:, :, None, None], out, 0.0) ** 2), out

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  g_chunked, chunked = out_and_grads(4)
  g_whole, whole = out_and_grads(16)
  ref = reference_attention(q, k, v, np.asarray(mask))
  np.testing.assert_allclose(np.asarray(chunked)[vis], ref[vis], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(chunked, whole, atol=1e-6)
  for a, b in zip(g_chunked, g_whole):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_einsum_with_more_keys_than_queries_is_the_last_queries_of_the_sequence():
  """Chunked prefill: T queries after a cached prefix attend to it and causally to
  themselves, i.e. they are the last T queries of the whole sequence."""
  q, k, v = random_qkv(3, 12, 6, 2, 8, jnp.float32, seed=2)
  mask = padded_mask([12, 7, 9], 12, left=False)
  mask[2, 3] = False  # a masked key inside the prefix
  t = 5
  out = attention.einsum_attention(q[:, -t:], k, v, jnp.asarray(mask))
  ref = reference_attention(q, k, v, mask)[:, -t:]
  vis = visible_BT(mask)[:, -t:]
  np.testing.assert_allclose(np.asarray(out)[vis], ref[vis], atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="keys for"):
    attention.einsum_attention(q, k[:, :4], v[:, :4], jnp.asarray(mask[:, :4]))


def test_unknown_impl_names_valid_ones():
  q, k, v = random_qkv(1, 4, 2, 1, 8, jnp.float32)
  with pytest.raises(ValueError, match="einsum, splash"):
    attention.causal_attention(q, k, v, jnp.ones((1, 4), bool), impl="flashy")


def test_auto_is_einsum_on_cpu():
  q, k, v = random_qkv(2, 8, 2, 1, 8, jnp.float32)
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  mask = jnp.asarray(padded_mask([8, 3], 8, left=False))
  out = attention.causal_attention(q, k, v, mask, sharding=sharding)
  np.testing.assert_array_equal(out, attention.einsum_attention(q, k, v, mask))


def auto_mesh(shape, axes, devices):
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape), axes,
                           axis_types=(AxisType.Auto,) * len(axes))


# T = 200 pads to 256 = two 128 blocks: a diagonal and a skipped upper block per row of
# blocks, and 56 padded keys that must stay invisible. Rows mix left and right padding.
SPLASH_T = 200


def splash_case(left_lengths, right_lengths, seed=0):
  mask = np.concatenate([padded_mask(left_lengths, SPLASH_T, left=True),
                         padded_mask(right_lengths, SPLASH_T, left=False)])
  q, k, v = random_qkv(len(mask), SPLASH_T, 4, 2, 32, jnp.float32, seed=seed)
  return q, k, v, mask


# (mesh shape, axis names, batch spec): heads split over tp=2; tp=4 divides N=4 but not
# K=2 (kv heads repeated); batch over two axes with no tp.
MESHES = [((2, 2), ("fsdp", "tp"), "fsdp"),
          ((1, 4), ("data", "tp"), "data"),
          ((2, 2), ("data", "fsdp"), ("data", "fsdp"))]


@pytest.mark.parametrize("shape,axes,batch", MESHES)
def test_splash_interpret_matches_reference(shape, axes, batch):
  """The Pallas kernel itself (interpret mode on CPU) under shard_map, vs the reference."""
  q, k, v, mask = splash_case([200, 1], [150, 130])
  mesh = auto_mesh(shape, axes, jax.devices()[:4])
  sharding = NamedSharding(mesh, P(batch))
  out = jax.jit(lambda *a: attention.splash_attention(
      *a, sharding=sharding, block_size=128, interpret=True))(q, k, v, jnp.asarray(mask))
  assert out.shape == q.shape and out.dtype == q.dtype
  assert np.isfinite(np.asarray(out)).all()
  vis = visible_BT(mask)
  ref = reference_attention(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(out)[vis], ref[vis], atol=1e-5, rtol=1e-5)


def test_splash_interpret_gradients_match_einsum():
  """The kernel's custom VJP (dq and dkv kernels) against autodiff of the einsum path."""
  q, k, v, mask = splash_case([150], [130], seed=1)
  mask = jnp.asarray(mask)
  mesh = auto_mesh((2, 2), ("fsdp", "tp"), jax.devices()[:4])
  sharding = NamedSharding(mesh, P("fsdp"))
  w_BTNH = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
  # Only queries that see a key carry a cotangent, as a masked loss would.
  w_BTNH = jnp.where(jnp.asarray(visible_BT(np.asarray(mask)))[:, :, None, None], w_BTNH, 0.0)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v, mask) * w_BTNH)

  splash = functools.partial(attention.splash_attention, sharding=sharding, block_size=128,
                             interpret=True)
  grads = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)
  expected = jax.grad(loss(attention.einsum_attention), argnums=(0, 1, 2))(q, k, v)
  for name, got, want in zip("qkv", grads, expected):
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"d{name}")


def test_splash_rejects_uneven_batch():
  q, k, v = random_qkv(3, 8, 2, 1, 32, jnp.float32)
  mesh = auto_mesh((2,), ("fsdp",), jax.devices()[:2])
  with pytest.raises(ValueError, match="batch 3"):
    attention.causal_attention(q, k, v, jnp.ones((3, 8), bool), impl="splash",
                               sharding=NamedSharding(mesh, P("fsdp")))


def test_splash_flops_by_hand():
  # T=1000 pads to 1024: two 512 forward tiles, 3 of the 4 pairs on or below the diagonal;
  # the fused backward's one 1024 tile is 4 of those.
  block_matmul = 2 * 512 * 512 * 128
  assert attention.splash_flops(1, 1000, 1, 128) == 3 * 2 * block_matmul
  assert (attention.splash_flops(2, 1000, 4, 128, backward=True)
          == 2 * 4 * (3 * 2 + 4 * 5) * block_matmul)
  # T=2048, 512-wide tiles: 10 of 16 pairs; 1024-wide: 3 of 4.
  assert attention.splash_flops(1, 2048, 1, 128, backward=True) == (10 * 2 + 12 * 5) * block_matmul
  # T=100 is one 128 block.
  assert attention.splash_flops(1, 100, 1, 64) == 2 * (2 * 128 * 128 * 64)
  # Beyond 16 kv tiles of 1024 the backward is unfused: 7 matmuls on 512 tiles.
  nb = 34  # T=17000 pads to 17408 = 34 x 512 (17 x 1024)
  assert not attention.fused_backward(17000) and attention.fused_backward(16384)
  assert (attention.splash_flops(1, 17000, 1, 128, backward=True)
          == 9 * (nb * (nb + 1) // 2) * block_matmul)
  # Rectangular tiles: 512 queries x 1024 keys over T=2048: q tiles 0-1 see kv tile 0,
  # q tiles 2-3 see kv tiles 0-1 -> 6 tiles of 512 x 1024.
  assert (attention.splash_block_flops(1, 2048, 1, 128, 512, 1024)
          == 6 * 2 * 512 * 1024 * 128)


@pytest.fixture(scope="module")
def tpu_mesh():
  """A ('fsdp', 'tp') mesh over a simulated v5e:2x2 (libtpu, no TPU attached)."""
  pytest.importorskip("libtpu", reason="libtpu (the tpu extra) is not installed")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies

  topo = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu")
  return auto_mesh((2, 2), ("fsdp", "tp"), topo.devices)


def _compile_for_tpu(mesh, fn, b=2, t=1000, n=4, k=2, h=128):
  sharding = NamedSharding(mesh, P("fsdp"))
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=sharding)
  kv = jax.ShapeDtypeStruct((b, t, k, h), jnp.bfloat16, sharding=sharding)
  mask = jax.ShapeDtypeStruct((b, t), jnp.bool_, sharding=sharding)
  with jax.set_mesh(mesh):
    return jax.jit(functools.partial(fn, sharding=sharding)).lower(q, kv, kv, mask).compile()


def test_auto_compiles_splash_for_tpu(tpu_mesh):
  """impl='auto' on TPU devices lowers to the Pallas kernel; T=1000 is not a block multiple."""
  compiled = _compile_for_tpu(tpu_mesh, attention.causal_attention)
  assert compiled.memory_analysis() is not None
  assert "tpu_custom_call" in compiled.as_text()


@pytest.mark.parametrize("t,fused", [(1000, True), (17000, False)])
def test_splash_backward_compiles_for_tpu(tpu_mesh, t, fused):
  def loss(q, k, v, mask, sharding):
    out = attention.causal_attention(q, k, v, mask, impl="splash", sharding=sharding)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  def grads(q, k, v, mask, sharding):
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v, mask, sharding)

  compiled = _compile_for_tpu(tpu_mesh, grads, t=t)
  assert compiled.memory_analysis() is not None
  text = compiled.as_text()
  assert "splash_mha_dkv" in text
  if fused:  # the forward kernel and one backward kernel for dq, dk and dv
    assert text.count("tpu_custom_call") == 2 and "splash_mha_dq" not in text
  else:  # T beyond 16 kv tiles: separate dq and dkv kernels
    assert "splash_mha_dq" in text


def _paged_case(shards, rows=8, h=128, kv=2, groups=2, num_layers=2, page=4, width=5, seed=0):
  """A pool [L, D, P, C, 2K, H] of random pages, shuffled page tables of distinct local pages
  per shard, positions on and off page boundaries, and one new token per row."""
  rng = np.random.default_rng(seed)
  per_shard = rows // shards
  pages = per_shard * width + 3  # a few pages no row holds, then the null page
  pool = rng.normal(size=(num_layers, shards, pages + 1, page, 2 * kv, h)).astype(np.float32)
  table = np.concatenate([rng.permutation(pages)[:per_shard * width].reshape(per_shard, width)
                          for _ in range(shards)]).astype(np.int32)
  pos = np.array([0, 3, 4, 9, 17, 19, 7, 12])[:rows].astype(np.int32)
  q = rng.normal(size=(rows, 1, kv * groups, h)).astype(np.float32)
  k_new = rng.normal(size=(rows, 1, kv, h)).astype(np.float32)
  v_new = rng.normal(size=(rows, 1, kv, h)).astype(np.float32)
  write = np.ones((rows,), bool)
  write[1] = False  # an inactive row writes nothing
  return pool, table, pos, q, k_new, v_new, write


@pytest.mark.parametrize("impl,data,tp", [
    ("gather", 1, 1), ("gather", 2, 1), ("gather", 2, 2), ("gather", 0, 0), ("gather", -2, 0),
    ("view", 1, 1), ("view", 2, 2), ("view", -2, 0),
    ("ragged", 1, 1), ("ragged", 2, 1), ("ragged", 2, 2)])
def test_paged_attention_matches_the_ragged_kernels_reference(impl, data, tp, monkeypatch):
  """paged_attention.paged_attention (the write and the read, per device under the shard_map a pod
  runs) against jax's reference for the TPU ragged paged attention kernel (decode rows: one
  query each, kv length = position + 1), on shuffled page tables, GQA 4 query heads over 2
  kv heads. Meshes: data x tp devices; (0, 0) and (-2, 0): no mesh, one or two pool shards.

  "ragged" runs our TPU wrapper (the pool viewed as [L*D*P] pages, the write and the page
  table offset into that view) with the Pallas kernel, which cannot run on CPU (Pallas' TPU
  interpret mode cannot reshape its VMEM buffers), replaced by the XLA read on the pages
  the wrapper hands it: a wrong offset or a misplaced write reads the wrong pages.

  "view" runs the XLA path over a `paged_view` taken before the write (as a CPU decode
  chunk takes it at its start): the new token must land in the view as in the pool, and
  the view afterwards must equal a fresh view of the updated pool."""
  from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

  if impl == "ragged":
    def kernel_stand_in(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale,
                        num_kv_pages_per_block, num_queries_per_block):
      assert sm_scale == q.shape[-1] ** -0.5 and 0 < num_kv_pages_per_block
      assert 0 < num_queries_per_block <= q.shape[0]
      assert cu_q_lens.shape == (q.shape[0] + 1,) and num_seqs.shape == (1,)
      return paged_attention.gather_decode_attention(q, kv_pages[page_indices], kv_lens)

    monkeypatch.setattr(rpa, "ragged_paged_attention", kernel_stand_in)
  shards = max(1, abs(data))
  pool, table, pos, q, k_new, v_new, write = _paged_case(shards)
  rows, h, page = q.shape[0], q.shape[3], pool.shape[3]
  per_shard = rows // shards
  layer = 1
  mesh = (auto_mesh((data, tp), ("data", "tp"), jax.devices()[:data * tp]) if data > 0
          else None)
  width = table.shape[1]
  view_of = jax.jit(functools.partial(paged_attention.paged_view, layer=layer, view_pages=width,
                                      mesh=mesh))
  view = view_of(pool, table_BM=table) if impl == "view" else None
  fn = jax.jit(functools.partial(paged_attention.paged_attention, view_pages=width,
                                 impl="gather" if impl == "view" else impl, mesh=mesh))
  out, got_pool, got_view = fn(q, k_new, v_new, pool, jnp.int32(layer), table, pos, write,
                               view=view)
  assert (got_view is None) == (impl != "view")
  got_pool = np.asarray(got_pool)
  expected_pool = pool.copy()
  for b in range(rows):  # the new key/value landed at its page and offset, keys at even heads
    if write[b]:
      at = (layer, b // per_shard, table[b, pos[b] // page], pos[b] % page)
      expected_pool[at + (slice(0, None, 2),)] = k_new[b, 0]
      expected_pool[at + (slice(1, None, 2),)] = v_new[b, 0]
  np.testing.assert_array_equal(got_pool, expected_pool)
  if impl == "view":
    fresh = view_of(jnp.asarray(expected_pool), table_BM=table)
    for got, want in zip(got_view, fresh):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for s in range(shards):
    sl = slice(s * per_shard, (s + 1) * per_shard)
    ref = rpa.ref_ragged_paged_attention(
        jnp.asarray(q[sl, 0]), jnp.asarray(expected_pool[layer, s]), jnp.asarray(pos[sl] + 1),
        jnp.asarray(table[sl]), jnp.arange(per_shard + 1, dtype=jnp.int32),
        jnp.asarray([per_shard], jnp.int32), sm_scale=h ** -0.5)
    np.testing.assert_allclose(np.asarray(out)[sl, 0], np.asarray(ref), atol=2e-5, rtol=0)


def test_paged_attention_compiles_the_ragged_kernel_for_tpu(tpu_mesh):
  """impl='auto' on a TPU mesh lowers the decode read to the Pallas ragged kernel, with the
  pool's kv heads over 'tp' and the write done per device. Inside a scan over the layers
  with the pool in the carry (as in decode), the kernel gets the whole local pool as pages
  (`plan` on the paper recipe measured handing it `pool[layer]` instead at 0.5 GiB more
  temporaries and a 1.6x slower decode bound). The kernel cannot run here (Pallas' TPU interpret mode cannot reshape its
  VMEM buffers), so the numbers are checked through the same wrapper with the XLA read
  above."""
  mesh = auto_mesh((2, 2), ("data", "tp"), tpu_mesh.devices.flat)
  rows, n, k, h, page, width, pages, layers_ = 8, 8, 4, 128, 16, 4, 20, 3
  rep = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
  args = (jax.ShapeDtypeStruct((rows, 1, n, h), jnp.bfloat16, sharding=rep("data", None, "tp")),
          jax.ShapeDtypeStruct((rows, 1, k, h), jnp.bfloat16, sharding=rep("data", None, "tp")),
          jax.ShapeDtypeStruct((rows, 1, k, h), jnp.bfloat16, sharding=rep("data", None, "tp")),
          jax.ShapeDtypeStruct((layers_, 2, pages + 1, page, 2 * k, h), jnp.bfloat16,
                               sharding=rep(None, "data", None, None, "tp")),
          jax.ShapeDtypeStruct((rows, width), jnp.int32, sharding=rep("data")),
          jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=rep("data")),
          jax.ShapeDtypeStruct((rows,), jnp.bool_, sharding=rep("data")))

  def layers_scan(q, k_new, v_new, pool, table, pos, write):
    def body(pool, i):
      out, pool, _ = paged_attention.paged_attention(q, k_new, v_new, pool, i, table, pos, write,
                                            view_pages=width, mesh=mesh)
      return pool, out
    return jax.lax.scan(body, pool, jnp.arange(layers_))

  with jax.set_mesh(mesh):
    compiled = jax.jit(layers_scan, donate_argnums=(3,)).lower(*args).compile()
  calls = [line for line in compiled.as_text().splitlines()
           if "ragged_paged_attention_kernel" in line and "custom-call(" in line]
  assert len(calls) == 1  # one kernel, in the scanned layer body
  # Its pool operand is every layer's pages of this device (2K / tp = 4 heads), not one
  # layer's slice: at the paper's scale a slice cost a layer-sized copy per call.
  assert f"bf16[{layers_ * (pages + 1)},{page},{2 * k // 2},{h}]" in calls[0]
