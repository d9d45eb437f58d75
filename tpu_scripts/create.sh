#!/usr/bin/env bash
# Requests a Cloud TPU slice as a queued resource (v5e, v5p or v6e; spot or on-demand).
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
usage: $JR_SCRIPT --name NAME --type TYPE [options]

Requests a TPU slice with 'gcloud compute tpus queued-resources create'. The queued
resource and its TPU node share NAME. Multi-host slices get one VM per worker.

  --type TYPE              v5litepod-N (alias v5e-N; N chips: 1,4,8,...,256),
                           v5p-N (N TensorCores = 2 per chip: 8,16,32,...),
                           v6e-N (N chips: 1,4,8,...,256)
  --spot                   Spot capacity (cheaper, preemptible)
  --reserved               reserved capacity (your project's reservation)
  --runtime-version V      TPU VM image (default per type: v5e v2-alpha-tpuv5-lite,
                           v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e)
  --valid-until DURATION   give up if not provisioned within DURATION (e.g. 6h, 2d)
  --wait                   poll until the queued resource is ACTIVE (fails on FAILED)
  --zone ZONE              default per type: v5e us-west4-a, v5p us-east5-a, v6e us-east5-b
$JR_COMMON_HELP

example:
  $JR_SCRIPT --name rl-v5p --type v5p-32 --spot --zone us-east5-a --wait
EOF
}

TYPE="" SPOT=0 RESERVED=0 RUNTIME="" VALID_UNTIL="" WAIT=0
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --type) jr_need_value "$@"; TYPE=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --reserved) RESERVED=1; shift ;;
    --runtime-version) jr_need_value "$@"; RUNTIME=$2; shift 2 ;;
    --valid-until) jr_need_value "$@"; VALID_UNTIL=$2; shift 2 ;;
    --wait) WAIT=1; shift ;;
    *) jr_bad_arg "$1" ;;
  esac
done

jr_require_name
[[ -n $TYPE ]] || jr_die "--type is required (v5litepod-N, v5p-N or v6e-N)"
jr_tpu_type "$TYPE"
((SPOT && RESERVED)) && jr_die "--spot and --reserved exclude each other"
[[ -z $VALID_UNTIL || $VALID_UNTIL =~ ^[0-9]+[smhd]$ ]] ||
  jr_die "--valid-until '$VALID_UNTIL' must be a duration like 30m, 6h or 2d"
ZONE=${ZONE:-$TPU_ZONE}
RUNTIME=${RUNTIME:-$TPU_RUNTIME}

jr_log "$TPU_ACCEL: $TPU_CHIPS chips on $TPU_WORKERS worker VM(s), zone $ZONE, runtime $RUNTIME"
jr_scope
args=(gcloud compute tpus queued-resources create "$TPU_NAME" "--node-id=$TPU_NAME"
  "--accelerator-type=$TPU_ACCEL" "--runtime-version=$RUNTIME" "${JR_SCOPE[@]}")
((SPOT)) && args+=(--spot)
((RESERVED)) && args+=(--reserved)
[[ -z $VALID_UNTIL ]] || args+=("--valid-until-duration=$VALID_UNTIL")
jr_run "${args[@]}"

if ((WAIT)); then
  describe=(gcloud compute tpus queued-resources describe "$TPU_NAME" "${JR_SCOPE[@]}"
    "--format=value(state.state)")
  if ((DRY_RUN)); then
    jr_run "${describe[@]}"
  else
    while true; do
      state=$(jr_run "${describe[@]}")
      jr_log "queued resource $TPU_NAME: $state"
      case "$state" in
        ACTIVE) break ;;
        FAILED | SUSPENDED) jr_die "queued resource $TPU_NAME is $state" ;;
      esac
      sleep 30
    done
  fi
fi
jr_log "next: export JAXRL_TPU_NAME=$TPU_NAME JAXRL_TPU_ZONE=$ZONE; tpu_scripts/setup.sh"
