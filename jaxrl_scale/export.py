"""`jaxrl-scale export RUN_DIR OUT_DIR`: a run's trained policy as a Hugging Face directory.

    jaxrl-scale export runs/qwen3_8b runs/export/qwen3-8b              # the newest checkpoint
    jaxrl-scale export runs/qwen3_8b runs/export/step-500 --step 500 --dtype float32

Reads the run's config.yaml and the params of one checkpoint (the trainer's float32
masters), and writes config.json, safetensors and the tokenizer files that
`transformers.AutoModelForCausalLM.from_pretrained`, `jaxrl-scale generate` / `eval` and
serving engines load. The weights go out in `model.param_dtype` (what the run's generator
sampled with; bfloat16 in the paper's configs) unless --dtype says otherwise. The model's
shape comes from the run's starting checkpoint (`model.path`, whose config.json and
tokenizer files are copied) or its preset; a run on the built-in byte tokenizer gets that
tokenizer written as Hugging Face files (`ByteTokenizer.write_hf_files`). OUT_DIR must not
exist or be empty: nothing is overwritten. It runs on the CPU (JAX_PLATFORMS=cpu unless
set): the host's memory holds the params.

Only the standard library is imported at module level (the CLI builds every command's
parser on each call).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from jaxrl_scale.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("run_dir", metavar="RUN_DIR", help="a training run's directory")
  parser.add_argument("out_dir", metavar="OUT_DIR", help="where the Hugging Face files go "
                      "(must not exist or be empty)")
  parser.add_argument("--step", type=int, default=None,
                      help="the checkpoint's step (default: the newest)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                      help="the weights' dtype (default: the run's model.param_dtype)")


def run(args: argparse.Namespace) -> int:
  run_dir = pathlib.Path(args.run_dir)
  config_path = run_dir / "config.yaml"
  if not config_path.is_file():
    raise UserError(f"{config_path}: not found (RUN_DIR must be a training run's directory)")
  out_dir = pathlib.Path(args.out_dir)
  if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
    raise UserError(f"{out_dir}: exists and is not an empty directory (nothing is overwritten)")

  # The host's memory holds the params (a TPU chip's HBM may not): no accelerator needed.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=g-import-not-at-top

  from jaxrl_scale import checkpoint  # pylint: disable=g-import-not-at-top
  from jaxrl_scale import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.models import hf_io  # pylint: disable=g-import-not-at-top

  cfg = config_lib.load(str(config_path), [])
  ckpt_dir = run_dir / "checkpoints"
  with checkpoint.Checkpointer(ckpt_dir, async_save=False) as ckpt:
    steps = ckpt.all_steps() if ckpt_dir.is_dir() else []
    if not steps:
      raise UserError(f"{ckpt_dir}: no checkpoint to export")
    step = steps[-1] if args.step is None else args.step
    if step not in steps:
      raise UserError(f"--step {step}: no such checkpoint in {ckpt_dir} (steps: "
                      f"{', '.join(map(str, steps))})")
    mcfg, tokenizer_dir = _model_config(cfg, args.dtype)
    print(f"export: step {step} of {run_dir} ({mcfg.num_params() / 1e6:.2f}M params, "
          f"{mcfg.param_dtype}) -> {out_dir}", file=sys.stderr, flush=True)
    params = ckpt.read_arrays(step, keys=("params",))["params"]  # not the optimizer state
  model = _fill(mcfg, params, f"{ckpt_dir}/{step}")
  del params
  hf_io.save_hf_model(model, mcfg, str(out_dir), tokenizer_dir=tokenizer_dir)
  if tokenizer_dir is None:  # the built-in byte tokenizer, as Hugging Face files
    from jaxrl_scale.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    tokenizer_lib.ByteTokenizer().write_hf_files(str(out_dir))
  jax.clear_caches()
  print(out_dir)
  return 0


def _model_config(cfg, dtype: str | None):
  """(the exported model's config, the directory whose tokenizer files go with it)."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.pipeline import wiring  # pylint: disable=g-import-not-at-top

  spec = cfg.model
  if spec.path is not None and not os.path.isfile(os.path.join(spec.path, "config.json")):
    raise UserError(f"model.path {spec.path}: the run's starting checkpoint is gone (its "
                    "config.json gives the exported model's shape)")
  dtype = dtype or spec.param_dtype
  mcfg = dataclasses.replace(wiring.policy_config(cfg), param_dtype=dtype, dtype=dtype)
  tokenizer = spec.path if spec.tokenizer == "byte" else spec.tokenizer
  if tokenizer not in (None, "byte") and os.path.isfile(tokenizer):
    tokenizer = os.path.dirname(os.path.abspath(tokenizer))
  return mcfg, (None if tokenizer in (None, "byte") else tokenizer)


def _fill(mcfg, params, where: str):
  """A Transformer of `mcfg` whose params are the checkpoint's `params` in mcfg.param_dtype."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from jaxrl_scale.models import transformer  # pylint: disable=g-import-not-at-top

  if not isinstance(params, dict):
    raise UserError(f"{where}: holds no params")
  model = nnx.eval_shape(lambda: transformer.Transformer(mcfg, rngs=nnx.Rngs(0)))
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  try:  # the host's memory, not one accelerator's
    device = jax.local_devices(backend="cpu")[0]
  except RuntimeError:
    device = jax.local_devices()[0]
  for path, var in flat:
    node = params
    for key in (*map(str, path), "value"):
      if not isinstance(node, dict) or key not in node:
        raise UserError(f"{where}: no param {'/'.join(map(str, path))} (the checkpoint is not "
                        "of this run's model)")
      node = node[key]
    if tuple(node.shape) != tuple(var.get_value().shape):
      raise UserError(f"{where}: param {'/'.join(map(str, path))} has shape "
                      f"{tuple(node.shape)}, the run's model {tuple(var.get_value().shape)}")
    var.set_value(jax.device_put(np.asarray(node), device).astype(mcfg.param_dtype))
  return model
