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


# --- One source for each number (issue 67 item 6): a guide's MFU or roofline figure is one a
# committed results file holds (benchmarks/results/**/*.json), so a page cannot quote a figure
# of a run nobody kept, or an older one than the files hold; a page that needs another number
# links to the log instead of quoting it.

# A quoted figure and the results keys it must be among: "36.3% MFU", "MFU bound 0.82",
# "MFU <= 0.82", "54.0% / 42.3% of the HBM roofline".
QUOTED_FIGURES = [
    (re.compile(r"(\d+(?:\.\d+)?)% MFU"), "mfu", True),
    (re.compile(r"MFU (?:bound (?:of )?|<= ?)(\d\.\d+)"), "mfu", False),
    (re.compile(r"(\d+(?:\.\d+)?%(?: / \d+(?:\.\d+)?%)*) of the (?:HBM )?roofline"), "roofline",
     True),
]


@functools.cache
def _results_values(key_part: str) -> frozenset[float]:
  """Every number the committed results JSON files hold under a key naming `key_part`."""
  out: set[float] = set()

  def walk(x, key: str) -> None:
    if isinstance(x, dict):
      for k, v in x.items():
        walk(v, k)
    elif isinstance(x, list):
      for v in x:
        walk(v, key)
    elif isinstance(x, (int, float)) and not isinstance(x, bool) and key_part in key.lower():
      out.add(float(x))

  for f in sorted((ROOT / "benchmarks" / "results").rglob("*.json")):
    walk(__import__("json").loads(f.read_text()), "")
  return frozenset(out)


def _unheld_figures(text: str, values=_results_values) -> list[str]:
  """The MFU / roofline figures of `text`'s prose that no results file holds, rounded as
  written (a percentage to its decimals of a fraction times 100)."""
  missing = []
  for pattern, key, percent in QUOTED_FIGURES:
    for m in pattern.finditer(_prose(text)):
      for figure in re.findall(r"\d+(?:\.\d+)?", m.group(1)):
        digits = len(figure.partition(".")[2])
        held = {round(v * 100 if percent else v, digits) for v in values(key)}
        if round(float(figure), digits) not in held:
          missing.append(m.group(0))
  return missing


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_quoted_figures_are_held_by_the_results_files(path):
  missing = _unheld_figures(path.read_text())
  assert not missing, f"{path.name} quotes {missing}, which no benchmarks/results/ JSON " \
      "holds: quote the latest committed figure, or link to the log instead of quoting"


def test_the_figure_check_catches_an_unheld_figure():
  """A figure the files hold passes, one they do not (or a rounding away) fails."""
  values = lambda key: {"mfu": {0.3632, 0.8239}, "roofline": {0.5399, 0.4228}}[key]
  assert _unheld_figures("36.3% MFU, MFU bound 0.82, MFU <= 0.82", values) == []
  assert _unheld_figures("54.0% / 42.3% of the HBM roofline", values) == []
  assert _unheld_figures("36.4% MFU and MFU bound 0.86; 36% MFU", values) == \
      ["36.4% MFU", "MFU bound 0.86"]
  assert _unheld_figures("54.0% / 41.0% of the roofline", values) == \
      ["54.0% / 41.0% of the roofline"]
  assert _unheld_figures("```\n99.9% MFU\n```\n", values) == []  # a command's output
  # The H100 1.7B step's MFU (causal), as gpu_h100_2026-11-28/train_step_bench.json holds it.
  assert any(round(v, 4) == 0.3632 for v in _results_values("mfu"))


# --- Fit accuracies (issue 67 item 6): a section that cites an extension run's results file
# (`extension_*.json`: the demo run past its budget, fitted at 1/3 and 1/2) quotes only what
# those files hold. Each kind of figure is matched to what it is, not to any number in the
# file: "9 of 10" to a held-of-fits count (one config's, or pooled over the files cited),
# "0.899 against [0.940, 0.994]" to one fit's interval and its seed's plateau, "0.930 [0.901,
# 0.958]" to one fit's forecast and interval, a lone 0.064 to a median width or error (one
# config's or pooled) or a seed's plateau. A figure the page's own printed output shows (a
# ```text block: a replayed forecast line) is quoted from there.

EXTENSION_FILE = re.compile(r"\b(extension_[\w-]+\.json)\b")
INTERVAL = re.compile(r"(?:(\d\.\d+)(\s+against)?\s+)?\[(\d\.\d+),\s+(\d\.\d+)\]")
COUNT = re.compile(r"\b(\d+) of (\d+)\b")
LONE = re.compile(r"(?<![\d.])(\d\.\d{3})(?![\d.])")


def _sections(text: str) -> list[str]:
  """The text split at its headings (a ``` block's lines are not headings)."""
  out, cur, fence = [], [], False
  for line in text.splitlines():
    if line.strip().startswith("```"):
      fence = not fence
    if not fence and line.startswith("#") and cur:
      out.append("\n".join(cur))
      cur = []
    cur.append(line)
  return [*out, "\n".join(cur)] if cur else out


@functools.cache
def _results_json(name: str) -> dict:
  return __import__("json").loads((ROOT / "benchmarks" / "results" / name).read_text())


def _same(figure: str, value: float) -> bool:
  """`figure` as written (0.064) is `value` rounded to its decimals."""
  digits = len(figure.partition(".")[2])
  return round(float(figure), digits) == round(value, digits)


def _accuracy_held(files: list[dict]):
  """What extension results hold: (held, fits) counts, each fit's (interval, forecast,
  plateau), and the lone figures (median widths and errors, plateaus)."""
  import statistics
  counts, fits, lone = set(), [], []
  pooled: dict[tuple[str, str], list] = {}
  for d in files:
    for seed in d["seeds"]:
      lone.append(seed["plateau"])
      for f in seed["fits"]:
        fits.append((f["interval"], f["forecast"], seed["plateau"]))
    for group, g in d["checking"].items():
      rows = {s["seed"]: s for s in d["seeds"]}
      for frac, b in g["by_fraction"].items():
        counts.add((b["held"], b["fits"]))
        lone += [b["median_width"], b["median_abs_err"]]
        p = pooled.setdefault((group, frac), [0, 0, [], []])
        p[0] += b["held"]
        p[1] += b["fits"]
        for f in (f for s in g["seeds"] for f in rows[s]["fits"] if f"{f['fraction']:.3g}" == frac):
          p[2].append(f["width"])
          p[3].append(f["abs_err"])
  if len(files) > 1:
    for held, n, widths, errors in pooled.values():
      counts.add((held, n))
      lone += [statistics.median(widths), statistics.median(errors)]
  return counts, fits, lone


def _accuracy_figures(text: str, load=_results_json) -> list[tuple[str, bool]]:
  """(figure, held) for each fit-accuracy figure of the sections of `text` that cite an
  extension results file."""
  out = []
  printed = " ".join(" ".join(re.findall(r"^```.*?^```", text, flags=re.S | re.M)).split())
  for section in _sections(text):
    names = sorted(set(EXTENSION_FILE.findall(_prose(section))))
    if not names:
      continue
    counts, fits, lone = _accuracy_held([load(n) for n in names])
    prose = _prose(section)
    for m in INTERVAL.finditer(prose):
      x, against, lo, hi = m.groups()
      held = any(_same(lo, i[0]) and _same(hi, i[1]) and
                 (x is None or _same(x, plateau if against else forecast))
                 for i, forecast, plateau in fits)
      quoted = " ".join(m.group(0).split())  # the page may break the line inside it
      out.append((quoted, held or quoted in printed))
    prose = INTERVAL.sub(" ", prose)
    out += [(m.group(0), (int(m.group(1)), int(m.group(2))) in counts)
            for m in COUNT.finditer(prose)]
    out += [(m.group(1), any(_same(m.group(1), v) for v in lone) or m.group(1) in printed)
            for m in LONE.finditer(prose)]
  return out


ACCURACY_PAGES = {"forecast_accuracy.md": 15, "forecasting.md": 3}  # figures at least


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_quoted_fit_accuracies_are_held_by_the_results_files(path):
  figures = _accuracy_figures(path.read_text())
  missing = [f for f, held in figures if not held]
  assert not missing, f"{path.name} quotes {missing}, which the extension results it cites " \
      "do not hold: quote the committed figures, or link to the log instead of quoting"
  assert len(figures) >= ACCURACY_PAGES.get(path.name, 0), \
      f"{path.name}: only {len(figures)} fit-accuracy figures found: the check lost its section"


def test_the_accuracy_check_catches_an_unheld_figure():
  """Held figures pass; a wrong count, interval, pairing or median fails."""
  both = "## Runs\n\n`extension_cpu_tiny_3x.json`, `extension_cpu_math_code_3x.json`:\n"
  held = lambda text: [f for f, ok in _accuracy_figures(both + text) if not ok]
  assert held("held on 18 of 20 and 16 of 20; 9 of 10; median width 0.088\n") == []
  assert held("0.899 against [0.940, 0.994]; 0.930 [0.901, 0.958], plateau 0.943\n") == []
  assert held("held on 17 of 20; 0.899 against [0.941, 0.994]; 0.979 against [0.940, 0.994];"
              " 0.931 [0.901, 0.958]; median width 0.089\n") == \
      ["0.899 against [0.941, 0.994]", "0.979 against [0.940, 0.994]", "0.931 [0.901, 0.958]",
       "17 of 20", "0.089"]
  # One config's section does not hold the pooled counts; a printed line holds its figures.
  assert [f for f, ok in _accuracy_figures("`extension_cpu_tiny_3x.json`: 18 of 20\n") if not ok]\
      == ["18 of 20"]
  assert held("```text\n  0.930 [0.902, 0.953]\n```\nit read 0.930 [0.902, 0.953]\n") == []
  assert _accuracy_figures("# No results cited\n\n17 of 20, 0.123 [0.1, 0.2]\n") == []


# --- A plan table (docs/moe.md) is the committed `plan --json` it links: a row
# "| `CONFIG` PROGRAM (...) | GiB / chip | headroom | compiled / model FLOPs | MFU bound |"
# reads the program of the linked JSON whose name starts with CONFIG, as `plan` rounds it.

PLAN_ROW = re.compile(r"^\| `(\w+)` (train_step|sft_step|weight_cast|prefill|decode)\b([^|]*)"
                      r"\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|", re.M)


def _plan_cells(program: dict) -> list[str]:
  ratio, mfu = program["flops_ratio"], program["mfu_bound"]
  return [f"{program['hbm_bytes_per_chip'] / 2**30:.2f}", f"{program['headroom']:.0%}",
          "-" if ratio is None else f"{ratio:.2f}x", "-" if mfu is None else f"{mfu:.2f}"]


def _unheld_plan_rows(text: str, load=_results_json) -> list[str]:
  """The plan-table rows of `text` that differ from the plan JSON their section links."""
  wrong = []
  for section in _sections(text):
    plans = re.findall(r"\]\((?:\.\./)?benchmarks/results/([^)\s]+\.json)\)", section)
    for m in PLAN_ROW.finditer(_prose(section)):
      config, program, note, *cells = m.groups()
      linked = [p for p in plans if pathlib.Path(p).name.startswith(config + "_")]
      if len(linked) != 1:
        wrong.append(f"{config} {program}: links {len(linked)} plans of it, not 1")
        continue
      got = _plan_cells(load(linked[0])["programs"][program])
      over = load(linked[0])["programs"][program].get("bytes_over_min")
      if [c.strip() for c in cells] != got or (
          "minimum bytes" in note and f"{over:.2f}x the minimum bytes" not in note):
        wrong.append(f"{config} {program}: {[c.strip() for c in cells]} where {linked[0]} "
                     f"holds {got}" + (f", {over:.2f}x the minimum bytes" if over else ""))
  return wrong


def test_plan_tables_are_the_committed_plans():
  text = (ROOT / "docs" / "moe.md").read_text()
  assert len(PLAN_ROW.findall(_prose(text))) >= 8, "moe.md's plan table was not found"
  wrong = _unheld_plan_rows(text)
  assert not wrong, f"moe.md: {wrong}: quote the committed plan, or commit the new one"


def test_the_plan_table_check_catches_a_stale_row():
  link = "[p](../benchmarks/results/plan_slice_sizes_2026-11-28/scalerl_scout_shaped_v5p-256.json)"
  row = "| `scalerl_scout_shaped` train_step (128) | {} | 10% | 1.37x | 0.49 |\n"
  assert _unheld_plan_rows(f"## P\n{link}\n\n" + row.format("85.38")) == []
  assert len(_unheld_plan_rows(f"## P\n{link}\n\n" + row.format("84.74"))) == 1  # 2026-11-26's
  assert len(_unheld_plan_rows("## P\n\n" + row.format("85.38"))) == 1  # no plan linked
  decode = "| `scalerl_scout_shaped` decode (4): {}x the minimum bytes | 68.87 | 28% | 5.49x | 0.02 |\n"
  assert _unheld_plan_rows(f"## P\n{link}\n\n" + decode.format("1.05")) == []
  assert len(_unheld_plan_rows(f"## P\n{link}\n\n" + decode.format("1.50"))) == 1


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
