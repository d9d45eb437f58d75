"""Qwen3-MoE against transformers beyond logits: greedy decoding through our Sampler
(prefill, paged decode, every layer-loop path), the load-balancing loss."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import decode, engine, records
from jaxrl_scale.models import hf_io
from jaxrl_scale.parallel import mesh as mesh_lib

SAMPLER = SamplerConfig(num_slots=3, max_new_tokens=12, temperature=0.0, decode_chunk=4,
                        prompt_buckets=(16,))


@pytest.fixture(scope="module")
def moe_model(hf_checkpoints):
  path, hf_model = hf_checkpoints["qwen3_moe"]
  model, cfg = hf_io.load_hf_model(path)
  return model, cfg, hf_model


def _hf_greedy(hf_model, prompt, max_new, eos):
  import torch

  with torch.no_grad():
    out = hf_model.generate(
        input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=int),
        max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0,
        output_logits=True, return_dict_in_generate=True)
  tokens = out.sequences[0, len(prompt):].tolist()
  logprobs = [torch.log_softmax(step[0].float(), -1)[t].item()
              for step, t in zip(out.logits, tokens)]
  return tokens, np.asarray(logprobs)


def _forget_programs():
  for program in (decode.admit_program, decode.decode_program, decode.layers_program):
    program.cache_clear()


@pytest.fixture(scope="module")
def greedy_refs(moe_model):
  """(prompts, eos, transformers' greedy (tokens, logprobs) of each prompt)."""
  model, cfg, hf_model = moe_model
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, cfg.vocab_size, n).tolist() for n in (3, 11, 6, 1, 14, 8)]
  free = [_hf_greedy(hf_model, p, SAMPLER.max_new_tokens, 2)[0] for p in prompts]
  # EOS: a token the free runs emit mid-sequence, so that some rows really stop early.
  mid = [t for toks in free for t in set(toks[1:-2])]
  eos = max(set(mid), key=lambda t: (mid.count(t), -t))
  refs = [_hf_greedy(hf_model, p, SAMPLER.max_new_tokens, eos) for p in prompts]
  assert sum(len(t) < SAMPLER.max_new_tokens for t, _ in refs) >= 2
  return prompts, eos, refs


def _check(sampler, greedy_refs):
  prompts, _, refs = greedy_refs
  for out, (tokens, logprobs) in zip(sampler.generate(
      [records.Request(p, prompt_id=i) for i, p in enumerate(prompts)]), refs):
    assert out.tokens.tolist() == tokens
    np.testing.assert_allclose(out.logprobs, logprobs, atol=1e-4, rtol=0)


def test_greedy_through_the_sampler_matches_transformers(moe_model, greedy_refs):
  # Six prompts of different lengths through 3 slots (batched prefill, continuous batching);
  # on CPU the decode steps run the layers unrolled over per-layer cache views.
  _check(engine.Sampler(moe_model[0], SAMPLER, eos_ids=[greedy_refs[1]]), greedy_refs)


@pytest.mark.slow
def test_greedy_on_the_accelerator_layer_paths_matches_transformers(moe_model, greedy_refs,
                                                                   monkeypatch):
  # The accelerator paths: per-layer weight copies, and the scan over the stacked weights.
  model, eos = moe_model[0], greedy_refs[1]
  _forget_programs()
  monkeypatch.setattr(decode, "on_cpu", lambda mesh: False)
  try:
    copies = engine.Sampler(model, SAMPLER, eos_ids=[eos])
    assert copies._layer_leaves is not None
    _check(copies, greedy_refs)
    stacked = engine.Sampler(model, dataclasses.replace(SAMPLER, layer_weight_copies=False),
                             eos_ids=[eos])
    assert stacked._layer_leaves is None
    _check(stacked, greedy_refs)
  finally:
    _forget_programs()


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_step2"])
def test_load_balancing_loss_matches_transformers(name, hf_checkpoints, hf_helpers):
  import torch
  from transformers.models.qwen3_moe import modeling_qwen3_moe

  path, hf_model = hf_checkpoints[name]
  model, cfg = hf_io.load_hf_model(path)
  tokens, positions, mask = hf_helpers.padded_batch(cfg.vocab_size, [9, 5, 2], 9, left=True)
  _, stats = nnx.jit(lambda m, *a: m.hidden_states_with_stats(*a))(
      model, *(jnp.asarray(x) for x in (tokens, positions, mask)))
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions),
                   attention_mask=torch.tensor(mask.astype(np.int64)), output_router_logits=True)
  assert len(out.router_logits) == sum(cfg.moe_layers())
  want = modeling_qwen3_moe.load_balancing_loss_func(
      out.router_logits, cfg.num_experts, cfg.experts_per_token,
      torch.tensor(mask.astype(np.int64)))
  np.testing.assert_allclose(float(stats.load_balancing_loss()), float(want), rtol=1e-5)
  assert float(stats.tokens) == mask.sum() * sum(cfg.moe_layers())


@pytest.mark.slow  # ~35 s; the default run covers the shard_map path in moe_train_test
def test_greedy_on_a_generator_mesh_matches_transformers(moe_model, greedy_refs):
  # Rows over 'data' (each shard's prompts sorted to their experts on their own, in a
  # shard_map), F of the experts over 'tp' (partial sums added).
  import jax

  mesh = jax.make_mesh((2, 2), mesh_lib.GENERATOR_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.devices()[:4])
  sampler = engine.Sampler(moe_model[0], dataclasses.replace(SAMPLER, num_slots=4), mesh=mesh,
                           eos_ids=[greedy_refs[1]])
  gate = sampler.params["layers"]["moe"]["gate_proj"][...]
  assert gate.sharding.spec == jax.sharding.PartitionSpec(None, None, None, "tp")
  _check(sampler, greedy_refs)
