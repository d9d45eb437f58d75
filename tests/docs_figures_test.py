"""Figures the guides quote are the ones the committed results files hold (issue 67 item 6).

Split from docs_test.py, whose page and command checks it shares (`DOCS`, `ROOT`, `_prose`).
"""

from __future__ import annotations

import functools
import pathlib
import re

import pytest

from tests.docs_test import DOCS, ROOT, _prose

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
    if "narrowest_scale" in d:  # `extension.py --combine --json`: its scaled intervals
      row = d["narrowest_scale"]
      lone += [v for part in ("as_built", "at_scale", "checking_would_pick")
               for k, v in (row.get(part) or {}).items() if "width" in k]
      continue
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
  assert held("held on 27 of 30 and 26 of 30; 12 of 15; median width 0.099\n") == []
  assert held("0.899 against [0.940, 0.994]; 0.930 [0.901, 0.958], plateau 0.943\n") == []
  assert held("held on 23 of 30; 0.899 against [0.941, 0.994]; 0.979 against [0.940, 0.994];"
              " 0.931 [0.901, 0.958]; median width 0.089\n") == \
      ["0.899 against [0.941, 0.994]", "0.979 against [0.940, 0.994]", "0.931 [0.901, 0.958]",
       "23 of 30", "0.089"]
  # One config's section does not hold the pooled counts; a printed line holds its figures.
  assert [f for f, ok in _accuracy_figures("`extension_cpu_tiny_3x.json`: 25 of 30\n") if not ok]\
      == ["25 of 30"]
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
