"""The run's environment (config `env`): one episode per request, for rollouts and evals.

    episode_for = environment.episodes(cfg, tokenizer)   # None: single-turn run
    request = records.Request(prompt.token_ids, episode=episode_for(prompt), ...)

Each prompt's record (its answer, task and the task's verifier name) goes to the
environment's factory (jaxrl_scale/envs/), with the episode limits of `env` and its
key=value options. The first episode of every prompt is built at once, so an unknown
environment, a bad option or a chat template without the environment's role stops the
run with one line before any rollout. `trace_examples` turns tool-using solutions into the
SFT warm start's examples by playing them through the same environment.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrl_scale.config import Config, EnvConfig
from jaxrl_scale.data import sources as data_sources
from jaxrl_scale.data import tasks
from jaxrl_scale.envs import base, registry
from jaxrl_scale.errors import UserError
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
  missing = [s for s in registry.stop_strings(name) if s not in cfg.sampler.stop_strings]
  if missing:
    raise UserError(f"config key 'sampler.stop_strings': environment {name!r} ends a turn at "
                    f"{missing[0]!r}: add it to the list")
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


def split_turns(solution: str, stop_strings: Sequence[str]) -> list[str]:
  """A tool-using solution's model turns: each ends at (and keeps) the first stop string
  found in what is left, as the sampler ends a turn; the rest is the last turn."""
  stops = [s for s in stop_strings if s]
  turns, rest = [], solution
  while stops:
    hits = [(rest.find(s), s) for s in stops if s in rest]
    if not hits:
      break
    at, stop = min(hits)
    turns.append(rest[:at + len(stop)])
    rest = rest[at + len(stop):]
  if rest or not turns:
    turns.append(rest)
  return turns


def trace_examples(prompts: Sequence[data_sources.Prompt], tokenizer: Any,
                   episode_for: EpisodeFor, stop_strings: Sequence[str], *,
                   workers: int = 1) -> tuple[list[tuple[list[int], list[int]]], int]:
  """SFT examples from tool-using solutions, played through the run's environment.

  Each solution is the model's turns (`split_turns`); they are given to a fresh episode
  one by one, so what comes between two turns is the environment's own tokens (a real
  tool call's output, rendered with the chat template), exactly what RL's episodes hold.
  Each model turn is one example whose prompt is everything before it: the environment's
  tokens carry no loss. The last turn ends on EOS. A trace whose episode ends before its
  last turn (a limit, a failed tool) is dropped whole.

  Returns:
    (examples in prompt order, traces dropped).
  """
  def play(prompt: data_sources.Prompt) -> list[tuple[list[int], list[int]]] | None:
    turns = split_turns(prompt.solution, stop_strings)
    episode = episode_for(prompt)()
    context, out = list(prompt.token_ids), []
    for i, text in enumerate(turns):
      last = i == len(turns) - 1
      ids = [int(t) for t in tokenizer.encode(text)] + ([tokenizer.eos_id] if last else [])
      out.append((list(context), ids))
      if last:
        return out
      context += ids
      step = episode.step(records.Turn(tokens=np.asarray(ids, np.int32),
                                       finish_reason=records.STOP, index=i))
      if step.done:
        return None
      context += [int(t) for t in step.tokens]
    return out

  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    played = list(pool.map(play, [p for p in prompts if p.solution]))
  examples = [ex for trace in played if trace is not None for ex in trace]
  return examples, sum(trace is None for trace in played)
