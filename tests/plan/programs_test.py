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


def test_an_moe_run_with_routing_records_plans_them():
  """With model.routing record/replay the train step takes the sampler's [P, G, S, L, K]
  records and the sampler's programs return them; `plan` compiles both that way."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).resolve().parents[2]
  texts = {}
  for routing in ("own", "replay"):
    cfg = config.load(root / "configs" / "cpu_tiny_moe.yaml",
                      [f"model.routing={routing}", "sft.steps=0"])
    mcfg = wiring.model_config_for(cfg, None)
    _, progs = programs.build(cfg, mcfg, jax.devices())
    texts[routing] = {p.name: p.lower().as_text() for p in progs
                      if p.name in ("train_step", "prefill", "decode")}
  p, g = cfg.rl.prompts_per_step, cfg.rl.generations_per_prompt
  s = cfg.data.max_prompt_tokens + cfg.sampler.max_new_tokens
  sparse, k = sum(mcfg.moe_layers()), mcfg.experts_per_token
  records = f"tensor<{p}x{g}x{s}x{sparse}x{k}xui8"
  assert records in texts["replay"]["train_step"]
  assert records not in texts["own"]["train_step"]
  for name in ("prefill", "decode"):  # the routing output, [.., L, K] uint8
    assert f"x{sparse}x{k}xui8>" in texts["replay"][name], name
    assert f"x{sparse}x{k}xui8>" not in texts["own"][name], name
