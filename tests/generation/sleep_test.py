"""Sampler.sleep: colocated roles free the sampler's device memory while the trainer steps.

The real Sampler on a tiny model: sleeping must free the page pool, slot state, per-layer
copies and weights (the live arrays' bytes drop by all of them), and waking must give the
very tokens a sampler that never slept gives, from the weights posted since.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import layout as layout_lib
from tests.generation import engine_test as et


def _sampler(model, buffers):
  cfg = SamplerConfig(**{**et.SAMPLER.__dict__, "weight_buffers": buffers})
  return engine.Sampler(model, cfg, eos_ids=())


def _live_bytes() -> int:
  return sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted())


def _held(sampler) -> int:
  """Bytes of everything the sampler holds on the device: weights, layer copies, state."""
  leaves = list(sampler._param_leaves) + list(sampler._layer_leaves or ())  # pylint: disable=protected-access
  leaves += jax.tree.leaves(sampler._state)  # pylint: disable=protected-access
  return sum(x.nbytes for x in leaves if isinstance(x, jax.Array) and not x.is_deleted())


@pytest.mark.parametrize("buffers", [1, 2])
def test_sleep_frees_the_sampler_and_wakes_to_the_same_tokens(loaded, prompts, buffers):
  model, _ = loaded["qwen2"]
  params = nnx.split(model)[1]
  want = _sampler(model, buffers).generate(prompts[:4])
  sampler = _sampler(model, buffers)
  sampler.generate(prompts[:4])
  held = _held(sampler)
  pool = layout_lib.bytes_per_device(jax.tree.leaves(sampler._state))  # pylint: disable=protected-access
  assert held > pool > 0
  before = _live_bytes()
  sampler.sleep()
  assert sampler.asleep
  # Everything it held is gone: weights, per-layer copies, page pool and slot state.
  assert before - _live_bytes() >= held
  sampler.sleep()  # twice is harmless
  sampler.update_params(params, version=3)
  got = sampler.generate(prompts[:4])
  assert not sampler.asleep
  for g, w in zip(got, want):
    assert g.tokens.tolist() == w.tokens.tolist()
    assert (g.versions == 3).all()
    np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-6)


def test_a_run_after_sleep_without_new_weights_is_an_error(loaded, prompts):
  model, _ = loaded["qwen2"]
  sampler = _sampler(model, 1)
  sampler.sleep()
  with pytest.raises(RuntimeError, match="no weights were posted since"):
    sampler.generate(prompts[:2])


def test_the_same_arrays_posted_again_after_sleep_are_placed_again(loaded, prompts):
  """An eval right after a step posts the very arrays the step posted; after a sleep those
  were deleted on the sampler's side, so the post must place them, not be skipped."""
  model, _ = loaded["qwen2"]
  params = nnx.split(model)[1]
  sampler = _sampler(model, 2)
  sampler.update_params(params, version=1)
  first = sampler.generate(prompts[:2])
  sampler.sleep()
  sampler.update_params(params, version=1)  # the same arrays, the same version
  again = sampler.generate(prompts[:2])
  for a, b in zip(first, again):
    assert a.tokens.tolist() == b.tokens.tolist()
