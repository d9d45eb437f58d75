"""Routing replay for MoE policies: the sampler records the experts it ran, the trainer's
forward replays them (gates still from its own router), and `routing_mismatch` says how
often the trainer's own top-k would have chosen otherwise."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType

from jaxrl_scale import config
from jaxrl_scale.generation import engine, records
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import moe, sharding
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import logprobs, train_step

P, G, S, MAX_PROMPT = 4, 4, 16, 6
# Layer 0 dense, layer 1 sparse (the interleave's per-layer choice runs under replay too);
# fsdp=4 divides the model dim, tp=2 heads, kv heads, both MLP sizes and the vocab.
CFG = model_config.ModelConfig(
    family="qwen3_moe", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, intermediate_size=64, qk_norm=True, num_experts=4,
    experts_per_token=2, moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=(0,))
FAST_COMPILE = {"xla_backend_optimization_level": 0}
TEMPERATURE = 0.8


def _mesh_8():
  return jax.make_mesh((4, 2), mesh_lib.TRAINER_AXES, axis_types=(AxisType.Auto,) * 2,
                       devices=jax.devices()[:8])


@functools.cache
def _state(tied: bool, nudge: float):
  """Random params (NumPy, O(0.3) so routing varies). `tied`: expert 3's router column is
  expert 2's, so the two tie on every token (top-k then takes expert 2, the lower index);
  `nudge` adds that much noise to expert 3's column, which breaks the ties one way or the
  other: a router that differs by rounding-sized amounts, as a sampler's does."""
  graphdef, abstract = sharding.abstract_model(CFG)
  rng = np.random.default_rng(0)

  def one(path, x):
    keys = [getattr(p, "key", None) for p in path]
    shape = x.get_value().shape
    if keys[-1] == "scale":
      return x.replace(np.ones(shape, np.float32))
    value = (0.3 * rng.standard_normal(shape)).astype(np.float32)
    if keys[-1] == "router" and tied:  # [L, D, E]
      value[..., 3] = value[..., 2]
      value[..., 3] += nudge * np.random.default_rng(1).standard_normal(value[..., 3].shape)
    return x.replace(value)

  state = jax.tree.map_with_path(one, abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return graphdef, state


def _model(mesh, tied=False, nudge=0.0):
  graphdef, state = _state(tied, nudge)
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def _rollouts(model, seed, prefill_chunk=0):
  """On-policy completions of `model` with routing records, packed into a TrainBatch."""
  sampler = engine.Sampler(
      model, config.SamplerConfig(num_slots=8, max_new_tokens=S - MAX_PROMPT,
                                  temperature=TEMPERATURE, decode_chunk=4,
                                  prompt_buckets=(8,), prefill_chunk=prefill_chunk),
      eos_ids=(), seed=3, max_prompt_len=MAX_PROMPT, record_routing=True)
  rng = np.random.default_rng(seed)
  prompts = [[int(t) for t in rng.integers(1, 64, size=rng.integers(2, MAX_PROMPT + 1))]
             for _ in range(P)]
  done = sampler.generate([records.Request(prompts[p], prompt_id=p, sample_index=g)
                           for p in range(P) for g in range(G)])
  grid = lambda f: [[f(done[p * G + g]) for g in range(G)] for p in range(P)]  # noqa: E731
  batch = batch_lib.pack_rl(prompts, grid(lambda c: c.tokens.tolist()),
                            grid(lambda c: c.logprobs.tolist()), rng.normal(size=(P, G)),
                            seq_len=S, routing=grid(lambda c: c.routing))
  return batch, done


def _trainer(mesh, replay, model=None, **optim):
  opt = config.OptimConfig(lr=1e-3, warmup_steps=0, **optim)
  objective = train_step.RLObjective(config.RLConfig(), temperature=TEMPERATURE,
                                     replay_routing=replay)
  return train_step.Trainer(model if model is not None else _model(mesh), mesh, opt,
                            objective, micro_batches=2, compiler_options=FAST_COMPILE)


def _logprobs(model, batch, replay):
  """The trainer-side forward of every row: (logp [P, G, S], routing mismatch)."""
  rows = lambda x: jnp.asarray(x).reshape((P * G,) + x.shape[2:])  # noqa: E731
  fn = nnx.jit(functools.partial(logprobs.token_logprobs_and_stats, temperature=TEMPERATURE,
                                 replay=replay))
  logp, _, stats = fn(model, rows(batch.tokens_PGS), rows(batch.positions_PGS),
                      rows(batch.input_mask_PGS), routing_BSLK=rows(batch.routing_PGSLK))
  return np.asarray(logp).reshape(P, G, S), float(stats.routing_mismatch())


def test_sampler_records_every_fed_position_and_nothing_for_a_dense_model():
  batch, done = _rollouts(_model(mesh_lib.single_device_mesh()), seed=5, prefill_chunk=2)
  for c in done:
    n = len(c.prompt_tokens) - 1 + c.num_tokens
    assert c.routing.shape == (n, 1, 2) and c.routing.dtype == np.uint8
    assert (c.routing < CFG.num_experts).all()
    assert (c.routing[:, 0, 0] != c.routing[:, 0, 1]).all()  # top-2: two distinct experts
  # The records are the trainer's own routing of the same policy (on-policy: no mismatch),
  # prompt pieces (prefill_chunk=2) and decode steps in position order.
  assert _logprobs(_model(mesh_lib.single_device_mesh()), batch, replay=False)[1] == 0.0
  mask = batch_lib.recorded_mask(batch.input_mask_PGS)
  assert mask.sum() == sum(len(c.prompt_tokens) - 1 + c.num_tokens for c in done)
  assert not batch.routing_PGSLK[~mask].any()

  dense = model_config.ModelConfig(family="qwen3", vocab_size=64, hidden_size=32,
                                   num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                                   intermediate_size=64, qk_norm=True)
  sampler = engine.Sampler(nnx.merge(sharding.abstract_model(dense)[0], _dense_state(dense)),
                           config.SamplerConfig(num_slots=4, max_new_tokens=3,
                                                prompt_buckets=(8,)),
                           eos_ids=(), record_routing=True)
  assert not sampler.record_routing
  assert sampler.generate([[1, 2, 3]])[0].routing is None


def _dense_state(cfg):
  _, abstract = sharding.abstract_model(cfg)
  return jax.tree.map(lambda x: x.replace(np.full(x.get_value().shape, 0.05, np.float32)),
                      abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))


def test_replay_scores_the_samplers_routing_when_the_trainers_router_differs():
  """The sampler's router ties experts 2 and 3 everywhere; the trainer's differs by 1e-5
  noise on expert 3's column (a stale or differently rounded copy). Its own top-k then
  flips the tie on some tokens (different experts: log-probs far off); replayed, it runs
  the sampler's experts with gates that moved by ~1e-5, and scores the sampler's tokens
  with the sampler's log-probs."""
  sampler_model = _model(mesh_lib.single_device_mesh(), tied=True)
  batch, _ = _rollouts(sampler_model, seed=7)
  mask = batch.loss_mask_PGS > 0
  trainer_model = _model(mesh_lib.single_device_mesh(), tied=True, nudge=1e-5)

  own, own_mismatch = _logprobs(trainer_model, batch, replay=False)
  replayed, replay_mismatch = _logprobs(trainer_model, batch, replay=True)
  own_err = np.abs(own - batch.gen_logp_PGS)[mask]
  replay_err = np.abs(replayed - batch.gen_logp_PGS)[mask]
  assert own_mismatch > 0.02 and replay_mismatch == own_mismatch
  assert own_err.max() > 1e-2, own_err.max()  # the flips are visible: the check can fail
  assert replay_err.max() < 1e-4, replay_err.max()
  # The sampler's own model, without replay, agrees too (the ties break alike).
  same, same_mismatch = _logprobs(sampler_model, batch, replay=False)
  assert same_mismatch == 0.0 and np.abs(same - batch.gen_logp_PGS)[mask].max() < 1e-4

  # The same through the sharded train step: ratios 1 with replay, not without.
  for replay, on_policy in ((True, True), (False, False)):
    trainer = _trainer(_mesh_8(), replay, _model(_mesh_8(), tied=True, nudge=1e-5),
                       logits_chunk=5, remat="full")
    metrics = jax.device_get(trainer.step(batch))
    gap = max(abs(metrics["ratio_min"] - 1), abs(metrics["ratio_max"] - 1))
    assert (gap < 1e-4) if on_policy else (gap > 1e-2), (replay, gap)
    np.testing.assert_allclose(metrics["routing_mismatch"], own_mismatch, rtol=1e-6)


def test_on_policy_replay_step_ratio_one_compiles_once_and_moves_the_router():
  batch, _ = _rollouts(_model(mesh_lib.single_device_mesh()), seed=11)
  trainer = _trainer(_mesh_8(), replay=True, logits_chunk=6)
  _, grads = trainer.loss_and_grads(batch)
  router_grad = np.asarray(grads["layers"]["moe"]["router"][...])
  assert np.abs(router_grad[1]).max() > 1e-6  # the sparse layer's gates carry gradient
  first = jax.device_get(trainer.step(batch))
  assert abs(first["ratio_min"] - 1) < 1e-4 and abs(first["ratio_max"] - 1) < 1e-4
  assert first["routing_mismatch"] == 0.0
  # Other records of the same shapes (another batch): no second trace or compile.
  other, _ = _rollouts(_model(mesh_lib.single_device_mesh()), seed=12)
  second = jax.device_get(trainer.step(other))
  assert not second["nonfinite"]
  assert trainer.trace_count == 1 and trainer.cache_size() == 1


def _reference_moe(params, x_ND, experts_NK, cfg):
  """The MoE output with the given experts, built by hand: each (token, slot) gathers its
  expert's weights and runs its SwiGLU; gates are the router softmax at those experts,
  renormalised (norm_topk_prob)."""
  probs_NE = jax.nn.softmax(jnp.dot(x_ND, params["router"],
                                    precision=jax.lax.Precision.HIGHEST), axis=-1)
  gates_NK = jnp.take_along_axis(probs_NE, experts_NK, axis=-1)
  gates_NK = gates_NK / jnp.sum(gates_NK, axis=-1, keepdims=True)
  hi = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  gate_NKDF = params["gate_proj"][experts_NK]
  up_NKDF = params["up_proj"][experts_NK]
  down_NKFD = params["down_proj"][experts_NK]
  h_NKF = jax.nn.silu(hi("nd,nkdf->nkf", x_ND, gate_NKDF)) * hi("nd,nkdf->nkf", x_ND, up_NKDF)
  return hi("nk,nkf,nkfd->nd", gates_NK, h_NKF, down_NKFD)


def test_replayed_block_equals_a_hand_built_gather_of_the_chosen_experts_and_its_grads():
  cfg = model_config.ModelConfig(
      family="qwen3_moe", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
      num_kv_heads=1, head_dim=8, intermediate_size=32, qk_norm=True, num_experts=6,
      experts_per_token=2, moe_intermediate_size=8, norm_topk_prob=True)
  block = moe.MoE(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(3)
  for _, v in nnx.to_flat_state(nnx.state(block, nnx.Param)):
    v.set_value(jnp.asarray(0.5 * rng.standard_normal(v.get_value().shape), jnp.float32))
  graphdef, state = nnx.split(block)
  x_BTD = jnp.asarray(rng.standard_normal((2, 5, 16)), jnp.float32)
  # Recorded choices unlike the router's own: two distinct random experts per token.
  recorded_BTK = np.stack([rng.permutation(6)[:2] for _ in range(10)]).reshape(2, 5, 2)
  recorded_BTK = jnp.asarray(recorded_BTK, jnp.uint8)
  r_BTD = jnp.asarray(rng.standard_normal((2, 5, 16)), jnp.float32)

  def replayed(s):
    y_BTD, stats, experts_BTK = nnx.merge(graphdef, s).apply(x_BTD, recorded_BTK=recorded_BTK,
                                                             replay=True)
    return jnp.sum(y_BTD * r_BTD), (y_BTD, stats, experts_BTK)

  def reference(s):
    params = {k: v for k, v in nnx.to_pure_dict(s).items() if not isinstance(v, dict)}
    y_ND = _reference_moe(params, x_BTD.reshape(10, 16),
                          recorded_BTK.reshape(10, 2).astype(jnp.int32), cfg)
    return jnp.sum(y_ND.reshape(2, 5, 16) * r_BTD), y_ND.reshape(2, 5, 16)

  (_, (y, stats, experts)), grads = jax.jit(jax.value_and_grad(replayed, has_aux=True))(state)
  (_, y_ref), grads_ref = jax.jit(jax.value_and_grad(reference, has_aux=True))(state)
  np.testing.assert_array_equal(np.asarray(experts), np.asarray(recorded_BTK))
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-4, atol=1e-5)
  for name in ("router", "gate_proj", "up_proj", "down_proj"):
    g, g_ref = np.asarray(grads[name][...]), np.asarray(grads_ref[name][...])
    assert np.abs(g_ref).max() > 0
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5, err_msg=name)
  # The mismatch counts recorded choices the router's own top-2 lacks, by hand.
  own = np.asarray(block.route(x_BTD.reshape(10, 16))[1])
  rec = np.asarray(recorded_BTK).reshape(10, 2)
  want = sum(e not in own[i] for i in range(10) for e in rec[i]) / 20
  assert want > 0
  np.testing.assert_allclose(float(stats.routing_mismatch()), want, rtol=1e-6)

  # Without replay the same records only feed the metric: the output is the router's own.
  y_own, _ = block(x_BTD)
  y_rec, stats_rec, _ = block.apply(x_BTD, recorded_BTK=recorded_BTK, replay=False)
  np.testing.assert_array_equal(np.asarray(y_own), np.asarray(y_rec))
  assert float(stats_rec.routing_mismatch()) == float(stats.routing_mismatch())


def test_pack_rl_rejects_routing_of_the_wrong_length():
  routing = [[np.zeros((3, 1, 2), np.uint8)]]
  batch = batch_lib.pack_rl([[1, 2]], [[[3, 4]]], [[[-1.0, -1.0]]], np.zeros((1, 1)),
                            seq_len=6, routing=routing)
  assert batch.routing_PGSLK.shape == (1, 1, 6, 1, 2)
  with pytest.raises(ValueError, match="covers 2 positions, expected 3"):
    batch_lib.pack_rl([[1, 2]], [[[3, 4]]], [[[-1.0, -1.0]]], np.zeros((1, 1)), seq_len=6,
                      routing=[[np.zeros((2, 1, 2), np.uint8)]])


def test_a_tail_on_fewer_rows_records_the_same_routing():
  # EOS on, so rows end at different steps and the tail runs on 4 of the 8 slots: the
  # routing records are scattered back to their slots with the tokens.
  model = _model(mesh_lib.single_device_mesh())
  rng = np.random.default_rng(1)
  prompts = [[int(t) for t in rng.integers(1, 64, size=rng.integers(2, MAX_PROMPT + 1))]
             for _ in range(6)]
  runs = []
  for buckets in (1, 2):
    sampler = engine.Sampler(
        model, config.SamplerConfig(num_slots=8, max_new_tokens=S - MAX_PROMPT,
                                    temperature=TEMPERATURE, decode_chunk=2,
                                    prompt_buckets=(8,), decode_row_buckets=buckets),
        eos_ids=tuple(range(1, 64, 5)), seed=3, max_prompt_len=MAX_PROMPT,
        record_routing=True)
    runs.append(sampler.generate([records.Request(p, prompt_id=i, sample_index=g)
                                  for i, p in enumerate(prompts) for g in range(2)]))
    assert (sampler.stats.row_chunks > 0) == (buckets == 2)
  assert len({c.num_tokens for c in runs[0]}) > 2  # ragged lengths: a real tail
  for full, rows in zip(*runs):
    assert full.tokens.tolist() == rows.tokens.tolist()
    np.testing.assert_array_equal(full.routing, rows.routing)
    np.testing.assert_allclose(full.logprobs, rows.logprobs, atol=1e-5, rtol=0)
