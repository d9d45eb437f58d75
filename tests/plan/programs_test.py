"""plan.programs' model FLOPs: an MoE counts the experts a token is routed to, not all."""

from jaxrl_scale.models import config as model_config
from jaxrl_scale.plan import programs


def test_moe_model_flops_count_the_active_experts_only():
  moe = model_config.preset("qwen3_30b_a3b")
  embed = 0 if moe.tie_embeddings else moe.vocab_size * moe.hidden_size
  assert programs.matmul_params(moe) == moe.num_params(active=True) - embed
  # 30.5B total, 3.35B active: 6N per token would be ~9x too large with every expert.
  assert programs.matmul_params(moe) < 0.15 * moe.num_params()
  dense = model_config.preset("qwen3_8b")
  assert programs.matmul_params(dense) == dense.num_params() - (
      0 if dense.tie_embeddings else dense.vocab_size * dense.hidden_size)
