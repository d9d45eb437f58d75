"""The host side of admission prefill: jobs of admitted rows, cut into pieces.

An admission (the rows placed into free slots in one engine iteration, one job per prompt-
length bucket) is prefilled `piece` positions per engine iteration: the whole bucket, or
`sampler.prefill_chunk` positions (chunked prefill). `next_piece` builds the device input
(`decode.Admission`) of a job's next piece: each distinct prompt once (the G completions of
one prompt share its prefill), every destination row, and which rows the piece completes
(they start decoding). The Sampler (engine.py) dispatches it with `decode.admit_program`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_scale.config import SamplerConfig
from jaxrl_scale.generation import decode, records


def prompt_rows(n: int) -> int:
  """Rows of a shared prefill for n distinct prompts: the next of 1, 2, 3, 4, 6, 8, 12, 16,
  24, ... (powers of two and their 1.5x), so padding wastes at most a third of the rows
  (48 prompts of 16 samples each take 48 rows, not 64) for twice the compiled sizes."""
  p = decode.next_pow2(n)
  return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


@dataclasses.dataclass
class PrefillJob:
  """The prefill of one admission's rows (slot, buffer) in one prompt-length bucket, run
  `piece` positions per engine iteration; `start` positions are done."""

  rows: list[tuple[int, records.TokenBuffer]]
  piece: int
  start: int = 0

  @property
  def done(self) -> bool:
    return all(buf.prefilled for _, buf in self.rows)


def next_piece(job: PrefillJob, cfg: SamplerConfig, num_slots: int,
               ) -> tuple[decode.Admission, list[tuple[int, records.TokenBuffer]], int, int]:
  """The device input of the job's next piece (positions [job.start, job.start + piece)),
  and advances job.start past it.

  Returns:
    (admission, the rows it covers in admission order (those not yet prefilled), u distinct
    prompt rows and n destination rows computed, padding included). The caller marks
    rows[i] prefilled where admission.activate_n[i].
  """
  rows = [(slot, buf) for slot, buf in job.rows if not buf.prefilled]
  start, t = job.start, job.piece
  # Rows with the same prompt (the G completions of one RL prompt) share one prefill.
  sources: dict[tuple[int, ...], int] = {}
  for _, buf in rows:
    sources.setdefault(tuple(buf.request.prompt_tokens), len(sources))
  n = min(decode.next_pow2(len(rows)), num_slots)
  u = min(prompt_rows(len(sources)), n)
  tokens = np.zeros((u, t), np.int32)
  length = np.ones((u,), np.int32)
  src_slot = np.zeros((u,), np.int32)
  for prompt, i in sources.items():
    piece = prompt[start:start + t]
    tokens[i, :len(piece)] = piece
    length[i] = len(prompt)
  cols = {k: np.zeros((n,), dt) for k, dt in (
      ("source", np.int32), ("seed", np.int32), ("temperature", np.float32),
      ("top_k", np.int32), ("top_p", np.float32), ("limit", np.int32),
      ("force_at", np.int32), ("answer_budget", np.int32), ("last", np.int32))}
  slots = np.full((n,), num_slots, np.int32)  # padding rows are dropped
  activate = np.zeros((n,), bool)
  for i, (slot, buf) in enumerate(rows):
    req = buf.request
    slots[i] = slot
    source = sources[tuple(req.prompt_tokens)]
    src_slot[source] = slot  # any row of the prompt holds its earlier pieces
    cols["source"][i] = source
    cols["seed"][i] = buf.seed
    cols["temperature"][i] = cfg.temperature if req.temperature is None else req.temperature
    cols["top_k"][i] = cfg.top_k if req.top_k is None else req.top_k
    cols["top_p"][i] = cfg.top_p if req.top_p is None else req.top_p
    cols["limit"][i] = buf.limit
    cols["force_at"][i] = buf.force_at
    cols["answer_budget"][i] = cfg.answer_budget
    cols["last"][i] = req.prompt_tokens[-1]
    # Positions [0, P - 1) go into the cache; the first decode step feeds the last.
    activate[i] = len(req.prompt_tokens) - 1 <= start + t
  job.start += t
  adm = decode.Admission(
      tokens_uT=tokens, length_u=length, source_n=cols["source"], slot_n=slots,
      src_slot_u=src_slot, activate_n=activate, last_n=cols["last"], seed_n=cols["seed"],
      temperature_n=cols["temperature"], top_k_n=cols["top_k"], top_p_n=cols["top_p"],
      limit_n=cols["limit"], force_at_n=cols["force_at"],
      answer_budget_n=cols["answer_budget"])
  return adm, rows, u, n
