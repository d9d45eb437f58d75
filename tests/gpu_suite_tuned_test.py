"""benchmarks/gpu_suite.py on CPU: the decode runs tuned by the kernel sweep (this call's, or
an earlier call's with --sweep-from)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_suite  # noqa: E402  (benchmarks/ is not a package)


def test_a_tuned_run_gets_the_sweeps_fastest_configuration_for_its_kernel_and_batch():
  """The b256 "page" run: no sweep (or a failed one) leaves the module's defaults; after
  it, the fastest "page" row at batch 256, not the fastest row overall nor batch 64's."""
  runs = {r["name"]: r for r in gpu_suite.plan(81559, "/tmp/ck")}
  page256, base = runs["decode_b256_triton_page"], runs["decode_b256_triton"]
  row = lambda kernel, batch, tokens, us: dict(  # noqa: E731
      batch=batch, kernel=kernel, kv_tokens_per_block=tokens, num_warps=8, num_stages=1,
      target_programs=1024, us=us)
  best_by_kernel = {"head": {"256": row("head", 256, 64, 150.0)},
                    "page": {"64": row("page", 64, 16, 60.0), "256": row("page", 256, 32, 170.0)}}
  sweep = dict(name="decode_kernel_sweep", rc=0,
               report={"sweep": {"best": {"256": best_by_kernel["head"]["256"]},
                                 "best_by_kernel": best_by_kernel}})
  assert gpu_suite.tuned(page256, []) is None
  assert gpu_suite.tuned(page256, [dict(sweep, rc=124)]) is None
  assert gpu_suite.tuned(base, [sweep]) is None  # not marked tuned: the defaults' baseline
  assert gpu_suite.tuned(page256, [sweep]) == dict(kv_tokens_per_block=32, num_warps=8,
                                                   num_stages=1, target_programs=1024)
  assert gpu_suite.tuned(runs["decode_b64_triton_page"], [sweep])["kv_tokens_per_block"] == 16
  # The default kernel's tuned run: only when its fastest row is not its defaults (which
  # decode_b256_triton measured already); joint_kv goes on as 0 or 1.
  head256 = runs["decode_b256_triton_tuned"]
  assert head256["only_tuned"]
  defaults = dict(kernel="head", kv_tokens_per_block=64, num_warps=8, num_stages=1,
                  target_programs=1024, joint_kv=False)
  at_defaults = dict(sweep, report={"sweep": {
      "defaults": defaults,
      "best_by_kernel": {"head": {"256": dict(defaults, batch=256, us=150.0)}}}})
  assert gpu_suite.tuned(head256, [at_defaults]) is None
  joint = dict(sweep, report={"sweep": {
      "defaults": defaults,
      "best_by_kernel": {"head": {"256": dict(defaults, batch=256, joint_kv=True, us=120.0)}}}})
  assert gpu_suite.tuned(head256, [joint]) == dict(kv_tokens_per_block=64, num_warps=8,
                                                   num_stages=1, target_programs=1024,
                                                   joint_kv=1)


def test_the_suite_passes_the_sweeps_choice_to_the_tuned_runs(tmp_path, monkeypatch):
  """main, its runs stubbed: the b256 "page" decode that runs after the sweep gets
  `--triton-config` with the sweep's fastest "page" row at batch 256, its other arguments
  (the saved tokens' path last) intact, and the run records the configuration."""
  import json

  seen = {}

  def fake_run(run, log, timeout):
    seen[run["name"]] = run["argv"]
    report = None
    if run["name"] == "decode_kernel_sweep":
      report = {"sweep": {"best_by_kernel": {"page": {"256": dict(
          batch=256, kernel="page", kv_tokens_per_block=32, num_warps=8, num_stages=2,
          target_programs=4096, us=150.0)}}}}
    return {**{k: v for k, v in run.items() if k != "argv"}, "rc": 0, "report": report}

  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  monkeypatch.setattr(gpu_suite, "run_one", fake_run)
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(gpu_suite.os.path, "isdir", lambda path: True)
  assert gpu_suite.main(["--out", str(tmp_path), "--commit", "abc",
                         "--only", "decode_kernel_sweep,decode_b256_triton_page,"
                         "decode_b64_triton_page,decode_b256_triton_tuned"]) == 0
  argv = seen["decode_b256_triton_page"]
  tmp = gpu_suite.tempfile.gettempdir()
  planned = next(r for r in gpu_suite.plan(
      81559, os.path.join(tmp, "gpu_suite_qwen3_0p6b"),
      tokens_dir=os.path.join(tmp, "gpu_suite_tokens")) if r["name"] == "decode_b256_triton_page")
  assert argv[:-2] == planned["argv"] and argv[-4] == "--save-tokens"
  assert argv[-2:] == ["--triton-config",
                       "kv_tokens_per_block=32,num_warps=8,num_stages=2,target_programs=4096"]
  assert "--triton-config" not in seen["decode_b64_triton_page"]  # none at batch 64
  runs = {r["name"]: r for r in json.loads((tmp_path / "gpu_suite.json").read_text())["runs"]}
  assert runs["decode_b256_triton_page"]["triton_config"]["num_stages"] == 2
  assert "triton_config" not in runs["decode_b64_triton_page"]
  # The default kernel's tuned run, with no faster "head" row in the sweep: recorded as
  # skipped, not run.
  assert "decode_b256_triton_tuned" not in seen
  assert "the kernel sweep found nothing faster" in runs["decode_b256_triton_tuned"]["skipped"]


def test_a_second_call_takes_the_tuned_configuration_from_an_earlier_sweep(tmp_path,
                                                                         monkeypatch, capsys):
  """--sweep-from: a call that does not sweep gives its tuned runs the fastest rows of an
  earlier call's sweep (its gpu_suite.json); a file without a finished sweep, or none at
  all, stops with one line before anything runs."""
  import json

  seen = {}

  def fake_run(run, log, timeout):
    seen[run["name"]] = run["argv"]
    return {**{k: v for k, v in run.items() if k != "argv"}, "rc": 0, "report": None}

  row = dict(batch=256, kernel="page", kv_tokens_per_block=32, num_warps=8, num_stages=2,
             target_programs=4096, joint_kv=False, us=150.0)
  earlier = tmp_path / "earlier.json"
  earlier.write_text(json.dumps({"runs": [
      {"name": "decode_kernel_sweep", "rc": 0,
       "report": {"sweep": {"best_by_kernel": {"page": {"256": row}}}}}]}))
  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  monkeypatch.setattr(gpu_suite, "run_one", fake_run)
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(gpu_suite.os.path, "isdir", lambda path: True)
  out = tmp_path / "out"
  assert gpu_suite.main(["--out", str(out), "--commit", "abc", "--only",
                         "decode_b256_triton_page", "--sweep-from", str(earlier)]) == 0
  assert seen["decode_b256_triton_page"][-2:] == [
      "--triton-config",
      "kv_tokens_per_block=32,num_warps=8,num_stages=2,target_programs=4096,joint_kv=0"]
  assert "kernel sweep in" in (out / "gpu_suite.log").read_text()
  # Without it the same run keeps the defaults.
  seen.clear()
  assert gpu_suite.main(["--out", str(out), "--commit", "abc", "--only",
                         "decode_b256_triton_page"]) == 0
  assert "--triton-config" not in seen["decode_b256_triton_page"]
  earlier.write_text(json.dumps({"runs": [{"name": "decode_kernel_sweep", "rc": 124}]}))
  broken = tmp_path / "broken.json"
  broken.write_text("{")
  seen.clear()
  for bad, why in ((earlier, "no finished kernel sweep"), (tmp_path / "none.json", "No such file"),
                   (broken, "JSONDecodeError")):
    capsys.readouterr()
    with pytest.raises(SystemExit):
      gpu_suite.main(["--only", "decode_b256_triton_page", "--sweep-from", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--sweep-from {bad}" in err and why in err, err
  assert not seen
