"""`jaxrl-scale generate` end to end on a tiny Hugging Face directory."""

import json
import re

import numpy as np
import pytest

from jaxrl_scale import cli
from jaxrl_scale.generation import command
from jaxrl_scale.models import tokenizer as tokenizer_lib


def test_generate_json_matches_transformers_greedy(hf_checkpoints, capsys):
  import torch

  ck = hf_checkpoints["qwen2"]
  rc = cli.main(["generate", "--model", ck.path, "--prompt", "hello", "--n", "2", "--greedy",
                 "--max-new-tokens", "8", "--json"])
  assert rc == 0
  out = json.loads(capsys.readouterr().out)
  prompt = tokenizer_lib.load_tokenizer(ck.path).encode("hello", add_special_tokens=True)
  with torch.no_grad():
    ref = ck.hf_model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=8,
                               do_sample=False, eos_token_id=257, pad_token_id=258,
                               attention_mask=torch.ones(1, len(prompt), dtype=int))
  ref_tokens = ref[0, len(prompt):].tolist()
  assert [c["sample_index"] for c in out["completions"]] == [0, 1]
  for c in out["completions"]:
    assert c["tokens"] == ref_tokens and c["num_tokens"] == len(ref_tokens)
    assert all(np.isfinite(c["logprobs"])) and isinstance(c["text"], str)
  assert out["tokens"] == 2 * len(ref_tokens) and out["tokens_per_second"] > 0
  # 8 new tokens are one decode chunk (sampler.decode_chunk 8), the one that compiles: there
  # is no rate after compilation to give.
  assert out["steady_tokens_per_second"] is None
  assert cli.main(["generate", "--model", ck.path, "--prompt", "hello", "--greedy",
                   "--max-new-tokens", "24"]) == 0
  last = capsys.readouterr().out.splitlines()[-1]
  assert re.fullmatch(r"\d+ tokens in [\d.]+ s: [\d.]+ tokens/s \([\d.]+ tokens/s after "
                      r"compilation, \d+ slots\)", last), last


def test_prompts_file_and_errors(tmp_path, capsys):
  good = tmp_path / "p.jsonl"
  good.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
  plain = tmp_path / "p.txt"
  plain.write_text("first\n\nsecond\n")
  parser = cli.build_parser()
  args = parser.parse_args(["generate", "--model", str(tmp_path), "--prompts-file", str(good)])
  assert command.read_prompts(args) == ["a", "b"]
  args = parser.parse_args(["generate", "--model", str(tmp_path), "--prompts-file", str(plain)])
  assert command.read_prompts(args) == ["first", "second"]

  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a"}\n{"text": 1}\n')
  assert cli.main(["generate", "--model", str(tmp_path), "--prompts-file", str(bad)]) == 2
  err = capsys.readouterr().err.strip()
  assert "bad.jsonl line 2" in err and len(err.splitlines()) == 1
  assert cli.main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
  assert "not a directory" in capsys.readouterr().err
  run_dir = tmp_path / "run"  # what `jaxrl-scale train` leaves, given where a model goes
  run_dir.mkdir()
  (run_dir / "config.yaml").write_text("run: {}\n")
  assert cli.main(["generate", "--model", str(run_dir), "--prompt", "x"]) == 2
  err = capsys.readouterr().err.strip()
  assert f"a training run's directory, not a Hugging Face one; `jaxrl-scale export {run_dir} " \
      "OUT_DIR`" in err and len(err.splitlines()) == 1, err
  with pytest.raises(SystemExit):  # --prompt and --prompts-file are exclusive
    parser.parse_args(["generate", "--model", "m", "--prompt", "x", "--prompts-file", "f"])


def test_report_progress_waits_then_repeats_and_leaves_the_end_to_the_caller():
  import types
  now = [0.0]
  lines = []
  sampler = types.SimpleNamespace(stats=types.SimpleNamespace(tokens=0))
  report = command.report_progress(lines.append, sampler, first_s=30.0, every_s=30.0,
                                   clock=lambda: now[0])
  for t, done, tokens in ((10, 0, 100), (31, 2, 900), (40, 3, 1000), (62, 5, 2000),
                          (99, 8, 3000)):
    now[0], sampler.stats.tokens = t, tokens
    report(done, 8)
  assert lines == ["generated 2/8 samples (900 tokens)", "generated 5/8 samples (2000 tokens)"]


def test_a_long_generate_prints_progress_on_stderr(hf_checkpoints, capsys, monkeypatch):
  real = command.report_progress
  monkeypatch.setattr(command, "report_progress",  # every run counts as long here
                      lambda say, sampler, first_s: real(say, sampler, first_s=0.0))
  rc = cli.main(["generate", "--model", hf_checkpoints["qwen2"].path, "--prompt", "hello",
                 "--n", "3", "--greedy", "--max-new-tokens", "8", "--json"])
  captured = capsys.readouterr()
  assert rc == 0
  assert len(json.loads(captured.out)["completions"]) == 3  # stdout stays the output
  assert re.search(r"^generate \[ *[\d.]+s\] generated [0-2]/3 samples \(\d+ tokens\)$",
                   captured.err, re.MULTILINE), captured.err

