#!/usr/bin/env bash
# Runs ON each TPU worker (started by launch.sh under setsid/nohup, so it outlives the ssh
# session): one `jaxrl-scale train` process, its log, a periodic copy of the run
# directory to GCS, and a clean stop on SIGTERM (stop.sh). Not meant for a laptop.
set -uo pipefail

JR_SCRIPT=$(basename "$0")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<EOF
usage: $JR_SCRIPT --run-dir DIR [--gcs URL] [--sync-every S] [--resume] -- CONFIG [key=value ...]

Runs 'jaxrl-scale train CONFIG key=value ... --output-dir DIR' from the repository
directory. Output goes to DIR/logs/worker-W.log (W: the worker number from the TPU
metadata, or \$JAXRL_WORKER); DIR/logs/worker-W.pid holds this script's pid and
DIR/logs/worker-W.exit the exit status. With --gcs, worker 0 copies DIR to URL every
SECONDS (default 300) and at the end; other workers copy only their logs.

  --run-dir DIR        run directory on this worker (relative paths: from \$HOME)
  --gcs URL            gs://bucket/prefix/RUN receiving the run directory
  --sync-every S       seconds between copies (default 300)
  --resume             first copy URL back into DIR (a new VM after preemption), then
                       pass --resume to train
  --venv DIR           virtualenv holding jaxrl-scale (default: the repository's .venv)
EOF
}

die() {
  printf '%s: error: %s\n' "$JR_SCRIPT" "$*" >&2
  exit 2
}

RUN_DIR="" GCS="" SYNC_EVERY=300 RESUME=0 VENV="$HERE/../.venv"
while (($#)); do
  case "$1" in
    --run-dir) (($# > 1)) || die "--run-dir needs a value"; RUN_DIR=$2; shift 2 ;;
    --gcs) (($# > 1)) || die "--gcs needs a value"; GCS=${2%/}; shift 2 ;;
    --sync-every) (($# > 1)) || die "--sync-every needs a value"; SYNC_EVERY=$2; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --venv) (($# > 1)) || die "--venv needs a value"; VENV=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unexpected argument '$1' (see --help)" ;;
  esac
done
[[ -n $RUN_DIR ]] || die "--run-dir is required"
(($# > 0)) || die "give the train config after '--'"
[[ $SYNC_EVERY =~ ^[1-9][0-9]*$ ]] || die "--sync-every '$SYNC_EVERY' must be a positive integer"
[[ -z $GCS || $GCS == gs://* ]] || die "--gcs '$GCS' must start with gs://"
[[ $RUN_DIR == /* ]] || RUN_DIR="$HOME/$RUN_DIR"

worker=${JAXRL_WORKER:-}
if [[ -z $worker ]]; then
  worker=$(curl -sf -m 5 -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
    2>/dev/null) || worker=$(hostname)
fi
logs="$RUN_DIR/logs"
mkdir -p "$logs" || die "cannot create $logs"
exec >>"$logs/worker-$worker.log" 2>&1
# One training per worker: the TPU chips cannot be shared between processes.
for pid_file in "$RUN_DIR"/../*/logs/worker-*.pid; do
  if [[ -e $pid_file ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    die "a run is already active ($pid_file: pid $(cat "$pid_file")); stop it first"
  fi
done
echo $$ >"$logs/worker-$worker.pid"
rm -f "$logs/worker-$worker.exit"
echo "== $(date -u +%FT%TZ) worker $worker on $(hostname): jaxrl-scale train $*"

# Orbax writes a checkpoint under a temporary name, then renames it: never copy those.
sync_up() {
  [[ -n $GCS ]] || return 0
  if [[ $worker == 0 ]]; then
    gsutil -m -q rsync -r -x '.*orbax-checkpoint-tmp.*' "$RUN_DIR" "$GCS"
  else
    gsutil -m -q rsync -r "$logs" "$GCS/logs"
  fi
}

train_args=("$@")
if ((RESUME)); then
  if [[ -n $GCS ]]; then
    gsutil -m -q rsync -r "$GCS" "$RUN_DIR" || echo "== nothing to restore from $GCS"
  fi
  train_args+=(--resume)
fi

sync_pid=""
if [[ -n $GCS ]]; then
  (while sleep "$SYNC_EVERY"; do sync_up || echo "== sync to $GCS failed; retrying later"; done) &
  sync_pid=$!
fi

cd "$HERE/.." || die "no repository directory at $HERE/.."
"$VENV/bin/jaxrl-scale" train "${train_args[@]}" --output-dir "$RUN_DIR" &
train_pid=$!
# stop.sh sends TERM here: pass it on, then fall through to the final sync.
trap 'echo "== stop requested"; kill -TERM "$train_pid" 2>/dev/null' TERM INT
# A trapped signal interrupts `wait`; wait again until train has really exited.
while true; do
  wait "$train_pid"
  status=$?
  kill -0 "$train_pid" 2>/dev/null || break
done
[[ -z $sync_pid ]] || kill "$sync_pid" 2>/dev/null
echo "== $(date -u +%FT%TZ) exit $status"
echo "$status" >"$logs/worker-$worker.exit"
rm -f "$logs/worker-$worker.pid"
sync_up || echo "== final sync to $GCS failed"
exit "$status"
