"""benchmarks/gpu/paged_decode_check.py on CPU (interpret mode, tiny shapes): its timing loop
and its block-size sweep. The numbers that matter come from a GPU (benchmarks/gpu/gpu_suite.py)."""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.gpu import paged_decode_check  # noqa: E402
from tests.plan import gpu_plan_test  # noqa: E402


def test_read_seconds_chains_every_step_and_hands_the_carry_on():
  """The loop runs `reps` chained steps per call (a counter in the carry sees each one, over
  the first call and every timed call), and the carry goes from call to call; the step
  count is traced, so one compile serves one step and many."""
  seen = []

  def step(carry, inc):
    seen.append(1)  # traced once
    return carry + inc

  fn = paged_decode_check.chained(step)
  assert int(fn(jnp.zeros((), jnp.int32), 1, jnp.int32(5))) == 5
  sec, last = paged_decode_check.read_seconds(fn, jnp.zeros((), jnp.int32), (jnp.int32(1),),
                                              reps=7, repeats=3)
  assert sec > 0 and len(seen) == 1
  assert int(last) == 7 * (1 + 3)  # the first call and three timed calls, 7 steps each
  sec, (n, x) = paged_decode_check.read_seconds(
      paged_decode_check.chained(lambda c, inc: (c[0] + inc, c[1] * 2)),
      (jnp.zeros((), jnp.int32), jnp.ones(3)), (jnp.int32(2),), reps=5, repeats=2)
  assert int(n) == 2 * 5 * 3 and float(x[0]) == 2.0 ** 15


def test_sweep_checks_every_configuration_against_float32_and_picks_the_fastest():
  from jaxrl_scale.models import paged_triton

  every = paged_decode_check.sweep_configs(4)
  # The defaults first; then blocks of 2, 4, 8 and 16 pages, 4 and 8 warps, 1 and 2 stages
  # (the default block, 64 positions, is 16 pages of 4 here, swept once); then the split
  # target both ways at the default block.
  target = paged_triton.TARGET_PROGRAMS
  defaults = dict(kv_tokens_per_block=paged_triton.KV_TOKENS_PER_BLOCK,
                  num_warps=paged_triton.NUM_WARPS, num_stages=paged_triton.NUM_STAGES,
                  target_programs=target)
  assert len(every) == 4 * 2 * 2 + 2
  assert every[0] == defaults
  assert {c["kv_tokens_per_block"] for c in every} == {8, 16, 32, 64}
  assert {c["num_warps"] for c in every} == {4, 8}
  assert {c["num_stages"] for c in every} == {1, 2}
  assert [c for c in every if c["target_programs"] != target] == [
      dict(defaults, target_programs=t) for t in (1, 4 * target)]
  assert len({tuple(sorted(c.items())) for c in every}) == len(every)
  # At Qwen3-0.6B's pages of 16 (the GPU's sweep): the same grid but `LEFT_OUT`, which
  # spills registers in the H100 compile (256 positions at 4 warps and one stage).
  gpu = paged_decode_check.sweep_configs(16)
  assert paged_decode_check.LEFT_OUT == {(256, 4, 1)}
  assert len(gpu) == 4 * 2 * 2 - len(paged_decode_check.LEFT_OUT) + 2 and gpu[0] == defaults
  assert {c["kv_tokens_per_block"] for c in gpu} == {32, 64, 128, 256}
  assert not [c for c in gpu if (c["kv_tokens_per_block"], c["num_warps"], c["num_stages"])
              in paged_decode_check.LEFT_OUT]
  rng = np.random.default_rng(0)
  some = every[:1] + [c for c in every if c["num_stages"] == 2][:1] + every[-2:]
  report = paged_decode_check.sweep(rng, [4], 24, (4, 2, 16, 4), reps=2, repeats=1,
                                    peak=None, interpret=True, configs=some)
  assert len(report["runs"]) == 4
  assert all("error" not in r and r["max_abs_vs_f32"] < 0.02 for r in report["runs"])
  best = report["best"]["4"]
  assert best["us"] == min(r["us"] for r in report["runs"])
  assert report["defaults"] == defaults


def test_a_wrong_kernel_shows_in_the_sweep(monkeypatch):
  """A configuration whose output is wrong is reported with its error against float32, not
  hidden behind its time."""
  from jaxrl_scale.models import paged_triton

  real = paged_triton.triton_decode_attention

  def broken(q, kv, table, lens, **kw):
    out = real(q, kv, table, lens, **kw)
    return out * 2 if kw.get("num_warps") == 4 else out

  monkeypatch.setattr(paged_triton, "triton_decode_attention", broken)
  rng = np.random.default_rng(1)
  configs = [c for c in paged_decode_check.sweep_configs(4) if c["num_stages"] == 2][:2]
  assert {c["num_warps"] for c in configs} == {4, 8}
  report = paged_decode_check.sweep(rng, [4], 24, (4, 2, 16, 4), reps=1, repeats=1,
                                    peak=None, interpret=True, configs=configs)
  errs = {r["num_warps"]: r["max_abs_vs_f32"] for r in report["runs"]}
  assert errs[4] > 0.1 > errs[8]


@pytest.mark.skipif(not gpu_plan_test._cuda_plan_available(),
                    reason="JAX's CUDA plugin and cuDNN are not installed")
def test_every_sweep_configuration_compiles_for_an_h100():
  """XLA compiles the Triton kernel for an H100 without one (`plan`'s deviceless target),
  Triton to PTX with its shared-memory check included (8 s): every configuration the sweep
  times at Qwen3-0.6B's shape (batch 256) compiles, so none spends device time on a compile
  error; one past the shared memory (256 positions in 6 pipeline stages) does not."""
  from benchmarks.gpu import kernel_occupancy  # pylint: disable=g-import-not-at-top

  compile_one = kernel_occupancy.compile_for_h100(256)

  def compiles(cfg) -> str:
    try:
      compile_one(**cfg)
    except Exception as e:  # pylint: disable=broad-except
      return str(e).splitlines()[0]
    return ""

  configs = paged_decode_check.sweep_configs(16)
  for cfg in configs:
    assert compiles(cfg) == "", cfg
  too_big = dict(configs[0], kv_tokens_per_block=256, num_stages=6)
  assert "Shared memory size limit exceeded" in compiles(too_big)
