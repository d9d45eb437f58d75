"""benchmarks/gpu/kernel_occupancy.py: the occupancy arithmetic by hand, its parsers on XLA's and
ptxas' own text, and (where CUDA's ptxas and JAX's CUDA plugin are installed) every sweep
configuration compiled for an H100: none spills, each fits the SM as computed."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.gpu import kernel_occupancy  # noqa: E402
from tests.plan import gpu_plan_test  # noqa: E402


def test_programs_per_sm_by_hand():
  # 128 registers x 32 lanes = 4,096 a warp, x 4 warps = 16,384: 4 of 65,536. Shared
  # memory (12 KiB + 1 KiB reserved) would allow 17, threads 16.
  got = kernel_occupancy.programs_per_sm(128, 128, 12 * 1024)
  assert got == dict(programs_per_sm=4, limited_by="registers", warps_per_sm=16)
  # Registers go 256 a warp: 33 a thread take 1,280 a warp (not 1,056), x 4 warps = 5,120
  # -> 12 programs (not 15); threads would allow 16.
  assert kernel_occupancy.programs_per_sm(33, 128, 0)["programs_per_sm"] == 12
  # 140 KiB of shared memory: one program of 228 KiB.
  got = kernel_occupancy.programs_per_sm(64, 128, 140 * 1024)
  assert (got["programs_per_sm"], got["limited_by"]) == (1, "shared memory")
  # Tiny programs stop at 32 an SM.
  assert kernel_occupancy.programs_per_sm(16, 32, 0)["limited_by"] == "programs"


def test_parsers_read_xla_and_ptxas_text():
  thunks = ("001: kCustomKernel [source | next=002 (1)] loop_convert_fusion_1 grid: [1024, 1, "
            "1] threads: [128, 1, 1]  shared_memory: 0 bytes\n"
            "002: kCustomKernel [prev=001 (1) | next=003 (1)] paged_decode_attention "
            "grid: [4, 256, 1] threads: [128, 1, 1]  shared_memory: 20480 bytes\n")
  assert kernel_occupancy.parse_launch(thunks) == dict(
      name="paged_decode_attention", programs=1024, threads=128, shared_bytes=20480)
  assert kernel_occupancy.parse_launch(thunks.splitlines()[0]) is None
  ptxas = ("ptxas info    : Compiling entry function 'paged_decode_attention' for 'sm_90a'\n"
           "ptxas info    : Function properties for paged_decode_attention\n"
           "    8 bytes stack frame, 32 bytes spill stores, 16 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 8 bytes cumulative stack size")
  assert kernel_occupancy.parse_ptxas(ptxas) == dict(registers=255, spill_bytes=48)
  with pytest.raises(ValueError, match="no register count"):
    kernel_occupancy.parse_ptxas("ptxas fatal: unknown arch")


@pytest.mark.skipif(kernel_occupancy.find_ptxas() is None, reason="CUDA's ptxas is not installed")
@pytest.mark.skipif(not gpu_plan_test._cuda_plan_available(),
                    reason="JAX's CUDA plugin and cuDNN are not installed")
def test_no_sweep_configuration_spills_compiled_for_an_h100(tmp_path):
  """The whole tool in a fresh interpreter (XLA's dump flag must be set before jax starts):
  every configuration the GPU sweep times compiles for an H100 without spilling registers
  (`paged_decode_check.LEFT_OUT` holds the one that did), and the defaults fit 2 to 8
  programs an SM."""
  import json

  out = tmp_path / "occ.json"
  script = os.path.join(ROOT, "benchmarks", "gpu", "kernel_occupancy.py")
  run = subprocess.run([sys.executable, script, "--json", str(out)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  if run.returncode and "XLA wrote no PTX" in run.stderr:  # a jax newer than our pin
    pytest.skip(run.stderr.strip().splitlines()[-1])
  assert run.returncode == 0, run.stderr[-2000:]
  rows = json.loads(out.read_text())["runs"]
  assert len(rows) == len(kernel_occupancy_sweep())
  assert not [r for r in rows if r["spill_bytes"]], [r for r in rows if r["spill_bytes"]]
  defaults = rows[0]
  assert {k: defaults[k] for k in kernel_occupancy_sweep()[0]} == kernel_occupancy_sweep()[0]
  assert defaults["name"] == "paged_decode_attention"
  assert 2 <= defaults["programs_per_sm"] <= 8 and defaults["programs"] == 256 * 8
  for r in rows:
    assert r["programs_per_sm"] == kernel_occupancy.programs_per_sm(
        r["registers"], r["threads"], r["shared_bytes"])["programs_per_sm"]


def kernel_occupancy_sweep():
  from benchmarks.gpu import paged_decode_check  # pylint: disable=g-import-not-at-top
  return paged_decode_check.sweep_configs(16)
