"""`jaxrl-scale plan` end to end: a tiny recipe compiled for a simulated TPU slice.

This test must run in CI (libtpu is in the test extra): it is the check that the run's own
programs still lower and compile for a TPU.
"""

import json

import pytest

from jaxrl_scale import cli

pytest.importorskip("libtpu", reason="pip install -e '.[test]' brings libtpu (jax[tpu])")

# The embedded demo's recipe, made smaller so the compiles take seconds.
TINY = ["mesh.trainer_devices=2", "mesh.generator_devices=2", "rl.prompts_per_step=8",
        "rl.generations_per_prompt=2", "sampler.num_slots=16", "optim.micro_batch_prompts=4",
        "sft.steps=0"]

KEYS = {"chips", "hbm_bytes_per_chip", "hbm_capacity_bytes", "fits", "compiled_flops_per_chip",
        "model_flops_per_chip", "bytes_accessed_per_chip", "bound_seconds", "mfu_bound",
        "kernel_bound_seconds", "kernel_bound_seconds_by_family", "mfu_kernel_bound",
        "collective_bytes_per_chip", "compile_seconds"}


def test_tiny_recipe_plans_on_v5e(capsys):
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY, "--topology", "v5e:2x2", "--json"])
  out = capsys.readouterr().out
  plan = json.loads(out)
  assert code == 0, plan
  assert plan["topology"] == "v5e:2x2" and plan["chips"] == 4 and plan["fits"] is True
  assert set(plan["programs"]) == {"train_step", "weight_cast", "prefill", "decode"}
  # The train step's remat choice is printed with the plan (cpu_tiny.yaml: none).
  assert plan["trainer"] == {"remat": "none", "logits_chunk": 512, "micro_batch_prompts": 4,
                             "sequence_parallel": False}
  for name, row in plan["programs"].items():
    assert KEYS <= set(row), name
    assert row["chips"] == 2 and row["fits"]
    assert 0 < row["hbm_bytes_per_chip"] < row["hbm_capacity_bytes"]
  train = plan["programs"]["train_step"]
  # fp32 master weights and two fp32 Adam moments: the optimizer holds twice the params
  # (plus its step counters).
  res = train["resident_bytes_per_chip"]
  assert 2 * res["params"] <= res["optimizer"] <= 2 * res["params"] + 64
  assert train["compiled_flops_per_chip"] > 0 and train["bound_seconds"] > 0
  # Each kernel's roofline summed: at least the time of all the FLOPs at peak (every dot
  # runs in some kernel); the 2-chip gradient all-reduce is left out of it.
  peak = plan["chip_spec"]["peak_flops"]
  for row in plan["programs"].values():
    assert row["kernel_bound_seconds"] >= row["compiled_flops_per_chip"] / peak * (1 - 1e-9)
    # ... and split by kernel family, which adds up to it.
    assert sum(row["kernel_bound_seconds_by_family"].values()) == pytest.approx(
        row["kernel_bound_seconds"])
  # The train step's splash kernels and matmuls each have their family.
  assert {"matmul", "attention"} <= set(train["kernel_bound_seconds_by_family"])
  # Two trainer chips: the gradients cross between them.
  assert train["collective_bytes_per_chip"] > 0
  assert train["mfu_kernel_bound"] == pytest.approx(
      train["model_flops_per_chip"] / peak / train["kernel_bound_seconds"])
  # The generator holds the param_dtype copy of the weights and a KV cache.
  assert plan["programs"]["decode"]["resident_bytes_per_chip"]["kv_cache"] > 0


def test_does_not_fit_exits_1_with_one_line(capsys):
  # 4096 slots of 64k tokens: a KV cache far beyond a v5e chip's 16 GiB.
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY[:-3], "sft.steps=0",
                   "sampler.num_slots=4096", "sampler.max_new_tokens=65536",
                   "optim.micro_batch_prompts=4", "rl.prompts_per_step=4",
                   "--topology", "v5e:2x2", "--programs", "weight_cast,prefill,decode"])
  captured = capsys.readouterr()
  assert code == 1
  err = [line for line in captured.err.splitlines() if line.startswith("jaxrl-scale plan:")]
  assert len(err) == 1
  assert "does not fit on v5e:2x2" in err[0] and "sampler.num_slots" in err[0]


def test_v5e_8_is_one_host_and_a_shortfall_exits_1(capsys):
  """v5e-8 is one host of 8 chips: a run too big for it is compiled and reported as not
  fitting (exit 1: program, need, capacity), not refused as a multi-host split (exit 2)."""
  code = cli.main(["plan", "configs/cpu_tiny.yaml", "mesh.trainer_devices=4",
                   "mesh.generator_devices=4", "sft.steps=0", "sampler.num_slots=4096",
                   "sampler.max_new_tokens=65536", "optim.micro_batch_prompts=4",
                   "rl.prompts_per_step=4", "--topology", "v5e-8",
                   "--programs", "decode", "--json"])
  captured = capsys.readouterr()
  assert code == 1, captured.err[-500:]
  plan = json.loads(captured.out)
  assert plan["hosts"] == 1 and plan["chips"] == 8
  err = [line for line in captured.err.splitlines() if line.startswith("jaxrl-scale plan:")]
  assert len(err) == 1
  assert "decode does not fit on v5e-8: needs " in err[0] and "of 16.00 GiB" in err[0]


def test_bad_topology_is_a_one_line_error(capsys):
  code = cli.main(["plan", "configs/cpu_tiny.yaml", "--topology", "v5p-96"])
  assert code == 2
  assert "no v5p slice of that size" in capsys.readouterr().err


def test_colocated_roles_count_each_others_state(capsys):
  """On shared chips the sampler's programs run beside the trainer's fp32 master weights and
  optimizer state, and the train step beside the sampler's weights and KV cache."""
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY, "mesh.colocated=true",
                   "--topology", "v5e:2x2", "--json"])
  plan = json.loads(capsys.readouterr().out)
  assert code == 0, plan
  rows = plan["programs"]
  train, decode = rows["train_step"], rows["decode"]
  trainer_state = (train["resident_bytes_per_chip"]["params"]
                   + train["resident_bytes_per_chip"]["optimizer"])
  # The sampler holds its weights twice (live and a posted update) besides its KV cache.
  sampler_state = sum(decode["resident_bytes_per_chip"].values())
  pending = decode["resident_bytes_per_chip"]["pending_params"]
  assert pending == decode["resident_bytes_per_chip"]["params"] > 0
  assert trainer_state > 0 and sampler_state > 0
  assert decode["also_resident_bytes_per_chip"] == trainer_state + pending
  assert rows["prefill"]["also_resident_bytes_per_chip"] == trainer_state + pending
  assert train["also_resident_bytes_per_chip"] == sampler_state
  assert decode["hbm_bytes_per_chip"] >= trainer_state + sampler_state


def test_programs_flag_compiles_only_those(capsys):
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY, "--topology", "v5e:2x2",
                   "--programs", "decode", "--json"])
  plan = json.loads(capsys.readouterr().out)
  assert code == 0 and set(plan["programs"]) == {"decode"}
  assert cli.main(["plan", "configs/cpu_tiny.yaml", "--topology", "v5e:2x2",
                   "--programs", "decoder"]) == 2
  assert "unknown program 'decoder'" in capsys.readouterr().err


def test_decode_row_counts_the_minimum_bytes(capsys):
  """The least a decode chunk must read, computed here by hand for the tiny model: every
  weight but the untied embedding table once per step (plus the rows' embeddings), and every
  row's KV at its full length (no sampler.kv_cache_tokens: the pool holds every slot's)."""
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY, "--topology", "v5e:2x2",
                   "--programs", "decode", "--json"])
  plan = json.loads(capsys.readouterr().out)
  row = plan["programs"]["decode"]
  assert code == 0
  # tiny_llama with 4 layers: vocab 264, hidden 64, 4 heads and 2 kv heads of 16, MLP 128,
  # untied head; float32 weights and cache. 2 generator chips: data 2, 8 of the 16 slots each.
  v, d, f, n, k, h, layers = 264, 64, 128, 4, 2, 16, 4
  per_layer = d * (n + 2 * k) * h + n * h * d + 3 * d * f + 2 * d
  weights = 4 * (layers * per_layer + d + d * v) + 4 * 8 * d  # + 8 rows' embeddings
  kv = 8 * (8 + 6) * layers * 2 * k * h * 4  # 8 rows x (prompt bucket 8 + 6 new) positions
  steps = 4  # sampler.decode_chunk
  assert row["min_bytes_per_chip_by_kind"] == {"weights": steps * weights,
                                               "kv_cache": steps * kv}
  assert row["min_bytes_per_chip"] == steps * (weights + kv)
  assert row["bytes_over_min"] == pytest.approx(
      row["bytes_accessed_per_chip"] / row["min_bytes_per_chip"])
  # The compiled program reads at least that much.
  assert row["bytes_over_min"] >= 1.0
  from jaxrl_scale.plan import report
  text = report.table(plan)
  assert f"decode bytes: {row['bytes_over_min']:.2f}x the minimum per chip" in text
  assert "train step: optim.remat none, optim.micro_batch_prompts 4" in text
  fam = row["kernel_bound_seconds_by_family"]
  assert "  decode kernels s by family: " + ", ".join(
      f"{f} {t:.3g} ({t / row['kernel_bound_seconds']:.0%})" for f, t in fam.items()) in text
  assert list(fam) == [f for f in ("matmul", "attention", "copy", "other") if f in fam]
  # Where XLA rematerialised, the note names the sampler's knobs, not the trainer's.
  assert "XLA recomputes" not in text
  row["xla_rematerialized"] = 3
  line = next(x for x in report.table(plan).splitlines() if "decode: XLA recomputes 3" in x)
  assert "(sampler.num_slots) or a smaller page pool (sampler.kv_cache_tokens)" in line
  assert "optim." not in line


def test_advice_tells_a_compiler_refusal_from_a_shortfall():
  from jaxrl_scale.plan import report
  row = {"fits": False, "hbm_bytes_per_chip": None, "hbm_capacity_bytes": 32 * 2**30,
         "error": "INTERNAL: RET_CHECK failure ... Unexpected device_id 9"}
  line = report.advice({"name": "v6e-64", "programs": {"decode": row}})
  assert line.startswith("decode does not compile for v6e-64: INTERNAL") and "slots" not in line
  row = dict(row, hbm_bytes_per_chip=51 * 2**30,
             error="RESOURCE_EXHAUSTED: Ran out of memory on HBM")
  line = report.advice({"name": "v6e-64", "programs": {"decode": row}})
  assert "does not fit on v6e-64: needs 51.00 GiB of 32.00 GiB" in line
  assert "sampler.num_slots" in line


def test_train_step_advice_follows_how_its_micro_batch_splits():
  """Lowering optim.micro_batch_prompts is advised only where a chip holds more than one row
  of a micro-batch; where the rows do not split at all, the advice says so first."""
  from jaxrl_scale.plan import report
  row = {"fits": False, "hbm_bytes_per_chip": 120 * 2**30, "hbm_capacity_bytes": 95 * 2**30,
         "error": "RESOURCE_EXHAUSTED: Ran out of memory on HBM", "micro_batch_rows": 32,
         "data_parallel": 16, "micro_batch_rows_per_chip": 2}
  plan = lambda r: {"name": "v5p-128", "programs": {"train_step": r}}  # noqa: E731
  assert "lower optim.micro_batch_prompts" in report.advice(plan(row))
  one = dict(row, micro_batch_rows=16, micro_batch_rows_per_chip=1)
  line = report.advice(plan(one))
  assert "micro_batch_prompts" not in line and "optim.remat=full" in line
  whole = dict(row, micro_batch_rows=24, data_parallel=32, micro_batch_rows_per_chip=24)
  line = report.advice(plan(whole))
  assert ("a micro-batch's 24 rows do not split over the trainer's 32 data-parallel chips, "
          "so each computes all of them") in line
  assert "a multiple of 32" in line and "4x fewer devices" in line
  # Colocated: the sampler's state beside the step, and what lowers it.
  line = report.advice(plan(dict(one, also_resident_bytes_per_chip=20 * 2**30)))
  assert ("20.00 GiB of the sampler's weights and KV cache stay beside it (colocated): free "
          "them while it steps (sampler.sleep_while_training=true") in line
  assert "sampler.kv_cache_tokens" in line


def test_a_multi_turn_run_plans_its_continuation(capsys):
  """env.name set: the sampler's resume program (one episode's environment tokens into its
  slot) is compiled beside prefill and decode, its piece sized by env.tool_output_chars,
  and the note says the page pool holds the episodes' pages across turns."""
  code = cli.main(["plan", "configs/cpu_tiny.yaml", *TINY, "env.name=retry",
                   "env.tool_output_chars=100", "--topology", "v5e:2x2", "--json"])
  plan = json.loads(capsys.readouterr().out)
  assert code == 0, plan
  assert set(plan["programs"]) == {"train_step", "weight_cast", "prefill", "decode", "resume"}
  resume, prefill = plan["programs"]["resume"], plan["programs"]["prefill"]
  assert resume["fits"] and 0 < resume["hbm_bytes_per_chip"] < resume["hbm_capacity_bytes"]
  # The same pool and weights as the prefill; one row of 8 positions (cpu_tiny's budget of
  # 6 new tokens caps the 100 + 64) against the prefill's every slot.
  assert resume["resident_bytes_per_chip"]["kv_cache"] == prefill["resident_bytes_per_chip"][
      "kv_cache"]
  assert 0 < resume["model_flops_per_chip"] < prefill["model_flops_per_chip"]
  assert any("hold their pages across turns" in n for n in resume.get("notes", []))
