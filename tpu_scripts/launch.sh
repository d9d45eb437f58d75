#!/usr/bin/env bash
# Starts the same `jaxrl-scale train` on every worker of a TPU slice, detached from ssh.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
usage: $JR_SCRIPT --name NAME --gcs gs://BUCKET/PREFIX [options] -- CONFIG [key=value ...]

Runs 'jaxrl-scale train CONFIG key=value ...' on all workers at once (JAX's
multi-controller runtime needs every host to start the same program). Each worker runs
tpu_scripts/train_worker.sh under setsid/nohup, so the run survives the ssh session:
  run directory  ~/$RUNS_DIR/RUN on each worker (~/$RUNS_DIR/latest points to it)
  logs           ~/$RUNS_DIR/RUN/logs/worker-W.log
  GCS copy       gs://BUCKET/PREFIX/RUN: worker 0 copies the run directory (metrics.jsonl,
                 checkpoints, tb/) every --sync-every seconds and at the end; every
                 worker copies its log.
Environment on every worker: JAXRL_DISTRIBUTED=auto (jax.distributed.initialize() from
the TPU metadata) plus each --env.

  --gcs URL            gs://bucket/prefix receiving run directories and logs (required)
  --run-name RUN       run name (default: the UTC start time, YYYYMMDD-HHMMSS)
  --env KEY=VALUE      extra environment variable on every worker (repeatable)
  --sync-every S       seconds between copies to GCS (default 300)
  --resume             restore ~/$RUNS_DIR/RUN from GCS first (e.g. on a new VM after a
                       Spot preemption) and continue from its last checkpoint
  --remote-dir DIR     install directory on the workers, relative to home (default $REMOTE_DIR)
$JR_COMMON_HELP

example:
  $JR_SCRIPT --name rl-v5p --gcs gs://my-bucket/jaxrl --run-name qwen3-8b-a -- \\
      configs/scalerl_qwen3_8b.yaml run.steps=2000
EOF
}

GCS="" RUN_NAME="" SYNC_EVERY=300 RESUME=0 ENVS=() TRAIN=()
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if [[ $1 == -- ]]; then shift; TRAIN=("$@"); break; fi
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --gcs) jr_need_value "$@"; GCS=${2%/}; shift 2 ;;
    --run-name) jr_need_value "$@"; RUN_NAME=$2; shift 2 ;;
    --env) jr_need_value "$@"; ENVS+=("$2"); shift 2 ;;
    --sync-every) jr_need_value "$@"; SYNC_EVERY=$2; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --remote-dir) jr_need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    -*) jr_bad_arg "$1" ;;
    *) TRAIN=("$@"); break ;;  # the config and its overrides may follow without '--'
  esac
done

# `jaxrl-scale train` has no --dry-run: one after the config is meant for this script,
# and running the real thing by mistake would start a pod-sized job.
train=()
for word in "${TRAIN[@]+"${TRAIN[@]}"}"; do
  if [[ $word == --dry-run ]]; then DRY_RUN=1; else train+=("$word"); fi
done
TRAIN=("${train[@]+"${train[@]}"}")
jr_require_name
jr_require_gcs --gcs "$GCS"
((${#TRAIN[@]} > 0)) ||
  jr_die "give the train config after '--', e.g. -- configs/x.yaml run.steps=100"
RUN_NAME=${RUN_NAME:-$(date -u +%Y%m%d-%H%M%S)}
jr_require_run_name "$RUN_NAME"
[[ $SYNC_EVERY =~ ^[1-9][0-9]*$ ]] ||
  jr_die "--sync-every '$SYNC_EVERY' must be a positive integer"
for kv in "${ENVS[@]+"${ENVS[@]}"}"; do
  [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || jr_die "--env '$kv' must be KEY=VALUE"
done
for word in "${TRAIN[@]}"; do
  [[ $word != --output-dir* ]] ||
    jr_die "do not pass --output-dir: the run directory is ~/$RUNS_DIR/$RUN_NAME"
done

run_dir="$RUNS_DIR/$RUN_NAME"
worker_args=(--run-dir "$run_dir" --gcs "$GCS/$RUN_NAME" --sync-every "$SYNC_EVERY")
((RESUME)) && worker_args+=(--resume)
logs=$(jr_quote "$run_dir/logs")
# Started detached (setsid nohup) so it outlives this ssh session; after a few seconds a
# worker without a live pid file (and without a clean exit) failed to start: show why.
remote="set -e; mkdir -p $logs; ln -sfn $(jr_quote "$RUN_NAME") $(jr_quote "$RUNS_DIR/latest"); \
setsid nohup $(jr_join env JAXRL_DISTRIBUTED=auto "${ENVS[@]+"${ENVS[@]}"}" \
  bash "$REMOTE_DIR/tpu_scripts/train_worker.sh" "${worker_args[@]}" -- "${TRAIN[@]}") \
>>$logs/launch-\$(hostname).log 2>&1 </dev/null & sleep 5; \
if ! ls $logs/worker-*.pid >/dev/null 2>&1 && ! grep -qsx 0 $logs/worker-*.exit; then \
echo \"run did not start on \$(hostname):\"; tail -n 20 $logs/*.log; exit 1; fi"
jr_ssh all "$remote"

jr_log "run $RUN_NAME started on all workers of $TPU_NAME; GCS copy: $GCS/$RUN_NAME"
jr_log "follow: tpu_scripts/logs.sh --name $TPU_NAME --follow"
jr_log "stop:   tpu_scripts/stop.sh --name $TPU_NAME"
