# shellcheck shell=bash disable=SC2034  # globals here are read by the sourcing scripts
# Shared by every tpu_scripts/*.sh: error messages, flag parsing, TPU type defaults, and
# the --dry-run mode that prints each command ("+ gcloud ...", one per line, on stdout)
# instead of running it. Informational messages go to stderr, so stdout of a dry run is
# exactly the list of commands.

set -euo pipefail

JR_SCRIPT=$(basename "$0")
JR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY_RUN=0
TPU_NAME=${JAXRL_TPU_NAME:-}
ZONE=${JAXRL_TPU_ZONE:-}
PROJECT=${JAXRL_TPU_PROJECT:-}
# Where things live on every worker, relative to the worker's home directory.
REMOTE_DIR=${JAXRL_TPU_REMOTE_DIR:-jaxrl_scale}
RUNS_DIR=${JAXRL_TPU_RUNS_DIR:-jaxrl_runs}
JR_SHIFT=0

jr_die() {
  printf '%s: error: %s\n' "$JR_SCRIPT" "$*" >&2
  exit 2
}

jr_log() {
  if ((DRY_RUN)); then
    printf '%s: (dry run) %s\n' "$JR_SCRIPT" "$*" >&2
  else
    printf '%s: %s\n' "$JR_SCRIPT" "$*" >&2
  fi
}

# Quotes one word for a POSIX shell; plain words stay unquoted so dry runs read easily.
jr_quote() {
  local word=$1
  if [[ $word =~ ^[A-Za-z0-9_./:=@,+%^-]+$ ]]; then
    printf '%s' "$word"
  else
    printf "'%s'" "${word//\'/\'\\\'\'}"
  fi
}

# Joins words into one shell-safe command line.
jr_join() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(jr_quote "$word")"
  done
  printf '%s' "$out"
}

# Runs a command, or with --dry-run prints it as "+ cmd args" on stdout.
jr_run() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(jr_join "$@")"
  else
    printf '+ %s\n' "$(jr_join "$@")" >&2
    "$@"
  fi
}

# Splits --flag=value into --flag value (up to a lone "--"), into the array JR_ARGS.
jr_split_args() {
  JR_ARGS=()
  while (($#)); do
    case "$1" in
      --) JR_ARGS+=("$@"); return ;;
      --*=*) JR_ARGS+=("${1%%=*}" "${1#*=}") ;;
      *) JR_ARGS+=("$1") ;;
    esac
    shift
  done
}

# Dies unless flag $1 has a value $2.
jr_need_value() {
  if (($# < 2)) || [[ -z $2 || $2 == --* ]]; then
    jr_die "flag $1 needs a value (see --help)"
  fi
}

# Handles the flags every script takes. Returns 1 if $1 is not one of them; otherwise sets
# JR_SHIFT to the number of words consumed. Scripts define usage() before calling it.
jr_common_flag() {
  case "$1" in
    --name) jr_need_value "$@"; TPU_NAME=$2; JR_SHIFT=2 ;;
    --zone) jr_need_value "$@"; ZONE=$2; JR_SHIFT=2 ;;
    --project) jr_need_value "$@"; PROJECT=$2; JR_SHIFT=2 ;;
    --dry-run) DRY_RUN=1; JR_SHIFT=1 ;;
    -h | --help) usage; exit 0 ;;
    *) return 1 ;;
  esac
}

jr_bad_arg() {
  case "$1" in
    -*) jr_die "unknown flag '$1' (see --help)" ;;
    *) jr_die "unexpected argument '$1' (see --help)" ;;
  esac
}

# Text of the flags every script takes, for usage().
JR_COMMON_HELP="  --name NAME        TPU / queued resource name (env JAXRL_TPU_NAME)
  --zone ZONE        GCE zone (env JAXRL_TPU_ZONE; default: gcloud's compute/zone)
  --project PROJECT  GCP project (env JAXRL_TPU_PROJECT; default: gcloud's core/project)
  --dry-run          print the commands (one per line, prefixed '+ ') instead of running them
  -h, --help         show this help"

jr_require_name() {
  [[ -n $TPU_NAME ]] || jr_die "--name is required (or set JAXRL_TPU_NAME)"
  [[ $TPU_NAME =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
    jr_die "--name '$TPU_NAME' must be lowercase letters, digits and '-', starting with a letter"
}

jr_require_gcs() {  # $1 flag name, $2 value
  [[ -n $2 ]] || jr_die "$1 is required: a gs://bucket/prefix for run directories and logs"
  [[ $2 =~ ^gs://[a-z0-9][-_.a-z0-9]*[a-z0-9](/.*)?$ ]] ||
    jr_die "$1 '$2' must look like gs://bucket/prefix"
}

jr_require_run_name() {
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
    jr_die "--run-name '$1' may hold only letters, digits, '.', '_' and '-'"
}

# gcloud's --zone / --project, only where given (otherwise gcloud's own config decides).
jr_scope() {
  JR_SCOPE=()
  [[ -z $ZONE ]] || JR_SCOPE+=("--zone=$ZONE")
  [[ -z $PROJECT ]] || JR_SCOPE+=("--project=$PROJECT")
}

# Runs a shell command line on workers ($1: all, 0, 1-3, ...) of the TPU.
jr_ssh() {
  local workers=$1 command=$2
  jr_scope
  jr_run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--worker=$workers" "${JR_SCOPE[@]}" \
    --command "$command"
}

# The jax version pinned in pyproject.toml: jax[tpu] must match it on the workers.
jr_jax_pin() {
  local line
  line=$(grep -Eo '"jax==[0-9][0-9A-Za-z.]*"' "$JR_ROOT/pyproject.toml" | head -n 1) ||
    jr_die "no \"jax==X\" pin found in $JR_ROOT/pyproject.toml"
  line=${line#\"jax==}
  printf '%s' "${line%\"}"
}

# Resolves an accelerator type. Sets TPU_ACCEL (gcloud's spelling), TPU_FAMILY,
# TPU_RUNTIME and TPU_ZONE (defaults), TPU_CHIPS and TPU_WORKERS (host VMs).
# Zones hold different TPU generations and change over time: check with
#   gcloud compute tpus accelerator-types list --zone=ZONE
jr_tpu_type() {
  local type=$1 n
  n=${type##*-}
  [[ $type == *-* && $n =~ ^[1-9][0-9]*$ ]] ||
    jr_die "--type '$type' must be v5litepod-N (alias v5e-N), v5p-N or v6e-N"
  case "${type%-*}" in
    v5e | v5litepod)
      TPU_FAMILY=v5e TPU_ACCEL="v5litepod-$n" TPU_RUNTIME=v2-alpha-tpuv5-lite TPU_ZONE=us-west4-a
      ;;
    v6e)
      TPU_FAMILY=v6e TPU_ACCEL="v6e-$n" TPU_RUNTIME=v2-alpha-tpuv6e TPU_ZONE=us-east5-b
      ;;
    v5p)
      TPU_FAMILY=v5p TPU_ACCEL="v5p-$n" TPU_RUNTIME=v2-alpha-tpuv5 TPU_ZONE=us-east5-a
      ;;
    *) jr_die "--type '$type' must be v5litepod-N (alias v5e-N), v5p-N or v6e-N" ;;
  esac
  if [[ $TPU_FAMILY == v5p ]]; then
    # v5p-N counts TensorCores: 2 per chip, 4 chips per host VM.
    ((n % 8 == 0 && n <= 12288)) ||
      jr_die "--type '$type': v5p sizes are multiples of 8 TensorCores up to 12288 (v5p-8, ...)"
    TPU_CHIPS=$((n / 2)) TPU_WORKERS=$((n / 8))
  else
    # v5e / v6e count chips: up to 8 on one VM, 4 per VM in multi-host slices.
    case $n in
      1 | 4 | 8 | 16 | 32 | 64 | 128 | 256) ;;
      *) jr_die "--type '$type': $TPU_FAMILY sizes are 1, 4, 8, 16, 32, 64, 128 or 256 chips" ;;
    esac
    TPU_CHIPS=$n
    if ((n <= 8)); then TPU_WORKERS=1; else TPU_WORKERS=$((n / 4)); fi
  fi
}
