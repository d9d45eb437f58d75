#!/usr/bin/env bash
# Stops a run on every worker (the TPU stays up); the final copy to GCS still happens.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF2
usage: $JR_SCRIPT --name NAME [--run-name RUN] [--force]

Sends SIGTERM to train_worker.sh on every worker: it stops 'jaxrl-scale train', copies the
run directory to GCS one last time and records the exit status. The TPU keeps running
(delete.sh releases it). Resume later with 'launch.sh --resume --run-name RUN'.

  --run-name RUN   run to stop (default: the latest run on the workers)
  --force          SIGKILL the whole process group at once (no final copy)
$JR_COMMON_HELP
EOF2
}

RUN_NAME="" FORCE=0
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --run-name) jr_need_value "$@"; RUN_NAME=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    *) jr_bad_arg "$1" ;;
  esac
done

jr_require_name
[[ -z $RUN_NAME ]] || jr_require_run_name "$RUN_NAME"
logs=$(jr_quote "$RUNS_DIR/${RUN_NAME:-latest}/logs")
# train_worker.sh runs under setsid: its pid is also its process group id.
# Single quotes on purpose: $f and $(cat) expand on the worker, not here.
# shellcheck disable=SC2016
if ((FORCE)); then
  signal='-KILL -- -$(cat "$f")'
else
  signal='-TERM $(cat "$f")'
fi
jr_ssh all "for f in $logs/worker-*.pid; do [ -e \"\$f\" ] || continue; \
echo \"stopping pid \$(cat \"\$f\") on \$(hostname)\"; kill $signal 2>/dev/null || true; done"
