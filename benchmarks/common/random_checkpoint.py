"""Random Qwen3 checkpoints in Hugging Face form, written with `transformers`, for the
benches that load a model from disk (sampler_bench, prefill_bench) and for the GPU suite's
decode runs (`CheckpointWriter`: in a background process while other runs go on)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The GPU suite's decode model: Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 heads of 128,
# 8 kv heads, MLP 3072, vocab 151936, tied), random, in bfloat16.
QWEN3_0P6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                  rope_theta=1000000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def write_qwen3(path: str, dtype: str, **config) -> str:
  """Writes a random Qwen3 (`transformers.Qwen3Config(**config)`, torch seed 0) in `dtype`
  into PATH.partial, then renames it to `path`: a write killed midway leaves no checkpoint
  that looks whole. Returns where the time went (import, random init, save)."""
  t = time.perf_counter()
  import torch
  import transformers

  imported = time.perf_counter()
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(**config)
  model = transformers.AutoModelForCausalLM.from_config(
      cfg, dtype=getattr(torch, dtype)).eval()
  built = time.perf_counter()
  partial = path + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  model.save_pretrained(partial)
  os.replace(partial, path)
  return (f"import {imported - t:.1f} s, random init {built - imported:.1f} s, save "
          f"{time.perf_counter() - built:.1f} s")


def write_qwen3_0p6b(path: str) -> str:
  """The GPU suite's decode checkpoint (QWEN3_0P6B in bfloat16): 12 s on a 2-core CPU, 45-52
  s on the device machine in 2026-11, hence `CheckpointWriter`."""
  return write_qwen3(path, "bfloat16", **QWEN3_0P6B)


# The writer's torch threads: the runs beside it keep most of the host's cores.
WRITER_THREADS = 4


def writer_command(path: str) -> list[str]:
  """The process that writes the suite's checkpoint (`write_qwen3_0p6b`), on the CPU only."""
  return [sys.executable, "-c",
          "import sys; from benchmarks.common import random_checkpoint as r; "
          "print(r.write_qwen3_0p6b(sys.argv[1]))", path]


class CheckpointWriter:
  """Writes the decode runs' checkpoint in a background process from the suite's start, so
  the runs before the first decode run (the kernel checks, train steps) use the time it
  takes; the first decode run waits for it (`wait`). CPU only (no CUDA device visible to
  it, WRITER_THREADS torch threads): it neither takes GPU memory from a run nor competes
  for the GPU."""

  def __init__(self, path: str, log):
    self.path, self.log = path, log
    self.error: str | None = None
    self.start = time.perf_counter()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(WRITER_THREADS),
               PYTHONUNBUFFERED="1")
    log(f"=== writing the Qwen3-0.6B-shaped checkpoint in the background ({path})")
    # Its output goes to a file, not a pipe nobody reads until it ends (a full pipe would
    # stall it).
    self.output = tempfile.TemporaryFile(mode="w+")
    self.proc = subprocess.Popen(writer_command(path), cwd=ROOT, env=env,
                                 stdout=self.output, stderr=subprocess.STDOUT, text=True)

  def wait(self, timeout: float) -> str | None:
    """None once the checkpoint is there; else why not (the write failed, or did not end
    within `timeout` s: then it is stopped). Logs the outcome once."""
    if self.proc is None:
      return self.error
    waited = time.perf_counter()
    try:
      self.proc.wait(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
      self.stop()
      self.error = f"the checkpoint was not written within {timeout:.0f} s of waiting"
      self.log(f"=== {self.error}")
      return self.error
    self.output.seek(0)
    lines = [x for x in self.output.read().splitlines() if x.strip()]
    self.output.close()
    last = lines[-1] if lines else ""
    if self.proc.returncode != 0 or not os.path.isdir(self.path):
      self.error = f"writing the checkpoint failed (exit {self.proc.returncode}): {last[:300]}"
      self.log(f"=== {self.error}")
    else:
      self.log(f"=== wrote the Qwen3-0.6B-shaped checkpoint in "
               f"{time.perf_counter() - self.start:.1f} s ({last}); the first decode run "
               f"waited {time.perf_counter() - waited:.1f} s for it")
    self.proc = None
    return self.error

  def stop(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    self.proc = None
    self.output.close()
