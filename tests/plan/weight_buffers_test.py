"""plan counts sampler.weight_buffers: with 1 there is no pending copy of the weights."""

import pathlib

import jax
import pytest

from jaxrl_scale import config
from jaxrl_scale.pipeline import wiring
from jaxrl_scale.plan import programs

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _programs(*overrides):
  cfg = config.load(ROOT / "configs" / "cpu_tiny.yaml", ["sft.steps=0", *overrides])
  mcfg = wiring.model_config_for(cfg, None)
  _, progs = programs.build(cfg, mcfg, jax.devices())
  return {p.name: p for p in progs}


@pytest.mark.parametrize("colocated", [False, True])
def test_one_weight_buffer_holds_no_pending_copy(colocated):
  mesh = [f"mesh.colocated={str(colocated).lower()}"]
  two = _programs(*mesh, "sampler.weight_buffers=2")
  one = _programs(*mesh, "sampler.weight_buffers=1")
  params = two["decode"].resident["params"]
  assert params > 0 and one["decode"].resident["params"] == params
  assert two["decode"].resident["pending_params"] == params
  assert one["decode"].resident["pending_params"] == 0
  for name in ("prefill", "decode"):  # the pending copy sits beside both
    assert two[name].also_resident - one[name].also_resident == params, name
  trainer = ("train_step", "weight_cast")
  if not colocated:  # the trainer's chips never see the sampler's memory
    for name in trainer:
      assert one[name].also_resident == two[name].also_resident, name
    return
  layers = one["decode"].resident.get("layer_copies", 0.0)
  sampler_one = sum(one["decode"].resident.values())
  assert sampler_one == sum(two["decode"].resident.values()) - params
  # The train step runs beside the sampler's one copy, KV cache and slot state.
  assert two["train_step"].also_resident - one["train_step"].also_resident == params
  # The cast of an update runs after the sampler has deleted its weights and layer copies.
  optimizer = one["train_step"].resident["optimizer"]
  assert "optimizer" not in one["weight_cast"].resident  # beside it, counted once
  assert one["weight_cast"].also_resident == optimizer + sampler_one - params - layers
  assert two["weight_cast"].also_resident == optimizer + sampler_one + params


@pytest.mark.parametrize("mode", ["colocated", "pipeline"])
def test_a_sleeping_sampler_leaves_the_trainer_its_chips(mode):
  """sampler.sleep_while_training: in the sync modes the train step, the SFT step and the
  cast run beside none of the sampler's state; pipeline mode overlaps the roles, so only the
  warm start's SFT step (before any rollout) does; with sleep off all of them count it."""
  base = ["sft.steps=5", f"pipeline.mode={mode}", "mesh.colocated=true"]
  cfg = config.load(ROOT / "configs" / "cpu_tiny.yaml", base)
  mcfg = wiring.model_config_for(cfg, None)
  progs = {p.name: p for p in programs.build(cfg, mcfg, jax.devices())[1]}
  off = {p.name: p for p in programs.build(
      config.load(ROOT / "configs" / "cpu_tiny.yaml", base + ["sampler.sleep_while_training=false"]),
      mcfg, jax.devices())[1]}
  sampler_state = sum(progs["decode"].resident.values())
  optimizer = progs["train_step"].resident["optimizer"]
  trainer_state = progs["train_step"].resident["params"] + optimizer
  assert sampler_state > 0
  assert progs["sft_step"].also_resident == 0
  assert off["sft_step"].also_resident == sampler_state
  assert off["train_step"].also_resident == sampler_state
  assert off["weight_cast"].also_resident == optimizer + sampler_state
  if mode == "colocated":
    assert progs["train_step"].also_resident == 0
    assert progs["weight_cast"].also_resident == optimizer
    assert any("sampler sleeps" in n for n in progs["train_step"].notes)
  else:
    assert progs["train_step"].also_resident == sampler_state
    assert progs["weight_cast"].also_resident == optimizer + sampler_state
  for name in ("prefill", "decode"):  # the trainer's state stays beside the sampler
    assert progs[name].also_resident - off[name].also_resident == 0
    assert progs[name].also_resident >= trainer_state
