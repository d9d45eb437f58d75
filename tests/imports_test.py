"""No import circles in jaxrl_scale/: read every module's imports (function-level ones too).

A circle is broken by moving code (a shared helper into a module both sides import), not by
hiding one side's import inside a function: this test reads every `import` in the file, so
a hidden import still counts.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "jaxrl_scale"


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py under root/PACKAGE (a package is its __init__)."""
  out = {}
  for path in sorted((root / PACKAGE).rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _targets(module: str, path: pathlib.Path, node: ast.Import | ast.ImportFrom,
             known: dict[str, pathlib.Path]) -> set[str]:
  """The package modules an import statement loads (by name; the nearest known module)."""
  if isinstance(node, ast.Import):
    names = {a.name for a in node.names}
  else:
    base = node.module or ""
    if node.level:  # relative: from the module's package, up (level - 1) packages
      package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
      package = package[:len(package) - (node.level - 1)]
      base = ".".join(package + ([base] if base else []))
    # `from pkg import name`: name is a submodule when one exists, else an attribute of pkg.
    names = {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
  out = set()
  for name in names:
    while name and name not in known:
      name = name.rpartition(".")[0]
    if name:
      out.add(name)
  return out


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
  """Module -> the package modules it imports anywhere in its file (top-level or not).

  Importing `a.b.c` also runs the package `a.b`'s __init__, but that is Python's normal
  parent-first order, not a circle: only the named module counts as an edge.
  """
  known = _modules(root)
  graph = {}
  for module, path in known.items():
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        edges |= _targets(module, path, node, known)
    edges.discard(module)
    graph[module] = edges
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan, iterative)."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      v, children = work[-1]
      w = next(children, None)
      if w is not None:
        if w not in index:
          index[w] = low[w] = len(index)
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph[w]))))
        elif w in on_stack:
          low[v] = min(low[v], index[w])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[v])
      if low[v] == index[v]:
        component = []
        while True:
          w = stack.pop()
          on_stack.discard(w)
          component.append(w)
          if w == v:
            break
        if len(component) > 1:
          out.append(sorted(component))
  return out


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
  members = set(component)
  return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_no_import_circles():
  graph = import_graph()
  assert len(graph) > 50, "the package's modules were not found"
  found = circles(graph)
  assert not found, "import circles in jaxrl_scale/ (move the shared code into a module " \
      "both import): " + " | ".join(_describe(c, graph) for c in found)


def test_the_reader_finds_circles(tmp_path):
  """A circle through a function-level import, a relative import or `import a.b as c` fails."""
  pkg = tmp_path / PACKAGE
  (pkg / "sub").mkdir(parents=True)
  for name in ("__init__.py", "sub/__init__.py"):
    (pkg / name).write_text("")
  (pkg / "sub" / "a.py").write_text("def f():\n  from jaxrl_scale.sub import b\n  return b\n")
  (pkg / "sub" / "b.py").write_text("from . import c\n")
  (pkg / "sub" / "c.py").write_text("import jaxrl_scale.sub.a as a\nimport os\n")
  (pkg / "d.py").write_text("from jaxrl_scale.sub import a\n")  # into the circle, not in it
  graph = import_graph(tmp_path)
  assert graph["jaxrl_scale.sub.c"] == {"jaxrl_scale.sub.a"}
  assert circles(graph) == [["jaxrl_scale.sub.a", "jaxrl_scale.sub.b", "jaxrl_scale.sub.c"]]
  (pkg / "sub" / "c.py").write_text("import os\n")
  assert circles(import_graph(tmp_path)) == []
