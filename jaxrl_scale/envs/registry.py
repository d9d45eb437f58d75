"""Environments by name, so a config (or a research fork) picks or adds one.

An environment is a factory `fn(ctx: base.EnvContext, **options) -> records.Episode`:
it builds one episode of one sequence from the task record, the prompt's ids, the
tokenizer and the limits. The sampler calls the maker that `episode_maker` returns each
time the sequence starts (again after a preemption), so an episode starts fresh.

  @registry.register_env("echo")
  def echo(ctx, *, role="user"):
    return Echo(ctx, role)

  request = records.Request(prompt_ids, episode=registry.episode_maker(
      "python_tool", record, prompt_ids, tokenizer, base.Limits(max_turns=3)))

Built-in names: "python_tool" (jaxrl_scale/envs/python_tool.py), "retry"
(jaxrl_scale/envs/retry.py).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_scale.envs import base
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.models import tokenizer as tokenizer_lib

EnvFactory = Callable[..., records.Episode]

_ENVS: dict[str, EnvFactory] = {}
_STOPS: dict[str, tuple[str, ...]] = {}  # name -> the stop strings its turns need
_BUILTINS = ("jaxrl_scale.envs.python_tool", "jaxrl_scale.envs.retry")


def _load_builtins() -> None:
  # Imported on first lookup, not at module import: the built-ins register through here.
  for module in _BUILTINS:
    importlib.import_module(module)


def register_env(name: str, stop_strings: Sequence[str] = ()
                 ) -> Callable[[EnvFactory], EnvFactory]:
  """Decorator registering `fn(ctx, **options) -> Episode` under `name`.

  Args:
    name: the name configs use; re-registering a name raises ValueError.
    stop_strings: text that ends a model turn for this environment (python_tool:
      "</python>", so a turn ends at its call): `generate --env` adds them to the
      sampler's, and a training run whose `sampler.stop_strings` lacks one is an error.

  Returns:
    The decorator, which returns the factory unchanged.
  """
  if not name or not isinstance(name, str):
    raise ValueError(f"environment name must be a non-empty string, got {name!r}")

  def decorator(fn: EnvFactory) -> EnvFactory:
    if name in _ENVS and _ENVS[name] is not fn:
      raise ValueError(f"environment {name!r} is already registered")
    _ENVS[name] = fn
    _STOPS[name] = tuple(stop_strings)
    return fn

  return decorator


def stop_strings(name: str) -> tuple[str, ...]:
  """The stop strings environment `name` needs (`register_env`); () for none."""
  get_env(name)
  return _STOPS.get(name, ())


def get_env(name: str) -> EnvFactory:
  """The environment factory registered as `name` (UserError naming the nearest names)."""
  _load_builtins()
  if name not in _ENVS:
    near = difflib.get_close_matches(name, _ENVS, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    raise UserError(f"unknown environment {name!r}{hint} (known: {', '.join(sorted(_ENVS))})")
  return _ENVS[name]


def list_envs() -> list[str]:
  """All registered environment names, sorted."""
  _load_builtins()
  return sorted(_ENVS)


def parse_options(options: Sequence[str], what: str = "env.options") -> dict[str, Any]:
  """Environment options written as "key=value" (the value read as YAML: 3, 0.5, true,
  text) as keyword arguments; `what` names them in a UserError."""
  import yaml  # pylint: disable=g-import-not-at-top

  out: dict[str, Any] = {}
  for option in options:
    key, sep, value = option.partition("=")
    if not sep or not key.strip().isidentifier():
      raise UserError(f"{what}: entries are key=value, got {option!r}")
    try:
      out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as e:
      raise UserError(f"{what}: {option!r}: the value is not YAML ({e})".splitlines()[0]
                      ) from None
  return out


def episode_maker(name: str, record: Mapping[str, Any], prompt_tokens: Sequence[int],
                  tokenizer: tokenizer_lib.Tokenizer, limits: base.Limits | None = None,
                  **options: Any) -> Callable[[], records.Episode]:
  """What `records.Request.episode` takes: a fresh episode of `name` per call.

  One episode is built at once and thrown away, so an unknown option or a chat template
  that cannot render the environment's messages is a UserError here, not a failure on
  the sampler's environment threads.

  Args:
    name: a registered environment.
    record: the task record (answer, tests, ...).
    prompt_tokens: the prompt's ids.
    tokenizer: the policy's tokenizer.
    limits: the episode's limits (default `base.Limits()`).
    **options: the environment's own options (see its factory).

  Returns:
    A callable making a new episode each time.
  """
  factory = get_env(name)
  ctx = base.EnvContext(record=record, prompt_tokens=tuple(int(t) for t in prompt_tokens),
                        tokenizer=tokenizer, limits=limits or base.Limits())
  try:
    factory(ctx, **options)
  except TypeError as e:
    raise UserError(f"environment {name!r}: {e}") from None
  return lambda: factory(ctx, **options)
