"""benchmarks/plan/plan_configs.py plans every config one slice size up as well (issue 68)."""

import importlib.util
import pathlib

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "plan" / "plan_configs.py"
_spec = importlib.util.spec_from_file_location("plan_configs", _PATH)
plan_configs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan_configs)


@pytest.mark.parametrize("topology, bigger", [
    ("v5p-128", "v5p-256"), ("v5p-256", "v5p-512"), ("h100", "h100-2"), ("h100-8", "h100-16"),
    ("v5litepod-256", None),  # the largest v5e slice
    ("v5p:4x4x4", None),  # a chip topology: not doubled by name
])
def test_next_size(topology, bigger):
  assert plan_configs.next_size(topology) == bigger


def test_every_config_with_a_topology_is_planned_one_size_up():
  for path in sorted((_PATH.parents[2] / "configs").glob("*.yaml")):
    topology = plan_configs.header_topology(path)
    if topology is not None and path.stem != "cpu_tiny":
      assert plan_configs.next_size(topology) is not None, path.name
