"""`jaxrl-scale export`: a run's checkpoint out as a Hugging Face directory transformers loads."""

import io
import json
import shutil

import jax
import numpy as np
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale import cli
from jaxrl_scale import config
from jaxrl_scale.pipeline import wiring
from tests.generation import conftest as gen
from tests.train_setup import ROOT, tiny_overrides, write_task


def _hf_cfg(start, task, run_dir, steps):
  """A run of `steps` RL steps from the Hugging Face directory `start` (3 SFT steps first)."""
  overrides = [o for o in tiny_overrides(task, steps=steps)
               if not o.startswith(("model.hidden_size", "model.num_layers",
                                    "model.intermediate_size"))]
  return config.load(ROOT / "configs" / "cpu_tiny.yaml", overrides + [
      f"model.path={start}", "sft.steps=3", "eval.every=0", "checkpoint.every=1",
      f"run.output_dir={run_dir}", "run.progress=true"])


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
  """A tiny random Qwen3 directory, and a run that starts from it (SFT steps change it)."""
  base = tmp_path_factory.mktemp("export")
  start = base / "start"
  gen.make_hf_model(gen.SPECS["qwen3"], seed=4).save_pretrained(start)
  gen.write_byte_tokenizer(str(start))
  write_task(base / "task.jsonl")
  cfg = _hf_cfg(start, base / "task.jsonl", base / "run", steps=2)
  out = io.StringIO()
  wiring.train(cfg, cfg.run.output_dir, stream=out)
  return start, base / "run", out.getvalue()


def test_a_run_from_a_checkpoint_says_it_is_loading_it(hf_run):
  start, _, out = hf_run
  lines = out.splitlines()
  loading = lines.index(f"  loading the policy from {start}")
  assert lines[loading + 1].startswith(f"  policy {start}: 0.04M params (loaded in "), out


def test_resuming_a_run_from_a_checkpoint_does_not_read_its_weights(hf_run, tmp_path):
  # The run from `start` (2 steps) goes on to step 3 from its checkpoint, with the starting
  # directory's weights gone: it must not need them, and must train as an uninterrupted
  # 3-step run from the same weights does.
  start, run_dir, _ = hf_run
  task = run_dir.parent / "task.jsonl"
  ref = _hf_cfg(start, task, tmp_path / "ref", steps=3)
  wiring.train(ref, ref.run.output_dir)
  shapes_only = tmp_path / "start"
  shutil.copytree(start, shapes_only)
  (shapes_only / "model.safetensors").unlink()
  shutil.copytree(run_dir, tmp_path / "run")
  resumed = _hf_cfg(shapes_only, task, tmp_path / "run", steps=3)
  out = io.StringIO()
  outcome = wiring.train(resumed, resumed.run.output_dir, resume=True, stream=out)
  assert outcome.reason == "done" and outcome.step == 3
  assert "resumed from checkpoint step 2" in out.getvalue()
  assert "loading the policy" not in out.getvalue()
  # Every param is the uninterrupted run's: none kept the random shapes-only init.
  jax.tree.map(np.testing.assert_array_equal, _checkpoint_params(tmp_path / "run", 3),
               _checkpoint_params(tmp_path / "ref", 3))


def _checkpoint_params(run_dir, step):
  with checkpoint.Checkpointer(run_dir / "checkpoints") as ckpt:
    return ckpt.read_arrays(step)["params"]


def test_export_writes_the_checkpoints_weights_for_transformers(hf_run, tmp_path, capsys):
  import torch
  import transformers

  start, run_dir, _ = hf_run
  out = tmp_path / "out"
  assert cli.main(["export", str(run_dir), str(out), "--step", "1"]) == 0
  assert capsys.readouterr().out.strip() == str(out)
  exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  original = transformers.AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
  sd = {k: v.numpy() for k, v in exported.state_dict().items()}
  p = _checkpoint_params(run_dir, 1)
  # By hand, tensor by tensor: transformers' Linear weights are [out, in]; ours [in, ...].
  np.testing.assert_array_equal(sd["model.embed_tokens.weight"], p["embed_tokens"]["embedding"]["value"])
  np.testing.assert_array_equal(sd["model.norm.weight"], p["norm"]["scale"]["value"])
  np.testing.assert_array_equal(sd["lm_head.weight"], p["lm_head"]["kernel"]["value"].T)
  q = p["layers"]["self_attn"]["q_proj"]["kernel"]["value"][1]  # layer 1: [hidden, heads, dim]
  np.testing.assert_array_equal(sd["model.layers.1.self_attn.q_proj.weight"],
                                q.reshape(q.shape[0], -1).T)
  down = p["layers"]["mlp"]["down_proj"]["kernel"]["value"][0]
  np.testing.assert_array_equal(sd["model.layers.0.mlp.down_proj.weight"], down.T)
  # The run trained: the export is not the starting checkpoint.
  assert not np.allclose(sd["lm_head.weight"], original.state_dict()["lm_head.weight"].numpy())
  for name in ("tokenizer.json", "tokenizer_config.json"):  # the starting directory's
    assert (out / name).read_bytes() == (start / name).read_bytes()
  # And jaxrl-scale's own commands read it.
  assert cli.main(["generate", "--model", str(out), "--prompt", "3:", "--greedy",
                   "--max-new-tokens", "4", "--json"]) == 0
  assert len(json.loads(capsys.readouterr().out)["completions"]) == 1


def test_export_defaults_to_the_newest_step_and_the_runs_dtype(hf_run, tmp_path, capsys):
  _, run_dir, _ = hf_run
  out = tmp_path / "out"
  assert cli.main(["export", str(run_dir), str(out), "--dtype", "bfloat16"]) == 0
  assert "step 2 of" in capsys.readouterr().err
  hf = json.loads((out / "config.json").read_text())
  assert hf["torch_dtype"] == "bfloat16" or hf.get("dtype") == "bfloat16"
  from safetensors.numpy import load_file
  import ml_dtypes
  tensors = load_file(out / "model.safetensors")
  head = _checkpoint_params(run_dir, 2)["lm_head"]["kernel"]["value"].T
  assert tensors["lm_head.weight"].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(tensors["lm_head.weight"], head.astype(ml_dtypes.bfloat16))


def test_bad_input_is_one_line_and_writes_nothing(hf_run, tmp_path, capsys):
  _, run_dir, _ = hf_run
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "keep.txt").write_text("mine")
  for argv, message in (
      ([str(tmp_path / "nope"), str(tmp_path / "o1")], "config.yaml: not found"),
      ([str(run_dir), str(taken)], "is not an empty directory"),
      ([str(run_dir), str(tmp_path / "o2"), "--step", "7"], "--step 7: no such checkpoint"),
  ):
    assert cli.main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
  assert [p.name for p in taken.iterdir()] == ["keep.txt"]
  assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


# 60 s on 2 cores (a whole run): slow. tests/models/tokenizer_test.py checks the exported
# byte tokenizer's files against transformers by default.
@pytest.mark.slow
def test_a_byte_tokenizer_run_exports_a_tokenizer_that_reads_as_it_trained(tmp_path, capsys):
  # The CPU demo's policy (a preset on the built-in byte tokenizer) leaves the run with
  # tokenizer files: transformers and `jaxrl-scale generate` read it and agree.
  import torch
  import transformers

  from jaxrl_scale.models import tokenizer as tokenizer_lib

  write_task(tmp_path / "task.jsonl")
  cfg = config.load(ROOT / "configs" / "cpu_tiny.yaml", tiny_overrides(
      tmp_path / "task.jsonl", steps=1) + ["eval.every=0", "checkpoint.every=1",
                                           f"run.output_dir={tmp_path / 'run'}"])
  wiring.train(cfg, cfg.run.output_dir)
  out = tmp_path / "out"
  assert cli.main(["export", str(tmp_path / "run"), str(out)]) == 0
  capsys.readouterr()
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  p = _checkpoint_params(tmp_path / "run", 1)
  np.testing.assert_array_equal(model.state_dict()["model.embed_tokens.weight"].numpy(),
                                p["embed_tokens"]["embedding"]["value"])
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  byte = tokenizer_lib.ByteTokenizer()
  prompts = [f"{i}:" for i in (3, 8, 21, 46, 57, 70)]
  (tmp_path / "prompts.txt").write_text("\n".join(prompts))
  assert cli.main(["generate", "--model", str(out), "--prompts-file", str(tmp_path / "prompts.txt"),
                   "--greedy", "--max-new-tokens", "4", "--json"]) == 0
  completions = json.loads(capsys.readouterr().out)["completions"]
  assert [c["prompt_index"] for c in completions] == list(range(len(prompts)))
  for prompt, completion in zip(prompts, completions):
    ids = byte.apply_chat_template(prompt, tokenize=True)
    assert hf_tok(prompt).input_ids == ids  # the ids the policy saw in training
    with torch.no_grad():
      greedy = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0, len(ids):]
    assert completion["tokens"] == greedy.tolist()[:len(completion["tokens"])], prompt
    assert completion["text"] == hf_tok.decode(greedy, skip_special_tokens=True)
    assert completion["text"] == byte.decode(completion["tokens"], skip_special_tokens=True)
  # A policy that answered with EOS alone would not show the tokenizers agree on text.
  assert any(c["text"] for c in completions), completions


def test_the_policy_config_is_the_one_training_loads(hf_run):
  from jaxrl_scale.models import hf_io
  from jaxrl_scale.plan import command as plan_command
  start, _, _ = hf_run
  cfg = config.load(ROOT / "configs" / "cpu_tiny.yaml", [f"model.path={start}",
                                                          "model.param_dtype=bfloat16",
                                                          "model.dtype=bfloat16"])
  _, loaded = hf_io.load_hf_model(str(start), param_dtype="bfloat16", dtype="bfloat16",
                                  lm_head_fp32=True, attention_impl="auto")
  assert wiring.policy_config(cfg) == loaded
  assert loaded.hidden_size == 32 and loaded.param_dtype == "bfloat16"  # the checkpoint's
  notes = []
  assert plan_command._model_config(cfg, notes.append) == loaded and notes == []
  # plan (not export) falls back to the preset when the directory is not on this machine.
  gone = config.load(ROOT / "configs" / "cpu_tiny.yaml", ["model.path=/nonexistent/ckpt"])
  assert plan_command._model_config(gone, notes.append) == wiring.model_config_for(gone, None)
  assert "has no config.json here" in notes[0]
