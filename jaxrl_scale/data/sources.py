"""Encoded prompts for training and validation, with a position that resumes exactly.

`PromptSource` takes random-access records (a list, or a TFDS `RecordView`) in the
contract of `jaxrl_scale.data.tasks` and

  * holds out a validation set chosen by seed: the `num_validation` records whose
    BLAKE2b(seed, id) is smallest. The choice depends on the ids and the seed only, not on
    storage order, the tokenizer or the length limit, so runs that differ in recipe share
    their validation prompts;
  * renders each prompt with the chat template when the tokenizer has one (else the plain
    template) and drops prompts longer than `max_prompt_tokens`, counting them;
  * yields training prompts forever, reshuffled every epoch by (seed, epoch), asking the
    `keep(prompt_id)` hook first so the No-Positive-Resampling curriculum can drop
    prompts (skips are counted);
  * exposes its position {epoch, index, seed, num_train} as a plain dict for checkpoints:
    `load_state_dict` continues the stream exactly where `state_dict` was taken.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_scale.data import code_problems
from jaxrl_scale.data import records as records_lib
from jaxrl_scale.data import tasks
from jaxrl_scale.data import templates
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib

_SCAN_CHUNK = 1024


class PromptsExhausted(UserError):
  """Every training prompt was dropped by the keep hook (e.g. all solved)."""


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One prompt ready for the sampler.

  Attributes:
    id: the record's stable id (the curriculum's key).
    task: selects the reward function (tasks.REWARD_FOR_TASK).
    prompt: the question as stored.
    text: the rendered input (chat or plain template).
    token_ids: `text` encoded, at most max_prompt_tokens long.
    answer: ground truth for the verifier.
    solution: SFT warm-start target.
    domain: the domain of a mixed-domain run (data/mixture.py), which names its metrics;
      "" for a single-source run.
  """

  id: str
  task: str
  prompt: str
  text: str
  token_ids: tuple[int, ...]
  answer: str
  solution: str
  domain: str = ""


def _get_many(records: Sequence[Mapping[str, str]], indices: list[int]) -> list:
  if not indices:
    return []
  get_many = getattr(records, "get_many", None)
  return get_many(indices) if get_many is not None else [records[i] for i in indices]


def _split_key(seed: int, record_id: str) -> bytes:
  return hashlib.blake2b(f"{seed}\x1f{record_id}".encode("utf-8"), digest_size=8).digest()


class PromptSource:
  """Training prompts (an endless, resumable, reshuffled stream) and held-out validation."""

  def __init__(self, records: Sequence[Mapping[str, str]],
               tokenizer: tokenizer_lib.Tokenizer, *, max_prompt_tokens: int,
               num_validation: int = 0, seed: int = 0,
               template: templates.PromptTemplate | None = None,
               keep: Callable[[str], bool] | None = None, origin: str = "prompts"):
    """Scans every record once: renders, tokenizes and splits.

    Args:
      records: random-access records with keys tasks.RECORD_KEYS.
      tokenizer: encodes rendered prompts.
      max_prompt_tokens: longer prompts are dropped and counted.
      num_validation: held-out prompts (chosen before the length filter).
      seed: selects the validation set and the shuffle of every epoch.
      template: chat/plain template choice; default uses the chat template if present.
      keep: called with a prompt id before it is yielded; False skips it.
      origin: names the records in error messages (a file, "tfds:gsm8k").
    """
    if max_prompt_tokens < 1:
      raise UserError(f"{origin}: max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    if not 0 <= num_validation < len(records):
      raise UserError(f"{origin}: num_validation={num_validation} must be in [0, "
                      f"{len(records)}) to leave training prompts ({len(records)} records)")
    self._records = records
    self._tokenizer = tokenizer
    self._template = template or templates.PromptTemplate()
    self._max_prompt_tokens = max_prompt_tokens
    self._keep = keep
    self.origin = origin
    self.seed = seed
    lengths, keys = self._scan()
    # Rank by hash of (seed, id): a stable choice whatever the storage order (TFDS
    # shuffles on write) and whatever the tokenizer.
    is_validation = np.zeros(len(records), dtype=bool)
    is_validation[sorted(range(len(records)), key=keys.__getitem__)[:num_validation]] = True
    fits = lengths <= max_prompt_tokens
    self._train_indices = np.flatnonzero(~is_validation & fits)
    validation = np.flatnonzero(is_validation & fits)
    self._validation_indices = validation[np.argsort([keys[i] for i in validation],
                                                     kind="stable")]
    self.num_records = len(records)
    self.num_too_long = int(np.sum(~is_validation & ~fits))
    self.num_validation_too_long = int(np.sum(is_validation & ~fits))
    self.num_filtered = 0
    if len(self._train_indices) == 0:
      raise UserError(f"{origin}: no training prompt fits max_prompt_tokens="
                      f"{max_prompt_tokens} ({self.num_too_long} dropped as too long)")
    self._epoch, self._index = 0, 0
    self._order = self._epoch_order(0)
    self._validation: list[Prompt] | None = None

  def _scan(self) -> tuple[np.ndarray, list[bytes]]:
    lengths = np.zeros(len(self._records), dtype=np.int64)
    keys: list[bytes] = []
    for start in range(0, len(self._records), _SCAN_CHUNK):
      indices = list(range(start, min(start + _SCAN_CHUNK, len(self._records))))
      chunk = _get_many(self._records, indices)
      for i, record in zip(indices, chunk):
        self._check_record(record, i)
      texts = [templates.render(self._tokenizer, r["prompt"], self._template) for r in chunk]
      encoded = templates.encode_rendered(self._tokenizer, texts, self._template)
      lengths[start:start + len(chunk)] = [len(ids) for ids in encoded]
      keys.extend(_split_key(self.seed, r["id"]) for r in chunk)
    return lengths, keys

  def _check_record(self, record: Any, index: int) -> None:
    if not isinstance(record, Mapping):
      raise UserError(f"{self.origin}: record {index} is a {type(record).__name__}, not a dict")
    for key in tasks.RECORD_KEYS:
      if not isinstance(record.get(key), str):
        raise UserError(f"{self.origin}: record {index}: field {key!r} is missing or not a "
                        "string")

  def _epoch_order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(len(self._train_indices))

  def _prompt(self, record: Mapping[str, str]) -> Prompt:
    text = templates.render(self._tokenizer, record["prompt"], self._template)
    (ids,) = templates.encode_rendered(self._tokenizer, [text], self._template)
    return Prompt(id=record["id"], task=record["task"], prompt=record["prompt"], text=text,
                  token_ids=tuple(ids), answer=record["answer"], solution=record["solution"])

  @property
  def num_train(self) -> int:
    """Training prompts that fit the length limit (before the keep hook)."""
    return len(self._train_indices)

  @property
  def num_validation(self) -> int:
    """Validation prompts that fit the length limit."""
    return len(self._validation_indices)

  def set_keep(self, keep: Callable[[str], bool] | None) -> None:
    """Installs (or removes) the hook asked before yielding each training prompt."""
    self._keep = keep

  def __iter__(self) -> PromptSource:
    return self

  def __next__(self) -> Prompt:
    skipped_in_a_row = 0
    while True:
      if self._index >= len(self._order):
        self._epoch, self._index = self._epoch + 1, 0
        self._order = self._epoch_order(self._epoch)
      record = self._records[int(self._train_indices[self._order[self._index]])]
      self._index += 1
      if self._keep is None or self._keep(record["id"]):
        return self._prompt(record)
      self.num_filtered += 1
      skipped_in_a_row += 1
      if skipped_in_a_row >= len(self._train_indices):
        raise PromptsExhausted(f"{self.origin}: the curriculum dropped all {self.num_train} "
                               "training prompts")

  def take(self, n: int) -> list[Prompt]:
    """The next `n` training prompts."""
    return [next(self) for _ in range(n)]

  def validation(self) -> list[Prompt]:
    """The held-out prompts, in a fixed order (the keep hook does not apply)."""
    if self._validation is None:
      chunk = _get_many(self._records, [int(i) for i in self._validation_indices])
      self._validation = [self._prompt(r) for r in chunk]
    return list(self._validation)

  def stats(self) -> dict[str, int]:
    """Counts for logging: sizes, length-limit drops and curriculum skips."""
    return {"records": self.num_records, "train": self.num_train,
            "validation": self.num_validation, "dropped_too_long": self.num_too_long,
            "validation_dropped_too_long": self.num_validation_too_long,
            "filtered": self.num_filtered, "epoch": self._epoch}

  def state_dict(self) -> dict[str, int]:
    """The stream position: {epoch, index, seed, num_train}, JSON-serialisable."""
    return {"epoch": self._epoch, "index": self._index, "seed": self.seed,
            "num_train": self.num_train}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Continues the stream from a `state_dict()` of a source over the same data."""
    for key in ("epoch", "index", "seed", "num_train"):
      if not isinstance(state.get(key), (int, np.integer)) or isinstance(state.get(key), bool):
        raise UserError(f"data position: {key!r} is missing or not an integer in {dict(state)}")
    if state["seed"] != self.seed:
      raise UserError(f"data position: seed {state['seed']} differs from this source's seed "
                      f"{self.seed} (data.seed)")
    if state["num_train"] != self.num_train:
      raise UserError(f"data position: num_train {state['num_train']} differs from "
                      f"{self.num_train} training prompts in {self.origin} (data changed?)")
    if state["epoch"] < 0 or not 0 <= state["index"] <= self.num_train:
      raise UserError(f"data position: epoch {state['epoch']} / index {state['index']} out of "
                      f"range for {self.num_train} training prompts")
    self._epoch, self._index = int(state["epoch"]), int(state["index"])
    self._order = self._epoch_order(self._epoch)


def _is_local_file(source: str) -> bool:
  return source.lower().endswith((".jsonl", ".json", ".parquet"))


def load_records(cfg: Any) -> tuple[Sequence[Mapping[str, str]], str]:
  """The records named by a `jaxrl_scale.config.DataConfig`, and an origin for messages.

  data.source is a built-in task ("arithmetic", "countdown/n4", "code/io"), "tfds:NAME" or
  a .jsonl / .parquet path; a path with data.task "code" / "code_fraction" is read as code
  problems in the datasets' own layouts (data/code_problems.py). Built-in tasks generate num_train + num_validation records from
  data.seed; with data.data_dir set, built-in tasks and local files go through their TFDS
  builders (prepared there once), without it they are generated / read in memory. The
  records are the same either way.
  """
  source = cfg.source
  # answer_format / solution_field / task are optional DataConfig fields (MATH-style files
  # need answer_format="boxed"); defaults read the answer field as is.
  field_options = {"answer_format": getattr(cfg, "answer_format", "raw"),
                   "solution_field": getattr(cfg, "solution_field", None),
                   "task": getattr(cfg, "task", "math")}
  if source.startswith("tfds:"):
    from jaxrl_scale.data import tfds_builders  # pylint: disable=g-import-not-at-top
    name = source[len("tfds:"):]
    fields = None
    if name.split("/")[0] not in tfds_builders.KNOWN_DATASETS:
      fields = records_lib.FieldMap(prompt_field=cfg.prompt_field,
                                    answer_field=cfg.answer_field, id_field=cfg.id_field,
                                    **field_options)
    return tfds_builders.tfds_dataset(name, data_dir=cfg.data_dir, fields=fields), source
  if _is_local_file(source) and field_options["task"] in code_problems.CODE_TASKS:
    # Code files: the datasets' own layouts, read as-is (data/code_problems.py).
    if cfg.data_dir is None:
      return code_problems.read_local(source, task=field_options["task"]), source
    from jaxrl_scale.data import tfds_builders  # pylint: disable=g-import-not-at-top
    return tfds_builders.code_file(source, task=field_options["task"],
                                   data_dir=cfg.data_dir), source
  if _is_local_file(source):
    fields = records_lib.FieldMap(prompt_field=cfg.prompt_field, answer_field=cfg.answer_field,
                                  id_field=cfg.id_field, **field_options)
    if cfg.data_dir is None:
      return records_lib.read_local(source, fields), source
    from jaxrl_scale.data import tfds_builders  # pylint: disable=g-import-not-at-top
    return tfds_builders.local_file(source, fields, data_dir=cfg.data_dir), source
  if source.split("/")[0] not in tasks.TASKS:
    raise UserError(f"data.source: {source!r} is not a built-in task ({', '.join(tasks.TASKS)}"
                    "), 'tfds:NAME' or a .jsonl / .parquet file")
  task, preset, params = tasks.parse_task(source)
  n = cfg.num_train + cfg.num_validation
  if cfg.data_dir is None:
    return tasks.generate(task, n, cfg.seed, **params), source
  from jaxrl_scale.data import tfds_builders  # pylint: disable=g-import-not-at-top
  config_cls = {"arithmetic": tfds_builders.ArithmeticConfig,
                "countdown": tfds_builders.CountdownConfig,
                "code": tfds_builders.CodeConfig}.get(task)
  if config_cls is None:
    raise UserError(f"data.data_dir: the built-in task {task!r} has no TFDS builder; leave "
                    "data.data_dir unset (its problems are generated in memory)")
  config = config_cls(name=f"{preset}_n{n}_s{cfg.seed}", num_train=n, num_test=0,
                      seed=cfg.seed, **params)
  return tfds_builders.builtin(task, config, data_dir=cfg.data_dir), source


def from_config(cfg: Any, tokenizer: tokenizer_lib.Tokenizer,
                keep: Callable[[str], bool] | None = None) -> PromptSource:
  """A PromptSource for a `jaxrl_scale.config.DataConfig` (see `load_records`)."""
  records, origin = load_records(cfg)
  return PromptSource(records, tokenizer, max_prompt_tokens=cfg.max_prompt_tokens,
                      num_validation=cfg.num_validation, seed=cfg.seed,
                      template=templates.PromptTemplate(use_chat_template=cfg.chat_template),
                      keep=keep, origin=origin)
