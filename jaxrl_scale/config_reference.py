"""The config reference page (docs/config.md), generated from jaxrl_scale/config.py.

Every key's documentation is read from the config module's own source: the `#` comment at
the end of the field's line(s) and the `#` lines directly above it, and each section's class
docstring as that section's introduction. So the page cannot drift from the code as long as
tests/config_reference_test.py keeps docs/config.md equal to `markdown()`.

    python -m jaxrl_scale.config_reference --write docs/config.md
    python -m jaxrl_scale.config_reference --check docs/config.md
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import json
import math
import pathlib
import re
import sys
import tokenize
import types
import typing
from typing import Any, Literal

from jaxrl_scale import config

DOC_PATH = "docs/config.md"
WRITE_COMMAND = f"python -m jaxrl_scale.config_reference --write {DOC_PATH}"


@dataclasses.dataclass(frozen=True)
class Key:
  """One documented config key."""

  dotted: str  # e.g. "sampler.max_new_tokens"; list elements read "data.sources[].path"
  type: str  # readable type, e.g. "float | null"
  default: str  # as YAML writes it; "" for keys without a default
  doc: str  # the field's comments joined into one paragraph


@dataclasses.dataclass(frozen=True)
class Section:
  """A dataclass of keys: a top-level section or a nested one."""

  dotted: str
  intro: str  # the class docstring ("" when it has none)
  keys: tuple[Key, ...]


# ----------------------------------------------------------------------------------------
# Reading comments and docstrings from the source.


class _Source:
  """The comments and class definitions of one module's source."""

  def __init__(self, module: types.ModuleType):
    text = inspect.getsource(module)
    self.classes = {node.name: node for node in ast.walk(ast.parse(text))
                    if isinstance(node, ast.ClassDef)}
    # line number -> (comment text without '#', whether the comment is the whole line).
    self.comments: dict[int, tuple[str, bool]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.COMMENT:
        whole_line = not tok.line[:tok.start[1]].strip()
        self.comments[tok.start[0]] = (tok.string[1:].strip(), whole_line)

  def docstring(self, cls: type) -> str:
    # Not cls.__doc__: dataclasses invent one ("EvalConfig(every: int = 10, ...)").
    node = self.classes.get(cls.__name__)
    return (ast.get_docstring(node) or "") if node is not None else ""

  def field_comment(self, cls: type, name: str) -> str:
    node = self.classes.get(cls.__name__)
    if node is None:
      return ""
    for stmt in node.body:
      if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
          and stmt.target.id == name):
        break
    else:
      return ""
    above = []
    line = stmt.lineno - 1
    while line in self.comments and self.comments[line][1]:
      above.insert(0, self.comments[line][0])
      line -= 1
    trailing = [self.comments[n][0] for n in range(stmt.lineno, stmt.end_lineno + 1)
                if n in self.comments and not self.comments[n][1]]
    return " ".join(part for part in above + trailing if part)


# ----------------------------------------------------------------------------------------
# Types and defaults as a reader of a YAML file sees them.


def type_name(tp) -> str:
  """A readable name of an annotation: "int", "float | null", "one of a/b", "list of int"."""
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    return " | ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
  if origin is Literal:
    return "one of " + "/".join(str(a) for a in typing.get_args(tp))
  if origin in (tuple, list):
    return "list of " + type_name(typing.get_args(tp)[0])
  if dataclasses.is_dataclass(tp):
    return "mapping"
  return getattr(tp, "__name__", str(tp))


# YAML 1.1 reads these plain words as booleans or null, so a string spelled so needs quotes.
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
_PLAIN = re.compile(r"[A-Za-z_/.][A-Za-z0-9_/.+-]*")


def yaml_value(value: Any) -> str:
  """`value` as PyYAML's safe_dump writes it in flow style (without importing yaml)."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    if math.isnan(value):
      return ".nan"
    if math.isinf(value):
      return ".inf" if value > 0 else "-.inf"
    text = repr(value).lower()
    # PyYAML's float representer: "5e-07" would read back as a string in YAML 1.1.
    if "." not in text and "e" in text:
      text = text.replace("e", ".0e", 1)
    return text
  if isinstance(value, str):
    if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
      return value
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar
  if isinstance(value, (tuple, list)):
    return "[" + ", ".join(yaml_value(v) for v in value) + "]"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{yaml_value(k)}: {yaml_value(v)}" for k, v in value.items()) + "}"
  raise TypeError(f"no YAML spelling for default {value!r}")


# ----------------------------------------------------------------------------------------
# Walking the config.


def _list_element(tp):
  """The dataclass a `tuple[X, ...]` field holds, else None."""
  if typing.get_origin(tp) in (tuple, list):
    args = typing.get_args(tp)
    if args and dataclasses.is_dataclass(args[0]):
      return args[0]
  return None


def _default(field: dataclasses.Field) -> Any:
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return dataclasses.MISSING


def sections(module: types.ModuleType | None = None) -> list[Section]:
  """Every section of `module.Config` (default: jaxrl_scale.config), nested sections after
  their parent, in field order."""
  module = module or config
  source = _Source(module)
  out: list[Section] = []

  def walk(cls: type, prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    keys, nested = [], []
    for field in dataclasses.fields(cls):
      tp, dotted = hints[field.name], prefix + field.name
      element = _list_element(tp)
      if dataclasses.is_dataclass(tp):
        nested.append((tp, dotted))
        continue
      if element is not None:
        nested.append((element, dotted + "[]"))
      default = _default(field)
      keys.append(Key(
          dotted=dotted,
          type=f"list of mappings ({dotted}[].*)" if element is not None else type_name(tp),
          default="" if default is dataclasses.MISSING else yaml_value(
              config.to_dict(default) if element is not None else default),
          doc=source.field_comment(cls, field.name)))
    if prefix or keys:  # Config's own scalars, if it ever has any, form a "top level" section
      out.append(Section(prefix.rstrip(".") or "top level", source.docstring(cls), tuple(keys)))
    for sub, dotted in nested:
      walk(sub, dotted + ".")

  walk(module.Config, "")
  return out


# ----------------------------------------------------------------------------------------
# Rendering.


def _cell(text: str) -> str:
  """`text` fit for a table cell: '|' escaped, and '<', '>' outside `code` so that
  "rollout/<name>" is not read as an HTML tag."""
  parts = text.replace("\n", " ").split("`")
  for i in range(0, len(parts), 2):
    parts[i] = parts[i].replace("<", "\\<").replace(">", "\\>")
  return "`".join(parts).replace("|", "\\|")


def markdown(module: types.ModuleType | None = None) -> str:
  """The whole docs/config.md page for `module` (default: jaxrl_scale.config)."""
  lines = [
      "# Configuration reference",
      "",
      "Generated from the field comments and section docstrings of `jaxrl_scale/config.py`;"
      f" do not edit by hand. Regenerate with `{WRITE_COMMAND}`.",
      "Every key below has the default shown; a YAML file given to `jaxrl-scale train` overrides"
      " any of them (section, then key), and `key.sub=value` arguments after the file override"
      " the file, e.g. `jaxrl-scale train configs/cpu_tiny.yaml rl.loss=grpo optim.lr=1e-6`.",
      "",
  ]
  secs = sections(module)
  lines.append("Sections: " + ", ".join(f"[`{s.dotted}`](#{_anchor(s.dotted)})" for s in secs)
               + ".")
  for sec in secs:
    lines += ["", f"## {sec.dotted}", ""]
    if sec.intro:
      lines += [sec.intro, ""]
    lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key in sec.keys:
      default = f"`{_code(key.default)}`" if key.default else "(required)"
      lines.append(f"| `{key.dotted}` | {_type_cell(key.type)} | {default} | {_cell(key.doc)} |")
  return "\n".join(lines) + "\n"


def _code(text: str) -> str:
  # Inside a code span only the table's '|' needs escaping (GFM unescapes it first).
  return text.replace("|", "\\|")


def _type_cell(name: str) -> str:
  if name.startswith("one of "):
    return "one of " + "/".join(f"`{_code(c)}`" for c in name[len("one of "):].split("/"))
  return f"`{_code(name)}`"


def _anchor(heading: str) -> str:
  # GitHub's heading anchors: lower case, punctuation other than '-' and '_' dropped.
  return re.sub(r"[^a-z0-9_\- ]", "", heading.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m jaxrl_scale.config_reference",
      description="Write or check the config reference generated from jaxrl_scale/config.py.")
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--write", metavar="PATH", help=f"write the page to PATH (e.g. {DOC_PATH})")
  group.add_argument("--check", metavar="PATH",
                     help="exit 1 when PATH differs from the generated page")
  args = parser.parse_args(argv)
  text = markdown()
  if args.write:
    pathlib.Path(args.write).write_text(text)
    return 0
  if args.check:
    path = pathlib.Path(args.check)
    try:
      current = path.read_text()
    except OSError as e:
      print(f"{path}: cannot read ({e.strerror}); generate it with "
            f"`python -m jaxrl_scale.config_reference --write {path}`", file=sys.stderr)
      return 1
    if current != text:
      print(f"{path} is stale (jaxrl_scale/config.py changed): regenerate it with "
            f"`python -m jaxrl_scale.config_reference --write {path}`", file=sys.stderr)
      return 1
    return 0
  sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
