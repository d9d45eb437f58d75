"""Shared set-up of the end-to-end `jaxrl-scale train` tests (tests/train_test.py,
train_resume_test.py, train_preempt_test.py): the tiny run's task and overrides, its
fixtures, readers of a run directory, and a launcher of `jaxrl-scale train` subprocesses.

A test module takes the fixtures by importing them (`from tests.train_setup import
compile_cache, task_file`); `compile_cache` is autouse, so importing it is enough.
"""

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import jax
import pytest

from jaxrl_scale import checkpoint
from jaxrl_scale import config
from jaxrl_scale import metrics

ROOT = pathlib.Path(__file__).resolve().parents[1]


def write_task(path: pathlib.Path) -> None:
  """Prompts 'N:' whose answer is N mod 2: a few SFT steps give a policy that is right about
  half the time, so every group has reward variance and every step trains."""
  with open(path, "w") as f:
    for i in range(80):
      a = str(i % 2)
      f.write(json.dumps({"id": f"r{i}", "prompt": f"{i}:", "answer": a, "solution": a}) + "\n")


def tiny_overrides(data: pathlib.Path, steps: int = 4) -> list[str]:
  return [
      f"run.steps={steps}", "run.tensorboard=false", "run.progress=false",
      "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
      f"data.source={data}", "data.task=arithmetic", "data.id_field=id",
      "data.solution_field=solution", "data.num_validation=8", "data.max_prompt_tokens=8",
      "sft.steps=15", "sft.lr=1e-2", "sft.batch_size=16", "run.sft_stop_pass_rate=null",
      "rl.prompts_per_step=4", "rl.generations_per_prompt=4", "optim.lr=1e-3",
      "optim.warmup_steps=0", "sampler.num_slots=16", "sampler.max_new_tokens=4",
      "sampler.decode_chunk=4", "sampler.prompt_buckets=[8]",
      "eval.every=2", "eval.samples_per_prompt=2", "checkpoint.every=2",
      "checkpoint.async_save=false", "forecast.n_boot=0", "pipeline.max_staleness=2",
      "pipeline.mode=sync",  # the demo's mode is pipeline; tests name the mode they need
  ]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "parity.jsonl"
  write_task(path)
  return path


# One compilation cache for every module that uses this fixture (the shapes are the same in
# all their runs): only the session's first run pays for XLA compiles, as when these tests
# were one file. JAX keeps the first cache directory it opened anyway; sharing it also warms
# the subprocesses that the signal tests launch.
_CACHE_DIRS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
  if not _CACHE_DIRS:
    _CACHE_DIRS.append(str(tmp_path_factory.mktemp("jax_cache")))
  cache = _CACHE_DIRS[0]
  old = (jax.config.jax_compilation_cache_dir,
         jax.config.jax_persistent_cache_min_compile_time_secs)
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  yield cache
  jax.config.update("jax_compilation_cache_dir", old[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])


def run_cfg(task_file, run_dir, *extra, steps=4):
  return config.load(ROOT / "configs" / "cpu_tiny.yaml",
                     tiny_overrides(task_file, steps) + [f"run.output_dir={run_dir}", *extra])


def read_rows(run_dir):
  return metrics.read_metrics(pathlib.Path(run_dir) / "metrics.jsonl")


def final_params(run_dir):
  """The params of a run's newest checkpoint as host arrays."""
  with checkpoint.Checkpointer(pathlib.Path(run_dir) / "checkpoints") as ckpt:
    step = ckpt.latest_step()
    return step, ckpt.read_arrays(step)


def check_stream(rows, steps, k):
  assert [r["step"] for r in rows] == list(range(steps + 1))
  hours = [r["compute_hours"] for r in rows]
  assert all(b >= a for a, b in zip(hours, hours[1:]))
  assert all("val/pass_rate" in r for r in rows if r["step"] % 2 == 0)
  trained = [r for r in rows[1:] if "train/loss" in r]
  assert trained, "no step trained"
  assert all(r["staleness/max"] <= k for r in rows[1:])
  assert all(r["flops"] > 0 for r in rows[1:])


# Subprocesses: real signals.


def launch(task_file, run_dir, cache, *extra, steps):
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("XLA_FLAGS", None)  # the command simulates its own devices
  cmd = [sys.executable, "-m", "jaxrl_scale.train", str(ROOT / "configs" / "cpu_tiny.yaml"),
         *tiny_overrides(task_file, steps), "run.progress=true", *extra,
         "--output-dir", str(run_dir)]
  return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def wait_for_step(run_dir, step, proc, timeout=300):
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise AssertionError(f"run exited early:\n{proc.stdout.read()}")
    if path.exists() and any(json.loads(line).get("step") == step
                             for line in path.read_text().splitlines() if line.endswith("}")):
      return
    time.sleep(0.05)
  raise AssertionError(f"step {step} not reached in {timeout}s")


def finish(proc, timeout=300):
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


class Output:
  """Reads a launched run's output in a thread, so a test can wait for a line meanwhile."""

  def __init__(self, proc):
    self.proc, self.lines = proc, []
    self._reader = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
    self._reader.start()

  def wait_for(self, text, timeout):
    deadline = time.monotonic() + timeout
    while not any(text in line for line in list(self.lines)):
      if not self._reader.is_alive():
        raise AssertionError(f"the run ended before printing {text!r}:\n{''.join(self.lines)}")
      if time.monotonic() > deadline:
        raise AssertionError(f"no {text!r} in {timeout}s:\n{''.join(self.lines)}")
      time.sleep(0.05)

  def finish(self, timeout=300):
    self.proc.wait(timeout=timeout)
    self._reader.join(timeout=timeout)
    return self.proc.returncode, "".join(self.lines)
