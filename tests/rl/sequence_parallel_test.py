"""optim.sequence_parallel: the train step's residual stream split along the sequence over
'tp' gives the same loss and gradients as without it, and the compiled step really keeps
each layer's remat residual split (a flag that changed nothing would fail here)."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from jaxrl_scale import config
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import config as model_config
from jaxrl_scale.parallel import mesh as mesh_lib
from jaxrl_scale.rl import train_step
from tests import random_batch, random_model

P, G, S, PROMPT_LEN = 4, 4, 20, 4
FSDP, TP, MICRO = 2, 4, 2
FAST_COMPILE = {"xla_backend_optimization_level": 0}
# tp 4 divides the heads, kv heads, both MLP sizes and the vocab; fsdp 2 the model dim.
DENSE = model_config.ModelConfig(
    family="llama", vocab_size=64, hidden_size=32, num_layers=2, num_heads=8,
    num_kv_heads=4, head_dim=8, intermediate_size=64)
# tiny_qwen3_moe's shape at these sizes: three layers, the middle one dense.
MOE = model_config.ModelConfig(
    family="qwen3_moe", vocab_size=64, hidden_size=32, num_layers=3, num_heads=8,
    num_kv_heads=4, head_dim=8, intermediate_size=64, qk_norm=True, num_experts=4,
    experts_per_token=2, moe_intermediate_size=16, norm_topk_prob=True, mlp_only_layers=(1,),
    router_aux_loss_coef=0.001)


def _mesh(tp=TP):
  return jax.make_mesh((8 // tp, tp), mesh_lib.TRAINER_AXES,
                       axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])


def _model(cfg, mesh, scale):
  """The same random float32 model (built in NumPy) in fresh buffers on `mesh`."""
  return random_model.random_model(cfg, mesh, scale)


def _trainer(cfg, mesh, sequence_parallel, scale=0.1):
  opt = config.OptimConfig(lr=1e-3, warmup_steps=0, remat="full", logits_chunk=8,
                           sequence_parallel=sequence_parallel)
  trainer = train_step.Trainer(_model(cfg, mesh, scale), mesh, opt,
                               train_step.RLObjective(config.RLConfig(), temperature=1.0),
                               micro_batches=MICRO, compiler_options=FAST_COMPILE)
  # The layer scan, as on TPUs (where sequence parallelism matters): its stacked residual
  # is what the HLO checks below look for; on CPU the trainer would unroll the layers.
  trainer.unroll_layers = False
  return trainer


def _batch(seed=1):
  return random_batch.rl_batch(seed, prompts=P, generations=G, seq_len=S,
                              prompt_len=PROMPT_LEN)


def _saved_residual_shapes(cfg, hlo: str) -> tuple[int, int]:
  """How often the compiled step names the per-device stacked layer residual
  f32[L, rows, S, D] (whole sequence) and f32[L, rows, S / tp, D] (split)."""
  rows = P * G // MICRO // FSDP
  whole = f"f32[{cfg.num_layers},{rows},{S},{cfg.hidden_size}]"
  split = f"f32[{cfg.num_layers},{rows},{S // TP},{cfg.hidden_size}]"
  return hlo.count(whole), hlo.count(split)


def _loss_and_grads(trainer, batch):
  loss, grads = trainer.loss_and_grads(batch)
  return float(loss), jax.device_get(grads)


def _assert_same(a, b):
  (loss0, grads0), (loss1, grads1) = a, b
  assert np.isfinite(loss0)
  np.testing.assert_allclose(loss1, loss0, atol=1e-5, rtol=0)
  flat1 = dict(jax.tree_util.tree_flatten_with_path(grads1)[0])
  for path, g0 in jax.tree_util.tree_flatten_with_path(grads0)[0]:
    np.testing.assert_allclose(flat1[path], g0, atol=1e-5, rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_dense_same_loss_and_grads_and_the_saved_residual_is_split():
  batch, mesh = _batch(), _mesh()
  plain, split = _trainer(DENSE, mesh, False), _trainer(DENSE, mesh, True)
  _assert_same(_loss_and_grads(plain, batch), _loss_and_grads(split, batch))
  # Without it every tp chip keeps each layer's whole [rows, S, D] input for the backward
  # pass; with it only its S / tp slice, and never the whole one.
  whole, part = _saved_residual_shapes(DENSE, plain.compile(batch).as_text())
  assert whole > 0 and part == 0
  whole, part = _saved_residual_shapes(DENSE, split.compile(batch).as_text())
  assert part > 0 and whole == 0


@pytest.mark.slow  # the dense case above runs by default (14 s each on 2 cores)
def test_moe_same_loss_and_grads_and_the_saved_residual_is_split():
  # Weights of std 0.3 so that routing varies between tokens; the middle layer is dense
  # (the interleave's per-layer choice runs under the split carry too).
  batch, mesh = _batch(), _mesh()
  split = _trainer(MOE, mesh, True, scale=0.3)
  _assert_same(_loss_and_grads(_trainer(MOE, mesh, False, scale=0.3), batch),
               _loss_and_grads(split, batch))
  whole, part = _saved_residual_shapes(MOE, split.compile(batch).as_text())
  assert part > 0 and whole == 0


def test_residual_sharding_splits_the_sequence_over_tp():
  trainer = _trainer(DENSE, _mesh(), True)
  assert trainer.residual_sharding(8, S) == NamedSharding(
      trainer.mesh, PartitionSpec("fsdp", "tp", None))
  # Rows that do not split over the data axes: only the sequence is split.
  assert trainer.residual_sharding(3, S).spec == PartitionSpec(None, "tp", None)
  assert _trainer(DENSE, _mesh(), False).residual_sharding(8, S) is None


def test_tp_1_is_a_no_op():
  # Nothing to split over: the program is the one without the flag.
  assert _trainer(DENSE, _mesh(tp=1), True).residual_sharding(8, S) is None


def test_sequence_not_divisible_by_tp_is_a_one_line_error():
  trainer = _trainer(DENSE, _mesh(), True)
  with pytest.raises(UserError, match=r"optim.sequence_parallel.*18.*tp=4"):
    trainer.residual_sharding(8, 18)
  with pytest.raises(UserError, match=r"optim.sequence_parallel.*2060.*trainer_tp=8") as err:
    config.load(None, ["optim.sequence_parallel=true", "mesh.trainer_tp=8",
                       "data.max_prompt_tokens=12", "sampler.max_new_tokens=2048"])
  assert "\n" not in str(err.value)
  # Divisible, or tp 1: accepted.
  config.load(None, ["optim.sequence_parallel=true", "mesh.trainer_tp=8",
                     "data.max_prompt_tokens=16", "sampler.max_new_tokens=2048"])
  config.load(None, ["optim.sequence_parallel=true", "data.max_prompt_tokens=7"])
