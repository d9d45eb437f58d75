"""Expert parallelism in the run's own programs (tiny_qwen3_moe, float32, 8 simulated
devices): the sampler's greedy decode on generator meshes with an expert axis (ep 2, 4)
gives the tokens, log-probs and routing records of ep 1, and the train step with routing
replay gives ep 1's loss and gradients."""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from jaxrl_scale import config
from jaxrl_scale.generation import engine, records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import train_step
from tests import random_model

P, G, S, MAX_PROMPT = 4, 4, 14, 6
CFG = dataclasses.replace(model_config.tiny_qwen3_moe(), dtype="float32",
                          param_dtype="float32")
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _mesh(axes, shape):
  n = int(np.prod(shape))
  return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(shape),
                       devices=jax.devices()[:n])


GENERATORS = {1: (mesh_lib.GENERATOR_AXES, (4, 1)),
              2: (("data", "expert", "tp"), (2, 2, 1)),
              4: (("data", "expert", "tp"), (1, 4, 1))}
TRAINERS = {1: (mesh_lib.TRAINER_AXES, (8, 1)),
            2: (("fsdp", "expert", "tp"), (4, 2, 1)),
            4: (("fsdp", "expert", "tp"), (2, 4, 1))}


@functools.cache
def _state():
  """Random params (NumPy, O(0.2) so the routing varies from token to token)."""
  return random_model.random_state(CFG, 0.2)


def _model(mesh):
  return random_model.place(*_state(), mesh)


@functools.cache
def _rollouts(ep):
  """Greedy completions with routing records on the generator mesh of `ep`, and a batch
  packed from them."""
  mesh = _mesh(*GENERATORS[ep])
  sampler = engine.Sampler(
      _model(mesh), config.SamplerConfig(num_slots=8, max_new_tokens=S - MAX_PROMPT,
                                         temperature=0.0, decode_chunk=4, prompt_buckets=(8,)),
      mesh=mesh, eos_ids=(), seed=3, max_prompt_len=MAX_PROMPT, record_routing=True)
  rng = np.random.default_rng(7)
  prompts = [[int(t) for t in rng.integers(1, 250, size=rng.integers(2, MAX_PROMPT + 1))]
             for _ in range(P)]
  done = sampler.generate([records.Request(prompts[p], prompt_id=p, sample_index=g)
                           for p in range(P) for g in range(G)])
  grid = lambda f: [[f(done[p * G + g]) for g in range(G)] for p in range(P)]  # noqa: E731
  batch = batch_lib.pack_rl(prompts, grid(lambda c: c.tokens.tolist()),
                            grid(lambda c: c.logprobs.tolist()), rng.normal(size=(P, G)),
                            seq_len=S, routing=grid(lambda c: c.routing))
  return batch, done, sampler


@pytest.mark.slow  # 3 samplers' compiles: ~60-120 s each on 2 loaded cores
@pytest.mark.parametrize("ep", [2, 4])
def test_decode_with_an_expert_axis_equals_ep_1(ep):
  _, want, _ = _rollouts(1)
  _, got, sampler = _rollouts(ep)
  # The sampler's copy of the experts is split over the expert axis, not replicated.
  gate = sampler._params["layers"]["moe"]["gate_proj"]
  assert gate.sharding.spec[1] == "expert"
  assert gate.addressable_shards[0].data.shape[1] == CFG.num_experts // ep
  routed = set()
  for a, b in zip(want, got):
    np.testing.assert_array_equal(b.tokens, a.tokens)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
    np.testing.assert_array_equal(b.routing, a.routing)
    routed |= set(np.unique(a.routing).tolist())
  assert len(routed) == CFG.num_experts  # every shard's experts took part


def _trainer(ep):
  mesh = _mesh(*TRAINERS[ep])
  objective = train_step.RLObjective(config.RLConfig(), temperature=1.0, replay_routing=True)
  return train_step.Trainer(_model(mesh), mesh, config.OptimConfig(lr=1e-3, warmup_steps=0),
                            objective, micro_batches=2, compiler_options=FAST_COMPILE)


@pytest.mark.slow  # ~260 s on 2 loaded cores (4 step programs)
def test_train_step_with_an_expert_axis_and_routing_replay_equals_ep_1():
  batch, _, _ = _rollouts(1)
  ref_loss, ref_grads = jax.device_get(_trainer(1).loss_and_grads(batch))
  for ep in (2, 4):
    trainer = _trainer(ep)
    gate = trainer.params["layers"]["moe"]["gate_proj"][...]
    assert gate.sharding.spec[1] == "expert"  # [L, E, D, F]: E over the expert axis
    assert trainer.activation_sharding(8).spec[0] == ("fsdp", "expert")
    loss, grads = jax.device_get(trainer.loss_and_grads(batch))
    np.testing.assert_allclose(loss, ref_loss, atol=1e-5)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grads),
                                 jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5,
                                 err_msg=f"ep={ep} {jax.tree_util.keystr(path)}")
  # One optimizer step through the compiled step program: the same routing is replayed
  # (no mismatch: the records are this policy's own) and the experts stay split.
  metrics = jax.device_get(trainer.step(batch))
  assert not metrics["nonfinite"]
  np.testing.assert_allclose(metrics["loss"], ref_loss, atol=1e-5)
  assert metrics["routing_mismatch"] == 0.0
  assert trainer.params["layers"]["moe"]["gate_proj"][...].sharding.spec[1] == "expert"
