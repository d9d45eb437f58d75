"""plan.programs' model FLOPs: an MoE counts the experts a token is routed to, not all."""

import pytest

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


@pytest.mark.slow  # 43 s on 2 cores; the one check that plan counts routing records (-m slow)
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


def test_train_step_temporaries_do_not_grow_with_the_slice():
  """Issue 68: on a slice with twice the trainer chips, 1 prompt of G rows per micro-batch no
  longer split over them and every chip computed the whole micro-batch (the paper recipe on
  a v5p-256: 667.70 GiB of temporaries a chip, against 63.19 on a v5p-128). The train step
  of one recipe planned on 2 and on 4 trainer chips: one row a chip on both, and no more
  temporaries per chip on the bigger slice (without the fix: 2.2x)."""
  import pytest  # pylint: disable=g-import-not-at-top
  pytest.importorskip("libtpu")
  import pathlib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import config  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.plan import chips, report  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(__file__).resolve().parents[2]
  # 2 completions of 512 tokens a prompt, 1 prompt per micro-batch: 2 rows, which the
  # 4-chip trainer cannot split.
  recipe = ["sft.steps=0", "rl.prompts_per_step=4", "rl.generations_per_prompt=2",
            "optim.micro_batch_prompts=1", "data.max_prompt_tokens=64",
            "sampler.max_new_tokens=448", "sampler.prompt_buckets=[64]", "sampler.num_slots=8"]
  rows = {}
  for topology, trainer in (("v5p-8", 2), ("v5p-16", 4)):
    cfg = config.load(root / "configs" / "cpu_tiny.yaml", recipe + [
        f"mesh.trainer_devices={trainer}", f"mesh.generator_devices={trainer}"])
    plan = report.run_plan(cfg, wiring.model_config_for(cfg, None), chips.resolve(topology),
                           only=["train_step"])
    rows[trainer] = plan["programs"]["train_step"]
  assert rows[2]["micro_batch_rows"] == 2 and "notes" not in rows[2]
  assert rows[4]["micro_batch_rows"] == 4  # 2 prompts a micro-batch on the bigger slice
  assert rows[4]["notes"] == ["optim.micro_batch_prompts 1 -> 2 per micro-batch: 2 rows do "
                              "not split over the trainer's 4 data-parallel chips, 4 do "
                              "(1 a chip)"]
  assert rows[2]["micro_batch_rows_per_chip"] == rows[4]["micro_batch_rows_per_chip"] == 1
  assert (rows[4]["temporaries_bytes_per_chip"] <= rows[2]["temporaries_bytes_per_chip"]), rows
