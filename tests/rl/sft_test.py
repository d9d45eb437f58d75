import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxrl_scale import config
from jaxrl_scale.models import config as model_config
from jaxrl_scale.models import sharding
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import batch as batch_lib
from jaxrl_scale.rl import sft

BOS, SEP, EOS, DIGIT0 = 1, 2, 3, 10
SEQ_LEN = 10
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # halves CPU compile time


def tiny_cfg() -> model_config.ModelConfig:
  return model_config.ModelConfig(family="llama", vocab_size=32, hidden_size=64, num_layers=2,
                                  num_heads=4, num_kv_heads=2, head_dim=16,
                                  intermediate_size=128)


def make_model(mesh, seed: int = 0):
  """Random params drawn in NumPy and placed on `mesh` (XLA-compiling a random init costs
  seconds on CPU)."""
  graphdef, abstract = sharding.abstract_model(tiny_cfg())
  rng = np.random.default_rng(seed)

  def one(path, x):
    shape = x.get_value().shape
    if getattr(path[-1], "key", None) == "scale":  # RMSNorm scales start at 1
      return x.replace(np.ones(shape, np.float32))
    return x.replace((0.02 * rng.standard_normal(shape)).astype(np.float32))

  state = jax.tree.map_with_path(one, abstract, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh)))


def toy_examples(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
  """Prompt: three digits; solution: each digit + 1 (mod 10), in reverse order, then EOS."""
  digits = np.random.default_rng(seed).integers(0, 10, size=(n, 3))
  return [([BOS, *(DIGIT0 + d).tolist(), SEP], [*(DIGIT0 + (d[::-1] + 1) % 10).tolist(), EOS])
          for d in digits]


def greedy_solved(model, examples) -> float:
  """Fraction of examples whose every solution token is the model's argmax (teacher forced),
  computed straight from the logits, independently of the trainer's metrics."""
  b = batch_lib.pack_sft([p for p, _ in examples], [s for _, s in examples], seq_len=SEQ_LEN)
  logits = np.asarray(nnx.jit(lambda m, t, p, k: m(t, p, k))(
      model, b.tokens_BS, b.positions_BS, b.input_mask_BS))
  pred = logits[:, :-1].argmax(-1)
  target, mask = b.tokens_BS[:, 1:], b.loss_mask_BS[:, 1:] > 0
  return float(np.mean(np.all((pred == target) | ~mask, axis=-1)))


def test_pack_sft_masks_only_solution_tokens():
  b = batch_lib.pack_sft([[1, 2, 3]], [[7, 8]], seq_len=8, pad_id=0, batch_size=2)
  np.testing.assert_array_equal(b.tokens_BS[0], [1, 2, 3, 7, 8, 0, 0, 0])
  np.testing.assert_array_equal(b.loss_mask_BS[0], [0, 0, 0, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(b.input_mask_BS[0], [1, 1, 1, 1, 1, 0, 0, 0])
  assert not b.loss_mask_BS[1].any() and not b.input_mask_BS[1].any()  # padding row


def test_sft_learns_a_deterministic_toy_task():
  mesh = mesh_lib.single_device_mesh()
  model = make_model(mesh)
  examples = toy_examples(200)
  before = greedy_solved(model, examples)
  cfg = config.SFTConfig(steps=100, lr=1e-2, batch_size=50, warmup_steps=10)
  seen = []
  result = sft.run_sft(model, mesh, cfg, config.OptimConfig(), examples, seq_len=SEQ_LEN,
                       on_metrics=lambda step, m: seen.append(step),
                       compiler_options=FAST_COMPILE)
  losses = [h["loss"] for h in result.history]
  assert seen == list(range(100)) and len(losses) == 100
  assert np.mean(losses[-10:]) < 0.2 * losses[0]
  assert result.epochs == 25  # 200 examples / 50 per batch, cycled
  assert result.trainer.trace_count == 1
  after = greedy_solved(result.trainer.model(), examples)
  assert before < 0.05 and after >= 0.8
  assert result.history[-1]["token_accuracy"] > 0.8


def test_sft_sharded_micro_batched_matches_single_device():
  examples = toy_examples(16, seed=1)
  cfg = config.SFTConfig(steps=3, lr=1e-2, batch_size=8, warmup_steps=0)
  runs = []
  for mesh, micro in ((mesh_lib.single_device_mesh(), 0),
                      (jax.make_mesh((4, 2), mesh_lib.TRAINER_AXES,
                                     axis_types=(jax.sharding.AxisType.Auto,) * 2), 4)):
    model = make_model(mesh, seed=3)
    run_cfg = dataclasses.replace(cfg, micro_batch_size=micro)
    runs.append(sft.run_sft(model, mesh, run_cfg, config.OptimConfig(), examples,
                            seq_len=SEQ_LEN, compiler_options=FAST_COMPILE))
  single, sharded = ([h["loss"] for h in r.history] for r in runs)
  np.testing.assert_allclose(sharded, single, atol=1e-5)
  assert single[2] < single[0]


def test_run_sft_drops_long_examples_and_stops_when_an_iterator_runs_out():
  mesh = mesh_lib.single_device_mesh()
  model = make_model(mesh)
  examples = toy_examples(5) + [([BOS] * 8, [EOS] * 4)]  # 12 tokens > SEQ_LEN
  cfg = config.SFTConfig(steps=10, lr=1e-3, batch_size=4, warmup_steps=0)
  result = sft.run_sft(model, mesh, cfg, config.OptimConfig(), iter(examples),
                       seq_len=SEQ_LEN, compiler_options=FAST_COMPILE)
  # 5 usable examples: one full batch and one padded batch, then the iterator is spent.
  assert len(result.history) == 2 and result.skipped_too_long == 1
  assert [h["num_loss_tokens"] for h in result.history] == [16.0, 4.0]
