"""`jaxrl-scale --version`: the package, jax and jaxlib versions, without importing jax."""

import glob
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

from jaxrl_scale import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
  with open(ROOT / "pyproject.toml", "rb") as f:
    return tomllib.load(f)["project"]["version"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_package_jax_and_jaxlib_versions(flag, capsys):
  assert cli.main([flag]) == 0
  out = capsys.readouterr().out
  jax_v, jaxlib_v = importlib.metadata.version("jax"), importlib.metadata.version("jaxlib")
  assert out == f"jaxrl-scale {_pyproject_version()} (jax {jax_v}, jaxlib {jaxlib_v})\n"


def test_version_does_not_import_jax():
  # This test process has jax loaded already (conftest), so ask a fresh interpreter.
  code = ("import sys; from jaxrl_scale import cli; rc = cli.main(['--version']); "
          "sys.exit(rc if 'jax' not in sys.modules else 3)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, f"rc {proc.returncode} (3 = jax imported): {proc.stderr}"
  assert proc.stdout.startswith(f"jaxrl-scale {_pyproject_version()} (jax ")


def test_help_lists_version_flag(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--help"])
  assert exit_info.value.code == 0
  assert "--version" in capsys.readouterr().out


def test_a_bare_host_runs_on_the_cpu_and_a_users_platform_is_kept(tmp_path):
  environ = {}
  assert cli.default_platform(environ, paths=(str(tmp_path / "nvidia"),)) == "cpu"
  assert environ == {"JAX_PLATFORMS": "cpu"}
  environ = {"JAX_PLATFORMS": "tpu"}
  assert cli.default_platform(environ, paths=()) is None
  assert environ == {"JAX_PLATFORMS": "tpu"}
  (tmp_path / "accel0").touch()
  environ = {}
  assert cli.default_platform(environ, paths=(str(tmp_path / "accel[0-9]*"),)) is None
  assert environ == {}


@pytest.mark.skipif(any(glob.glob(p) for p in cli.ACCELERATOR_PATHS),
                    reason="this host has an accelerator: JAX picks its platform")
def test_a_command_on_a_bare_host_prints_no_plugin_traceback():
  # Without JAX_PLATFORMS, JAX's CUDA plugin (the test extra installs it) logs a traceback
  # and libtpu its warnings when a command asks for devices on a host with neither.
  code = ("import sys; from jaxrl_scale import cli; cli.default_platform(); import jax; "
          "print(jax.devices()[0].platform)")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, env=env)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "cpu"
  assert "Traceback" not in proc.stderr, proc.stderr
  assert "plugin configuration error" not in proc.stderr, proc.stderr
