#!/usr/bin/env bash
# Deletes the queued resource and its TPU VMs (what create.sh made). Billing stops here.
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF2
usage: $JR_SCRIPT --name NAME --yes [--async]

Deletes queued resource NAME with --force, which also deletes its TPU node and every
worker VM: anything not copied to GCS is lost (stop.sh does a final copy first).

  --yes     confirm the deletion (not needed with --dry-run)
  --async   return without waiting for the deletion to finish
$JR_COMMON_HELP
EOF2
}

YES=0 ASYNC=0
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --yes) YES=1; shift ;;
    --async) ASYNC=1; shift ;;
    *) jr_bad_arg "$1" ;;
  esac
done

jr_require_name
((YES || DRY_RUN)) || jr_die "deleting $TPU_NAME loses its local disks; pass --yes to confirm"
jr_scope
args=(gcloud compute tpus queued-resources delete "$TPU_NAME" "${JR_SCOPE[@]}" --force --quiet)
((ASYNC)) && args+=(--async)
jr_run "${args[@]}"
