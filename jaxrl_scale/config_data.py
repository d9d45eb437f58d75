"""Config section of the prompts: `data` (a built-in task, a TFDS dataset or a local file)
and its mixed-domain `data.sources` entries.

Part of `jaxrl_scale.config`, which assembles the sections into one `Config`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal

from jaxrl_scale import config_io

_check = config_io.check


# The tasks whose domain is "code" by default (jaxrl_scale.data.code_problems.CODE_TASKS:
# config is the bottom layer, so the two names are repeated here).
_CODE_TASKS = ("code", "code_fraction")
_DOMAIN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@dataclasses.dataclass(frozen=True)
class SourceConfig:
  """One domain of a mixed-domain run: an entry of `data.sources`."""

  source: str = ""  # built-in task name, "tfds:NAME", or a .jsonl/.parquet path
  weight: float = 1.0  # share of the training prompts: weight / sum of all weights
  # This source's share of the SFT warm start's examples instead (null = `weight`; 0 = no
  # SFT on it). Domains learn at different speeds in SFT (the CPU demo's code task far
  # faster than its arithmetic), so a warm start on the RL mix can leave one domain solved
  # and another unlearned, neither of which RL can move.
  sft_weight: float | None = None
  # Reward function (verifier) of this source's prompts; null = the built-in task's own,
  # "math" for files and TFDS datasets.
  task: str | None = None
  # Domain name in the metric keys rollout/<name>/pass_rate and val/<name>/pass_rate
  # (lower-case letters, digits, '_' and '-'); null = "code" for code tasks, else "math".
  name: str | None = None
  prompt_field: str = "prompt"  # as data.prompt_field, for this source
  answer_field: str = "answer"  # as data.answer_field, for this source
  id_field: str | None = None  # as data.id_field, for this source
  solution_field: str | None = None  # as data.solution_field, for this source
  answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"  # as data.answer_format
  num_train: int = 2000  # built-in tasks: prompts generated for this source
  num_validation: int = 64  # this domain's own held-out prompts, split by data.seed

  @property
  def domain(self) -> str:
    """The domain name: `name`, else derived from the task (code tasks -> "code")."""
    if self.name is not None:
      return self.name
    task = self.task if self.task is not None else self.source.split("/")[0]
    return "code" if task in _CODE_TASKS else "math"


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Prompt source: a built-in task, a TFDS dataset or a local JSONL/Parquet file."""

  source: str = "arithmetic"  # built-in task name, "tfds:NAME", or a .jsonl/.parquet path
  data_dir: str | None = None  # TFDS data_dir (prepared datasets)
  prompt_field: str = "prompt"  # record field holding the prompt text
  answer_field: str = "answer"  # record field holding the reference answer
  id_field: str | None = None  # record field with a unique id; null = derived from the row
  solution_field: str | None = None  # worked solutions for the SFT warm start
  # How the answer field reads: "raw" as is, "gsm8k" (after '####'), "boxed" (last \boxed{}).
  answer_format: Literal["raw", "gsm8k", "boxed"] = "raw"
  task: str = "math"  # reward function for local / TFDS prompts (built-in tasks set their own)
  num_train: int = 2000  # built-in tasks: prompts generated
  num_validation: int = 64  # held-out prompts, split by seed
  max_prompt_tokens: int = 64  # longer prompts (after the template) are dropped and counted
  chat_template: bool = True  # use tokenizer_config.json's template when present
  seed: int = 0  # built-in tasks' generation, the held-out split and the epoch order
  # Mixed-domain training (e.g. math + code): a list of sources, each a mapping with its own
  # source, weight, task (verifier), name (domain) and the per-source keys of SourceConfig.
  # Batches mix them by weight; rollout and validation metrics are also logged per domain,
  # each domain with its own held-out set. Empty = the single source above. When set,
  # data.source, the field keys, data.task, data.num_train and data.num_validation above
  # must stay unset (they belong to each source).
  sources: tuple[SourceConfig, ...] = ()

  def __post_init__(self):
    _check(self.num_validation >= 0, "data.num_validation", "must be >= 0")
    _check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", "must be >= 1")
    if self.sources:
      self._check_sources()

  def _check_sources(self) -> None:
    defaults = DataConfig()
    for key in ("source", "prompt_field", "answer_field", "id_field", "solution_field",
                "answer_format", "task", "num_train", "num_validation"):
      _check(getattr(self, key) == getattr(defaults, key), f"data.{key}",
             "is not used when data.sources is set: give it to each source instead")
    seen: dict[str, int] = {}
    for i, src in enumerate(self.sources):
      key = f"data.sources[{i}]"
      _check(bool(src.source), f"{key}.source", "must name a built-in task, 'tfds:NAME' or "
             "a .jsonl / .parquet file")
      _check(math.isfinite(src.weight) and src.weight > 0, f"{key}.weight",
             f"must be a number > 0, got {src.weight}")
      _check(src.sft_weight is None or (math.isfinite(src.sft_weight) and src.sft_weight >= 0),
             f"{key}.sft_weight", f"must be a number >= 0 or null, got {src.sft_weight}")
      _check(src.num_train >= 1, f"{key}.num_train", f"must be >= 1, got {src.num_train}")
      _check(src.num_validation >= 0, f"{key}.num_validation",
             f"must be >= 0, got {src.num_validation}")
      _check(src.name is None or _DOMAIN_NAME_RE.fullmatch(src.name) is not None,
             f"{key}.name", f"{src.name!r} is not a metric-key name (1-32 of a-z 0-9 _ -, "
             "starting with a letter or digit)")
      domain = src.domain
      _check(domain not in seen, f"{key}.name",
             f"domain {domain!r} is also data.sources[{seen.get(domain)}]'s: give each source "
             "a distinct name")
      seen[domain] = i
