"""docs/config.md and its section pages docs/config/*.md: generated from the config classes
(jaxrl_scale/config.py and its section modules), current, complete, documented and short."""

import dataclasses
import importlib.util
import pathlib
import re
import sys
import typing
from typing import Any

import yaml

from jaxrl_scale import config
from jaxrl_scale import config_reference
from tests import docs_test

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "config.md"
REGENERATE = "python -m jaxrl_scale.config_reference --write docs/config.md"


def _all_pages(module=None) -> str:
  return "\n".join(config_reference.pages(module).values())


def _expected_keys(cls=config.Config, prefix: str = "") -> dict[str, tuple[Any, Any]]:
  """dotted key -> (annotation, default), by a walk of dataclasses.fields of its own."""
  out = {}
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    tp, dotted = hints[field.name], prefix + field.name
    if dataclasses.is_dataclass(tp):
      out.update(_expected_keys(tp, dotted + "."))
      continue
    out[dotted] = (tp, field.default)
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args and dataclasses.is_dataclass(args[0]):
      out.update(_expected_keys(args[0], dotted + "[]."))
  return out


def _rows(text: str) -> dict[str, list[str]]:
  """dotted key -> [type, default, description] cells of the page's key tables."""
  rows = {}
  for line in text.splitlines():
    m = re.match(r"\| `([^`]+)` \|", line)
    if not m:
      continue
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    assert len(cells) == 4, f"table row with {len(cells)} cells: {line}"
    assert m.group(1) not in rows, f"key listed twice: {m.group(1)}"
    rows[m.group(1)] = cells[1:]
  return rows


def test_docs_pages_are_current():
  pages = config_reference.pages()
  assert list(pages)[0] == "config.md" and len(pages) == 1 + len(dataclasses.fields(config.Config))
  for name, text in pages.items():
    path = DOC.parent / name
    assert path.exists(), f"docs/{name} is missing: run `{REGENERATE}`"
    assert path.read_text() == text, (
        f"docs/{name} is stale (the config classes changed): run `{REGENERATE}`")
  on_disk = {f"config/{p.name}" for p in (DOC.parent / "config").glob("*.md")}
  assert on_disk == set(pages) - {"config.md"}, f"pages of no section: {on_disk - set(pages)}"


def test_pages_are_short_with_short_paragraphs_and_links_that_resolve():
  # The limits of every hand-written guide (tests/docs_test.py), for the generated pages.
  for name in config_reference.pages():
    path = DOC.parent / name
    text = path.read_text()
    assert len(text.splitlines()) <= docs_test.MAX_PAGE_LINES, name
    long = [s for s, n in docs_test.paragraphs(text) if n > docs_test.MAX_PARAGRAPH_LINES]
    assert not long, f"docs/{name}: paragraphs over {docs_test.MAX_PARAGRAPH_LINES} lines at {long}"
    for file, anchor in docs_test._links(path):  # pylint: disable=protected-access
      target = (path.parent / file).resolve() if file else path
      assert target.exists(), f"docs/{name}: broken link {file}"
      assert not anchor or anchor in docs_test._anchors(target), (  # pylint: disable=protected-access
          f"docs/{name}: no heading for {file}#{anchor}")


def test_every_field_of_every_section_is_listed_with_a_description():
  rows = _rows(_all_pages())
  expected = _expected_keys()
  assert len(expected) > 100  # the walk reached every section
  missing = sorted(set(expected) - set(rows))
  assert not missing, f"keys absent from the reference: {missing}"
  assert not sorted(set(rows) - set(expected)), "the reference lists keys that do not exist"
  undocumented = sorted(k for k, (_, _, doc) in rows.items() if not doc)
  assert not undocumented, (
      f"fields without a '#' comment in their config module: {undocumented}")


def test_defaults_read_back_through_yaml_to_the_dataclass_defaults():
  rows = _rows(_all_pages())
  for key, (tp, default) in _expected_keys().items():
    written = rows[key][1]
    assert written.startswith("`") and written.endswith("`"), f"{key}: {written}"
    value = yaml.safe_load(written[1:-1].replace("\\|", "|"))
    assert config._coerce(value, tp, key) == default, f"{key}: {written} != {default!r}"


def test_readable_types_and_section_intros():
  rows = _rows(_all_pages())
  assert rows["run.steps"][0] == "`int`"
  assert rows["run.sft_stop_pass_rate"][0] == r"`float \| null`"
  assert rows["model.dtype"][0] == "one of `float32`/`bfloat16`"
  assert rows["sampler.prompt_buckets"][0] == "`list of int`"
  assert rows["sampler.stop_strings"][0] == "`list of str`"
  assert rows["run.steps"][2] == "RL optimizer steps"
  pages = config_reference.pages()
  sampler = pages["config/sampler.md"]
  assert sampler.startswith("# sampler\n") and "\n\nGeneration on the generator slice.\n" in sampler
  assert "generated from `jaxrl_scale/config_generation.py`" in sampler
  assert "\n## data.sources[]\n\nOne domain of a mixed-domain run" in pages["config/data.md"]
  assert "| [`data.sources[]`](config/data.md#datasources) | 12 |" in pages["config.md"]
  # A class without a docstring must not show the one dataclasses invents for it.
  assert not any("Config(" in page for page in pages.values())


def _load_module(path: pathlib.Path, monkeypatch):
  # get_type_hints resolves the (string) annotations in sys.modules[cls.__module__].
  name = f"config_reference_test_{path.stem}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, name, module)
  spec.loader.exec_module(module)
  return module


def test_comments_come_from_the_source(tmp_path, monkeypatch):
  path = tmp_path / "toy.py"
  path.write_text('''
import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class Inner:
  """Inner section."""

  depth: int = 2  # how deep

  # Group comment, then a blank line: it belongs to no field.

  mode: Literal["a", "b"] = "a"
  marker: str = "x # y"  # the '#' inside the string is not a comment


@dataclasses.dataclass(frozen=True)
class Outer:
  # Two lines above
  # the field.
  rate: float | None = 5e-7  # and a trailing one
  inner: Inner = Inner()
  items: tuple[Inner, ...] = ()


@dataclasses.dataclass(frozen=True)
class Config:
  outer: Outer = Outer()
''')
  module = _load_module(path, monkeypatch)
  secs = {s.dotted: s for s in config_reference.sections(module)}
  assert list(secs) == ["outer", "outer.inner", "outer.items[]"]
  assert secs["outer"].intro == ""
  assert secs["outer.inner"].intro == "Inner section."
  keys = {k.dotted: k for s in secs.values() for k in s.keys}
  assert keys["outer.rate"] == config_reference.Key(
      "outer.rate", "float | null", "5.0e-07", "Two lines above the field. and a trailing one")
  assert keys["outer.inner.depth"].doc == "how deep"
  assert keys["outer.inner.mode"].doc == ""
  assert keys["outer.inner.mode"].type == "one of a/b"
  assert keys["outer.inner.marker"].doc == "the '#' inside the string is not a comment"
  assert keys["outer.inner.marker"].default == '"x # y"'
  assert keys["outer.items"].default == "[]"
  assert keys["outer.items[].depth"].doc == "how deep"


def test_check_fails_when_a_key_is_added_without_regeneration(tmp_path, monkeypatch, capsys):
  page = tmp_path / "config.md"
  assert config_reference.main(["--write", str(page)]) == 0
  assert config_reference.main(["--check", str(page)]) == 0
  # The same config module with one more key: the page written above is now stale.
  source = pathlib.Path(config.__file__).read_text()
  anchor = "  steps: int = 100"
  assert anchor in source
  changed = tmp_path / "config_plus_key.py"
  changed.write_text(source.replace(anchor, "  new_key: int = 3  # a key added\n" + anchor, 1))
  module = _load_module(changed, monkeypatch)
  new_page = config_reference.pages(module)["config/run.md"]
  assert "| `run.new_key` | `int` | `3` | a key added |" in new_page
  monkeypatch.setattr(config_reference, "config", module)
  assert config_reference.main(["--check", str(page)]) == 1
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "stale" in err
  assert f"python -m jaxrl_scale.config_reference --write {page}" in err


def test_check_of_a_missing_file_is_one_line(tmp_path, capsys):
  assert config_reference.main(["--check", str(tmp_path / "absent.md")]) == 1
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "--write" in err


def test_a_page_of_no_section_is_stale_and_write_removes_it(tmp_path, capsys):
  page = tmp_path / "config.md"
  assert config_reference.main(["--write", str(page)]) == 0
  (tmp_path / "config" / "gone.md").write_text("# gone\n")  # a section since removed
  assert config_reference.main(["--check", str(page)]) == 1
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "config/gone.md" in err
  assert config_reference.main(["--write", str(page)]) == 0
  assert not (tmp_path / "config" / "gone.md").exists()
  assert config_reference.main(["--check", str(page)]) == 0
