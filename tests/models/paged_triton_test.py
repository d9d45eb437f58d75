"""The GPU decode attention (JAX's Pallas Triton paged attention kernel over our interleaved
page pool, `models/paged_triton.py`) on CPU in Pallas interpret mode: against a float64
NumPy attention over the same pages, against the gather path it replaces, through a whole
greedy decode of the real Sampler, and lowered for CUDA (no GPU needed to lower)."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import AxisType

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine, records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import paged_attention, paged_triton, transformer
from tests.models import attention_test


def _numpy_attention(q_BNH, kv_QCXH, table_BM, lens_B):
  """Float64: row b's query heads over its first lens_B[b] positions, keys of kv head k at
  pool head 2k and values at 2k + 1, scale head_dim ** -0.5; zeros for length 0."""
  b, n, h = q_BNH.shape
  k = kv_QCXH.shape[2] // 2
  out = np.zeros((b, n, h))
  for r in range(b):
    seq = kv_QCXH[table_BM[r]].reshape(-1, 2 * k, h)[:lens_B[r]].astype(np.float64)
    if not lens_B[r]:
      continue
    for head in range(n):
      kv = head // (n // k)
      s = seq[:, 2 * kv] @ q_BNH[r, head].astype(np.float64) * h ** -0.5
      p = np.exp(s - s.max())
      out[r, head] = (p / p.sum()) @ seq[:, 2 * kv + 1]
  return out


@pytest.mark.parametrize("kv,groups,page,tokens_per_block,splits,target", [
    (2, 2, 4, 8, 2, 1024),    # GQA; 2 pages a block, several blocks per split, 2 splits
    (1, 4, 4, 4, 16, 1024),   # MQA; one page a block, a split per block
    (4, 1, 8, 128, 16, 1024),  # MHA; the module's block size: one block, one split
    (2, 2, 4, 4, 16, 1),  # a grid big enough already: one split runs all 7 blocks in turn
    (2, 12, 4, 12, 2, 1024),  # 24 query heads (> 16, not a multiple); 3-page blocks
    # Qwen3's grouping (16 query heads over 8 kv heads, 2 a group): the queries and outputs
    # addressed in place 16 rows at a time, masked past the group (the last group's rows
    # run past the array); one split (normalised in the kernel) and several.
    (8, 2, 4, 8, 16, 1),
    (8, 2, 4, 8, 4, 1024),
])
def test_kernel_matches_float64_numpy(kv, groups, page, tokens_per_block, splits, target):
  rng = np.random.default_rng(0)
  rows, h, width, pages = 6, 16, 7, 50
  pool = rng.normal(size=(pages, page, 2 * kv, h)).astype(np.float32)
  table = rng.permutation(pages)[:rows * width].reshape(rows, width).astype(np.int32)
  # Empty, one position, a page boundary on either side, mid-page, every position.
  lens = np.array([0, 1, page, page + 1, 3 * page + 2, width * page], np.int32)
  q = rng.normal(size=(rows, kv * groups, h)).astype(np.float32)
  fn = jax.jit(functools.partial(paged_triton.triton_decode_attention, interpret=True,
                                 kv_tokens_per_block=tokens_per_block, max_splits=splits,
                                 target_programs=target))
  got = np.asarray(fn(q, pool, table, lens))
  np.testing.assert_allclose(got, _numpy_attention(q, pool, table, lens), atol=1e-5, rtol=0)
  assert not got[0].any()  # length 0: nothing read, zeros out


def test_splits_only_as_far_as_the_grid_needs():
  """Qwen3-0.6B (16 heads over 8 kv heads), 128 + 512 tokens in 128-position blocks (5):
  at batch 256 the grid has 2048 programs without splitting, so one split; at batch 64,
  two; a small batch splits every block."""
  assert paged_triton.num_splits(256, 16, 8, 5) == 1
  assert paged_triton.num_splits(64, 16, 8, 5) == 2
  assert paged_triton.num_splits(4, 16, 8, 5) == 5
  assert paged_triton.num_splits(1, 64, 8, 40) == 16  # capped at MAX_SPLITS
  assert paged_triton.num_splits(1, 16, 8, 5, target_programs=1) == 1


def _paged_case(shards, rows=8):
  """attention_test's case (a random pool [L, D, P, C, 2K, H], shuffled tables of distinct
  local pages per shard, positions on and off page boundaries, one inactive row) at head
  dim 16."""
  return attention_test._paged_case(shards, rows=rows, h=16, seed=1)


@pytest.mark.parametrize("data,tp", [(0, 0), (-2, 0), (2, 2)])
def test_paged_attention_triton_matches_gather_and_numpy(data, tp):
  """impl="triton" (the write, then the kernel over the whole pool with each row's layer and
  shard offset into its page ids) against impl="gather" and NumPy, layer 1 of 2. Meshes:
  (0, 0) and (-2, 0) no mesh with one or two pool shards; (2, 2) rows over 'data' and kv
  heads over 'tp' under shard_map."""
  shards = max(1, abs(data))
  pool, table, pos, q, k_new, v_new, write = _paged_case(shards)
  mesh = None
  if data > 0:
    mesh = jax.make_mesh((data, tp), ("data", "tp"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:data * tp])
  layer, width = 1, table.shape[1]
  outs = {}
  for impl in ("gather", "triton"):
    fn = jax.jit(functools.partial(paged_attention.paged_attention, view_pages=width,
                                   impl=impl, mesh=mesh))
    out, new_pool, _ = fn(q, k_new, v_new, pool, jnp.int32(layer), table, pos, write)
    outs[impl] = (np.asarray(out), np.asarray(new_pool))
  np.testing.assert_array_equal(outs["triton"][1], outs["gather"][1])  # the same write
  live = write
  np.testing.assert_allclose(outs["triton"][0][live], outs["gather"][0][live], atol=1e-5,
                             rtol=0)
  assert not outs["triton"][0][~live].any()  # an inactive row reads nothing
  per_shard = q.shape[0] // shards
  new_pool = outs["gather"][1]
  for s in range(shards):
    sl = slice(s * per_shard, (s + 1) * per_shard)
    ref = _numpy_attention(q[sl, 0], new_pool[layer, s], table[sl], pos[sl] + 1)
    np.testing.assert_allclose(outs["triton"][0][sl, 0][live[sl]], ref[live[sl]], atol=1e-5,
                               rtol=0)


def test_greedy_decode_through_the_sampler_matches_the_gather(monkeypatch):
  """A whole greedy generation of the real Sampler (float32 tiny Qwen3: GQA 4 over 2,
  qk-norm, tied head) with "auto" sent to the Triton kernel equals the default CPU path
  (per-chunk views of the gathered pages): same tokens, log-probs within 1e-5. Prompts of
  different lengths cross page boundaries and finish at different steps."""
  cfg = model_config.preset("tiny_qwen3")
  model = transformer.create_model(cfg, seed=0)
  sampler_cfg = SamplerConfig(num_slots=4, max_new_tokens=12, temperature=0.0, decode_chunk=4,
                              prompt_buckets=(16,), page_size=4)
  rng = np.random.default_rng(0)
  reqs = [records.Request(rng.integers(3, cfg.vocab_size, n).tolist(), prompt_id=i,
                          max_new_tokens=m)
          for i, (n, m) in enumerate([(3, 12), (9, 5), (6, 12), (1, 8), (14, 12)])]
  traced = []
  real = paged_triton.triton_decode_attention
  monkeypatch.setattr(paged_triton, "triton_decode_attention",
                      lambda *a, **k: traced.append(k["interpret"]) or real(*a, **k))

  def run():
    return engine.Sampler(model, sampler_cfg, eos_ids=()).generate(reqs)

  want = run()
  assert not traced  # the default CPU path does not touch the kernel
  monkeypatch.setattr(paged_attention, "AUTO_IMPL", "triton")
  got = run()
  assert traced and all(traced)  # the kernel, in interpret mode, in every layer traced
  assert [len(w.tokens) for w in want] == [12, 5, 12, 8, 12]
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g.tokens, w.tokens)
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)


def _lowered_for_cuda(rows: int, pages: int, **kw) -> str:
  """StableHLO text of the kernel lowered for CUDA at Qwen3-0.6B's decode attention shapes
  (16 query heads of 128 over 8 kv heads, pages of 16, bfloat16; 40 pages a row)."""
  args = (jax.ShapeDtypeStruct((rows, 16, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((pages, 16, 16, 128), jnp.bfloat16),
          jax.ShapeDtypeStruct((rows, 40), jnp.int32),
          jax.ShapeDtypeStruct((rows,), jnp.int32))
  fn = jax.jit(functools.partial(paged_triton.triton_decode_attention, interpret=False, **kw))
  # The target GPU named, as `plan` does with its deviceless topology: from jax 0.11 Pallas'
  # Triton lowering asks the abstract mesh for it when no GPU is attached (0.10 assumed sm90).
  h100 = jax.sharding.AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132,
                                     platform="gpu")
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",),
                                                                abstract_device=h100)):
    return fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_lowers_for_cuda_to_one_triton_call_on_the_pool_itself():
  """Qwen3-0.6B's decode attention shapes (16 query heads of 128 over 8 kv heads, pages of
  16, bfloat16) lower for CUDA without a GPU: Triton accepts the block specs, and the one
  kernel call takes the whole pool itself as both its key and its value operand (no copy,
  transpose or gather before it)."""
  rows, pages = 4, 200
  text = _lowered_for_cuda(rows, pages)
  calls = [x for x in text.splitlines() if "custom_call @__gpu$xla.gpu.triton" in x]
  assert len(calls) == 1
  operands = calls[0].split("triton(")[1].split(")")[0].split(", ")
  assert operands[1] == operands[2]
  assert operands[1].startswith("%arg1")
  assert calls[0].count(f"tensor<{pages}x16x16x128xbf16>") == 2
  assert "stablehlo.transpose" not in text and "stablehlo.gather" not in text


@pytest.mark.parametrize("splits", [1, 3])
def test_a_program_writes_only_its_own_query_rows(splits):
  """"head"'s programs share a row's output block, 16 rows each from their group's first
  (past the group: the next group's rows, or past the array). On a GPU they run at once, so
  a store past the group would race with the next group's program; interpret mode runs
  them in turn and the later program overwrites the garbage, so the numeric tests cannot
  see it. Here one program writes rows 2..17 of 20 with 3 of them live into outputs filled
  with a sentinel: only those 3 rows change."""
  h, n = 8, 20
  o = np.arange(16 * h, dtype=np.float32).reshape(16, h) + 1
  l = np.arange(16, dtype=np.float32) + 2
  m = np.arange(16, dtype=np.float32) - 3

  def kernel(*refs):
    row = jax.lax.broadcasted_iota(jnp.float32, (16,), 0)
    o_ = jax.lax.broadcasted_iota(jnp.float32, (16, h), 0) * h + jax.lax.broadcasted_iota(
        jnp.float32, (16, h), 1) + 1
    paged_triton._finish(o_, row + 2, row - 3, refs[len(refs) // 2:], pl.ds(2, 16), row < 3)

  shapes = [(n, h)] if splits == 1 else [(n, h), (n,), (n,)]
  sentinels = [np.full(s, -7.0, np.float32) for s in shapes]
  out = pl.pallas_call(kernel, out_shape=[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes],
                       input_output_aliases={i: i for i in range(len(shapes))},
                       interpret=True)(*sentinels)
  want = [x.copy() for x in sentinels]
  want[0][2:5] = o[:3] / l[:3, None] if splits == 1 else o[:3]
  if splits > 1:
    want[1][2:5], want[2][2:5] = l[:3], m[:3]
  for got, w in zip(out, want):
    np.testing.assert_allclose(np.asarray(got), w, rtol=1e-6)


def test_one_split_writes_the_output_in_the_pool_dtype_from_the_kernel():
  """Qwen3-0.6B's shapes at batch 256: the grid is big enough without splitting, so the
  kernel normalises and writes [rows, 16, 128] bf16 itself. Nothing pads the queries to 16
  a GQA group or writes float32 partial results for a combine: the lowered program has no
  pad and no reduction, and nothing in float32 after the kernel."""
  rows = 256  # 2048 programs without splitting: past the default grid target
  text = _lowered_for_cuda(rows, 2000)
  calls = [x for x in text.splitlines() if "custom_call @__gpu$xla.gpu.triton" in x]
  assert len(calls) == 1
  assert calls[0].rstrip().endswith(f"-> tensor<{rows}x16x128xbf16>"), calls[0][-200:]
  assert "stablehlo.pad" not in text and "stablehlo.reduce" not in text
  main = text.split("func.func public @main")[1].split("func.func")[0]
  after = main.split("custom_call @__gpu$xla.gpu.triton")[1].split("\n", 1)[1]
  assert "xf32>" not in after, after  # the queries are scaled in float32 before; no more


def test_auto_picks_the_kernel_on_gpu_only_where_triton_fits():
  assert paged_attention.paged_impl(None, 128, 16) == "gather"
  assert paged_attention.triton_unsupported(128, 16) == ""
  assert "power of two" in paged_attention.triton_unsupported(96, 16)
  assert "sampler.page_size 12" in paged_attention.triton_unsupported(128, 12)


_WITHOUT_TRITON = """
import sys
sys.modules["jax.experimental.pallas.triton"] = None  # a jax without the backend
import jax.numpy as jnp
from jaxrl_scale.models import paged_attention as p
from tests.models import attention_test
print(p.paged_triton.UNAVAILABLE)
print(p.triton_unsupported(128, 16))
p.mesh_platform = lambda mesh: "gpu"  # what auto picks on a GPU
print(p.paged_impl(None, 128, 16))
case = attention_test._paged_case(1, rows=4, h=16, seed=1)
pool, table, pos, q, k_new, v_new, write = (jnp.asarray(x) for x in case)
out, _, _ = p.paged_attention(q, k_new, v_new, pool, jnp.int32(0), table, pos, write,
                              view_pages=table.shape[1], impl="auto")
print(out.shape)
try:
  p.paged_attention(q, k_new, v_new, pool, jnp.int32(0), table, pos, write,
                    view_pages=table.shape[1], impl="triton")
except ValueError as e:
  print(e)
"""


def test_a_jax_without_the_triton_backend_gathers_on_gpu_and_names_why():
  """JAX deprecated its Pallas Triton backend in 0.11 (still in 0.12.0.1): where a jax lacks
  it, the package still imports, "auto" on a GPU gathers, and asking for "triton" stops
  with one line that says why (a fresh interpreter whose import of the backend fails)."""
  out = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON], capture_output=True,
                       text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  why = f"jax {jax.__version__} has no Pallas Triton backend"
  assert lines[0].startswith(why) and lines[1] == lines[0]
  assert lines[2] == "gather"
  assert lines[3] == "(4, 1, 4, 16)"
  assert lines[4] == f"paged attention impl 'triton': {lines[0]}"
  # With the backend (this interpreter), the same GPU picks the kernel.
  assert paged_triton.UNAVAILABLE == ""
  assert paged_attention.triton_unsupported(128, 16) == ""


def test_a_bad_override_is_named(monkeypatch):
  monkeypatch.setattr(paged_attention, "AUTO_IMPL", "flash")
  pool, table, pos, q, k_new, v_new, write = _paged_case(1)
  with pytest.raises(UserError, match="JAXRL_SCALE_DECODE_ATTENTION=flash: decode attention"):
    paged_attention.paged_attention(q, k_new, v_new, pool, jnp.int32(0), table, pos, write,
                                    view_pages=table.shape[1])


def test_the_environment_variable_sets_the_override():
  """A fresh interpreter with $JAXRL_SCALE_DECODE_ATTENTION=triton on a CPU (whose own choice
  is the gather) reads it at import."""
  code = "from jaxrl_scale.models import paged_attention as p; print(p.paged_impl(None, 128))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, env={**os.environ, paged_attention.ENV_VAR: "triton"})
  assert out.stdout.strip() == "triton"


def test_unset_arguments_are_the_module_constants_when_traced(monkeypatch):
  """Left None, the kernel's block, warps, stages and grid target are read from the module
  when traced (the benchmarks set them before they compile)."""
  seen = {}

  def spy(*args, **kw):
    seen.update(kw)
    return real(*args, **kw)

  real = paged_triton._row
  monkeypatch.setattr(paged_triton, "_row", spy)
  for name, value in (("KV_TOKENS_PER_BLOCK", 8), ("NUM_WARPS", 8), ("NUM_STAGES", 2),
                      ("TARGET_PROGRAMS", 1)):
    monkeypatch.setattr(paged_triton, name, value)
  rng = np.random.default_rng(0)
  pool = rng.normal(size=(20, 4, 4, 16)).astype(np.float32)
  table = rng.permutation(20)[:12].reshape(2, 6).astype(np.int32)
  q = rng.normal(size=(2, 4, 16)).astype(np.float32)
  lens = np.array([5, 24], np.int32)
  got = paged_triton.triton_decode_attention(q, pool, table, lens, interpret=True)
  assert seen == dict(pages_per_block=2, splits=1, interpret=True, num_warps=8, num_stages=2)
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(q, pool, table, lens),
                             atol=1e-5, rtol=0)
