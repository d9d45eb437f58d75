"""The benchmarks score a run against its part's peaks by exact device kind, or not at all."""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: benchmarks.* by package name
from benchmarks.gpu import paged_decode_check  # noqa: E402
from benchmarks.sampler import sampler_bench  # noqa: E402
from benchmarks.train import train_step_bench  # noqa: E402


@pytest.mark.parametrize("kind, tflops, gbps", [
    ("NVIDIA H100 80GB HBM3", 989, 3350),
    ("NVIDIA H100 PCIe", 756, 2000),  # a substring match on "H100" gave the SXM's 989 / 3350
    ("NVIDIA H100 NVL", 835, 3900),
    ("NVIDIA A100-SXM4-40GB", 312, 1555),  # and "A100" the 80 GB part's 2039 GB/s
    ("TPU v5", 459, 2765),  # v5p's device kind, which "TPU v5p" never matched
    ("TPU v5 lite", 197, 819),  # v5e's, which "TPU v5e" never matched
])
def test_peaks_by_exact_device_kind(kind, tflops, gbps):
  assert train_step_bench.spec_peak(kind) == pytest.approx(tflops)
  assert sampler_bench.peak_gbps(kind) == pytest.approx(gbps)
  assert paged_decode_check.peak_gbps(kind, "gpu") == pytest.approx(gbps)


@pytest.mark.parametrize("kind", ["NVIDIA H100", "NVIDIA H100 80GB HBM3e", "NVIDIA L4", "cpu"])
def test_an_unknown_device_gets_no_peak(kind):
  assert train_step_bench.spec_peak(kind) is None
  assert sampler_bench.peak_gbps(kind) is None
  assert paged_decode_check.peak_gbps(kind, "gpu") is None
