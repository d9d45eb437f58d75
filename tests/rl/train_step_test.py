import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType

from jaxrl_scale import config
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import sharding
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import logprobs
from jaxrl_scale.rl import placement
from jaxrl_scale.rl import train_step

P, G, S = 4, 4, 20
PROMPT_LEN = 4


def tiny_cfg(dtype: str = "float32") -> model_config.ModelConfig:
  # tp=2 divides heads, kv heads, mlp and vocab; fsdp=4 divides the model dim.
  return model_config.ModelConfig(family="llama", vocab_size=64, hidden_size=32, num_layers=1,
                                  num_heads=4, num_kv_heads=2, head_dim=8,
                                  intermediate_size=64, param_dtype=dtype, dtype=dtype)


def mesh_8() -> jax.sharding.Mesh:
  return jax.make_mesh((4, 2), mesh_lib.TRAINER_AXES, axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:8])


def make_batch(seed: int, gen_logp=None, advantages=None) -> batch_lib.TrainBatch:
  """Ragged completions, one forced-interruption token, one zero-weight (filtered) prompt."""
  rng = np.random.default_rng(seed)
  prompts = [list(rng.integers(1, 64, size=PROMPT_LEN)) for _ in range(P)]
  completions = [[list(rng.integers(1, 64, size=rng.integers(1, S - PROMPT_LEN + 1)))
                  for _ in range(G)] for _ in range(P)]
  if gen_logp is None:
    gen_logp = [[list(-rng.uniform(2.0, 6.0, size=len(c))) for c in cs] for cs in completions]
  trainable = [[[True] * len(c) for c in cs] for cs in completions]
  trainable[1][0][0] = False  # a forced-interruption token
  adv = rng.normal(size=(P, G)) if advantages is None else advantages
  weights = np.ones((P, G), np.float32)
  weights[2] = 0.0
  return batch_lib.pack_rl(prompts, completions, gen_logp, adv, seq_len=S, trainable=trainable,
                           weights=weights, prompt_ids=[10, 11, 12, 13])


FAST_COMPILE = {"xla_backend_optimization_level": 0}  # halves CPU compile time


@functools.cache
def _init_params(dtype: str = "float32"):
  """Random params built in NumPy (XLA-compiling a random init costs seconds on CPU)."""
  graphdef, abstract = sharding.abstract_model(tiny_cfg(dtype))
  rng = np.random.default_rng(0)

  def one(path, x):
    shape = x.get_value().shape
    if getattr(path[-1], "key", None) == "scale":  # RMSNorm scales start at 1
      return x.replace(np.ones(shape, jnp.dtype(dtype)))
    return x.replace((0.02 * rng.standard_normal(shape)).astype(jnp.dtype(dtype)))

  state = jax.tree.map_with_path(one, abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return graphdef, state


def fresh_model(mesh, dtype: str = "float32"):
  """The same initial model, in fresh buffers on `mesh` (a Trainer donates them)."""
  graphdef, state = _init_params(dtype)
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def make_trainer(mesh, loss="cispo", aggregation="prompt_avg", micro_batches=1, lr=1e-3,
                 dtype="float32", temperature=1.0, **optim):
  rl = config.RLConfig(loss=loss, aggregation=aggregation)
  opt = config.OptimConfig(lr=lr, warmup_steps=0, **optim)
  return train_step.Trainer(fresh_model(mesh, dtype), mesh, opt,
                            train_step.RLObjective(rl, temperature=temperature),
                            micro_batches=micro_batches, compiler_options=FAST_COMPILE)


def host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def test_pack_rl_layout():
  b = make_batch(0)
  assert b.tokens_PGS.shape == (P, G, S) and b.advantages_PG.shape == (P, G)
  assert not b.loss_mask_PGS[..., :PROMPT_LEN].any()  # no loss on prompt tokens
  np.testing.assert_array_equal(b.loss_mask_PGS * (1 - b.input_mask_PGS), 0)  # nor padding
  lp = PROMPT_LEN
  assert b.loss_mask_PGS[1, 0, lp] == 0 and b.input_mask_PGS[1, 0, lp] == 1  # interruption
  assert (b.gen_logp_PGS[b.loss_mask_PGS > 0] < 0).all()
  np.testing.assert_array_equal(b.prompt_id_PG[:, 0], [10, 11, 12, 13])


# CISPO (the recipe's) and GSPO (sequence-level ratios) by default; the rest with -m slow.
@pytest.mark.parametrize("loss", ["cispo", "gspo"] + [
    pytest.param(x, marks=pytest.mark.slow) for x in ("grpo", "dapo", "reinforce")])
def test_first_step_same_loss_sharded_and_single_device(loss):
  batch = make_batch(1)
  results = []
  for mesh in (mesh_8(), mesh_lib.single_device_mesh()):
    trainer = make_trainer(mesh, loss=loss, micro_batches=2)
    metrics = host(trainer.step(batch))
    assert not metrics["nonfinite"]
    results.append(metrics)
  sharded, single = results
  assert abs(sharded["loss"] - single["loss"]) < 1e-5
  np.testing.assert_allclose(sharded["grad_norm"], single["grad_norm"], rtol=1e-4)
  np.testing.assert_allclose(sharded["ratio_p50"], single["ratio_p50"], rtol=1e-4)
  assert sharded["num_loss_tokens"] == single["num_loss_tokens"] > 0


def test_params_and_opt_state_stay_sharded_like_params():
  mesh = mesh_8()
  trainer = make_trainer(mesh)
  kernel = trainer.params["layers"]["mlp"]["gate_proj"]["kernel"]
  assert kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp")
  is_adam = lambda x: isinstance(x, optax.ScaleByAdamState)
  (adam,) = [s for s in jax.tree.leaves(trainer.state.opt_state, is_leaf=is_adam) if is_adam(s)]
  for moment in (adam.mu, adam.nu):
    kernel = moment["layers"]["mlp"]["gate_proj"]["kernel"]
    assert kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp")
  trainer.step(make_batch(2))
  kernel = trainer.params["layers"]["mlp"]["gate_proj"]["kernel"]
  assert kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp")
  assert trainer.memory_analysis is not None


@pytest.mark.parametrize("aggregation", [
    "prompt_avg",
    pytest.param("token_avg", marks=pytest.mark.slow),
    pytest.param("sample_avg", marks=pytest.mark.slow),
])
def test_micro_batch_accumulation_equals_full_batch(aggregation):
  mesh = mesh_8()
  batch = make_batch(3)
  out = []
  for m in (1, 4):
    trainer = make_trainer(mesh, aggregation=aggregation, micro_batches=m)
    out.append(host(trainer.loss_and_grads(batch)))
  (loss_1, grads_1), (loss_4, grads_4) = out
  assert abs(loss_1 - loss_4) < 1e-5
  for g1, g4 in zip(jax.tree.leaves(grads_1), jax.tree.leaves(grads_4)):
    np.testing.assert_allclose(g4, g1, atol=1e-5, rtol=0)
  assert max(np.abs(g).max() for g in jax.tree.leaves(grads_1)) > 1e-3  # not all zero


_token_logprobs = nnx.jit(logprobs.token_logprobs)


def _completion_logp(trainer, batch, p, g) -> float:
  model = trainer.model()
  logp, _ = _token_logprobs(model, batch.tokens_PGS[p], batch.positions_PGS[p],
                            batch.input_mask_PGS[p])
  return float(np.sum(np.asarray(logp)[g] * batch.loss_mask_PGS[p, g]))


def test_positive_advantage_up_compile_once_and_nonfinite_skip():
  trainer = make_trainer(mesh_lib.single_device_mesh(), lr=1e-2, max_grad_norm=1.0)
  adv = np.zeros((P, G), np.float32)
  adv[0, 0] = 1.0
  adv[0, 1:] = -1.0 / 3.0
  batch = make_batch(4, advantages=adv)
  before_pos = _completion_logp(trainer, batch, 0, 0)
  before_neg = _completion_logp(trainer, batch, 0, 1)
  metrics = host(trainer.step(batch))
  assert not metrics["nonfinite"] and metrics["lr"] == pytest.approx(1e-2)
  assert _completion_logp(trainer, batch, 0, 0) > before_pos + 0.1
  assert _completion_logp(trainer, batch, 0, 1) < before_neg

  # A non-finite loss leaves params, optimizer state and step untouched, and says so.
  bad = make_batch(5)
  bad_adv = np.array(bad.advantages_PG)
  bad_adv[0, 0] = np.nan
  bad = batch_lib.TrainBatch(**{**vars(bad), "advantages_PG": bad_adv})
  params_before, opt_before = host(trainer.params), host(trainer.state.opt_state)
  metrics = host(trainer.step(bad))
  assert metrics["nonfinite"] and not np.isfinite(metrics["loss"])
  assert int(trainer.state.step) == 1
  for a, b in zip(jax.tree.leaves(params_before), jax.tree.leaves(host(trainer.params))):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(opt_before), jax.tree.leaves(host(trainer.state.opt_state))):
    np.testing.assert_array_equal(a, b)

  # More steps with new data (and numpy or device batches) reuse the one compiled step.
  metrics = host(trainer.step(trainer.shard_batch(make_batch(6))))
  assert not metrics["nonfinite"] and int(trainer.state.step) == 2
  assert trainer.trace_count == 1
  assert trainer.cache_size() == 1
  smaller = jax.tree.map(lambda x: x[:2], make_batch(6))
  with pytest.raises(ValueError, match="fixed shape"):
    trainer.step(smaller)


def test_an_empty_batch_is_a_one_line_error_and_the_trainer_still_trains():
  trainer = make_trainer(mesh_8())
  for empty in (batch_lib.pack_rl([], [], [], np.zeros((0, G)), seq_len=S), {}):
    pytest.raises(UserError, trainer.step, empty).match("empty batch")
  before = jax.tree.leaves(host(trainer.state.params))
  assert np.isfinite(host(trainer.step(make_batch(0)))["loss"])
  assert any((a != b).any() for a, b in zip(before, jax.tree.leaves(host(trainer.state.params))))


def test_micro_batches_for_config():
  assert train_step.micro_batches_for(config.OptimConfig(micro_batch_prompts=0), 48) == 1
  assert train_step.micro_batches_for(config.OptimConfig(micro_batch_prompts=8), 48) == 6
  with pytest.raises(UserError, match="optim.micro_batch_prompts"):
    train_step.micro_batches_for(config.OptimConfig(micro_batch_prompts=5), 48)


def test_micro_batches_split_over_the_trainer_chips():
  """A micro-batch whose rows do not divide the data-parallel chips would be computed whole
  by every chip (issue 68: the paper recipe on a v5p-256); fewer, larger ones are used."""
  devices = np.array(jax.devices()[:8])
  mesh8 = jax.sharding.Mesh(devices.reshape(8, 1), ("fsdp", "tp"))
  mesh4 = jax.sharding.Mesh(devices.reshape(4, 2), ("fsdp", "tp"))  # tp does not split rows
  one = config.OptimConfig(micro_batch_prompts=1)
  # 48 prompts x 2 rows: 1 prompt (2 rows) per micro-batch -> 4 prompts (8 rows, 1 a chip).
  assert train_step.micro_batches_for(one, 48, 2, mesh8) == 12
  assert train_step.micro_batches_for(one, 48, 2, mesh4) == 24
  # 16 rows a prompt already split over 8 chips: unchanged.
  assert train_step.micro_batches_for(one, 48, 16, mesh8) == 48
  # 3 prompts of 4 rows never split over 8: the smallest micro-batch that does is 2 prompts,
  # which does not divide 3; the whole batch (12 rows) does not either, so M stays.
  assert train_step.micro_batches_for(one, 3, 4, mesh8) == 3
  # 6 prompts of 4 rows: 2 prompts (8 rows) per micro-batch.
  assert train_step.micro_batches_for(one, 6, 4, mesh8) == 3
  # Without the mesh, the config's M as before.
  assert train_step.micro_batches_for(one, 48, 2) == 48
  note = placement.micro_batch_note("optim.micro_batch_prompts", 48, 2, 48, 12, mesh8)
  assert note == ("optim.micro_batch_prompts 1 -> 4 per micro-batch: 2 rows do not split "
                  "over the trainer's 8 data-parallel chips, 8 do (1 a chip)")
  assert placement.micro_batch_note("optim.micro_batch_prompts", 48, 16, 48, 48, mesh8) is None


def test_objective_takes_loss_params_from_config():
  rl = config.RLConfig(loss="dapo", clip_low=0.1, clip_high=0.3)
  objective = train_step.RLObjective(rl, temperature=1.0)
  assert objective.aggregation == "prompt_avg"
  with pytest.raises(UserError, match="rl.loss"):
    train_step.RLObjective(config.RLConfig(loss="cispoo"), temperature=1.0)


def test_token_logprobs_match_log_softmax():
  model = fresh_model(mesh_lib.single_device_mesh())
  batch = make_batch(7)
  tokens, pos, mask = batch.tokens_PGS[0], batch.positions_PGS[0], batch.input_mask_PGS[0]
  logp, top1 = _token_logprobs(model, tokens, pos, mask)
  logits = np.asarray(model(tokens, pos, mask), np.float64)
  peak = logits.max(-1, keepdims=True)
  ref = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
  want = np.take_along_axis(ref[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  assert logp.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logp)[:, 1:], want, atol=1e-5)
  assert (np.asarray(logp)[:, 0] == 0).all()
  np.testing.assert_array_equal(np.asarray(top1)[:, 1:],
                                logits[:, :-1].argmax(-1) == tokens[:, 1:])


def test_chunked_lm_head_gives_same_logprobs_and_grads():
  model = fresh_model(mesh_lib.single_device_mesh())
  graphdef, params = nnx.split(model)
  b = make_batch(8)
  tokens, pos, mask = b.tokens_PGS[1], b.positions_PGS[1], b.input_mask_PGS[1]
  weight = b.loss_mask_PGS[1]

  def objective(p, chunk):
    logp, top1 = logprobs.token_logprobs(nnx.merge(graphdef, p), tokens, pos, mask, chunk)
    return jnp.sum(logp * weight), (logp, top1)

  results = [jax.jit(jax.grad(objective, has_aux=True), static_argnums=1)(params, c)
             for c in (0, 6)]  # S - 1 = 19 targets: three chunks of 6 and a padded one
  (g_full, (logp_full, top1_full)), (g_chunk, (logp_chunk, top1_chunk)) = host(results)
  np.testing.assert_allclose(logp_chunk, logp_full, atol=1e-5)
  np.testing.assert_array_equal(top1_chunk, top1_full)
  for a, c in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_chunk)):
    np.testing.assert_allclose(c, a, atol=1e-5)


# --------------------------------------------------------------------------------------
# Mixed precision: float32 masters and Adam state whatever the model's param_dtype.


def _float_dtypes(tree) -> set[str]:
  return {str(x.dtype) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_bf16_model_gets_float32_masters_that_move_at_paper_lr_and_compile_once():
  mesh = mesh_8()
  # Paper rate, bf16 compute and bf16 params: one Adam step moves each weight by ~lr, far
  # below a bf16 weight's spacing (1.2e-4 at 0.02), so only a float32 master can move.
  trainer = make_trainer(mesh, lr=5e-7, dtype="bfloat16")
  assert _float_dtypes(trainer.params) == {"float32"}
  assert _float_dtypes(trainer.state.opt_state) == {"float32"}
  batch = make_batch(9)
  _, grads = host(trainer.loss_and_grads(batch))
  before = host(trainer.params)
  metrics = host(trainer.step(batch))
  assert not metrics["nonfinite"]
  after = host(trainer.params)
  nonzero = 0
  for g, a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(before), jax.tree.leaves(after)):
    assert b.dtype == np.float32
    moved = a != b
    np.testing.assert_array_equal(moved[g != 0], True)
    nonzero += int((g != 0).sum())
  assert nonzero > 1000  # the check covered most of the model
  assert _float_dtypes(trainer.state.opt_state) == {"float32"}
  dtypes = [x.dtype for x in jax.tree.leaves(trainer.state)]
  for seed in (10, 11):
    trainer.step(make_batch(seed))
  # The carried state kept its dtypes, so the one compiled program ran all three steps.
  assert [x.dtype for x in jax.tree.leaves(trainer.state)] == dtypes
  assert trainer.trace_count == 1 and trainer.cache_size() == 1
  assert int(trainer.state.step) == 3

  # The generator gets a param_dtype (bf16) copy of the float32 masters.
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  sampler = engine.Sampler(trainer.model(), config.SamplerConfig(
      num_slots=4, max_new_tokens=4, prompt_buckets=(16,)), eos_ids=())
  assert _float_dtypes(sampler.params) == {"bfloat16"}
  sampler.update_params(trainer.params, 1)
  assert _float_dtypes(sampler.params) == {"bfloat16"}
  assert _float_dtypes(trainer.params) == {"float32"}


# --------------------------------------------------------------------------------------
# Temperature: the trainer's log-probs are of the distribution the sampler drew from.


def _on_policy_batch(sampler, seed: int):
  """P prompts x G completions the sampler drew, packed with its log-probs, and the mask of
  the completion tokens (every one of them: no EOS ends a row early)."""
  from jaxrl_scale.generation import records  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  prompts = [[int(t) for t in rng.integers(1, 64, size=PROMPT_LEN)] for _ in range(P)]
  done = sampler.generate([records.Request(prompts[p], prompt_id=p, sample_index=g)
                           for p in range(P) for g in range(G)])
  completions = [[done[p * G + g].tokens.tolist() for g in range(G)] for p in range(P)]
  gen_logp = [[done[p * G + g].logprobs.tolist() for g in range(G)] for p in range(P)]
  batch = batch_lib.pack_rl(prompts, completions, gen_logp, rng.normal(size=(P, G)),
                            seq_len=S)
  mask = batch.loss_mask_PGS > 0
  assert mask.sum() == P * G * (S - PROMPT_LEN)
  return batch, mask


def test_trainer_logprobs_equal_the_samplers_at_its_temperature():
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  temperature = 0.7
  sampler = engine.Sampler(
      fresh_model(mesh_lib.single_device_mesh()),
      config.SamplerConfig(num_slots=8, max_new_tokens=S - PROMPT_LEN, temperature=temperature,
                           decode_chunk=4, prompt_buckets=(16,)),
      eos_ids=(), seed=3, max_prompt_len=PROMPT_LEN)
  batch, mask = _on_policy_batch(sampler, 12)

  model = fresh_model(mesh_lib.single_device_mesh())
  rows = lambda x: x.reshape(P * G, S)
  for t, close in ((temperature, True), (1.0, False)):
    logp = nnx.jit(functools.partial(logprobs.token_logprobs, temperature=t))(
        model, rows(batch.tokens_PGS), rows(batch.positions_PGS), rows(batch.input_mask_PGS))[0]
    err = np.abs(np.asarray(logp).reshape(P, G, S) - batch.gen_logp_PGS)[mask].max()
    # At T = 1 the same tokens have clearly different log-probs: the check can fail.
    assert (err < 1e-4) if close else (err > 1e-2), (t, err)

  # The same through the RL objective on a sharded trainer (chunked head): ratio = 1.
  trainer = make_trainer(mesh_8(), temperature=temperature, logits_chunk=6)
  metrics = host(trainer.step(batch))
  assert abs(metrics["ratio_min"] - 1) < 1e-4 and abs(metrics["ratio_max"] - 1) < 1e-4


def _bf16_policy_with_float32_values(mesh, dtype: str, num_layers: int = 1):
  """A model of param_dtype bfloat16 holding float32 values (what the Trainer's masters are),
  with an LM head large enough that rounding it to bf16 moves the log-probs visibly."""
  cfg = dataclasses.replace(tiny_cfg("bfloat16"), dtype=dtype, lm_head_fp32=True,
                            num_layers=num_layers)
  graphdef, abstract = sharding.abstract_model(cfg)
  rng = np.random.default_rng(5)

  def one(path, x):
    shape, keys = x.get_value().shape, [getattr(p, "key", None) for p in path]
    if keys[-1] == "scale":
      return x.replace(np.ones(shape, np.float32))
    std = 0.5 if "embedding" in keys else 0.05
    return x.replace((std * rng.standard_normal(shape)).astype(np.float32))

  state = jax.tree.map_with_path(one, abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def test_one_policy_on_both_sides_with_bf16_params_and_the_fp32_head():
  """The generator samples from its bf16 copy; the trainer differentiates float32 masters.
  Both must be the same policy (issue 33: the FP32 head upcast the unrounded master, a gap
  of ~1e-3 in on-policy log-probs). float32 compute isolates the weights: the sampler's
  decode and the trainer's forward then agree to float32 round-off."""
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  single = mesh_lib.single_device_mesh()
  sampler = engine.Sampler(
      _bf16_policy_with_float32_values(single, "float32"),
      config.SamplerConfig(num_slots=8, max_new_tokens=S - PROMPT_LEN, decode_chunk=4,
                           prompt_buckets=(16,)),
      eos_ids=(), seed=4, max_prompt_len=PROMPT_LEN)
  assert _float_dtypes(sampler.params) == {"bfloat16"}
  batch, mask = _on_policy_batch(sampler, 13)

  trainer = train_step.Trainer(
      _bf16_policy_with_float32_values(mesh_8(), "float32"), mesh_8(),
      config.OptimConfig(lr=1e-3, warmup_steps=0, logits_chunk=6),
      train_step.RLObjective(config.RLConfig(), temperature=1.0),
      compiler_options=FAST_COMPILE)
  assert _float_dtypes(trainer.params) == {"float32"}
  rows = lambda x: x.reshape(P * G, S)
  logp = nnx.jit(logprobs.token_logprobs)(
      trainer.model(), rows(batch.tokens_PGS), rows(batch.positions_PGS),
      rows(batch.input_mask_PGS))[0]
  err = np.abs(np.asarray(logp).reshape(P, G, S) - batch.gen_logp_PGS)[mask]
  assert err.max() <= 1e-5, (err.mean(), err.max())
  metrics = host(trainer.step(batch))
  assert abs(metrics["ratio_min"] - 1) <= 1e-5 and abs(metrics["ratio_max"] - 1) <= 1e-5


def test_one_policy_on_both_sides_with_the_papers_dtypes():
  """bf16 params and bf16 compute, FP32 head: the sampler's prefill and paged-decode
  programs and the trainer's sharded forward are one function. Issue 33: XLA kept the
  decode program's layer outputs in float32 where the trainer's layer loop rounded them to
  bf16, and the trainer's split matmuls (fsdp x tp) added bf16 partial sums; before
  `layers.residual` and the float32-output `layers.Einsum`: mean |dlogp| 7e-4, max 4e-3."""
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  single = mesh_lib.single_device_mesh()
  sampler = engine.Sampler(
      _bf16_policy_with_float32_values(single, "bfloat16", num_layers=2),
      config.SamplerConfig(num_slots=8, max_new_tokens=S - PROMPT_LEN, decode_chunk=4,
                           prompt_buckets=(16,)),
      eos_ids=(), seed=4, max_prompt_len=PROMPT_LEN)
  batch, mask = _on_policy_batch(sampler, 13)

  trainer = train_step.Trainer(
      _bf16_policy_with_float32_values(mesh_8(), "bfloat16", num_layers=2), mesh_8(),
      config.OptimConfig(lr=1e-3, warmup_steps=0, logits_chunk=6),
      train_step.RLObjective(config.RLConfig(), temperature=1.0),
      compiler_options=FAST_COMPILE)
  assert _float_dtypes(trainer.params) == {"float32"}
  rows = lambda x: x.reshape(P * G, S)
  logp = nnx.jit(logprobs.token_logprobs)(
      trainer.model(), rows(batch.tokens_PGS), rows(batch.positions_PGS),
      rows(batch.input_mask_PGS))[0]
  err = np.abs(np.asarray(logp).reshape(P, G, S) - batch.gen_logp_PGS)[mask]
  assert err.max() <= 1e-5, (err.mean(), err.max())
  metrics = host(trainer.step(batch))
  assert abs(metrics["ratio_min"] - 1) <= 1e-5 and abs(metrics["ratio_max"] - 1) <= 1e-5


def test_bf16_compute_trainer_masters_are_the_generators_function():
  """With the paper's dtypes (bf16 compute and params, FP32 head) the trainer's float32
  masters and the generator's bf16 copy give identical log-probs through one program.
  (The sampler's own programs against the trainer's:
  `test_one_policy_on_both_sides_with_the_papers_dtypes`.)"""
  from jaxrl_scale.generation import engine  # pylint: disable=g-import-not-at-top
  single = mesh_lib.single_device_mesh()
  master = _bf16_policy_with_float32_values(single, "bfloat16")
  sampler = engine.Sampler(master, config.SamplerConfig(num_slots=4, max_new_tokens=4,
                                                        prompt_buckets=(16,)), eos_ids=())
  copy = nnx.merge(nnx.graphdef(master), sampler.params)
  assert _float_dtypes(nnx.state(copy, nnx.Param)) == {"bfloat16"}
  assert _float_dtypes(nnx.state(master, nnx.Param)) == {"float32"}
  batch = make_batch(21)
  rows = lambda x: jnp.asarray(x).reshape(P * G, S)
  fn = nnx.jit(logprobs.token_logprobs)
  args = (rows(batch.tokens_PGS), rows(batch.positions_PGS), rows(batch.input_mask_PGS))
  np.testing.assert_array_equal(np.asarray(fn(master, *args)[0]), np.asarray(fn(copy, *args)[0]))


def test_rl_objective_temperature():
  rl = config.RLConfig()
  assert train_step.RLObjective(rl, temperature=0.7).temperature == 0.7
  # Greedy rows record the untempered log-softmax (generation/sampling.py).
  assert train_step.RLObjective(rl, temperature=0.0).temperature == 1.0


@pytest.mark.parametrize("key,value", [("top_p", 0.9), ("top_k", 20)])
def test_rl_run_refuses_a_truncated_sampler(key, value):
  with pytest.raises(UserError, match=f"config key 'sampler.{key}'"):
    config.load(None, [f"sampler.{key}={value}"])
  # The sampler alone (`jaxrl-scale generate`) still accepts it.
  assert getattr(config.SamplerConfig(**{key: value}), key) == value


# --------------------------------------------------------------------------------------
# Ahead-of-time: an abstract trainer lowers the same program without any memory.


def _abstract_model(mesh, dtype="float32"):
  graphdef, state = sharding.abstract_model(tiny_cfg(dtype))
  shardings = sharding.state_shardings(state, mesh)
  is_var = lambda x: isinstance(x, nnx.Variable)
  state = jax.tree.map(
      lambda v, s: v.replace(jax.ShapeDtypeStruct(v.get_value().shape, v.get_value().dtype,
                                                  sharding=s)),
      state, shardings, is_leaf=is_var)
  return nnx.merge(graphdef, state)


def test_the_step_unrolls_the_layers_on_cpu_only():
  """The trainer's layer loop by platform (`placement.cpu_program`): unrolled on CPU
  devices (the tests' meshes), one scan on TPUs and GPUs (what `plan` compiles for them) and
  for a mesh without devices."""
  import types  # pylint: disable=g-import-not-at-top
  assert placement.cpu_program(mesh_8())
  for platform in ("tpu", "gpu"):
    fake = types.SimpleNamespace(devices=np.array([[types.SimpleNamespace(platform=platform)]]))
    assert not placement.cpu_program(fake)
  assert not placement.cpu_program(jax.sharding.AbstractMesh((2,), ("fsdp",)))
  trainer = train_step.Trainer(fresh_model(mesh_8(), "float32"), mesh_8(),
                               config.OptimConfig(lr=1e-3, warmup_steps=0),
                               train_step.RLObjective(config.RLConfig(), temperature=1.0))
  assert trainer.unroll_layers and trainer.flat_projections


def test_the_cpu_step_multiplies_2d_matrices_with_the_same_loss_and_grads():
  """On CPU the trainer traces its step under `layers.flat_projections`: every dot of
  the lowered step that contracts without batch axes (the projections, the LM head and
  their backward) takes a 2-D lhs, where the [B, T, D] step has 3-D ones; the loss and the
  gradients are the same."""
  mesh, batch = mesh_8(), make_batch(15)
  out, ranks = [], []
  for flat in (True, False):
    trainer = make_trainer(mesh)
    trainer.flat_projections = flat
    out.append(host(trainer.loss_and_grads(batch)))
    ranks.append(_unbatched_dot_ranks(trainer.lower(batch).as_text()))
  assert ranks[0] and set(ranks[0]) == {2}, ranks[0]
  assert 3 in ranks[1], ranks[1]
  (loss_flat, grads_flat), (loss, grads) = out
  assert abs(loss_flat - loss) < 1e-5
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_flat)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def _unbatched_dot_ranks(hlo: str) -> list[int]:
  """The lhs rank of every dot_general without batching dims in StableHLO text `hlo`."""
  lines = [line for line in hlo.splitlines()
           if "stablehlo.dot_general" in line and "batching_dims" not in line]
  return [len(re.search(r": \(tensor<([0-9x]+)[a-z]", line).group(1).split("x")) - 1
          for line in lines]


def test_abstract_trainer_compiles_the_concrete_program():
  mesh = mesh_8()
  batch = make_batch(13)
  rl = config.RLConfig()
  opt = config.OptimConfig(lr=1e-3, warmup_steps=0, logits_chunk=6)
  objective = train_step.RLObjective(rl, temperature=1.0)
  abstract = train_step.Trainer(_abstract_model(mesh, "bfloat16"), mesh, opt, objective,
                                micro_batches=2, compiler_options=FAST_COMPILE)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract.state))
  assert _float_dtypes(abstract.state) == {"float32"}  # masters, as in a real run
  spec = batch_lib.rl_batch_spec(P, G, S)
  lowered = abstract.lower(spec)
  assert isinstance(lowered, jax.stages.Lowered)
  compiled = lowered.compile()
  assert compiled.cost_analysis() is not None
  with pytest.raises(RuntimeError, match="abstract"):
    abstract.step(batch)

  concrete = train_step.Trainer(fresh_model(mesh, "bfloat16"), mesh, opt, objective,
                                micro_batches=2, compiler_options=FAST_COMPILE)
  concrete.step(batch)
  want, got = concrete.memory_analysis, compiled.memory_analysis()
  assert got.argument_size_in_bytes == want.argument_size_in_bytes > 0
  assert got.output_size_in_bytes == want.output_size_in_bytes
  assert got.alias_size_in_bytes == want.alias_size_in_bytes > 0  # the state is donated
  assert lowered.as_text() == concrete.lower(batch).as_text()


@pytest.mark.parametrize("remat", ["full", pytest.param("dots", marks=pytest.mark.slow)])
def test_remat_chunked_head_and_activation_sharding_keep_loss_and_grads(remat):
  mesh = mesh_8()
  batch = make_batch(14)
  out = []
  for kw in (dict(remat="none", logits_chunk=0), dict(remat=remat, logits_chunk=6)):
    trainer = make_trainer(mesh, micro_batches=2, **kw)
    assert trainer.activation_sharding(P // 2 * G).spec == jax.sharding.PartitionSpec(
        "fsdp", None, None)
    out.append(host(trainer.loss_and_grads(batch)))
  (loss_ref, grads_ref), (loss, grads) = out
  assert abs(loss - loss_ref) < 1e-5
  for a, b in zip(jax.tree.leaves(grads_ref), jax.tree.leaves(grads)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
  assert max(np.abs(g).max() for g in jax.tree.leaves(grads_ref)) > 1e-3
