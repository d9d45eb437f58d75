"""Every shell line in the README and docs/ runs: commands exist, flags exist, configs load.

A ```bash block holds runnable lines, run in order as one shell would (usage syntax with placeholders goes in ```text). Each
line (continuations joined, `&&` / `;` / `|` split into commands, leading VAR=value
assignments and `export` applied as the environment) is checked by what it runs:

- `jaxrl-scale ...`: parsed by the real CLI parser (unknown flags and bad values fail);
  `train` / `plan` also load their YAML config with the overrides through `config.load`,
  so a renamed key or a missing config file fails here.
- `python[3] benchmarks/X.py ...`, `python -m jaxrl_scale.X ...`: the script exists and
  every `--flag` the line uses appears in the script's own `--help`.
- `tpu_scripts/X.sh ...`: run with `--dry-run` (prints the gcloud commands, runs none).
- `pip install -e ".[extra]"`: the extra exists in pyproject.toml.
- a few set-up commands (venv, source, cd, pytest) are allowed unchecked; anything else
  fails, so a new kind of command gets a check or a deliberate exemption.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Each benchmark group's README names its commands: its ```bash lines are checked as the docs'.
BENCH_READMES = sorted(p for p in ROOT.glob("benchmarks/*/README.md")
                       if p.parent.name != "results")  # the log is checked for links only
UNCHECKED = {("python3", "-m", "venv"), (".",), ("source",), ("cd",), ("python", "-m", "pytest"),
             ("tensorboard",), ("git",)}


def _bash_blocks(path: pathlib.Path) -> list[tuple[int, list[str]]]:
  """(first line number, its command lines joined over continuations) per ```bash block."""
  out, block, pending = [], None, ""
  for n, line in enumerate(path.read_text().splitlines(), 1):
    if line.strip().startswith("```"):
      if block is not None and block[1]:
        out.append(block)
      block = (n + 1, []) if line.strip() == "```bash" else None
      continue
    if block is None:
      continue
    code = "" if line.lstrip().startswith("#") else line.split(" #", 1)[0].rstrip()
    if code.endswith("\\"):
      pending += code[:-1] + " "
      continue
    full, pending = (pending + code).strip(), ""
    if full:
      block[1].append(full)
  return out


def _all_blocks():
  blocks = [(f"{p.name}:{n}", lines) for p in DOCS for n, lines in _bash_blocks(p)]
  blocks += [(f"{p.relative_to(ROOT)}:{n}", lines) for p in BENCH_READMES
             for n, lines in _bash_blocks(p)]
  assert sum(len(b) for _, b in blocks) >= 20, "the docs' runnable lines were not found"
  return blocks


def _split(line: str) -> list[list[str]]:
  """A command line -> its commands as argv lists (env assignments kept at the front)."""
  line = re.sub(r"\$\([^)]*\)", "SUBST", line)  # $(git rev-parse HEAD) -> one word
  out = []
  for part in re.split(r"&&|;|\|", line):
    argv = shlex.split(part)
    if argv:
      out.append(argv)
  return out


@functools.cache
def _help_flags(argv0: tuple[str, ...]) -> frozenset[str]:
  proc = subprocess.run([sys.executable, *argv0, "--help"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, f"{' '.join(argv0)} --help failed: {proc.stderr[-500:]}"
  return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", proc.stdout))


def _check_jaxrl_scale(args: list[str]) -> None:
  from jaxrl_scale import cli, config
  try:
    ns = cli.build_parser().parse_args(args)
  except SystemExit as e:
    pytest.fail(f"jaxrl-scale {' '.join(args)}: the CLI refuses it (exit {e.code})")
  if args and args[0] == "train":
    from jaxrl_scale import train
    path, overrides = train._split_args(ns)  # pylint: disable=protected-access
  elif args and args[0] == "plan":
    path, overrides = pathlib.Path(ns.config), list(ns.overrides)
  else:
    return
  assert (ROOT / path).exists(), f"config {path} does not exist"
  config.load(str(ROOT / path), overrides)


def _check_script(argv: list[str]) -> None:
  if argv[1] == "-m":
    module, rest = argv[2], argv[3:]
    import importlib.util
    assert importlib.util.find_spec(module) is not None, f"no module {module}"
    target = ("-m", module)
  else:
    script, rest = argv[1], argv[2:]
    assert (ROOT / script).exists(), f"no script {script}"
    target = (script,)
  known = _help_flags(target)
  used = [a.split("=", 1)[0] for a in rest if a.startswith("-") and a != "--"]
  unknown = [a for a in used if a not in known]
  assert not unknown, f"{' '.join(target)} has no {unknown} (its --help lists {sorted(known)})"


def _check_pip(argv: list[str]) -> None:
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  for a in argv:
    m = re.fullmatch(r"\.\[([\w,-]+)\]", a)
    if m:
      missing = [e for e in m.group(1).split(",") if e not in extras]
      assert not missing, f"pyproject.toml has no extra {missing}"


def _check(argv: list[str], env: dict[str, str]) -> None:
  if argv[0] == "export":
    env.update(a.split("=", 1) for a in argv[1:] if "=" in a)
    return
  env = dict(env)  # VAR=value before a command holds for that command only
  while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
    k, v = argv.pop(0).split("=", 1)
    env[k] = v
  if not argv:
    return
  if argv[0] == "jaxrl-scale":
    return _check_jaxrl_scale(argv[1:])
  if argv[0] in ("python", "python3") and len(argv) > 1 and (
      argv[1].startswith("benchmarks/") or (argv[1] == "-m" and argv[2].startswith("jaxrl_scale"))):
    return _check_script(argv)
  if argv[0] == "pip":
    return _check_pip(argv)
  if argv[0].startswith("tpu_scripts/"):
    proc = subprocess.run(["bash", argv[0], "--dry-run", *argv[1:]], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **env})
    assert proc.returncode == 0, f"{' '.join(argv)} --dry-run: {proc.stderr[-500:]}"
    return
  if any(tuple(argv[:len(u)]) == u for u in UNCHECKED):
    return
  pytest.fail(f"no check for the command {argv[0]!r}: add one to tests/docs_test.py "
              "or put the line in a ```text block")


@pytest.mark.parametrize("where,lines", _all_blocks(), ids=[w for w, _ in _all_blocks()])
def test_runnable_block(where, lines):
  env: dict[str, str] = {}  # an `export` holds for the rest of its block
  for line in lines:
    for argv in _split(line):
      _check(argv, env)


def test_the_checks_catch_stale_lines():
  """A renamed flag, a missing config, a stale config key and a missing extra all fail."""
  for bad in ["jaxrl-scale fit m.jsonl --no-such-flag",
              "jaxrl-scale train configs/no_such.yaml",
              "jaxrl-scale train configs/cpu_tiny.yaml rl.no_such_key=1",
              "python benchmarks/forecast/fit_bench.py --no-such-flag",
              'pip install -e ".[no_such_extra]"',
              "frobnicate --now"]:
    with pytest.raises(BaseException):
      for argv in _split(bad):
        _check(argv, {})


# --- The docs as guides (issue 67): short pages, short paragraphs, measurements in one log.

MEASUREMENTS_LOG = ROOT / "benchmarks" / "results" / "README.md"
GUIDES = DOCS
MAX_PAGE_LINES = 250
MAX_PARAGRAPH_LINES = 10
# A commit hash: 7-40 hex digits with a letter and a digit, not inside a word, path or number.
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def paragraphs(text: str) -> list[tuple[int, int]]:
  """(first line, line count) of each paragraph: prose lines outside ``` blocks, split at a
  blank line, a heading, a table row or a list item (each item its own paragraph)."""
  out, start, count, fence = [], 0, 0, False
  for n, line in enumerate(text.splitlines(), 1):
    s = line.strip()
    if s.startswith("```"):
      fence = not fence
    breaks = (fence or s.startswith("```") or not s or s.startswith(("#", "|"))
              or re.match(r"([-*]|\d+\.)\s", s))
    if breaks and count:
      out.append((start, count))
      count = 0
    if fence or s.startswith("```") or not s or s.startswith(("#", "|")):
      continue
    if not count:
      start = n
    count += 1
  if count:
    out.append((start, count))
  return out


def _prose(text: str) -> str:
  """The text outside ``` blocks (a command's output may show a hash or a date)."""
  return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens; an
  underscore inside a word (`gpu_small`) stays, as on GitHub."""
  text = re.sub(r"[`*\[\]]|\]\([^)]*\)", "", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  return {_slug(m) for m in re.findall(r"^#+ (.*)$", _prose(path.read_text()), re.M)}


def _links(path: pathlib.Path) -> list[tuple[str, str]]:
  """(target path, anchor) of every relative markdown link in the prose of `path`."""
  out = []
  for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
    if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition("#")
    out.append((file, anchor))
  return out


@pytest.mark.parametrize("path", GUIDES, ids=[p.name for p in GUIDES])
def test_guides_are_short_pages_of_short_paragraphs(path):
  text = path.read_text()
  lines = len(text.splitlines())
  assert lines <= MAX_PAGE_LINES, \
      f"{path.name}: {lines} lines (at most {MAX_PAGE_LINES}: " \
      "split it by subject)"
  long = [f"line {s} ({n} lines)" for s, n in paragraphs(text) if n > MAX_PARAGRAPH_LINES]
  assert not long, f"{path.name}: paragraphs over {MAX_PARAGRAPH_LINES} lines at {long}"


def _without_link_targets(text: str) -> str:
  """The text less each markdown link's target: a guide's link to a dated log entry
  (`[log](../benchmarks/results/README.md#h100-...-2026-11-28)`) is the citation the log asks
  for, not a dated record; the link's own text is still checked."""
  return re.sub(r"\]\([^)\s]+\)", "]", text)


@pytest.mark.parametrize("path", GUIDES, ids=[p.name for p in GUIDES])
def test_measurement_records_live_in_the_log(path):
  """Commit hashes and dated runs belong in benchmarks/results/README.md; a guide links there."""
  prose = _without_link_targets(_prose(path.read_text()))
  found = sorted(set(HASH.findall(prose)) | set(DATE.findall(prose)))
  assert not found, f"{path.name} names {found}: move the dated run to " \
      f"{MEASUREMENTS_LOG.relative_to(ROOT)} and link to it"


LINKED = [*DOCS, ROOT / "CHANGELOG.md", MEASUREMENTS_LOG,
          *sorted(p for p in ROOT.glob("benchmarks/**/*.md") if p != MEASUREMENTS_LOG)]


@pytest.mark.parametrize("path", LINKED, ids=[str(p.relative_to(ROOT)) for p in LINKED])
def test_relative_links_resolve(path):
  broken = []
  for file, anchor in _links(path):
    target = (path.parent / file).resolve() if file else path
    if not target.exists():
      broken.append(f"{file} (no such file)")
    elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
      broken.append(f"{file}#{anchor} (no such heading)")
  assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_the_page_checks_catch_what_they_guard(tmp_path):
  """A long paragraph, a hash, a date and a broken link or anchor are all found."""
  text = "# T\n\n## A heading, here\n\n" + "word\n" * 11 + "\n- item\n  more\n"
  assert paragraphs(text) == [(5, 11), (17, 2)]
  assert paragraphs("```\n" + "x\n" * 20 + "```\n") == []
  assert HASH.findall(_prose("at 0a1fe86, not 1234567 or deadbee-f or a/0a1fe86b\n```\nc050050\n```"))\
      == ["0a1fe86"]
  assert DATE.findall("run on 2026-11-28") == ["2026-11-28"]
  linked = _without_link_targets("[run of 2026-11-28](log.md#run-2026-11-27) [x](y#0a1fe86)")
  assert DATE.findall(linked) == ["2026-11-28"] and not HASH.findall(linked)
  page = tmp_path / "p.md"
  page.write_text(text + "[ok](#a-heading-here) [bad](#nope) [gone](missing.md) [w](https://x.y)\n")
  assert _links(page) == [("", "a-heading-here"), ("", "nope"), ("missing.md", "")]
  assert _anchors(page) == {"t", "a-heading-here"}
  assert _slug("One GPU / one node, end to end") == "one-gpu--one-node-end-to-end"
  assert _slug("`jaxrl-scale plan`: will it fit?") == "jaxrl-scale-plan-will-it-fit"
  assert _slug("gpu_small at reduced size on CPU (2026-11-28)") == \
      "gpu_small-at-reduced-size-on-cpu-2026-11-28"


# --- A new user's five tasks (issue 67 targets): each is answered in the first 40 lines of
# the page the README's "Where to go next" table points to, commands first. A task: the
# README row that sends the reader, and what the page's opening must hold (a ```bash line
# for a command, else a line of the page).

FIRST_LINES = 40
NEW_USER_TASKS = {
    "install on one GPU and run": ("run on an NVIDIA GPU", [
        r'pip install .*"\.\[cuda\]" && jaxrl-scale train \S+\.yaml']),
    "plan a v5p-128 run": ("know before renting whether a run fits", [
        r"^jaxrl-scale plan \S+\.yaml --topology v5p-128$"]),
    "bring my own math dataset": ("bring prompts, code problems", [
        r"^jaxrl-scale train \S+\.yaml data\.source=\S+\.jsonl .*data\.task=math\b"]),
    "add a code task with my own tests": ("bring prompts, code problems", [
        r"^jaxrl-scale train \S+\.yaml data\.source=\S+\.jsonl .*data\.task=code\b",
        r'page:^\{"prompt": .*"tests": \{"inputs"', r'page:"fn_name"']),
    "should I stop this run": ("decide whether to stop a run", [
        r"^jaxrl-scale fit \S+metrics\.jsonl", r"page:^## Continue or stop\?",
        r"page:stop and change the recipe", r"page:DECLINING\*\*: .*\n.*likely wasted"]),
}


def _readme_row_page(fragment: str) -> pathlib.Path:
  section = (ROOT / "README.md").read_text().split("## Where to go next", 1)[1]
  rows = [r for r in section.splitlines() if r.startswith("|") and fragment in r]
  assert len(rows) == 1, f"README's table: {len(rows)} rows name {fragment!r}"
  target = re.search(r"\]\(([^)#\s]+)", rows[0].split("|")[2]).group(1)
  return ROOT / target


def _unanswered(path: pathlib.Path, needs: list[str]) -> list[str]:
  """The needs of `needs` that the first FIRST_LINES lines of `path` do not meet."""
  opening = "\n".join(path.read_text().splitlines()[:FIRST_LINES])
  commands = [line for n, lines in _bash_blocks(path) if n <= FIRST_LINES for line in lines]
  missing = []
  for need in needs:
    if need.startswith("page:"):
      found = re.search(need[len("page:"):], opening, re.M)
    else:
      found = any(re.search(need, c) for c in commands)
    if not found:
      missing.append(need)
  return missing


@pytest.mark.parametrize("task", NEW_USER_TASKS)
def test_a_new_users_task_is_answered_in_the_first_lines(task):
  fragment, needs = NEW_USER_TASKS[task]
  page = _readme_row_page(fragment)
  missing = _unanswered(page, needs)
  assert not missing, f"{task!r}: the README sends the reader to {page.name}, whose first " \
      f"{FIRST_LINES} lines lack {missing}"


def test_the_first_lines_check_catches_a_late_answer(tmp_path):
  page = tmp_path / "p.md"
  page.write_text("# P\n\n```bash\njaxrl-scale fit runs/x/metrics.jsonl\n```\n")
  assert _unanswered(page, [r"^jaxrl-scale fit \S+metrics\.jsonl"]) == []
  page.write_text("# P\n" + "words\n" * FIRST_LINES + "```bash\njaxrl-scale fit m/metrics.jsonl\n```\n")
  assert _unanswered(page, [r"^jaxrl-scale fit \S+metrics\.jsonl", "page:^## Stop"]) == [
      r"^jaxrl-scale fit \S+metrics\.jsonl", "page:^## Stop"]
