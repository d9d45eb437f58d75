"""Downstream evals during training: benchmark pass@k beside the validation pass rate.

With `eval.downstream` (benchmark files) and `eval.downstream_every` (a multiple of
eval.every) set, every eval step whose step is a multiple of downstream_every (and the
last step) also samples eval.downstream_samples completions per benchmark problem with
the run's own sampler, right after the validation eval and with the same weights, and logs

  downstream/<name>/mean@<n>, downstream/<name>/pass@1, downstream/<name>/pass@<n>,
  downstream/<name>/invalid (samples without a verdict), downstream/seconds

in the step's metrics row. Prompts are rendered with the run's template (data.chat_template)
and must fit data.max_prompt_tokens; completions get sampler.max_new_tokens. Like the
validation eval, its time is excluded from compute_hours; its tokens are not added to the
row's flops. A long one prints its progress as the validation eval does
(`progress_for`). One process only: a multi-process run with eval.downstream is refused.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from jaxrl_scale.config import Config
from jaxrl_scale.data import sources
from jaxrl_scale.data import templates
from jaxrl_scale.downstream import benchmarks
from jaxrl_scale.errors import UserError

_DOWNSTREAM_SALT = 0xB3_4C  # seeds apart from the validation eval's


class WithDownstream:
  """An `eval.Evaluator` that also runs downstream benchmarks on the steps they are due.

  Everything but `run` is the wrapped evaluator's (the loop reads `k`, for example).

  Args:
    evaluator: the run's validation evaluator (its `run(params, version)` loads weights).
    sampler: generates with the weights the evaluator just loaded (`generate(requests)`).
    tokenizer: renders prompts, decodes completions.
    benches: the benchmarks.
    every: steps between downstream evals.
    last_step: the run's final step (always evaluated).
    samples: n per problem.
    temperature, seed, template, timeout_s, num_threads: as `benchmarks.evaluate`.
    progress_for: step -> `on_progress(done, total)` for that step's downstream sampling
      (the run's console reporter); None for none.
    episode_for, correct_reward: the run's environment, as `benchmarks.evaluate` takes
      them (None: single-turn samples).
  """

  def __init__(self, evaluator: Any, sampler: Any, tokenizer: Any,
               benches: list[benchmarks.Benchmark], *, every: int, last_step: int,
               samples: int, temperature: float, seed: int = 0,
               template: templates.PromptTemplate = templates.PromptTemplate(),
               timeout_s: float = 5.0, num_threads: int = 4,
               progress_for: Callable[[int], Callable[[int, int], None]] | None = None,
               episode_for: Callable[..., Any] | None = None, correct_reward: float = 1.0):
    self.evaluator = evaluator
    self.sampler = sampler
    self.tokenizer = tokenizer
    self.benches = benches
    self.every = every
    self.last_step = last_step
    self.samples = samples
    self.ks = sorted({1, samples})
    self.temperature = temperature
    self.seed = seed
    self.template = template
    self.timeout_s = timeout_s
    self.num_threads = num_threads
    self.progress_for = progress_for
    self.episode_for = episode_for
    self.correct_reward = correct_reward

  def __getattr__(self, name: str) -> Any:
    return getattr(self.evaluator, name)

  def run(self, params: Any = None, version: int | None = None,
          on_progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """The validation metrics, plus the downstream ones when `version` (the step) is due."""
    out = self.evaluator.run(params, version, on_progress)
    step = self.sampler.version if version is None else version
    if step % self.every == 0 or step == self.last_step:
      out.update(self.run_downstream(step))
    return out

  def run_downstream(self, step: int | None = None) -> dict[str, float]:
    """downstream/<name>/... metrics of the sampler's current weights (sampled for `step`)."""
    t0 = time.perf_counter()
    generate = self.sampler.generate
    if self.progress_for is not None and step is not None:
      generate = functools.partial(generate, on_progress=self.progress_for(step))
    results = benchmarks.evaluate(
        generate, self.tokenizer, self.benches, samples=self.samples, ks=self.ks,
        temperature=self.temperature, seed=self.seed ^ _DOWNSTREAM_SALT, template=self.template,
        timeout_s=self.timeout_s, num_threads=self.num_threads,
        stop=getattr(self.evaluator, "stop", None),  # SIGTERM: abandoned like the eval
        episode_for=self.episode_for, correct_reward=self.correct_reward)
    out = {}
    for result in results:
      prefix = f"downstream/{result['name']}"
      for key, value in result.items():
        if key.startswith(("mean@", "pass@")) and not key.endswith("_problems"):
          out[f"{prefix}/{key}"] = float(value)
      out[f"{prefix}/invalid"] = float(result["invalid"])
    out["downstream/seconds"] = time.perf_counter() - t0
    return out


def read_benchmarks(cfg: Config, tokenizer: Any, processes: int = 1
                    ) -> list[benchmarks.Benchmark]:
  """cfg.eval.downstream's benchmark files, read and checked (UserError naming the key on
  bad input): a run reads them before its warm start, so a bad path stops it at once."""
  if processes > 1:
    raise UserError(f"config key 'eval.downstream': not supported in multi-process runs "
                    f"({processes} processes); run `jaxrl-scale eval` on a checkpoint instead")
  template = templates.PromptTemplate(use_chat_template=cfg.data.chat_template)
  benches = []
  for spec in cfg.eval.downstream:
    try:
      bench = benchmarks.read_benchmark(spec)
    except UserError as e:
      raise UserError(f"config key 'eval.downstream': {e}") from None
    for record, ids in zip(bench.records, benchmarks.prompt_ids(tokenizer, bench, template)):
      if len(ids) > cfg.data.max_prompt_tokens:
        raise UserError(f"config key 'eval.downstream': {bench.path}: problem {record['id']!r} "
                        f"is {len(ids)} tokens, more than data.max_prompt_tokens="
                        f"{cfg.data.max_prompt_tokens}")
    benches.append(bench)
  names = [b.name for b in benches]
  for name in names:
    if names.count(name) > 1:
      raise UserError(f"config key 'eval.downstream': name {name!r} given twice (PATH:NAME)")
  return benches


def from_config(cfg: Config, evaluator: Any, sampler: Any, tokenizer: Any, *,
                processes: int = 1,
                progress_for: Callable[[int], Callable[[int, int], None]] | None = None,
                episode_for: Callable[[Any], Any] | None = None,
                benches: list[benchmarks.Benchmark] | None = None) -> WithDownstream:
  """Wraps `evaluator` with cfg.eval.downstream's benchmarks (`benches`, as
  `read_benchmarks` returned them; read here when None).

  `episode_for`: the run's environment (`pipeline.environment.episodes`: a prompt's
  episode maker); each benchmark problem then runs as an episode of it, as the validation
  eval's prompts do, its correct reward rl.reward_correct."""
  if benches is None:
    benches = read_benchmarks(cfg, tokenizer, processes)
  template = templates.PromptTemplate(use_chat_template=cfg.data.chat_template)
  return WithDownstream(evaluator, sampler, tokenizer, benches, every=cfg.eval.downstream_every,
                        last_step=cfg.run.steps, samples=cfg.eval.downstream_samples,
                        temperature=cfg.eval.temperature, seed=cfg.run.seed,
                        template=template, timeout_s=cfg.pipeline.reward_timeout_s,
                        num_threads=cfg.pipeline.reward_workers, progress_for=progress_for,
                        episode_for=None if episode_for is None else functools.partial(
                            _problem_episode, episode_for, template, tokenizer),
                        correct_reward=cfg.rl.reward_correct)


def _problem_episode(episode_for: Callable[[Any], Any], template: templates.PromptTemplate,
                     tokenizer: Any, bench: benchmarks.Benchmark, record: dict[str, str],
                     ids: list[int]) -> Any:
  """A benchmark problem's episode maker from the run's `episode_for` (which takes the
  prompts of the run's own data: `data.sources.Prompt`)."""
  return episode_for(sources.Prompt(
      id=f"{bench.name}/{record['id']}", task=bench.task, prompt=record["prompt"],
      text=templates.render(tokenizer, record["prompt"], template), token_ids=tuple(ids),
      answer=record["answer"], solution=""))
