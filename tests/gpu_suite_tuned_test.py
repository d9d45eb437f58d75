"""benchmarks/gpu/gpu_suite.py on CPU: the decode run tuned by the kernel sweep (this call's, or
an earlier call's with --sweep-from)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.gpu import gpu_suite  # noqa: E402


DEFAULTS = dict(kv_tokens_per_block=64, num_warps=4, num_stages=1, target_programs=1024)


def test_a_tuned_run_gets_the_sweeps_fastest_configuration_at_its_batch():
  """The b256 tuned run: no sweep (or a failed one) leaves the module's defaults; after it,
  the fastest row at batch 256, not batch 64's; none when that row is the defaults (which
  decode_b256_triton measured already)."""
  runs = {r["name"]: r for r in gpu_suite.plan(81559, "/tmp/ck")}
  tuned256, base = runs["decode_b256_triton_tuned"], runs["decode_b256_triton"]
  assert tuned256["only_tuned"]
  row = lambda batch, tokens, us: dict(  # noqa: E731
      batch=batch, kv_tokens_per_block=tokens, num_warps=8, num_stages=1,
      target_programs=1024, us=us)
  sweep = dict(name="decode_kernel_sweep", rc=0, report={"sweep": {
      "defaults": DEFAULTS, "best": {"64": row(64, 128, 60.0), "256": row(256, 32, 170.0)}}})
  assert gpu_suite.tuned(tuned256, []) is None
  assert gpu_suite.tuned(tuned256, [dict(sweep, rc=124)]) is None
  assert gpu_suite.tuned(base, [sweep]) is None  # not marked tuned: the defaults' baseline
  assert gpu_suite.tuned(tuned256, [sweep]) == dict(kv_tokens_per_block=32, num_warps=8,
                                                    num_stages=1, target_programs=1024)
  assert gpu_suite.tuned(dict(tuned256, batch=64), [sweep])["kv_tokens_per_block"] == 128
  at_defaults = dict(sweep, report={"sweep": {
      "defaults": DEFAULTS, "best": {"256": dict(DEFAULTS, batch=256, us=150.0)}}})
  assert gpu_suite.tuned(tuned256, [at_defaults]) is None
  # The split target alone differs: that is a configuration of its own.
  split = dict(sweep, report={"sweep": {
      "defaults": DEFAULTS,
      "best": {"256": dict(DEFAULTS, batch=256, target_programs=4096, us=140.0)}}})
  assert gpu_suite.tuned(tuned256, [split]) == dict(DEFAULTS, target_programs=4096)


def test_the_suite_passes_the_sweeps_choice_to_the_tuned_run(tmp_path, monkeypatch):
  """main, its runs stubbed: the b256 tuned decode that runs after the sweep gets
  `--triton-config` with the sweep's fastest row at batch 256, its other arguments (the
  saved tokens' path last) intact, and the run records the configuration; when the sweep's
  fastest is the defaults, the run is recorded as skipped, not run."""
  import json

  seen, best = {}, {}

  def fake_run(run, log, timeout):
    seen[run["name"]] = run["argv"]
    report = None
    if run["name"] == "decode_kernel_sweep":
      report = {"sweep": {"defaults": DEFAULTS, "best": {"256": dict(best, batch=256,
                                                                    us=150.0)}}}
    return {**{k: v for k, v in run.items() if k != "argv"}, "rc": 0, "report": report}

  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  monkeypatch.setattr(gpu_suite, "run_one", fake_run)
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(gpu_suite.os.path, "isdir", lambda path: True)
  only = ["--out", str(tmp_path), "--commit", "abc",
          "--only", "decode_kernel_sweep,decode_b256_triton_tuned"]
  best.update(kv_tokens_per_block=32, num_warps=8, num_stages=2, target_programs=4096)
  assert gpu_suite.main(only) == 0
  argv = seen["decode_b256_triton_tuned"]
  tmp = gpu_suite.tempfile.gettempdir()
  planned = next(r for r in gpu_suite.plan(
      81559, os.path.join(tmp, "gpu_suite_qwen3_0p6b"),
      tokens_dir=os.path.join(tmp, "gpu_suite_tokens")) if r["name"] == "decode_b256_triton_tuned")
  assert argv[:-2] == planned["argv"] and argv[-4] == "--save-tokens"
  assert argv[-2:] == ["--triton-config",
                       "kv_tokens_per_block=32,num_warps=8,num_stages=2,target_programs=4096"]
  runs = {r["name"]: r for r in json.loads((tmp_path / "gpu_suite.json").read_text())["runs"]}
  assert runs["decode_b256_triton_tuned"]["triton_config"]["num_stages"] == 2
  # No faster row than the defaults: recorded as skipped, not run.
  seen.clear()
  best.update(DEFAULTS)
  assert gpu_suite.main(only) == 0
  assert "decode_b256_triton_tuned" not in seen and "decode_kernel_sweep" in seen
  runs = {r["name"]: r for r in json.loads((tmp_path / "gpu_suite.json").read_text())["runs"]}
  assert "the kernel sweep found nothing faster" in runs["decode_b256_triton_tuned"]["skipped"]


def test_a_second_call_takes_the_tuned_configuration_from_an_earlier_sweep(tmp_path,
                                                                         monkeypatch, capsys):
  """--sweep-from: a call that does not sweep gives its tuned run the fastest row of an
  earlier call's sweep (its gpu_suite.json); a file without a finished sweep, or none at
  all, stops with one line before anything runs."""
  import json

  seen = {}

  def fake_run(run, log, timeout):
    seen[run["name"]] = run["argv"]
    return {**{k: v for k, v in run.items() if k != "argv"}, "rc": 0, "report": None}

  row = dict(batch=256, kv_tokens_per_block=32, num_warps=8, num_stages=2,
             target_programs=4096, us=150.0)
  earlier = tmp_path / "earlier.json"
  earlier.write_text(json.dumps({"runs": [
      {"name": "decode_kernel_sweep", "rc": 0,
       "report": {"sweep": {"defaults": DEFAULTS, "best": {"256": row}}}}]}))
  monkeypatch.setattr(gpu_suite, "gpu_info", lambda: ("NVIDIA H100 80GB HBM3", 81559))
  monkeypatch.setattr(gpu_suite, "run_one", fake_run)
  monkeypatch.setattr(gpu_suite.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(gpu_suite.os.path, "isdir", lambda path: True)
  out = tmp_path / "out"
  assert gpu_suite.main(["--out", str(out), "--commit", "abc", "--only",
                         "decode_b256_triton_tuned", "--sweep-from", str(earlier)]) == 0
  assert seen["decode_b256_triton_tuned"][-2:] == [
      "--triton-config",
      "kv_tokens_per_block=32,num_warps=8,num_stages=2,target_programs=4096"]
  assert "kernel sweep in" in (out / "gpu_suite.log").read_text()
  # Without it the same run has no sweep to read: skipped, not run at the defaults.
  seen.clear()
  assert gpu_suite.main(["--out", str(out), "--commit", "abc", "--only",
                         "decode_b256_triton_tuned"]) == 0
  assert "decode_b256_triton_tuned" not in seen
  earlier.write_text(json.dumps({"runs": [{"name": "decode_kernel_sweep", "rc": 124}]}))
  broken = tmp_path / "broken.json"
  broken.write_text("{")
  seen.clear()
  for bad, why in ((earlier, "no finished kernel sweep"), (tmp_path / "none.json", "No such file"),
                   (broken, "JSONDecodeError")):
    capsys.readouterr()
    with pytest.raises(SystemExit):
      gpu_suite.main(["--only", "decode_b256_triton_tuned", "--sweep-from", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--sweep-from {bad}" in err and why in err, err
  assert not seen
