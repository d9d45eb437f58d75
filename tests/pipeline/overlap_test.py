"""The real Sampler against weights that are still being computed, and weights it shares
devices with: overlap of generation with training (double buffer), admission after a
pending update, no aliasing of buffers a colocated trainer donates.

A "train step still running" is a long jitted program on another device (device 1; the
sampler decodes on device 0): its outputs exist as arrays at once but are not ready until
it ends, like the trainer's new params while its step runs. (A host callback cannot gate
it: programs with callbacks run synchronously on CPU.) The tests count decode chunks read
back while those params were not ready: a sampler that swaps unready weights in stalls
until they are ready, so it reads back at most the chunk already dispatched.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import engine
from jaxrl_scale.generation import records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import transformer
from jaxrl_scale.pipeline import generator
from jaxrl_scale.pipeline import sources

P, G = 2, 2
_STEP_MATMULS = 18000  # about 4 s of CPU work on device 1: many decode chunks' worth


@functools.partial(jax.jit, static_argnums=2)
def _slow_step(params, m_DD, n):
  m_DD = jax.lax.fori_loop(0, n, lambda i, m: jnp.tanh(m @ m), m_DD)
  zero = m_DD[0, 0] * 0  # the new params depend on the whole loop
  return jax.tree.map(lambda a: a * 1.05 + zero.astype(a.dtype), params)


def _training(params):
  """`params` scaled by 1.05, ready only when a long program on device 1 ends."""
  device = jax.devices()[1]
  m_DD = jax.device_put(jnp.full((256, 256), 1 / 256, jnp.float32), device)
  return _slow_step(jax.device_put(params, device), m_DD, _STEP_MATMULS)


def _ready(tree) -> bool:
  return all(x.is_ready() for x in jax.tree.leaves(tree))


def _model():
  mcfg = dataclasses.replace(model_config.tiny_llama(), num_layers=1)
  return transformer.Transformer(mcfg, rngs=nnx.Rngs(0))


def _sampler(model, num_slots=2, max_new_tokens=40, mesh=None):
  cfg = SamplerConfig(num_slots=num_slots, max_new_tokens=max_new_tokens, temperature=1.0,
                      decode_chunk=4, prompt_buckets=(16,))
  return engine.Sampler(model, cfg, eos_ids=(), seed=0, mesh=mesh)


def test_decoding_goes_on_while_new_weights_are_computed_and_new_requests_wait():
  model = _model()
  sampler = _sampler(model, max_new_tokens=160)  # on device 0
  jax.block_until_ready(_training(nnx.state(model, nnx.Param)))  # compiled beforehand
  state = {"posted": None, "unready_chunks": 0}
  long_req = records.Request([5, 6, 7], prompt_id="long", seed=1)
  short_req = records.Request([5, 6], prompt_id="short", max_new_tokens=4, seed=2)
  late_req = records.Request([8, 9], prompt_id="late", max_new_tokens=8, seed=3)

  def requests():
    yield long_req
    yield short_req
    while state["posted"] is None:
      yield None
    yield late_req  # offered while the update is still being computed

  def on_chunk(s, index):
    if index == 0:
      state["posted"] = _training(nnx.state(model, nnx.Param))
      s.update_params(state["posted"], 1)
    elif not _ready(state["posted"]):
      state["unready_chunks"] += 1

  out = {c.prompt_id: c for c in sampler.stream(requests(), on_chunk=on_chunk)}
  print("chunks read back while the new weights were computed:", state["unready_chunks"])
  assert state["unready_chunks"] >= 3, "decoding stalled behind the weights being computed"
  versions = out["long"].versions.tolist()
  assert versions[:4 * 3] == [0] * 12 and np.all(np.diff(versions) >= 0)
  # The request offered while the update was pending started on the new weights.
  assert set(out["late"].versions.tolist()) == {1}
  assert sampler.version == 1 and not sampler.update_pending


def test_pipeline_generates_while_the_trainer_computes_its_step(prompt_source, fakes):
  model = _model()
  sampler = _sampler(model, num_slots=4, max_new_tokens=64)
  jax.block_until_ready(_training(nnx.state(model, nnx.Param)))  # compiled beforehand
  # Count decode chunks whose results were read back while the new weights were still
  # being computed. (Chunks dispatched in that time say less: a sampler that swapped the
  # unready weights in still dispatched 2-11 chunks that then waited for them.)
  state = {"posted": None, "unready_reads": 0}
  read_chunk = sampler._read_chunk

  def counting_read(*args):
    out = list(read_chunk(*args))  # waits for the chunk's results
    if state["posted"] is not None and not _ready(state["posted"]):
      state["unready_reads"] += 1
    yield from out

  sampler._read_chunk = counting_read
  admitter = sources.Admitter(prompt_source, G, seed=0)
  src = generator.PipelineSource(sampler, admitter, fakes.Scorer(), num_prompts=P,
                                 max_staleness=16, queue_size=17, reward_workers=1).start()
  try:
    # k = 16: up to 34 groups (272 chunks) may be generated ahead, so the generator has work
    # for the whole step (even when this thread is slow to post) unless it waits for the
    # weights.
    groups = src.next_groups(0)
    state["posted"] = new_params = _training(nnx.state(model, nnx.Param))
    src.after_step(groups, new_params, 1)
    assert not _ready(new_params), "posting the weights waited for the train step"
    jax.block_until_ready(new_params)  # the trainer waits for its step (metrics, say)
    groups = src.next_groups(1)
  finally:
    src.close()
  # Measured on the 2-core dev machine: 13-14 chunks here (7-16 with a step a quarter as
  # long; at half as long, 4 in a full test run once and again on 2026-11-28, and 5, 14, 14
  # beside another test run, against 11, 14, 16 at this length, hence the longer step); 2-5
  # when the sampler waits for the posted weights (wait=True at every chunk boundary: 2
  # with either step length) or swaps them in unready (the chunks before the post reaches
  # the sampler still count).
  overlapped = state["unready_reads"]
  assert overlapped >= 6, f"{overlapped} chunks: no decoding while the train step ran"


# cast=True is slow-only (40 s): the cast copies anyway; cast=False is the case that can alias.
@pytest.mark.parametrize("cast", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_colocated_weights_survive_the_trainer_donating_its_buffers(cast):
  model = _model()
  devices = np.array(jax.devices()[:2]).reshape(2, 1)
  mesh = jax.sharding.Mesh(devices, ("data", "tp"))
  params = jax.device_put(nnx.state(model, nnx.Param),
                          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  if cast:  # float32 masters on the trainer, bf16 on the sampler: the cast copies anyway
    model = transformer.Transformer(dataclasses.replace(model.cfg, param_dtype="bfloat16"),
                                    rngs=nnx.Rngs(0))
  sampler = _sampler(model, mesh=mesh)
  sampler.update_params(params, 1)
  before = sampler.generate([[5, 6, 7], [8, 9]])
  # The train step: donates the params it was given (the same buffers, colocated).
  step = jax.jit(lambda p: jax.tree.map(lambda a: a + 1, p), donate_argnums=0)
  params = step(params)
  assert not sampler.update_pending
  after = sampler.generate([[5, 6, 7], [8, 9]])  # must not touch a donated buffer
  for a, b in zip(before, after):
    np.testing.assert_array_equal(a.tokens, b.tokens)
  assert all(not x.is_deleted() for x in jax.tree.leaves(sampler.params))
