"""The README's quick start and CI must not drift apart."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _quickstart_commands() -> list[str]:
  text = (ROOT / "README.md").read_text()
  section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
  return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_quickstart_is_exactly_two_commands():
  commands = _quickstart_commands()
  assert len(commands) == 2, commands
  assert all("\n" not in c for c in commands), commands


def test_ci_runs_the_readme_test_command():
  test_command = _quickstart_commands()[1]
  assert "pytest" in test_command
  ci = (ROOT / ".ci" / "run").read_text()
  assert test_command in ci
