"""The run's environment (config `env`): one episode per request, for rollouts and evals.

    episode_for = environment.episodes(cfg, tokenizer)   # None: single-turn run
    request = records.Request(prompt.token_ids, episode=episode_for(prompt), ...)

Each prompt's record (its answer, task and the task's verifier name) goes to the
environment's factory (jaxrl_scale/envs/), with the episode limits of `env` and its
key=value options. The first episode of every prompt is built at once, so an unknown
environment, a bad option or a chat template without the environment's role stops the
run with one line before any rollout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxrl_scale.config import Config, EnvConfig
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.data import tasks
from jaxrl_scale.envs import base, registry
from jaxrl_scale.generation import records

EpisodeFor = Callable[[data_sources.Prompt], Callable[[], records.Episode]]


def options(env: EnvConfig) -> dict[str, Any]:
  """`env.options` ("key=value", the value read as YAML) as keyword arguments."""
  return registry.parse_options(env.options)


def limits(cfg: Config) -> base.Limits:
  """The episode limits of `cfg.env` (max_tokens 0: the sampler's token budget)."""
  env = cfg.env
  return base.Limits(max_turns=env.max_turns,
                     max_tokens=env.max_tokens or cfg.sampler.max_new_tokens,
                     tool_call_s=env.tool_call_s, tool_episode_s=env.tool_episode_s,
                     tool_output_chars=env.tool_output_chars)


def record(prompt: data_sources.Prompt) -> dict[str, str]:
  """What an environment sees of a prompt: id, task, prompt, answer and `reward` (the
  task's verifier name, tasks.REWARD_FOR_TASK)."""
  return {"id": prompt.id, "task": prompt.task, "prompt": prompt.prompt,
          "answer": prompt.answer, "reward": tasks.reward_name(prompt.task)}


def episodes(cfg: Config, tokenizer: Any) -> EpisodeFor | None:
  """A function giving each prompt its episode maker (`records.Request.episode`), or None
  when the run has no environment (`env.name` empty).

  The environment's rewards default to the run's (rl.reward_correct / reward_incorrect)
  where its factory takes them; an option of the same name in `env.options` wins.
  """
  name = cfg.env.name
  if not name:
    return None
  registry.get_env(name)  # an unknown name fails here, naming the known ones
  opts = options(cfg.env)
  lim = limits(cfg)
  if name == "retry":
    opts.setdefault("correct_reward", cfg.rl.reward_correct)
    opts.setdefault("incorrect_reward", cfg.rl.reward_incorrect)
  made: dict[str, Callable[[], records.Episode]] = {}

  def episode_for(prompt: data_sources.Prompt) -> Callable[[], records.Episode]:
    if prompt.id not in made:  # one maker per prompt: its G requests share it
      made[prompt.id] = registry.episode_maker(name, record(prompt), prompt.token_ids,
                                               tokenizer, lim, **opts)
    return made[prompt.id]

  return episode_for
