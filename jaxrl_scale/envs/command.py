"""`jaxrl-scale generate` with an environment: episodes turn by turn.

    jaxrl-scale generate --model DIR --prompt "What is 417 * 38?" --env python_tool
    jaxrl-scale generate --model DIR --prompt "2+3=" --env retry --answer 5 \\
        --task arithmetic --max-turns 3 --env-option discount=1.0

Without --env this is `jaxrl-scale generate` as ever (generation/command.py). With it,
every sample is an episode of the named environment: the policy writes a turn, the
environment answers (a tool's output, feedback) and the policy goes on, until the
environment ends it or --max-turns / --max-new-tokens (which counts the whole episode)
runs out. The text output prints each piece under [model] or [env] and the episode's end
with its reward and counters; --json adds the pieces, the environment mask, the reward
and the counters to each completion.

Only stdlib imports at module level: the CLI builds every command's parser at start-up.
"""

from __future__ import annotations

import argparse
from typing import Any

from jaxrl_scale.generation import command as generation_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
  generation_command.add_arguments(parser)
  env = add_env_arguments(parser)
  env.add_argument("--answer", default="", metavar="TEXT",
                   help="the ground truth an environment checks the policy against (retry)")
  env.add_argument("--task", default="arithmetic", metavar="REWARD",
                   help="the verifier that scores an episode's answer (a reward name, e.g. "
                        "arithmetic, math, code; default arithmetic)")


def add_env_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
  """--env, --max-turns, --tool-call-s, --env-option (`generate` and `eval` share them);
  returns their group."""
  env = parser.add_argument_group("environment (multi-turn episodes)")
  env.add_argument("--env", metavar="NAME", default="",
                   help="run each sample as an episode of this environment (python_tool, "
                        "retry, or one registered with envs.registry.register_env)")
  env.add_argument("--max-turns", type=int, default=4, help="model turns (default 4)")
  env.add_argument("--tool-call-s", type=float, default=2.0,
                   help="seconds one tool call may run (default 2)")
  env.add_argument("--env-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the environment (repeatable; the value read as YAML)")
  return env


def env_setup(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
  """Checks `add_env_arguments`' flags (an unknown environment or option, --max-turns:
  one line each) and adds the environment's stop strings to `args.stop`. Returns
  (the episodes' `envs.base.Limits`, the environment's options)."""
  from jaxrl_scale.envs import base, registry  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.errors import UserError  # pylint: disable=g-import-not-at-top

  registry.get_env(args.env)  # an unknown name: one line naming the known ones
  args.stop = [*args.stop, *(s for s in registry.stop_strings(args.env) if s not in args.stop)]
  options = registry.parse_options(args.env_option, what="--env-option")
  if args.max_turns < 1:
    raise UserError(f"--max-turns must be >= 1, got {args.max_turns}")
  limits = base.Limits(max_turns=args.max_turns, max_tokens=args.max_new_tokens,
                       tool_call_s=args.tool_call_s,
                       tool_episode_s=max(args.tool_call_s, 10.0))
  return limits, options


def run(args: argparse.Namespace) -> int:
  if not args.env:
    return generation_command.run(args)
  from jaxrl_scale.envs import registry  # pylint: disable=g-import-not-at-top

  limits, options = env_setup(args)

  def episode_for(i: int, prompt_ids: list[int], tokenizer: Any):
    record = {"id": str(i), "task": args.task, "reward": args.task, "answer": args.answer}
    return registry.episode_maker(args.env, record, prompt_ids, tokenizer, limits, **options)

  return generation_command.run(args, episode_for=episode_for)
