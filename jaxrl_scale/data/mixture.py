"""Mixed-domain prompts (math + code in one run): several PromptSources drawn by weight.

`MixedSource` has the interface of `data.sources.PromptSource` (an endless resumable
stream of training prompts, a held-out validation set, a keep hook, a position as a
plain dict), over the sources of `data.sources`:

  * draw n picks source i with probability weight_i / sum(weights), from BLAKE2b(seed, n)
    alone, then takes that source's next prompt. Which domain a draw goes to therefore
    depends on nothing but the seed and the draw's number, so a resumed stream (the draw
    counter and every source's own position restored) draws exactly what an uninterrupted
    one would;
  * every prompt carries its domain (`Prompt.domain`, the source's name, which names its
    metrics) and its verifier (`Prompt.task`: the built-in task's own, or the source's
    `task`), and its id is prefixed with the domain ("code/<id>"), so prompts of two
    sources never share a curriculum entry;
  * each domain holds out its own validation set (its `num_validation`, split by the
    data seed as in a single-source run); `validation()` is all of them, domain by domain;
  * the SFT warm start draws its own stream by each source's `sft_weight` (`from_config(...,
    sft=True)`): domains learn at different speeds in SFT, and RL moves neither a domain
    it starts near zero on nor one it starts near solved.

A source whose prompts the keep hook drops entirely (No-Positive-Resampling solved all of
them) ends the run with `PromptsExhausted` naming it, as a single source does.

    prompts = mixture.from_config(cfg.data, tokenizer)   # PromptSource or MixedSource
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_scale.data import sources
from jaxrl_scale.data import tasks
from jaxrl_scale.data import templates
from jaxrl_scale.errors import UserError
from jaxrl_scale.models import tokenizer as tokenizer_lib


def draw_uniform(seed: int, draw: int) -> float:
  """A uniform number in [0, 1) for draw `draw`: platform- and version-independent."""
  digest = hashlib.blake2b(f"{seed}\x1fmix\x1f{draw}".encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


@dataclasses.dataclass
class Domain:
  """One source of the mixture.

  Attributes:
    name: the domain name (metric keys, id prefix).
    source: its prompts.
    weight: its relative share of the draws.
    task: verifier for all its prompts, or None to keep each record's own.
  """

  name: str
  source: sources.PromptSource
  weight: float
  task: str | None = None

  def prompt(self, prompt: sources.Prompt) -> sources.Prompt:
    return dataclasses.replace(prompt, id=f"{self.name}/{prompt.id}", domain=self.name,
                               task=self.task or prompt.task)


class MixedSource:
  """Training prompts drawn from several sources by weight; each domain's validation set.

  Args:
    domains: the sources, with distinct names and weights > 0.
    seed: selects the domain of every draw.
    keep: called with a (prefixed) prompt id before it is yielded; False skips it.
  """

  def __init__(self, domains: Sequence[Domain], *, seed: int = 0,
               keep: Callable[[str], bool] | None = None):
    if not domains:
      raise ValueError("a mixture needs at least one source")
    names = [d.name for d in domains]
    if len(set(names)) != len(names):
      raise UserError(f"data.sources: domain names must be distinct, got {names}")
    for d in domains:
      if not (np.isfinite(d.weight) and d.weight > 0):
        raise UserError(f"data.sources: domain {d.name!r} has weight {d.weight}, must be > 0")
    self.domains = list(domains)
    self.seed = seed
    weights = np.array([d.weight for d in domains], np.float64)
    self._cum = np.cumsum(weights / weights.sum())
    self._cum[-1] = 1.0  # rounding must not leave a gap above the last source
    self._draws = 0
    self.origin = " + ".join(f"{d.name}: {d.source.origin} x{d.weight:g}" for d in domains)
    self.set_keep(keep)

  @property
  def names(self) -> list[str]:
    return [d.name for d in self.domains]

  @property
  def shares(self) -> dict[str, float]:
    """Each domain's expected fraction of the draws."""
    return dict(zip(self.names, np.diff(self._cum, prepend=0.0).tolist()))

  @property
  def num_train(self) -> int:
    return sum(d.source.num_train for d in self.domains)

  @property
  def num_validation(self) -> int:
    return sum(d.source.num_validation for d in self.domains)

  @property
  def num_records(self) -> int:
    return sum(d.source.num_records for d in self.domains)

  def set_keep(self, keep: Callable[[str], bool] | None) -> None:
    """Installs the keep hook; each source asks it with the domain-prefixed id."""
    for d in self.domains:
      d.source.set_keep(None if keep is None else
                        (lambda pid, name=d.name: keep(f"{name}/{pid}")))

  def domain_of(self, draw: int) -> int:
    """Index of the domain that draw number `draw` takes its prompt from."""
    return int(np.searchsorted(self._cum, draw_uniform(self.seed, draw), side="right"))

  def __iter__(self) -> MixedSource:
    return self

  def __next__(self) -> sources.Prompt:
    domain = self.domains[self.domain_of(self._draws)]
    prompt = next(domain.source)  # raises PromptsExhausted naming the source
    self._draws += 1
    return domain.prompt(prompt)

  def take(self, n: int) -> list[sources.Prompt]:
    """The next `n` training prompts."""
    return [next(self) for _ in range(n)]

  def validation(self) -> list[sources.Prompt]:
    """Every domain's held-out prompts, domain by domain (each in its fixed order)."""
    return [d.prompt(p) for d in self.domains for p in d.source.validation()]

  def stats(self) -> dict[str, int]:
    """Totals over the sources (as PromptSource.stats) and "<domain>/<count>" per source."""
    out: dict[str, int] = {"draws": self._draws}
    for d in self.domains:
      for key, value in d.source.stats().items():
        out[f"{d.name}/{key}"] = value
        if key != "epoch":
          out[key] = out.get(key, 0) + value
    return out

  def state_dict(self) -> dict[str, Any]:
    """{"draws", "seed", "domains": {name: that source's position}}, JSON-serialisable."""
    return {"draws": self._draws, "seed": self.seed,
            "domains": {d.name: d.source.state_dict() for d in self.domains}}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Continues the stream from a `state_dict()` of a mixture of the same sources."""
    positions = state.get("domains")
    if not isinstance(positions, Mapping):
      raise UserError("data position: the checkpoint was written by a single-source run, "
                      f"this run mixes {self.names} (data.sources)")
    if sorted(positions) != sorted(self.names):
      raise UserError(f"data position: the checkpoint's domains {sorted(positions)} differ "
                      f"from data.sources' {sorted(self.names)}")
    draws = state.get("draws")
    if not isinstance(draws, (int, np.integer)) or isinstance(draws, bool) or draws < 0:
      raise UserError(f"data position: 'draws' is missing or not an integer >= 0 in "
                      f"{dict(state)}")
    if state.get("seed") != self.seed:
      raise UserError(f"data position: seed {state.get('seed')} differs from this mixture's "
                      f"seed {self.seed} (data.seed)")
    for d in self.domains:
      d.source.load_state_dict(positions[d.name])
    self._draws = int(draws)


def validation_subset(prompts: Sequence[sources.Prompt], max_prompts: int
                      ) -> list[sources.Prompt]:
  """The first `max_prompts` validation prompts of each domain (0 = all of them).

  A single-source run's prompts have one domain (""), so this is `prompts[:max_prompts]`;
  a mixture keeps every domain in its eval rather than the first domain only.
  """
  if not max_prompts:
    return list(prompts)
  taken: dict[str, int] = {}
  out = []
  for p in prompts:
    if taken.get(p.domain, 0) < max_prompts:
      taken[p.domain] = taken.get(p.domain, 0) + 1
      out.append(p)
  return out


def _source_data_config(cfg: Any, src: Any) -> Any:
  """A single-source DataConfig for entry `src` of `cfg.sources` (shared keys from `cfg`)."""
  return dataclasses.replace(
      cfg, sources=(), source=src.source, prompt_field=src.prompt_field,
      answer_field=src.answer_field, id_field=src.id_field, solution_field=src.solution_field,
      answer_format=src.answer_format, task=src.task or "math", num_train=src.num_train,
      num_validation=src.num_validation)


def from_config(cfg: Any, tokenizer: tokenizer_lib.Tokenizer,
                keep: Callable[[str], bool] | None = None, *, sft: bool = False
                ) -> sources.PromptSource | MixedSource:
  """The prompts of a `jaxrl_scale.config.DataConfig`: its single source when
  `cfg.sources` is empty (`sources.from_config`, unchanged), else a MixedSource.

  Args:
    cfg: the data section.
    tokenizer: encodes the rendered prompts.
    keep: the keep hook (see PromptSource).
    sft: the SFT warm start's mixture: each source's `sft_weight` (when set) instead of
      its `weight`, without the sources whose sft_weight is 0.
  """
  if not cfg.sources:
    return sources.from_config(cfg, tokenizer, keep=keep)
  domains = []
  for i, src in enumerate(cfg.sources):
    weight = src.sft_weight if sft and src.sft_weight is not None else src.weight
    if weight == 0:
      continue
    if src.task is not None:
      try:
        tasks.reward_name(src.task)
      except UserError as e:
        raise UserError(f"config key 'data.sources[{i}].task': {e}") from None
    one = _source_data_config(cfg, src)
    try:
      records, origin = sources.load_records(one)
    except UserError as e:  # its messages name data.source; say which entry
      raise UserError(f"config key 'data.sources[{i}]': {e}") from None
    prompt_source = sources.PromptSource(
        records, tokenizer, max_prompt_tokens=one.max_prompt_tokens,
        num_validation=one.num_validation, seed=one.seed,
        template=templates.PromptTemplate(use_chat_template=one.chat_template),
        origin=f"data.sources[{i}] ({origin})")
    domains.append(Domain(src.domain, prompt_source, weight, src.task))
  if not domains:
    raise UserError("config key 'data.sources': every sft_weight is 0, so the SFT warm start "
                    "has no examples (set sft.steps=0 or give a source an sft_weight > 0)")
  return MixedSource(domains, seed=cfg.seed, keep=keep)
