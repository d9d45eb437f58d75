"""Typed configs from nested dicts, YAML files and dotted `key.sub=value` overrides.

Generic over the frozen dataclasses of `jaxrl_scale.config` (any `cls`): values are coerced
to each field's annotation, and an unknown key, a wrong type or unreadable YAML becomes a
one-line `UserError` naming the dotted key (with the nearest valid name for typos).
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
import types
import typing
from typing import Any, Literal

import yaml

from jaxrl_scale.errors import UserError


def check(cond: bool, key: str, message: str) -> None:
  """A section's `__post_init__` check: raises UserError naming the dotted `key` unless `cond`."""
  if not cond:
    raise UserError(f"config key '{key}': {message}")


def _nearest(name: str, choices, prefix: str = "") -> str:
  match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
  return f" (did you mean '{prefix}{match[0]}'?)" if match else ""


def _type_name(tp) -> str:
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
  """Converts `value` to the annotated type `tp`, or raises UserError naming `key`."""
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    args = typing.get_args(tp)
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _coerce(value, arg, key)
      except UserError as e:
        errors.append(e)
    raise UserError(f"config key '{key}': expected {_type_name(tp)}, got {value!r}")
  if origin is Literal:
    choices = typing.get_args(tp)
    if value not in choices:
      hint = _nearest(str(value), [str(c) for c in choices])
      raise UserError(f"config key '{key}': must be one of {list(choices)}, got {value!r}{hint}")
    return value
  if origin is tuple:
    if isinstance(value, str):
      value = [value]
    if not isinstance(value, (list, tuple)):
      raise UserError(f"config key '{key}': expected a list, got {value!r}")
    (elem, *rest) = typing.get_args(tp)
    return tuple(_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value))
  if dataclasses.is_dataclass(tp):
    if isinstance(value, tp):
      return value
    if not isinstance(value, dict):
      raise UserError(f"config key '{key}': expected a mapping of fields, got {value!r}")
    return _from_dict(tp, value, key + ".")
  if tp is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
      return value.lower() in ("true", "yes", "1")
    raise UserError(f"config key '{key}': expected true/false, got {value!r}")
  if tp is int:
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
      raise UserError(f"config key '{key}': expected an integer, got {value!r}")
    try:
      f = float(value)
    except ValueError:
      raise UserError(f"config key '{key}': expected an integer, got {value!r}") from None
    if not f.is_integer():
      raise UserError(f"config key '{key}': expected an integer, got {value!r}")
    return int(f)
  if tp is float:
    # YAML 1.1 reads "1e-3" (no dot) as a string; accept any float() spelling.
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
      raise UserError(f"config key '{key}': expected a number, got {value!r}")
    try:
      return float(value)
    except ValueError:
      raise UserError(f"config key '{key}': expected a number, got {value!r}") from None
  if tp is str:
    if isinstance(value, (dict, list)) or value is None:
      raise UserError(f"config key '{key}': expected a string, got {value!r}")
    return str(value)
  raise TypeError(f"unsupported config annotation {tp!r} for '{key}'")


def _from_dict(cls, data: dict, prefix: str = ""):
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  kwargs = {}
  for k, v in data.items():
    if k not in hints:
      raise UserError(f"unknown config key '{prefix}{k}'{_nearest(str(k), names, prefix)}")
    kwargs[k] = _coerce(v, hints[k], prefix + k)
  return cls(**kwargs)


def from_dict(data: dict, cls):
  """Builds `cls` from a nested dict of overrides on top of the defaults."""
  return _from_dict(cls, data or {})


def to_dict(cfg) -> dict:
  """Nested plain dict (tuples become lists) for saving the resolved config."""

  def convert(x):
    if dataclasses.is_dataclass(x):
      return {f.name: convert(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, tuple):
      return [convert(v) for v in x]
    return x

  return convert(cfg)


def parse_overrides(overrides: list[str]) -> dict:
  """['rl.loss=grpo', 'optim.lr=1e-6'] -> {'rl': {'loss': 'grpo'}, 'optim': {'lr': '1e-6'}}.

  Values are read as YAML scalars or flow lists ("[16, 32]"), so types match a YAML file.
  """
  out: dict = {}
  for item in overrides:
    if "=" not in item:
      raise UserError(f"override '{item}' is not of the form key.sub=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
      raise UserError(f"override '{item}' has an empty key")
    try:
      value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
      value = raw
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise UserError(f"override '{item}' conflicts with an earlier override of '{part}'")
    node[parts[-1]] = value
  return out


def _merge(base: dict, extra: dict) -> dict:
  out = dict(base)
  for k, v in extra.items():
    if isinstance(v, dict) and isinstance(out.get(k), dict):
      out[k] = _merge(out[k], v)
    else:
      out[k] = v
  return out


def read_yaml(path: str | pathlib.Path) -> dict:
  path = pathlib.Path(path)
  try:
    text = path.read_text()
  except OSError as e:
    raise UserError(f"cannot read config file {path}: {e.strerror}") from None
  try:
    data = yaml.safe_load(text)
  except yaml.YAMLError as e:
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark is not None else ""
    raise UserError(f"config file {path}{where}: invalid YAML") from None
  if data is None:
    return {}
  if not isinstance(data, dict):
    raise UserError(f"config file {path}: top level must be a mapping of sections")
  return data


def load(path: str | pathlib.Path | None, overrides: list[str], cls):
  """Defaults, then the YAML file at `path` (if any), then dotted `overrides`."""
  data = read_yaml(path) if path is not None else {}
  data = _merge(data, parse_overrides(list(overrides)))
  try:
    return from_dict(data, cls)
  except UserError as e:
    if path is not None:
      raise UserError(f"{e} (in {path} or overrides)") from None
    raise


def replace(cfg, **changes):
  """dataclasses.replace for dotted keys: replace(cfg, **{'rl.loss': 'grpo'})."""
  nested: dict = {}
  for key, value in changes.items():
    node = nested
    parts = key.split(".")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = value
  return _from_dict(type(cfg), _merge(to_dict(cfg), nested))
