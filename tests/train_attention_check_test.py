"""benchmarks/gpu/train_attention_check.py on CPU: the cuDNN path's code runs through JAX's XLA
implementation here, so what this shows is that the check measures what it says and fails
on a wrong attention; whether cuDNN's kernel passes is the GPU suite's question."""

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository root: benchmarks.* by package name
from benchmarks.gpu import train_attention_check as check  # noqa: E402

from jaxrl_scale.models import attention  # noqa: E402


@pytest.mark.slow  # 22 s on 2 cores: a GPU check's machinery; the verdict is tested by hand below
def test_an_attention_off_by_one_position_fails_the_check(monkeypatch, capsys):
  """The "cudnn" way with its output shifted one position (the kind of bug a kernel's
  masking or layout gets wrong) is far outside the bf16 einsum path's error: the check
  exits 1 and says so, while the einsum way, untouched, stays within bf16 rounding of the
  float32 reference."""
  fused = attention.fused_attention

  def shifted(*a, **kw):
    return jnp.roll(fused(*a, **kw), 1, axis=1)

  monkeypatch.setattr(attention, "fused_attention", shifted)
  assert check.main(["--quick", "--json"]) == 1
  out = capsys.readouterr()
  report = json.loads(out.out.strip().splitlines()[-1])
  assert report["passed"] is False and report["kernel"] == "xla"
  einsum, cudnn = report["ways"]["einsum"], report["ways"]["cudnn"]
  assert einsum["grad_rel_l2"] < 0.05 and einsum["loss_rel"] < 1e-3  # bf16 rounding only
  assert cudnn["grad_rel_l2"] > check.TOLERANCE * einsum["grad_rel_l2"] + check.FLOOR
  assert report["cudnn_vs_einsum"]["grad_rel_l2"] > 0.05
  assert "FAILED: cuDNN's errors within 2.0x" in out.err
  assert report["shape"]["attention_impl"] == "cudnn" and report["shape"]["dtype"] == "bfloat16"


def test_errors_and_the_verdict_by_hand():
  """Relative errors against the reference, computed by hand on two tensors; the verdict
  allows TOLERANCE x einsum's error + FLOOR on the loss and the gradients' L2, no more."""
  ref = [np.array([3.0, 4.0], np.float32), np.array([[1.0, -2.0]], np.float32)]
  got = [np.array([3.0, 4.5], np.float32), np.array([[1.0, -2.0]], np.float32)]
  e = check.errors(2.1, got, 2.0, ref)
  assert np.isclose(e["loss_rel"], 0.05)
  assert np.isclose(e["grad_rel_l2"], 0.5 / np.sqrt(9 + 16 + 1 + 4))
  assert np.isclose(e["grad_max_rel"], 0.5 / 4.0)
  einsum = {"loss_rel": 1e-4, "grad_rel_l2": 1e-2, "grad_max_rel": 1.0}
  edge = {"loss_rel": 2e-4 + check.FLOOR, "grad_rel_l2": 2e-2 + check.FLOOR,
          "grad_max_rel": 9.0}
  assert check.passes(edge, einsum)
  assert not check.passes(dict(edge, grad_rel_l2=edge["grad_rel_l2"] * 1.01), einsum)
  assert not check.passes(dict(edge, loss_rel=edge["loss_rel"] * 1.01), einsum)
