"""sampler_bench's baseline: transformers' `generate` in a worker process of its own, on
the CPU or on the GPU JAX runs on (`device_for`), timed to the GPU's completion.

Its failures come back as one line: a machine it cannot run on as `UsageError` (a bad
--hf-device: sampler_bench exits 2 before compiling anything), anything else (out of GPU
memory beside JAX, say) as `HFFailed`, after which the bench goes on without the
comparison (`failed`).
"""

from __future__ import annotations

import multiprocessing
import time

import numpy as np


def _worker(path: str, dtype: str, device: str, conn) -> None:
  """transformers side, in its own process: torch's and XLA's CPU thread pools would
  otherwise spin against each other in one process and distort both timings. On "cuda"
  the model and the prompts live on the GPU and the timing waits for its kernels."""
  import torch
  import transformers

  if device == "cuda" and not torch.cuda.is_available():
    conn.send(("usage", f"--hf-device cuda: torch {torch.__version__} sees no CUDA device "
                        "here; pass --hf-device cpu or --skip-hf"))
    return
  dev = torch.device(device)
  try:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype)).to(dev).eval()
  except Exception as e:  # pylint: disable=broad-except
    conn.send(("failed", _one_line(e)))
    return
  conn.send(("ready", torch.get_num_threads()))
  while True:
    msg = conn.recv()
    if msg is None:
      return
    prompts, new_tokens, threads, temperature = msg
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                if temperature > 0 else dict(do_sample=False))
    try:
      ids = torch.tensor(prompts, device=dev)
      with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0, attention_mask=torch.ones_like(ids), **sampling)
        if dev.type == "cuda":
          torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - start
      tokens = out[:, ids.shape[1]:].cpu().numpy()
    except Exception as e:  # pylint: disable=broad-except
      conn.send(("failed", _one_line(e)))  # e.g. out of GPU memory beside JAX
      return
    conn.send(("done", (seconds, tokens)))


def _one_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


class HFFailed(Exception):
  """transformers' side failed (its message): the bench goes on without the comparison."""


class HF:
  """Batched `generate` of exactly N new tokens per row, timed in a worker process on
  `device` ("cpu" or "cuda")."""

  def __init__(self, path: str, dtype: str, device: str = "cpu"):
    ctx = multiprocessing.get_context("spawn")
    self.device = device
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_worker, args=(path, dtype, device, child), daemon=True)
    self.proc.start()
    kind, value = self._recv()  # torch's default thread count, or why it cannot run
    if kind == "usage":
      self.proc.join()
      raise UsageError(value)
    self.default_threads = value

  def _recv(self) -> tuple[str, object]:
    """The worker's next message; HFFailed (the worker gone) if it failed or died."""
    try:
      kind, value = self.conn.recv()
    except (EOFError, OSError):
      kind, value = "failed", f"the transformers process exited (code {self.proc.exitcode})"
    if kind == "failed":
      self.proc.join(timeout=30)
      raise HFFailed(value)
    return kind, value

  def generate(self, prompts: np.ndarray, new_tokens: int, threads: int,
               temperature: float) -> tuple[float, np.ndarray]:
    self.conn.send((prompts, new_tokens, threads, temperature))
    _, (seconds, tokens) = self._recv()
    assert tokens.shape == (prompts.shape[0], new_tokens)
    return seconds, tokens

  def close(self) -> None:
    if self.proc.is_alive():
      self.conn.send(None)
    self.proc.join()


def failed(e: HFFailed, report: dict, log) -> None:
  """transformers failed on this machine (say, out of GPU memory beside JAX): recorded and
  said, and the bench goes on with ours alone (a device run keeps its main number)."""
  report["hf_error"] = str(e)
  log(f"[decode] transformers failed, no comparison: {e}")


def device_for(choice: str, jax_backend: str) -> str:
  """Where transformers runs: "cuda" or "cpu". `auto` follows JAX: the same GPU when JAX
  runs on one, so the ratio compares two programs on one chip."""
  if choice == "cpu" or (choice == "auto" and jax_backend != "gpu"):
    return "cpu"
  return "cuda"


class UsageError(Exception):
  """Bad arguments for this machine: main prints the message and exits 2."""
