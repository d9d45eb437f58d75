"""The config reference (docs/config.md and a page per section under docs/config/),
generated from the config classes of jaxrl_scale/config.py and its section modules.

Every key's documentation is read from its class's own module source: the `#` comment at
the end of the field's line(s) and the `#` lines directly above it, and each section's class
docstring as that section's introduction. So the pages cannot drift from the code as long as
tests/config_reference_test.py keeps them equal to `pages()`.

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
  source: str = ""  # the file that defines the section's class, e.g. "jaxrl_scale/config.py"


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
  sources: dict[str, _Source] = {}
  out: list[Section] = []

  def walk(cls: type, prefix: str) -> None:
    # A section's comments are in the module that defines its class (config.py's own or one
    # of the section modules it imports).
    name = cls.__module__
    if name not in sources:
      sources[name] = _Source(sys.modules[name])
    source = sources[name]
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
      out.append(Section(prefix.rstrip(".") or "top level", source.docstring(cls), tuple(keys),
                         _file_name(sys.modules[name])))
    for sub, dotted in nested:
      walk(sub, dotted + ".")

  walk(module.Config, "")
  return out


def _file_name(module: types.ModuleType) -> str:
  """`module`'s file as the page names it: relative to the repository for the package's
  modules ("jaxrl_scale/config_model.py"), else the file's own name."""
  path = pathlib.Path(getattr(module, "__file__", "") or module.__name__ + ".py").resolve()
  root = pathlib.Path(__file__).resolve().parents[1]
  return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


# ----------------------------------------------------------------------------------------
# Rendering.


def _cell(text: str) -> str:
  """`text` fit for a table cell: '|' escaped, and '<', '>' outside `code` so that
  "rollout/<name>" is not read as an HTML tag."""
  parts = text.replace("\n", " ").split("`")
  for i in range(0, len(parts), 2):
    parts[i] = parts[i].replace("<", "\\<").replace(">", "\\>")
  return "`".join(parts).replace("|", "\\|")


def _table(sec: Section) -> list[str]:
  lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
  for key in sec.keys:
    default = f"`{_code(key.default)}`" if key.default else "(required)"
    lines.append(f"| `{key.dotted}` | {_type_cell(key.type)} | {default} | {_cell(key.doc)} |")
  return lines


def _summary(intro: str) -> str:
  """The first paragraph of a section's docstring, on one line."""
  return " ".join(intro.split("\n\n")[0].split())


def pages(module: types.ModuleType | None = None, index: str = "config.md") -> dict[str, str]:
  """Every page of the reference for `module` (default: jaxrl_scale.config): relative path
  -> text. `index` (e.g. "config.md") is a short page of the sections, linking to one page per
  top-level section in the folder of its stem ("config/run.md"); a nested section
  (`data.sources[]`) is on its parent's page."""
  stem = pathlib.PurePosixPath(index).stem
  secs = sections(module)
  top = [s for s in secs if "." not in s.dotted]
  lines = [
      "# Configuration reference",
      "",
      "Generated from the field comments and section docstrings of the config classes; do not"
      f" edit by hand. Regenerate with `{WRITE_COMMAND}` (it writes this page and the section"
      f" pages under `docs/{stem}/`).",
      "Every key has the default shown on its section's page; a YAML file given to"
      " `jaxrl-scale train` overrides any of them (section, then key), and `key.sub=value`"
      " arguments after the file override the file, e.g."
      " `jaxrl-scale train configs/cpu_tiny.yaml rl.loss=grpo optim.lr=1e-6`.",
      "",
      "| Section | Keys | What it sets | Defined in |",
      "| --- | --- | --- | --- |",
  ]
  out: dict[str, str] = {}
  for sec in top:
    page = f"{stem}/{_page_name(sec.dotted)}.md"
    family = [s for s in secs if s.dotted == sec.dotted or s.dotted.startswith(sec.dotted + ".")]
    for s in family:
      link = page if s is sec else f"{page}#{_anchor(s.dotted)}"
      lines.append(f"| [`{s.dotted}`]({link}) | {len(s.keys)} | {_cell(_summary(s.intro))} |"
                   f" `{s.source}` |")
    body = [
        f"# {sec.dotted}",
        "",
        f"Keys of the `{sec.dotted}` section, generated from `{sec.source}`; do not edit by"
        f" hand. All sections: [{index}](../{index}).",
    ]
    for s in family:
      if s is not sec:
        body += ["", f"## {s.dotted}"]
      if s.intro:
        body += ["", s.intro]
      body += [""] + _table(s)
    out[page] = "\n".join(body) + "\n"
  return {index: "\n".join(lines) + "\n", **out}


def _page_name(dotted: str) -> str:
  return re.sub(r"[^a-z0-9_-]", "", dotted.lower())


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


def write(path: str | pathlib.Path, module: types.ModuleType | None = None) -> None:
  """Writes the index page at `path` and its section pages beside it (in the folder of its
  stem), removing section pages that no section has any more."""
  path = pathlib.Path(path)
  texts = pages(module, path.name)
  folder = path.parent / path.stem
  folder.mkdir(parents=True, exist_ok=True)
  for stale in folder.glob("*.md"):
    if f"{path.stem}/{stale.name}" not in texts:
      stale.unlink()
  for name, text in texts.items():
    (path.parent / name).write_text(text)


def check(path: str | pathlib.Path, module: types.ModuleType | None = None) -> str | None:
  """None when the pages at `path` (and its section folder) are current, else the reason."""
  path = pathlib.Path(path)
  texts = pages(module, path.name)
  regenerate = f"`python -m jaxrl_scale.config_reference --write {path}`"
  folder = path.parent / path.stem
  extra = sorted(f"{path.stem}/{p.name}" for p in folder.glob("*.md")
                 if f"{path.stem}/{p.name}" not in texts) if folder.is_dir() else []
  for name, text in texts.items():
    page = path.parent / name
    try:
      current = page.read_text()
    except OSError as e:
      return f"{page}: cannot read ({e.strerror}); generate it with {regenerate}"
    if current != text:
      return f"{page} is stale (the config classes changed): regenerate it with {regenerate}"
  if extra:
    return f"{folder}: pages of no section {extra}: regenerate with {regenerate}"
  return None


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m jaxrl_scale.config_reference",
      description="Write or check the config reference generated from the config classes.")
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--write", metavar="PATH",
                     help=f"write the index page to PATH (e.g. {DOC_PATH}) and the section "
                     "pages to the folder of its stem (docs/config/)")
  group.add_argument("--check", metavar="PATH",
                     help="exit 1 when PATH or a section page differs from the generated one")
  args = parser.parse_args(argv)
  if args.write:
    write(args.write)
    return 0
  if args.check:
    problem = check(args.check)
    if problem:
      print(problem, file=sys.stderr)
      return 1
    return 0
  for name, text in pages().items():
    sys.stdout.write(f"<!-- {name} -->\n{text}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
