"""Tests of tpu_scripts/: every command in --dry-run mode, --help, flag errors, shellcheck,
and train_worker.sh run for real on this machine with a fake `jaxrl-scale` and `gsutil`."""

import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import textwrap
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tpu_scripts"
COMMANDS = ["create", "setup", "launch", "logs", "stop", "delete"]
JAX_PIN = re.search(r'"jax==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


@pytest.fixture
def env(tmp_path):
  """Environment whose gcloud / gsutil fail loudly: a dry run must never call them."""
  fake_bin = tmp_path / "fakebin"
  fake_bin.mkdir()
  for tool in ("gcloud", "gsutil"):
    path = fake_bin / tool
    path.write_text(f"#!/bin/sh\necho called >> {tmp_path}/{tool}.called\nexit 97\n")
    path.chmod(0o755)
  out = {k: v for k, v in os.environ.items() if not k.startswith("JAXRL_TPU_")}
  out["PATH"] = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
  out["TMPDIR"] = str(tmp_path)
  yield out
  for tool in ("gcloud", "gsutil"):
    assert not (tmp_path / f"{tool}.called").exists(), f"{tool} was run"


def run(script, *args, env=None, check=True):
  proc = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh"), *args], env=env,
                        capture_output=True, text=True, timeout=60)
  if check:
    assert proc.returncode == 0, proc.stderr
  return proc


def dry(script, *args, env=None):
  """Runs a dry run; returns the printed commands, each split into argv."""
  proc = run(script, "--dry-run", *args, env=env)
  lines = proc.stdout.splitlines()
  assert lines, f"{script} printed no commands"
  for line in lines:
    assert line.startswith("+ "), f"not a command line: {line!r}"
  return [shlex.split(line[2:]) for line in lines]


def flag(argv, name):
  """Value of --name=value or --name value in argv (None if absent)."""
  for i, word in enumerate(argv):
    if word.startswith(name + "="):
      return word.split("=", 1)[1]
    if word == name and i + 1 < len(argv):
      return argv[i + 1]
  return None


def remote(argv):
  """The shell command an ssh line runs on the workers; checked for syntax with bash -n."""
  assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  command = flag(argv, "--command")
  syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
  assert syntax.returncode == 0, (command, syntax.stderr)
  return command


# ---------------------------------------------------------------------------------------
# --help and flag errors.


@pytest.mark.parametrize("script", COMMANDS)
def test_help_prints_usage_and_exits_zero(script, env):
  proc = run(script, "--help", env=env)
  assert proc.stdout.startswith(f"usage: {script}.sh")
  assert "--dry-run" in proc.stdout and "--name" in proc.stdout
  assert run(script, "-h", env=env).stdout == proc.stdout


def test_train_worker_help(env):
  proc = run("train_worker", "--help", env=env)
  assert proc.stdout.startswith("usage: train_worker.sh --run-dir DIR")


@pytest.mark.parametrize("script", COMMANDS)
@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unknown flag '--bogus'"),
    (["--name"], "flag --name needs a value"),
    (["--zone="], "flag --zone needs a value"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_flags_exit_nonzero_with_one_line(script, args, message, env):
  if script == "launch" and args == ["stray"]:
    args = ["--name", "tpu", "--gcs", "gs://bkt/runs", "--bogus2"]
    message = "unknown flag '--bogus2'"
  proc = run(script, *args, "--dry-run", env=env, check=False)
  assert proc.returncode == 2
  assert proc.stdout == ""
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"{script}.sh: error: "), proc.stderr
  assert message in lines[0]


@pytest.mark.parametrize("script,args,message", [
    ("create", ["--type", "v5p-8"], "--name is required"),
    ("create", ["--name", "Bad_Name", "--type", "v5p-8"], "must be lowercase"),
    ("create", ["--name", "t"], "--type is required"),
    ("create", ["--name", "t", "--type", "v4-8"], "--type 'v4-8' must be v5litepod-N"),
    ("create", ["--name", "t", "--type", "v5p-12"], "multiples of 8 TensorCores"),
    ("create", ["--name", "t", "--type", "v6e-3"], "sizes are 1, 4, 8"),
    ("create", ["--name", "t", "--type", "v5e-8", "--spot", "--reserved"], "exclude each other"),
    ("create", ["--name", "t", "--type", "v5e-8", "--valid-until", "soon"], "duration"),
    ("setup", ["--name", "t", "--ref", "main"], "--ref needs --repo"),
    ("setup", ["--name", "t", "--gcs", "s3://x/y"], "must look like gs://bucket/prefix"),
    ("setup", ["--name", "t", "--source", "/nonexistent"], "has no pyproject.toml"),
    ("launch", ["--name", "t", "--", "c.yaml"], "--gcs is required"),
    ("launch", ["--name", "t", "--gcs", "gs://bkt/r"], "give the train config"),
    ("launch", ["--name", "t", "--gcs", "gs://bkt/r", "--run-name", "a b", "--", "c.yaml"],
     "--run-name 'a b'"),
    ("launch", ["--name", "t", "--gcs", "gs://bkt/r", "--env", "1X=2", "--", "c.yaml"],
     "must be KEY=VALUE"),
    ("launch", ["--name", "t", "--gcs", "gs://bkt/r", "--", "c.yaml", "--output-dir", "x"],
     "do not pass --output-dir"),
    ("logs", ["--gcs", "gs://bkt/r"], "--gcs needs --run-name"),
    ("logs", ["--name", "t", "--worker", "x"], "--worker 'x'"),
    ("logs", ["--name", "t", "--fetch", "d"], "--fetch reads the GCS copy"),
    ("stop", [], "--name is required"),
    ("delete", ["--name", "t"], "pass --yes"),
])
def test_invalid_settings_are_one_line_errors(script, args, message, env):
  extra = [] if (script, message) == ("delete", "pass --yes") else ["--dry-run"]
  proc = run(script, *args, *extra, env=env, check=False)
  assert proc.returncode == 2, proc.stdout
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and message in lines[0], proc.stderr


# ---------------------------------------------------------------------------------------
# Dry runs: the commands printed.


@pytest.mark.parametrize("type_,accel,runtime,zone,workers", [
    ("v5e-8", "v5litepod-8", "v2-alpha-tpuv5-lite", "us-west4-a", 1),
    ("v5litepod-64", "v5litepod-64", "v2-alpha-tpuv5-lite", "us-west4-a", 16),
    ("v5p-32", "v5p-32", "v2-alpha-tpuv5", "us-east5-a", 4),
    ("v6e-16", "v6e-16", "v2-alpha-tpuv6e", "us-east5-b", 4),
])
def test_create_requests_a_queued_resource(type_, accel, runtime, zone, workers, env):
  (cmd,) = dry("create", "--name", "rl-pod", "--type", type_, env=env)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rl-pod"]
  assert flag(cmd, "--node-id") == "rl-pod"
  assert flag(cmd, "--accelerator-type") == accel
  assert flag(cmd, "--runtime-version") == runtime
  assert flag(cmd, "--zone") == zone
  assert "--spot" not in cmd and flag(cmd, "--project") is None
  info = run("create", "--name", "rl-pod", "--type", type_, "--dry-run", env=env).stderr
  assert f"on {workers} worker VM(s)" in info


def test_create_spot_with_overrides_and_wait(env):
  cmds = dry("create", "--name=rl", "--type=v6e-8", "--spot", "--zone", "europe-west4-a",
             "--project", "my-proj", "--runtime-version", "v2-custom", "--valid-until", "6h",
             "--wait", env=env)
  create, describe = cmds
  assert "--spot" in create and "--reserved" not in create
  assert flag(create, "--zone") == "europe-west4-a"
  assert flag(create, "--project") == "my-proj"
  assert flag(create, "--runtime-version") == "v2-custom"
  assert flag(create, "--valid-until-duration") == "6h"
  assert describe[:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "rl"]
  assert flag(describe, "--format") == "value(state.state)"
  reserved = dry("create", "--name=rl", "--type=v5p-8", "--reserved", env=env)[0]
  assert "--reserved" in reserved and "--spot" not in reserved


def test_environment_supplies_name_zone_project(env):
  env.update(JAXRL_TPU_NAME="from-env", JAXRL_TPU_ZONE="us-east5-a", JAXRL_TPU_PROJECT="p2")
  (cmd,) = dry("stop", env=env)
  assert cmd[5] == "from-env"
  assert flag(cmd, "--zone") == "us-east5-a" and flag(cmd, "--project") == "p2"


def test_setup_copies_checkout_and_installs_pinned_jax_tpu(env, tmp_path):
  tar, scp, unpack, install, check = dry("setup", "--name", "rl", "--zone", "z1", env=env)
  assert tar[:2] == ["tar", "-czf"] and tar[-3:] == ["-C", str(ROOT), "."]
  assert "--exclude=./.venv" in tar and "--exclude=./.git" in tar
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5] == tar[2] and scp[6] == "rl:jaxrl_scale-src.tgz"
  assert "--worker=all" in scp and flag(scp, "--zone") == "z1"
  for cmd in (unpack, install, check):
    assert cmd[5] == "rl" and "--worker=all" in cmd and flag(cmd, "--zone") == "z1"
  assert "tar -xzf jaxrl_scale-src.tgz -C jaxrl_scale" in remote(unpack)
  words = shlex.split(remote(install).replace(";", " ; "))
  assert f"jax[tpu]=={JAX_PIN}" in words
  assert "python3.11 -m venv .venv" in remote(install)
  assert ".venv/bin/pip install -q -e ." in remote(install)
  assert "d.maybe_initialize(); print(d.describe())" in remote(check)
  assert "JAXRL_DISTRIBUTED=auto" in remote(check)


def test_setup_git_clone_mode(env):
  clone, install = dry("setup", "--name", "rl", "--repo", "https://github.com/o/r.git",
                       "--ref", "v1.2", "--python", "python3.12", "--remote-dir", "src/rl",
                       "--no-check", env=env)
  command = remote(clone)
  assert "git clone --quiet https://github.com/o/r.git src/rl" in command
  assert "checkout --quiet --force --detach origin/v1.2" in command
  assert "fetch --quiet --tags origin" in command  # a re-run updates the existing clone
  assert "python3.12 -m venv .venv" in remote(install) and "cd src/rl" in remote(install)


def test_setup_gcs_staging(env):
  tar, upload, unpack, install = dry("setup", "--name", "rl", "--gcs", "gs://bkt/stage/",
                                     "--no-check", env=env)
  assert upload == ["gsutil", "-q", "cp", tar[2], "gs://bkt/stage/jaxrl_scale-src.tgz"]
  assert remote(unpack).startswith(
      "set -e; gsutil -q cp gs://bkt/stage/jaxrl_scale-src.tgz jaxrl_scale-src.tgz;")


def test_launch_runs_train_on_all_workers_detached(env):
  (ssh,) = dry("launch", "--name", "rl", "--zone", "z1", "--gcs", "gs://bkt/runs/",
               "--run-name", "qwen-a", "--env", "XLA_FLAGS=--xla_a --xla_b",
               "--env", "WANDB_MODE=off", "--sync-every", "60", "--",
               "configs/scalerl.yaml", "rl.loss=cispo", "run.name=it's mine", env=env)
  assert "--worker=all" in ssh and flag(ssh, "--zone") == "z1"
  command = remote(ssh)
  assert "setsid nohup env JAXRL_DISTRIBUTED=auto" in command
  assert "ln -sfn qwen-a jaxrl_runs/latest" in command
  # The detached part, split back into argv.
  start = command.index("setsid nohup")
  end = command.index(" >>jaxrl_runs/qwen-a/logs/launch-$(hostname).log")
  argv = shlex.split(command[start:end])
  assert argv[:5] == ["setsid", "nohup", "env", "JAXRL_DISTRIBUTED=auto",
                      "XLA_FLAGS=--xla_a --xla_b"]
  assert argv[5:8] == ["WANDB_MODE=off", "bash", "jaxrl_scale/tpu_scripts/train_worker.sh"]
  sep = argv.index("--")
  assert flag(argv[:sep], "--run-dir") == "jaxrl_runs/qwen-a"
  assert flag(argv[:sep], "--gcs") == "gs://bkt/runs/qwen-a"
  assert flag(argv[:sep], "--sync-every") == "60"
  assert "--resume" not in argv
  assert argv[sep + 1:] == ["configs/scalerl.yaml", "rl.loss=cispo", "run.name=it's mine"]
  assert "</dev/null &" in command  # detached from the ssh session


def test_launch_resume_default_run_name_and_no_separator(env):
  # No "--" before the config; --dry-run after it still means this script's dry run.
  proc = run("launch", "--name", "rl", "--gcs", "gs://bkt/runs", "--resume",
             "configs/x.yaml", "run.steps=5", "--dry-run", env=env)
  (line,) = proc.stdout.splitlines()
  ssh = shlex.split(line[2:])
  argv = shlex.split(remote(ssh).split("setsid nohup", 1)[1].split(" >>", 1)[0])
  assert "--resume" in argv
  run_dir = flag(argv, "--run-dir")
  assert re.fullmatch(r"jaxrl_runs/\d{8}-\d{6}", run_dir)
  assert flag(argv, "--gcs") == "gs://bkt/runs/" + run_dir.split("/")[1]
  assert argv[argv.index("--") + 1:] == ["configs/x.yaml", "run.steps=5"]


def test_logs_over_ssh_and_from_gcs(env):
  (ssh,) = dry("logs", "--name", "rl", "--worker", "3", "--lines", "50", "--follow", env=env)
  assert "--worker=3" in ssh
  assert remote(ssh) == "tail -n 50 -F jaxrl_runs/latest/logs/worker-*.log"
  (ssh,) = dry("logs", "--name", "rl", "--run-name", "qwen-a", env=env)
  assert "--worker=0" in ssh
  assert remote(ssh) == "tail -n 100 jaxrl_runs/qwen-a/logs/worker-*.log"
  (cat,) = dry("logs", "--gcs", "gs://bkt/runs", "--run-name", "qwen-a", "--worker", "2",
               env=env)
  assert cat == ["gsutil", "cat", "gs://bkt/runs/qwen-a/logs/worker-2.log"]
  mkdir, rsync = dry("logs", "--gcs", "gs://bkt/runs", "--run-name", "qwen-a", "--fetch",
                     "local/qwen-a", env=env)
  assert mkdir == ["mkdir", "-p", "local/qwen-a"]
  assert rsync == ["gsutil", "-m", "rsync", "-r", "gs://bkt/runs/qwen-a", "local/qwen-a"]


def test_stop_signals_every_worker(env):
  (ssh,) = dry("stop", "--name", "rl", env=env)
  assert "--worker=all" in ssh
  command = remote(ssh)
  assert "jaxrl_runs/latest/logs/worker-*.pid" in command
  assert 'kill -TERM $(cat "$f")' in command
  (ssh,) = dry("stop", "--name", "rl", "--run-name", "qwen-a", "--force", env=env)
  assert "jaxrl_runs/qwen-a/logs/worker-*.pid" in remote(ssh)
  assert 'kill -KILL -- -$(cat "$f")' in remote(ssh)


def test_delete_removes_queued_resource_and_tpu(env):
  (cmd,) = dry("delete", "--name", "rl", "--zone", "z1", env=env)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "rl"]
  assert "--force" in cmd and "--quiet" in cmd and "--async" not in cmd
  assert flag(cmd, "--zone") == "z1"
  assert "--async" in dry("delete", "--name", "rl", "--yes", "--async", env=env)[0]


def test_shellcheck_clean():
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck is not installed")
  scripts = sorted(str(p) for p in SCRIPTS.glob("*.sh"))
  proc = subprocess.run(["shellcheck", "-x", *scripts], cwd=SCRIPTS, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------
# train_worker.sh for real, with fakes for jaxrl-scale and gsutil.


@pytest.fixture
def worker_env(tmp_path):
  home = tmp_path / "home"
  home.mkdir()
  venv_bin = tmp_path / "venv" / "bin"
  venv_bin.mkdir(parents=True)
  fake_train = venv_bin / "jaxrl-scale"
  # Records its argv and cwd, writes a metrics row, then sleeps or exits as told.
  fake_train.write_text(textwrap.dedent(f"""\
      #!/bin/bash
      printf '%s\\n' "$PWD" "$@" > {tmp_path}/train.args
      out="${{@: -1}}"
      echo '{{"step": 1}}' > "$out/metrics.jsonl"
      echo "training on JAXRL_DISTRIBUTED=$JAXRL_DISTRIBUTED"
      if [ -n "$FAKE_SLEEP" ]; then exec sleep "$FAKE_SLEEP"; fi
      exit "${{FAKE_RC:-0}}"
      """))
  fake_train.chmod(0o755)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gsutil = bin_dir / "gsutil"
  gsutil.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/gsutil.calls\n")
  gsutil.chmod(0o755)
  env = dict(os.environ, HOME=str(home), JAXRL_WORKER="0", JAXRL_DISTRIBUTED="auto",
             PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  return env, tmp_path, home


def _worker_cmd(tmp_path, *extra, train=("configs/cpu_tiny.yaml", "run.steps=3")):
  return ["bash", str(SCRIPTS / "train_worker.sh"), "--run-dir", "jaxrl_runs/r1",
          "--venv", str(tmp_path / "venv"), *extra, "--", *train]


def test_train_worker_runs_train_logs_and_syncs(worker_env):
  env, tmp_path, home = worker_env
  proc = subprocess.run(_worker_cmd(tmp_path, "--gcs", "gs://bkt/runs/r1"), env=env,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  run_dir = home / "jaxrl_runs" / "r1"
  args = (tmp_path / "train.args").read_text().splitlines()
  assert args[0] == str(ROOT)  # configs/ paths resolve against the repository
  assert args[1:] == ["train", "configs/cpu_tiny.yaml", "run.steps=3", "--output-dir",
                      str(run_dir)]
  log = (run_dir / "logs" / "worker-0.log").read_text()
  assert "training on JAXRL_DISTRIBUTED=auto" in log and "exit 0" in log
  assert (run_dir / "logs" / "worker-0.exit").read_text().strip() == "0"
  assert not (run_dir / "logs" / "worker-0.pid").exists()
  calls = (tmp_path / "gsutil.calls").read_text().splitlines()
  assert calls[-1] == f"-m -q rsync -r -x .*orbax-checkpoint-tmp.* {run_dir} gs://bkt/runs/r1"


def test_train_worker_failure_status_resume_and_non_primary_sync(worker_env):
  env, tmp_path, home = worker_env
  env.update(JAXRL_WORKER="3", FAKE_RC="7")
  proc = subprocess.run(_worker_cmd(tmp_path, "--gcs", "gs://bkt/runs/r1", "--resume"),
                        env=env, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 7
  logs = home / "jaxrl_runs" / "r1" / "logs"
  assert (logs / "worker-3.exit").read_text().strip() == "7"
  calls = (tmp_path / "gsutil.calls").read_text().splitlines()
  assert calls[0] == f"-m -q rsync -r gs://bkt/runs/r1 {home}/jaxrl_runs/r1"  # restore first
  assert calls[-1] == f"-m -q rsync -r {logs} gs://bkt/runs/r1/logs"  # only its own logs
  assert "--resume" in (tmp_path / "train.args").read_text().splitlines()


def test_train_worker_stops_on_sigterm_and_refuses_a_second_run(worker_env):
  env, tmp_path, home = worker_env
  env["FAKE_SLEEP"] = "60"
  proc = subprocess.Popen(_worker_cmd(tmp_path, "--gcs", "gs://bkt/runs/r1"), env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  logs = home / "jaxrl_runs" / "r1" / "logs"
  try:
    deadline = time.time() + 30
    while not (tmp_path / "train.args").exists() and time.time() < deadline:
      time.sleep(0.1)
    assert (logs / "worker-0.pid").read_text().strip() == str(proc.pid)
    # A second run on the same worker would fight over the TPU: refused.
    second = subprocess.run(
        ["bash", str(SCRIPTS / "train_worker.sh"), "--run-dir", "jaxrl_runs/r2",
         "--venv", str(tmp_path / "venv"), "--", "c.yaml"],
        env=env, capture_output=True, text=True, timeout=30)
    assert second.returncode == 2
    r2_log = (home / "jaxrl_runs" / "r2" / "logs" / "worker-0.log").read_text()
    assert "a run is already active" in r2_log
    os.kill(proc.pid, signal.SIGTERM)  # what stop.sh does
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
  finally:
    if proc.poll() is None:
      proc.kill()
  assert "stop requested" in (logs / "worker-0.log").read_text()
  assert (logs / "worker-0.exit").read_text().strip() == str(128 + signal.SIGTERM)
  calls = (tmp_path / "gsutil.calls").read_text().splitlines()
  assert calls[-1].endswith("gs://bkt/runs/r1")  # the final copy still happened
