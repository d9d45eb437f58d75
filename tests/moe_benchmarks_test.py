"""The benchmarks count an MoE model's active parameters: the top-k experts a token runs."""

import pathlib
import sys

from jaxrl_scale.models import config as model_config

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmarks.* by name
from benchmarks.sampler import sampler_bench  # noqa: E402
from benchmarks.train import train_step_bench  # noqa: E402


def test_train_step_flops_take_the_active_parameters_of_an_moe():
  cfg = model_config.tiny_qwen3_moe()
  total, active = cfg.num_params(), cfg.num_params(active=True)
  assert active < total
  assert train_step_bench.flop_params(cfg, total) == active
  dense = model_config.tiny_llama()
  assert train_step_bench.flop_params(dense, 12345) == 12345  # a dense model: all of them
  # 6 N per token: the MoE's step is credited with its active FLOPs only.
  rows, s = 2, 8
  attention = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * s * rows * s
  assert train_step_bench.model_flops(cfg, active, rows, s) == 6 * active * rows * s + attention


def test_sampler_floor_runs_the_active_matmuls_of_an_moe_decode_step():
  """tiny_qwen3_moe: layers 0 and 2 sparse (router + 2 experts of 32), layer 1 dense (128)."""
  cfg = model_config.tiny_qwen3_moe()
  batch = 4
  run, args = sampler_bench.floor_program(cfg, batch, "float32", steps=3)
  flops = run.lower(*args).compile().cost_analysis()["flops"]  # the loop body, counted once
  d = cfg.hidden_size
  nh, kh = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  attn = d * nh + 2 * d * kh + nh * d
  mlps = sum(d * cfg.num_experts + 3 * d * cfg.experts_per_token * cfg.moe_intermediate_size
             if sparse else 3 * d * cfg.intermediate_size for sparse in cfg.moe_layers())
  matmul_flops = 2 * batch * (cfg.num_layers * attn + mlps + cfg.vocab_size * d)
  # The active matmul parameters (the tied head counted once, as num_params does).
  assert mlps + cfg.num_layers * attn + cfg.vocab_size * d == (
      cfg.num_params(active=True) - cfg.num_layers * (2 * cfg.head_dim + 2 * d) - d)
  assert matmul_flops <= flops <= 1.25 * matmul_flops
