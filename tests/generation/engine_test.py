"""Sampler tests: parity with transformers, continuous batching, in-flight weight swaps,
reproducibility, truncated-distribution logprobs, forced interruption and stop strings."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import decode, engine, records
from jaxrl_scale.models import kv_cache, sharding
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.parallel import transfer

# One shape for every test, so compiled prefill/decode programs are shared.
SAMPLER = SamplerConfig(num_slots=4, max_new_tokens=16, temperature=0.0, decode_chunk=4,
                        prompt_buckets=(16,))


def _sampler(model, tokenizer=None, eos_ids=(), think_end_id=None, **overrides):
  cfg = SamplerConfig(**{**SAMPLER.__dict__, **overrides})
  return engine.Sampler(model, cfg, tokenizer=tokenizer, eos_ids=eos_ids,
                        think_end_id=think_end_id)


def _samples(prompts, g):
  """g requests (sample_index 0..g-1) per prompt, prompt_id = its index."""
  return [records.Request(p, prompt_id=i, sample_index=j) for i, p in enumerate(prompts)
          for j in range(g)]


def _hf_greedy(hf_model, prompt, max_new, eos):
  """transformers greedy generate: (tokens, log-softmax of each chosen token)."""
  import torch

  with torch.no_grad():
    out = hf_model.generate(
        input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=int),
        max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=258,
        output_logits=True, return_dict_in_generate=True)
  tokens = out.sequences[0, len(prompt):].tolist()
  logprobs = [torch.log_softmax(step[0].float(), -1)[t].item()
              for step, t in zip(out.logits, tokens)]
  return tokens, np.asarray(logprobs)


def _pick_eos(outputs):
  """A token that first appears mid-sequence in as many of `outputs` as possible."""
  counts = {}
  for toks in outputs:
    seen = set()
    for j, t in enumerate(toks):
      if t not in seen and 1 <= j <= len(toks) - 3:
        counts[t] = counts.get(t, 0) + 1
      seen.add(t)
  return max(counts, key=lambda t: (counts[t], -t))


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_greedy_matches_transformers_static_and_continuous(family, hf_checkpoints, loaded,
                                                           prompts):
  model, _ = loaded[family]
  free = _sampler(model).generate(prompts)
  eos = _pick_eos([c.tokens.tolist() for c in free])
  refs = [_hf_greedy(hf_checkpoints[family].hf_model, p, SAMPLER.max_new_tokens, eos)
          for p in prompts]
  assert sum(len(t) < SAMPLER.max_new_tokens for t, _ in refs) >= 2  # EOS really exercised

  sampler = _sampler(model, eos_ids=[eos])
  static = sampler.generate(prompts[:4])  # all prompts fit in the 4 slots at once
  sampler.reset_stats()
  continuous = sampler.generate(prompts)  # 8 prompts through 4 slots
  assert sampler.stats.admissions > 2  # freed slots were refilled mid-run
  # CPU's default reads each chunk back before dispatching the next, so a freed slot is
  # refilled a chunk sooner than with one chunk in flight; the tokens are the same.
  assert sampler.pipeline_depth == 0
  deep = engine.Sampler(model, SAMPLER, eos_ids=[eos], pipeline_depth=1)
  assert ([o.tokens.tolist() for o in deep.generate(prompts)]
          == [o.tokens.tolist() for o in continuous])
  assert sampler.stats.chunks <= deep.stats.chunks
  for outs in (static, continuous):
    for out, (ref_tokens, ref_logprobs) in zip(outs, refs):
      assert out.tokens.tolist() == ref_tokens
      np.testing.assert_allclose(out.logprobs, ref_logprobs, atol=1e-4, rtol=0)
      ended_on_eos = ref_tokens[-1] == eos
      assert out.finish_reason == (records.EOS if ended_on_eos else records.LENGTH)
      assert out.truncated == (not ended_on_eos)
      assert not out.forced.any() and (out.versions == 0).all()


def test_a_batch_tail_decodes_on_fewer_rows_and_still_matches_transformers(hf_checkpoints,
                                                                          loaded, prompts):
  # 16 requests through 8 slots, EOS on: once 4 or fewer are live, a chunk runs on a bucket
  # of 4 rows (gathered out of the slots, scattered back). Tokens and logprobs must match
  # transformers' greedy decode, and sampled ones the all-slots run's.
  model, _ = loaded["qwen3"]
  eos = _pick_eos([c.tokens.tolist() for c in _sampler(model).generate(prompts)])
  refs = [_hf_greedy(hf_checkpoints["qwen3"].hf_model, p, SAMPLER.max_new_tokens, eos)
          for p in prompts]
  sampler = _sampler(model, eos_ids=[eos], num_slots=8, decode_row_buckets=2)
  assert sampler._row_buckets == (8, 4)
  outs = sampler.generate(_samples(prompts, 2))
  assert sampler.stats.row_chunks > 0 and sampler.stats.row_chunks < sampler.stats.chunks
  for i, out in enumerate(outs):
    ref_tokens, ref_logprobs = refs[i // 2]
    assert out.tokens.tolist() == ref_tokens
    np.testing.assert_allclose(out.logprobs, ref_logprobs, atol=1e-4, rtol=0)

  def sampled(buckets):  # a sixth of the ids end a sequence, so lengths are ragged
    s = _sampler(model, eos_ids=list(range(0, 256, 6)), num_slots=8, temperature=1.0,
                 decode_row_buckets=buckets)
    return s, s.generate(_samples(prompts, 2))

  (rows, hot), (_, full) = sampled(2), sampled(1)
  assert rows.stats.row_chunks > 0
  for a, b in zip(hot, full):
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_row_buckets_halve_down_to_four_rows_and_never_split_sharded_slots():
  cpu = mesh_lib.single_device_mesh(axes=mesh_lib.GENERATOR_AXES)
  assert decode.row_buckets(None, 64, cpu, sharded_slots=False) == (64, 32, 16, 8)
  assert decode.row_buckets(None, 16, cpu, sharded_slots=False) == (16, 8, 4)
  assert decode.row_buckets(2, 64, cpu, sharded_slots=False) == (64, 32)
  assert decode.row_buckets(None, 6, cpu, sharded_slots=False) == (6,)
  assert decode.row_buckets(4, 64, cpu, sharded_slots=True) == (64,)
  buckets = (16, 8, 4)
  assert decode.row_index(buckets, list(range(9))) is None  # 9 live: all 16 slots
  got = decode.row_index(buckets, [13, 2, 7])
  assert got.tolist() == [2, 7, 13, 0]  # the live slots, then a free one to fill 4 rows
  assert len(set(decode.row_index(buckets, [1, 3, 5, 15, 0]).tolist())) == 8
  with pytest.raises(UserError, match="decode_row_buckets"):
    SamplerConfig(decode_row_buckets=0)


def test_long_generation_through_cache_views_matches_transformers(hf_checkpoints, loaded,
                                                                 prompts):
  # Cache length 16 + 80 = 96: early chunks read the first 4 pages of 16 positions, later
  # ones all 6; tokens and logprobs must not notice.
  model, _ = loaded["llama"]
  sampler = _sampler(model, max_new_tokens=80)
  outs = sampler.generate(prompts[:2])
  assert set(k[2] for k in sampler._decode_fns) == {4, 6}
  for prompt, out in zip(prompts, outs):
    tokens, logprobs = _hf_greedy(hf_checkpoints["llama"].hf_model, prompt, 80, None)
    assert out.tokens.tolist() == tokens
    np.testing.assert_allclose(out.logprobs, logprobs, atol=1e-4, rtol=0)


def test_sharded_on_generator_mesh_matches_single_device(loaded, prompts):
  model, _ = loaded["qwen2"]
  single = _sampler(model).generate(prompts[:4])
  devices = jax.devices()[:4]
  mesh = jax.make_mesh((2, 2), mesh_lib.GENERATOR_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)
  sharded = engine.Sampler(model, SAMPLER, mesh=mesh, eos_ids=())
  # The page pool [L, D, P, C, 2K, H]: its D shards over 'data', kv heads over 'tp'.
  assert sharded._state.cache.kv.sharding.spec[:5] == (None, "data", None, None, "tp")
  q_kernel = sharded.params["layers"]["self_attn"]["q_proj"]["kernel"][...]
  assert q_kernel.sharding.spec == jax.sharding.PartitionSpec(None, None, "tp", None)
  outs = sharded.generate(prompts[:4])
  for a, b in zip(single, outs):
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  with pytest.raises(UserError, match="sampler.num_slots"):
    engine.Sampler(model, SamplerConfig(**{**SAMPLER.__dict__, "num_slots": 3}), mesh=mesh)

  # Params posted from a trainer-style slice on other devices land on the generator mesh.
  trainer = jax.make_mesh((2, 2), mesh_lib.TRAINER_AXES,
                          axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[4:])
  params = nnx.split(model)[1]
  on_trainer = jax.device_put(params, sharding.state_shardings(params, trainer))
  sharded.update_params(nnx.to_pure_dict(on_trainer), version=3)
  again = sharded.generate(prompts[:4])
  assert transfer.same_placement(sharded.params, sharding.state_shardings(params, mesh))
  for a, b in zip(outs, again):
    assert a.tokens.tolist() == b.tokens.tolist() and (b.versions == 3).all()


def _perturbed(model, seed):
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(seed)  # NumPy: jax.random would compile once per shape
  noisy = jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype), params)
  return nnx.merge(graphdef, noisy)


_PAGE = 8


@jax.jit
def _prefill_pages(model, tokens_1T, t, cache):
  """Keys/values of model's full pass over tokens_1T[:, :t] into pages 0.. of shard 0."""
  width = tokens_1T.shape[1]
  pos_1T = jnp.arange(width)[None]
  _, k_L1TKH, v_L1TKH = model.prefill(tokens_1T, pos_1T, pos_1T < t)

  l, _, _, kv, h = k_L1TKH.shape
  # Keys at even heads, values at odd: [L, T, K, 2, H] -> pages [L, M, C, 2K, H].
  kv_LTK2H = jnp.stack([k_L1TKH[:, 0], v_L1TKH[:, 0]], axis=3)
  pages_LMCXH = kv_LTK2H.reshape(l, width // _PAGE, _PAGE, 2 * kv, h)
  return kv_cache.PagedKVCache(kv=cache.kv.at[:, 0, :width // _PAGE].set(pages_LMCXH))


@jax.jit
def _decode_one(model, token, pos, cache, table):
  return model.decode(jnp.asarray([[token]]), jnp.asarray([pos]), jnp.ones((1,), bool), cache,
                      table, view_pages=table.shape[1])


def _continue_greedy(model_a, model_b, prompt, tokens, k, n, width=32):
  """Cache filled by model_a with prompt + tokens[:k-1]; model_b then decodes n - k tokens."""
  inputs = list(prompt) + list(tokens[:k - 1])
  t = len(inputs)
  padded = jnp.asarray([inputs + [0] * (width - t)])  # one compiled shape for every prompt
  pages = (width + n) // _PAGE
  cache = kv_cache.init_pages(model_a.cfg, shards=1, pages=pages, page_size=_PAGE)
  table = jnp.arange(pages, dtype=jnp.int32)[None]
  cache = _prefill_pages(model_a, padded, t, cache)
  out, last = [], tokens[k - 1]
  for pos in range(t, t + n - k):
    logits, cache = _decode_one(model_b, last, pos, cache, table)
    last = int(jnp.argmax(logits[0, -1]))
    out.append(last)
  return out


def test_in_flight_update_continues_from_kept_cache(loaded, prompts):
  model_a, _ = loaded["qwen2"]
  model_b = _perturbed(model_a, seed=1)
  sampler = _sampler(model_a)

  def swap(s, chunk_index):
    if chunk_index == 0:
      s.update_params(nnx.split(model_b)[1], version=7)
      # The swap waits for the posted copy to be computed; on a loaded machine it could
      # otherwise land after the last token (CI saw every token at version 0).
      jax.block_until_ready(s.params)

  outs = sampler.generate(prompts[:4], on_chunk=swap)
  fresh_b = _sampler(model_b).generate(prompts[:4])
  n = SAMPLER.max_new_tokens
  differs_from_b = 0
  for prompt, out, b in zip(prompts, outs, fresh_b):
    k = int(np.argmax(out.versions == 7))
    assert 0 < k < n  # swapped mid-sequence
    np.testing.assert_array_equal(out.versions, [0] * k + [7] * (n - k))
    expected = _continue_greedy(model_a, model_b, prompt, out.tokens.tolist(), k, n)
    assert out.tokens[k:].tolist() == expected
    differs_from_b += out.tokens.tolist() != b.tokens.tolist()
  assert differs_from_b > 0  # the kept cache (built by the old weights) mattered
  # Later runs keep the new version.
  assert (sampler.generate(prompts[:1])[0].versions == 7).all()


def _forget_programs():
  for program in (decode.admit_program, decode.decode_program, decode.layers_program):
    program.cache_clear()


def test_gpu_path_decodes_from_the_per_swap_layer_weights(loaded, prompts, monkeypatch):
  """The GPU path (decode sees no CPU): the steps run the layers over the sampler's own
  per-layer weight copies and gather the rows' pages every step, with no per-chunk views."""
  model, _ = loaded["qwen3"]
  want = _sampler(model).generate(prompts[:4])  # the CPU path
  _forget_programs()  # compiled programs are memoised without the platform in their key
  monkeypatch.setattr(decode, "on_cpu", lambda mesh: False)
  try:
    sampler = _sampler(model)
    assert sampler._layer_leaves is not None
    got = sampler.generate(prompts[:4])
    for w, g in zip(want, got):
      assert g.tokens.tolist() == w.tokens.tolist()
      np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    # The steps read those copies, not the stacked weights: zeroed, they change the tokens.
    sampler._layer_leaves = tuple(jnp.zeros_like(x) for x in sampler._layer_leaves)
    zeroed = sampler.generate(prompts[:4])
    assert any(z.tokens.tolist() != w.tokens.tolist() for z, w in zip(zeroed, want))
    # Without the copies (to save memory) the steps read the stacked weights.
    one_copy = _sampler(model, layer_weight_copies=False)
    assert one_copy._layer_leaves is None
    for w, g in zip(want, one_copy.generate(prompts[:4])):
      assert g.tokens.tolist() == w.tokens.tolist()
  finally:
    _forget_programs()


def test_update_params_from_another_thread(loaded, prompts):
  model_a, _ = loaded["qwen2"]
  params_b = nnx.split(_perturbed(model_a, seed=2))[1]
  sampler = _sampler(model_a)
  started = threading.Event()
  thread = threading.Thread(target=lambda: (started.wait(), sampler.update_params(params_b, 1)))
  thread.start()

  def on_chunk(s, i):
    started.set()
    if i == 0:
      thread.join()  # make sure the update is posted while later chunks remain

  outs = sampler.generate(prompts, on_chunk=on_chunk)
  versions = np.concatenate([o.versions for o in outs])
  assert set(versions.tolist()) == {0, 1}
  for o in outs:
    assert (np.diff(o.versions) >= 0).all()
  with pytest.raises(ValueError, match="structure"):
    sampler.update_params({"w": jnp.zeros(3)}, 2)


def _truncated_logprobs(logits, temperature, top_k, top_p):
  """Reference (NumPy, float64): log-probs of the top-k/top-p renormalised distribution."""
  z = logits.astype(np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(z.shape, bool)
  keep[order[:top_k]] = True
  p = np.exp(z - z[keep].max()) * keep
  p /= p.sum()
  mass = 0.0
  for i in order[:top_k]:
    if mass >= top_p:
      keep[i] = False
    mass += p[i]
  z = np.where(keep, z, -np.inf)
  return z - np.log(np.exp(z - z.max()).sum()) - z.max()


def test_sampling_reproducible_and_logprobs_under_truncation(loaded, prompts):
  model, _ = loaded["qwen2"]
  kw = dict(temperature=0.8, top_k=20, top_p=0.7)
  reqs = _samples(prompts[:3], 2)
  first = _sampler(model, **kw).generate(reqs)
  again = _sampler(model, **kw).generate(reqs[::-1])[::-1]  # other slots, other order
  other_seed = engine.Sampler(model, SamplerConfig(**{**SAMPLER.__dict__, **kw}), eos_ids=(),
                              seed=5).generate(reqs)
  rerun = _sampler(model, **kw).generate(reqs)
  for a, b, c in zip(first, again, rerun):
    assert a.tokens.tolist() == b.tokens.tolist() == c.tokens.tolist()
    np.testing.assert_array_equal(a.logprobs, c.logprobs)  # bitwise on an identical run
    # Another slot may round the last bit differently (CPU vector remainder loops).
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  assert first[0].tokens.tolist() != first[1].tokens.tolist()  # samples of a prompt differ
  assert any(a.tokens.tolist() != c.tokens.tolist() for a, c in zip(first, other_seed))

  full_logits = jax.jit(lambda m, x: m(x, jnp.arange(32)[None], jnp.ones((1, 32), bool)))
  for out in first:
    seq = list(out.prompt_tokens) + out.tokens.tolist()
    # Right padding to one shape; causal attention keeps the real positions exact.
    logits = np.asarray(full_logits(model, jnp.asarray([seq + [0] * (32 - len(seq))])))[0]
    p = len(out.prompt_tokens)
    for j, tok in enumerate(out.tokens):
      ref = _truncated_logprobs(logits[p - 1 + j], 0.8, 20, 0.7)
      assert np.isfinite(ref[tok])  # the token was inside the top-k/top-p set
      np.testing.assert_allclose(out.logprobs[j], ref[tok], atol=1e-4)


def test_completions_of_one_prompt_share_one_prefill(loaded, prompts):
  model, _ = loaded["qwen3"]
  kw = dict(temperature=1.0, max_new_tokens=8)
  # Two prompts x 2 samples in one admission: 2 distinct prompts are prefilled, not 4.
  reqs = _samples(prompts[1:3], 2)
  sampler = _sampler(model, **kw)
  shared = sampler.generate(reqs)
  assert sampler.stats.admissions == 1
  assert sampler.stats.prefill_tokens == 2 * 16
  assert sampler.stats.unshared_prefill_tokens == 4 * 16
  # Each request admitted alone (its own prefill) gives the same tokens and logprobs.
  alone = [_sampler(model, **kw).generate([r])[0] for r in reqs]
  for a, b in zip(shared, alone):
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  assert shared[0].tokens.tolist() != shared[1].tokens.tolist()  # samples still differ


def test_generate_reports_each_completion_as_it_finishes(loaded, prompts):
  model, _ = loaded["qwen3"]
  sampler = _sampler(model, max_new_tokens=8)
  calls = []
  out = sampler.generate(_samples(prompts[:3], 2), on_progress=lambda d, t: calls.append(
      (d, t, sampler.stats.chunks)))
  assert [c for c in out if c is not None] == out
  assert {t for _, t, _ in calls} == {6}
  done = [d for d, _, _ in calls]
  assert done == sorted(done) and set(done) == set(range(7))  # each chunk, each completion
  # 6 requests on 4 slots: the first four are reported before the last two have decoded.
  first = next(chunks for d, _, chunks in calls if d == 1)
  assert calls[-1][0] == 6 and first < calls[-1][2]


def test_a_small_page_pool_waits_preempts_and_restarts_to_the_same_tokens(loaded, prompts):
  model, _ = loaded["llama"]
  free = _sampler(model, page_size=4).generate(prompts)
  # 12 pages of 4 positions for 4 slots that each reach 8 pages (16 + 16 positions): new
  # sequences wait for pages, and growing ones preempt the newest, which restart later.
  sampler = _sampler(model, page_size=4, kv_cache_tokens=48)
  small = sampler.generate(prompts)
  assert sampler.stats.preemptions > 0
  for a, b in zip(free, small):
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  assert sampler.stats.tokens == sum(c.num_tokens for c in small)  # restarts not counted twice
  pool = sampler._pool
  pool.check()
  assert pool.used_pages == 0 and pool.peak_pages == 12  # every page back; the pool was full
  with pytest.raises(UserError, match="sampler.kv_cache_tokens"):
    _sampler(model, page_size=4, kv_cache_tokens=16)  # less than one full sequence


# qwen2 and llama are slow-only (15 s together): every family's greedy parity through the
# whole-prompt path stays in the default run, and qwen3 covers the chunked path there.
@pytest.mark.parametrize("family", [pytest.param("qwen2", marks=pytest.mark.slow),
                                    pytest.param("llama", marks=pytest.mark.slow), "qwen3"])
def test_chunked_prefill_matches_transformers_and_decodes_between_pieces(family, hf_checkpoints,
                                                                         loaded, prompts):
  # Pieces of 4 positions over pages of 4: a piece reads 1-3 earlier pages (the pages of
  # the prompt's earlier pieces) and attends to them as well as causally to itself.
  model, _ = loaded[family]
  kw = dict(page_size=4, max_new_tokens=12)
  whole = _sampler(model, **kw).generate(prompts)
  sampler = _sampler(model, prefill_chunk=4, **kw)
  chunked = sampler.generate(prompts)  # 8 prompts (1-14 tokens) through 4 slots
  stats = sampler.stats
  assert stats.prefill_pieces > stats.admissions  # prompts really went in pieces
  assert set(sampler._admit_fns) == {0, 4, 8, 12}  # pieces after 0, 4, 8 and 12 positions
  # Decode chunks ran while a later piece of some prompt was still to come.
  assert stats.mixed_chunks > 0
  for prompt, a, b in zip(prompts, whole, chunked):
    ref_tokens, ref_logprobs = _hf_greedy(hf_checkpoints[family].hf_model, prompt, 12, None)
    assert b.tokens.tolist() == ref_tokens == a.tokens.tolist()
    np.testing.assert_allclose(b.logprobs, ref_logprobs, atol=1e-4, rtol=0)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)
  sampler._pool.check()
  assert sampler._pool.used_pages == 0


def test_chunked_prefill_shared_sharded_and_preempted(loaded, prompts):
  model, _ = loaded["qwen3"]
  kw = dict(page_size=4, temperature=1.0, max_new_tokens=16)
  # The G completions of a prompt share the pieces' prefill; sampled tokens and logprobs
  # are those of whole-prompt prefill.
  reqs = _samples(prompts[:4], 2)
  whole = _sampler(model, **kw).generate(reqs)
  sampler = _sampler(model, prefill_chunk=8, **kw)
  chunked = sampler.generate(reqs)
  assert sampler.stats.prefill_tokens < sampler.stats.unshared_prefill_tokens
  # A pool too small for every slot: growing sequences preempt the newest, which restart.
  small = _sampler(model, prefill_chunk=8, kv_cache_tokens=48, **kw)
  preempted = small.generate(reqs)
  assert small.stats.preemptions > 0
  small._pool.check()
  # On a 2 x 2 generator mesh (slots and pool shards over 'data', kv heads over 'tp').
  mesh = jax.make_mesh((2, 2), mesh_lib.GENERATOR_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:4])
  cfg = SamplerConfig(**{**SAMPLER.__dict__, **kw, "prefill_chunk": 8})
  sharded = engine.Sampler(model, cfg, mesh=mesh, eos_ids=()).generate(reqs)
  for outs in (chunked, preempted, sharded):
    for a, b in zip(whole, outs):
      assert a.tokens.tolist() == b.tokens.tolist()
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  with pytest.raises(UserError, match="sampler.prefill_chunk"):
    _sampler(model, prefill_chunk=-1)


def test_forced_interruption(loaded, prompts):
  model, tok = loaded["qwen2"]
  phrase = tok.encode("Stop</think>")
  kw = dict(interrupt=True, interrupt_min=2, interrupt_max=5, answer_budget=3,
            interrupt_phrase="Stop</think>")
  plain = _sampler(model).generate(prompts)
  outs = _sampler(model, tokenizer=tok, think_end_id=-1, **kw).generate(prompts)
  starts = set()
  for out, ref in zip(outs, plain):
    f = int(np.argmax(out.forced))
    starts.add(f)
    assert 2 <= f <= 5
    assert out.forced.tolist() == [False] * f + [True] * len(phrase) + [False] * 3
    assert out.tokens[f:f + len(phrase)].tolist() == phrase
    assert out.tokens[:f].tolist() == ref.tokens[:f].tolist()  # thinking untouched
    assert out.finish_reason == records.INTERRUPTED and out.truncated
  assert len(starts) > 1  # budgets are drawn per sequence

  # Thinking that ends on its own (here: the think-end id is the model's own first token)
  # before the budget cancels the interruption.
  first_tok = int(plain[0].tokens[0])
  natural = engine.Sampler(model, SamplerConfig(**{**SAMPLER.__dict__, **kw}), tokenizer=tok,
                           eos_ids=(), think_end_id=first_tok).generate(prompts[:1])[0]
  assert not natural.forced.any() and natural.finish_reason == records.LENGTH
  assert natural.tokens.tolist() == plain[0].tokens.tolist()


def test_stop_strings(loaded, prompts):
  model, tok = loaded["qwen2"]
  plain = _sampler(model, tokenizer=tok).generate(prompts)
  # A two-character ASCII stop string made by tokens 3 and 4, across the chunk boundary.
  for i, out in enumerate(plain):
    stop = tok.decode(out.tokens[3:5].tolist())
    if len(stop) == 2 and stop.isascii() and stop not in tok.decode(out.tokens[:4].tolist()):
      break
  else:
    pytest.fail("no usable stop string in the greedy outputs")
  got = _sampler(model, tokenizer=tok, stop_strings=(stop, "\u2603never")).generate(prompts)
  assert got[i].tokens.tolist() == out.tokens[:5].tolist()
  assert got[i].finish_reason == records.STOP and not got[i].truncated
  assert got[i].text.endswith(stop)
  for g, p in zip(got, plain):
    if g.finish_reason == records.STOP:
      assert stop in g.text and stop not in tok.decode(g.tokens[:-1].tolist())
    else:
      assert g.tokens.tolist() == p.tokens.tolist()


def test_stream_keeps_decoding_while_the_request_iterator_has_nothing(loaded, prompts):
  model, _ = loaded["qwen2"]
  sampler = _sampler(model)
  plain = sampler.generate(prompts)

  def requests():
    for i, p in enumerate(prompts):
      yield None  # "nothing to admit yet"
      yield records.Request(p, prompt_id=i)
      if i == 5:
        yield from [None] * 5

  got = sorted(sampler.stream(requests()), key=lambda c: c.prompt_id)
  assert [c.tokens.tolist() for c in got] == [c.tokens.tolist() for c in plain]


def test_bad_requests_raise_user_errors(loaded):
  model, _ = loaded["qwen2"]
  sampler = _sampler(model)
  with pytest.raises(UserError, match="prompt_id=0: empty prompt"):
    sampler.generate([records.Request([], prompt_id=0)])
  with pytest.raises(UserError, match="17 tokens"):
    sampler.generate([records.Request([1] * 17, prompt_id="x")])
  with pytest.raises(UserError, match="invalid top_p 0"):
    sampler.generate([records.Request([1], top_p=0.0)])
  with pytest.raises(UserError, match="max_new_tokens"):
    sampler.generate([records.Request([1], max_new_tokens=99)])
  with pytest.raises(UserError, match="stop strings need a tokenizer"):
    _sampler(model, stop_strings=("x",))
