"""sampler.weight_buffers 1: the single-buffered weight swap (generation/weights.py).

Which version a token is from: an update posted after chunk c has been read back (the
`on_chunk(c)` callback) is swapped in before the next chunk is dispatched, so with
pipeline_depth 1 chunks 0..c+1 run on the old weights and chunk c+2 on the new (depth 0,
CPU's default: chunk c+1 on the new); a token
records the version of the chunk that sampled it, and its log-prob is that version's. Its
sequence's keys and values written before the swap stay (the old weights'), so the new
weights continue from a cache the old ones built. The double buffer does the same once the
posted copy is computed (waited for below), so both must give the same tokens.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import weights
from tests.generation import engine_test as et

_WAIT_S = 60.0  # generous: only guards against a hang


def _sampler(model, buffers, depth=1, **overrides):
  cfg = SamplerConfig(**{**et.SAMPLER.__dict__, "weight_buffers": buffers, **overrides})
  return engine.Sampler(model, cfg, eos_ids=(), pipeline_depth=depth)


def _live_bytes() -> int:
  return sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted())


@pytest.mark.parametrize("bad", [0, 3, -1])
def test_weight_buffers_other_than_1_or_2_is_a_one_line_error(bad):
  with pytest.raises(UserError, match=r"^config key 'sampler.weight_buffers': must be 1 or 2, "
                     rf"got {bad}$"):
    SamplerConfig(weight_buffers=bad)


def _post_after_chunk_0(params, version, wait_computed):
  def swap(s, chunk_index):
    if chunk_index == 0:
      s.update_params(params, version=version)
      if wait_computed:  # the double buffer swaps only once the posted copy exists
        jax.block_until_ready(s.params)
  return swap


def _check_against_reference(model_a, model_b, prompts, outs, n):
  """Versions [0]*k + [7]*(n-k) with k mid-sequence; tokens after k are model_b's greedy
  continuation of the cache model_a built (an independent decode, not the sampler's)."""
  switch = set()
  for prompt, out in zip(prompts, outs):
    k = int(np.argmax(out.versions == 7))
    assert 0 < k < n
    np.testing.assert_array_equal(out.versions, [0] * k + [7] * (n - k))
    assert out.tokens[k:].tolist() == et._continue_greedy(
        model_a, model_b, prompt, out.tokens.tolist(), k, n)
    switch.add(k)
  return switch


@pytest.mark.parametrize("depth", [1, 0])
def test_single_buffer_swap_matches_the_double_buffer(loaded, prompts, depth):
  """An update posted mid-generation: the same tokens, log-probs and versions as the double
  buffer, the tokens after the swap from the new weights on the old cache; posted while
  idle, the next run is all new weights. The swap lands `depth` chunks after the next."""
  model_a, _ = loaded["qwen2"]
  model_b = et._perturbed(model_a, seed=1)
  params_b = nnx.split(model_b)[1]
  n = et.SAMPLER.max_new_tokens
  single = _sampler(model_a, 1, depth)
  got = single.generate(prompts[:4], on_chunk=_post_after_chunk_0(params_b, 7, False))
  want = _sampler(model_a, 2, depth).generate(
      prompts[:4], on_chunk=_post_after_chunk_0(params_b, 7, True))
  for g, w in zip(got, want):
    assert g.tokens.tolist() == w.tokens.tolist()
    np.testing.assert_array_equal(g.versions, w.versions)
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-6)
  # The first chunk dispatched after the post: chunk 1 + depth (of 4 tokens each).
  assert _check_against_reference(model_a, model_b, prompts, got, n) == {
      (1 + depth) * et.SAMPLER.decode_chunk}
  assert single.version == 7 and not single.update_pending
  # Posted with no generation running: swapped at once, every later token is version 9.
  single.update_params(nnx.split(model_a)[1], version=9)
  assert single.version == 9 and single.latest_version == 9
  fresh = _sampler(model_a, 2).generate(prompts[:4])
  for g, f in zip(single.generate(prompts[:4]), fresh):
    assert (g.versions == 9).all()
    assert g.tokens.tolist() == f.tokens.tolist()
    np.testing.assert_allclose(g.logprobs, f.logprobs, rtol=0, atol=1e-6)


def test_update_from_another_thread_waits_for_the_chunk_boundary(loaded, prompts):
  """The trainer's case: update_params from another thread while the loop runs returns only
  once the loop has stopped at a chunk boundary and the new weights are in; the tokens are
  those of the same swap made from the loop's own thread."""
  model_a, _ = loaded["qwen2"]
  model_b = et._perturbed(model_a, seed=1)
  params_b = nnx.split(model_b)[1]
  n = et.SAMPLER.max_new_tokens
  sampler = _sampler(model_a, 1)
  seen: dict = {}
  poster = None

  def post():
    sampler.update_params(params_b, version=7)
    seen["version_on_return"] = sampler.version

  def on_chunk(s, chunk_index):
    nonlocal poster
    if chunk_index == 0:
      poster = threading.Thread(target=post)
      poster.start()
      # Hold this boundary until the poster asks the loop to stop (so the swap lands at
      # the next one, as when posting from this thread); the poster is waiting then.
      deadline = time.monotonic() + _WAIT_S
      while time.monotonic() < deadline:
        with s._cond:
          if s._park:
            break
        time.sleep(0.01)
      seen["parked_request"] = s._park
      seen["version_while_waiting"] = s.version

  outs = sampler.generate(prompts[:4], on_chunk=on_chunk)
  poster.join(_WAIT_S)
  assert not poster.is_alive()
  assert seen == {"parked_request": True, "version_while_waiting": 0, "version_on_return": 7}
  assert _check_against_reference(model_a, model_b, prompts, outs, n) == {
      2 * et.SAMPLER.decode_chunk}
  same_thread = _sampler(model_a, 1).generate(
      prompts[:4], on_chunk=_post_after_chunk_0(params_b, 7, False))
  for o, t in zip(outs, same_thread):
    assert o.tokens.tolist() == t.tokens.tolist()
    np.testing.assert_array_equal(o.versions, t.versions)


@pytest.mark.parametrize("buffers", [1, 2])
def test_the_old_weights_are_freed_before_the_new_are_placed(loaded, prompts, monkeypatch,
                                                             buffers):
  """With one buffer the live weights (and their per-layer copies) are deleted before the
  update is placed, so the device holds at most one copy; the double buffer, measured the
  same way, holds two (which shows the measurement can tell)."""
  model_a, _ = loaded["qwen2"]
  params_b = nnx.split(et._perturbed(model_a, seed=1))[1]
  sampler = _sampler(model_a, buffers)
  assert sampler._layer_leaves is not None  # CPU: the per-layer copies are freed too
  params_bytes = sum(x.nbytes for x in sampler._param_leaves)
  placements: list[dict] = []
  real = weights.transfer.reshard

  def reshard(tree, *args, **kwargs):
    if not placements:  # not the update
      return real(tree, *args, **kwargs)
    old = list(sampler._param_leaves) + list(sampler._layer_leaves)
    deleted = [x.is_deleted() for x in old]
    out = jax.block_until_ready(real(tree, *args, **kwargs))
    placements.append({"old_deleted": deleted, "after": _live_bytes()})
    return out

  def on_chunk(s, chunk_index):
    if chunk_index == 0:
      placements.append({"before": _live_bytes()})
      s.update_params(params_b, version=7)

  monkeypatch.setattr(weights.transfer, "reshard", reshard)
  outs = sampler.generate(prompts[:4], on_chunk=on_chunk)
  assert any((o.versions == 7).any() for o in outs)
  before, placed = placements
  grown = placed["after"] - before["before"]
  if buffers == 1:
    assert all(placed["old_deleted"])
    # The new copy took the place of the old weights and their layer copies.
    assert grown <= 0.05 * params_bytes, (grown, params_bytes)
  else:
    assert not any(placed["old_deleted"])
    assert grown >= 0.95 * params_bytes, (grown, params_bytes)


def test_the_double_buffer_builds_new_layer_copies_after_the_old_are_released(
    loaded, prompts, monkeypatch):
  """CPU/GPU samplers hold per-layer copies of the weights. The chunks dispatched before the
  double buffer's swap still read the old weights and copies: a device frees their memory
  only when those chunks end, so copies built while they run would sit beside them (two
  sets of weights and of copies; `plan` counts the weights twice, the copies once). The
  swap therefore builds the new copies only once every chunk dispatched before it has
  finished and the sampler has let go of the old copies. Python's view (`jax.live_arrays`)
  cannot show a buffer an in-flight program holds, so this checks the order at the moment
  the new copies are built, with the slot state (what every chunk returns) still being
  computed when the swap begins: a slow program stands in for a long decode chunk."""
  model_a, _ = loaded["qwen2"]
  params_b = nnx.split(et._perturbed(model_a, seed=1))[1]
  cfg = SamplerConfig(**{**et.SAMPLER.__dict__, "weight_buffers": 2, "max_new_tokens": 48})
  sampler = engine.Sampler(model_a, cfg, eos_ids=())
  assert sampler._layer_leaves is not None

  @jax.jit
  def slow(state):  # the state unchanged, after ~0.1 s of matmuls it depends on
    m = jax.lax.fori_loop(0, 100, lambda _, m: jnp.tanh(m @ m), jnp.eye(256) * 0.5)
    zero = (m[0, 0] * 0).astype(jnp.int32)
    return jax.tree.map(lambda x: x + zero.astype(x.dtype), state)

  slow(sampler._state)  # compiled before the run
  swaps: list[dict] = []
  real_apply, real_layers = engine.Sampler._apply_pending, engine.Sampler._layers_of

  def apply_pending(self, wait):
    if self._pending is not None and all(
        x.is_ready() for x in jax.tree.leaves(self._pending[0])):  # a swap now
      self._state = slow(self._state)
      swaps.append({"began_busy": not all(x.is_ready() for x in jax.tree.leaves(self._state))})
    real_apply(self, wait)

  def layers_of(self, param_leaves):
    if swaps:  # in the swap (the first call is __init__'s)
      swaps[-1].update(chunks_done=all(x.is_ready() for x in jax.tree.leaves(self._state)),
                       old_copies_held=self._layer_leaves is not None)
    return real_layers(self, param_leaves)

  def on_chunk(s, chunk_index):
    if chunk_index == 0:
      s.update_params(params_b, version=7)
      jax.block_until_ready(s.params)  # computed: swapped in at the next chunk boundary

  monkeypatch.setattr(engine.Sampler, "_apply_pending", apply_pending)
  monkeypatch.setattr(engine.Sampler, "_layers_of", layers_of)
  outs = sampler.generate(prompts[:4], on_chunk=on_chunk)
  assert any((o.versions == 7).any() for o in outs)
  assert swaps == [{"began_busy": True, "chunks_done": True, "old_copies_held": False}]


@pytest.mark.slow  # 20-26 s on the 2-core machine under load (two ~2 s train steps)
def test_pipeline_source_with_one_buffer_overlaps_and_never_deadlocks():
  """PipelineRL's generator thread with weight_buffers 1: `after_step` (the trainer's
  thread) returns with the new weights in, the sampler decodes on the old ones while the
  train step computes the new, and training goes on step after step."""
  from jaxrl_scale.data import sources as data_sources  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.data import tasks  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import generator, rollouts, sources  # pylint: disable=g-import-not-at-top
  from tests.pipeline import overlap_test as ot  # pylint: disable=g-import-not-at-top

  class Scorer:
    def group(self, seq, prompt, completions, version):
      completions = sorted(completions, key=lambda c: c.sample_index)
      correct = np.array([c.sample_index % 2 == 0 for c in completions])
      return rollouts.Group(seq=seq, prompt=prompt, completions=completions,
                            rewards_G=np.where(correct, 1.0, -1.0).astype(np.float32),
                            correct_G=correct, counts={"total": len(completions)},
                            admitted_version=version)

  model = ot._model()
  cfg = SamplerConfig(num_slots=4, max_new_tokens=64, temperature=1.0, decode_chunk=4,
                      prompt_buckets=(16,), weight_buffers=1)
  sampler = engine.Sampler(model, cfg, eos_ids=(), seed=0)
  base = nnx.state(model, nnx.Param)
  jax.block_until_ready(ot._training(base))  # compiled beforehand
  state = {"posted": None, "unready_reads": 0}
  read_chunk = sampler._read_chunk

  def counting_read(*args):
    out = list(read_chunk(*args))
    if state["posted"] is not None and not ot._ready(state["posted"]):
      state["unready_reads"] += 1
    yield from out

  sampler._read_chunk = counting_read
  prompts = data_sources.PromptSource(tasks.arithmetic(120, 0, digits=2),
                                      tokenizer_lib.ByteTokenizer(), max_prompt_tokens=16,
                                      num_validation=8, seed=0)
  src = generator.PipelineSource(sampler, sources.Admitter(prompts, 2, seed=0), Scorer(),
                                 num_prompts=2, max_staleness=2, queue_size=3,
                                 reward_workers=1).start()
  versions_on_return = []
  trained = []

  def trainer():
    for version in range(2):
      groups = src.next_groups(version)
      trained.append(groups)
      state["posted"] = new = ot._training(base)  # "the train step", ~2 s on device 1
      src.after_step(groups, new, version + 1)
      versions_on_return.append(sampler.version)

  thread = threading.Thread(target=trainer)
  try:
    thread.start()
    thread.join(4 * _WAIT_S)
    assert not thread.is_alive(), "the trainer's thread is stuck"
  finally:
    src.close()
  assert versions_on_return == [1, 2]
  assert len(trained) == 2 and all(len(g) == 2 for g in trained)
  for groups in trained:
    for c in (c for g in groups for c in g.completions):
      assert np.all(np.diff(c.versions) >= 0)
  assert state["unready_reads"] >= 3, "no decoding while the train step ran"
