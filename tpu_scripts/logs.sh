#!/usr/bin/env bash
# Shows a run's log: live from a worker over ssh, or from the GCS copy.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF2
usage: $JR_SCRIPT --name NAME [--worker W] [--lines N] [--follow] [--run-name RUN]
       $JR_SCRIPT --gcs gs://BUCKET/PREFIX --run-name RUN [--worker W] [--lines N]
       $JR_SCRIPT --gcs gs://BUCKET/PREFIX --run-name RUN --fetch DIR

Without --gcs: tails ~/$RUNS_DIR/RUN/logs/worker-*.log on worker W over ssh (the TPU must
be up). With --gcs: reads the copy that launch.sh keeps in gs://BUCKET/PREFIX/RUN (also
after the TPU is gone); --fetch downloads the whole run directory (metrics.jsonl,
checkpoints, logs) into DIR, e.g. for 'jaxrl-scale fit DIR/metrics.jsonl'.

  --worker W       worker index (default 0: process 0 writes the metrics)
  --lines N        last N lines (default 100)
  --follow         keep following the log (ssh mode; Ctrl-C to stop)
  --run-name RUN   run name (default in ssh mode: the latest run on the worker)
  --gcs URL        gs://bucket/prefix given to launch.sh
  --fetch DIR      download gs://.../RUN into DIR instead of printing a log
$JR_COMMON_HELP
EOF2
}

WORKER=0 LINES=100 FOLLOW=0 RUN_NAME="" GCS="" FETCH=""
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --worker) jr_need_value "$@"; WORKER=$2; shift 2 ;;
    --lines) jr_need_value "$@"; LINES=$2; shift 2 ;;
    --follow) FOLLOW=1; shift ;;
    --run-name) jr_need_value "$@"; RUN_NAME=$2; shift 2 ;;
    --gcs) jr_need_value "$@"; GCS=${2%/}; shift 2 ;;
    --fetch) jr_need_value "$@"; FETCH=$2; shift 2 ;;
    *) jr_bad_arg "$1" ;;
  esac
done

[[ $WORKER =~ ^[0-9]+$ ]] || jr_die "--worker '$WORKER' must be a worker index (0, 1, ...)"
[[ $LINES =~ ^[1-9][0-9]*$ ]] || jr_die "--lines '$LINES' must be a positive integer"
[[ -z $RUN_NAME ]] || jr_require_run_name "$RUN_NAME"

if [[ -n $GCS ]]; then
  jr_require_gcs --gcs "$GCS"
  [[ -n $RUN_NAME ]] || jr_die "--gcs needs --run-name (the GCS copy holds every run)"
  ((FOLLOW == 0)) || jr_die "--follow works over ssh only; drop --gcs"
  if [[ -n $FETCH ]]; then
    jr_run mkdir -p "$FETCH"
    jr_run gsutil -m rsync -r "$GCS/$RUN_NAME" "$FETCH"
  else
    jr_run gsutil cat "$GCS/$RUN_NAME/logs/worker-$WORKER.log" | tail -n "$LINES"
  fi
  exit 0
fi

[[ -z $FETCH ]] || jr_die "--fetch reads the GCS copy: give --gcs and --run-name"
jr_require_name
run=$(jr_quote "$RUNS_DIR/${RUN_NAME:-latest}")
tail_flags="-n $LINES"
((FOLLOW == 0)) || tail_flags+=" -F"
jr_ssh "$WORKER" "tail $tail_flags $run/logs/worker-*.log"
