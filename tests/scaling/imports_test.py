"""`jaxrl-scale fit` and the scaling modules never import JAX (a cold fit stays fast)."""

import subprocess
import sys


def test_scaling_modules_and_fit_command_do_not_import_jax(tmp_path):
  code = (
      "import sys\n"
      "from jaxrl_scale.scaling import (bootstrap, command, compare, coverage, fit, "
      "forecast, io, live, noise, plot, synthetic, text)\n"
      "from jaxrl_scale import cli\n"
      "from jaxrl_scale.scaling import synthetic\n"
      f"path = {str(tmp_path / 'metrics.jsonl')!r}\n"
      "compute, noisy, _ = synthetic.make_curve(synthetic.TABLE1[0], seed=0)\n"
      "synthetic.write_metrics_jsonl(path, compute, noisy)\n"
      "assert cli.main(['fit', path, '--bootstrap', '50', '--plot', path + '.png']) == 0\n"
      "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.'))\n"
      "assert not bad, bad\n")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
