"""An MoE policy in the RL train step: sharded equals single-device, and the trainer scores
the sampler's own tokens with the sampler's log-probs (ratio 1 on-policy)."""


import jax
import numpy as np
from jax.sharding import AxisType

from jaxrl_scale import config
from jaxrl_scale.generation import engine, records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import train_step
from tests import random_batch, random_model

P, G, S, PROMPT_LEN = 4, 4, 16, 4
# fsdp=4 divides the model dim, tp=2 heads, kv heads, both MLP sizes and the vocab. Layer 0
# dense, layer 1 sparse: the interleave's per-layer choice runs under remat and grad.
CFG = model_config.ModelConfig(
    family="qwen3_moe", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, intermediate_size=64, qk_norm=True, num_experts=4,
    experts_per_token=2, moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=(0,))
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _mesh_8():
  return jax.make_mesh((4, 2), mesh_lib.TRAINER_AXES, axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:8])


def _model(mesh):
  """The same random model (O(0.3) weights so routing varies) on `mesh`."""
  return random_model.random_model(CFG, mesh, 0.3)


def _trainer(mesh, temperature=1.0, **optim):
  opt = config.OptimConfig(lr=1e-3, warmup_steps=0, **optim)
  return train_step.Trainer(_model(mesh), mesh, opt,
                            train_step.RLObjective(config.RLConfig(), temperature=temperature),
                            micro_batches=2, compiler_options=FAST_COMPILE)


def _batch(seed):
  return random_batch.rl_batch(seed, prompts=P, generations=G, seq_len=S,
                              prompt_len=PROMPT_LEN)


def test_moe_train_step_sharded_equals_single_device():
  batch = _batch(1)
  results = []
  for mesh in (_mesh_8(), mesh_lib.single_device_mesh()):
    trainer = _trainer(mesh, remat="full", logits_chunk=5)
    first = jax.device_get(trainer.step(batch))
    second = jax.device_get(trainer.step(batch))
    assert not first["nonfinite"] and not second["nonfinite"]
    results.append((first, second, trainer))
  (s1, s2, sharded), (u1, u2, _) = results
  for a, b in ((s1, u1), (s2, u2)):
    np.testing.assert_allclose(a["loss"], b["loss"], atol=1e-5)
    np.testing.assert_allclose(a["grad_norm"], b["grad_norm"], rtol=1e-4)
  assert s2["loss"] != s1["loss"]  # the step moved the policy
  # The experts stay sharded (D over fsdp, F over tp) through the step.
  gate = sharded.state.params["layers"]["moe"]["gate_proj"][...]
  assert gate.sharding.spec == jax.sharding.PartitionSpec(None, None, "fsdp", "tp")


def test_trainer_logprobs_equal_the_samplers_for_an_moe_policy():
  temperature = 0.8
  sampler = engine.Sampler(
      _model(mesh_lib.single_device_mesh()),
      config.SamplerConfig(num_slots=8, max_new_tokens=S - PROMPT_LEN, temperature=temperature,
                           decode_chunk=4, prompt_buckets=(8,)),
      eos_ids=(), seed=3, max_prompt_len=PROMPT_LEN)
  rng = np.random.default_rng(12)
  prompts = [[int(t) for t in rng.integers(1, 64, size=PROMPT_LEN)] for _ in range(P)]
  done = sampler.generate([records.Request(prompts[p], prompt_id=p, sample_index=g)
                           for p in range(P) for g in range(G)])
  completions = [[done[p * G + g].tokens.tolist() for g in range(G)] for p in range(P)]
  gen_logp = [[done[p * G + g].logprobs.tolist() for g in range(G)] for p in range(P)]
  batch = batch_lib.pack_rl(prompts, completions, gen_logp, rng.normal(size=(P, G)),
                            seq_len=S)
  trainer = _trainer(_mesh_8(), temperature=temperature, logits_chunk=6)
  metrics = jax.device_get(trainer.step(batch))
  assert abs(metrics["ratio_min"] - 1) < 1e-4 and abs(metrics["ratio_max"] - 1) < 1e-4
  # A different policy (the same model one step later) is visibly off-policy: the check
  # above can fail.
  later = jax.device_get(trainer.step(batch))
  assert max(abs(later["ratio_min"] - 1), abs(later["ratio_max"] - 1)) > 1e-3
