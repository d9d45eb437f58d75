#!/usr/bin/env bash
# Installs jaxrl_scale on every worker of a TPU slice: source, Python 3.11 venv, jax[tpu].
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
usage: $JR_SCRIPT --name NAME [options]

Puts the source on every worker (a tarball of this checkout, or a git clone), creates a
venv there and installs 'pip install -e .' plus jax[tpu] at the jax version pinned in
pyproject.toml ($(jr_jax_pin)), then checks that JAX sees the TPU on all workers.
Safe to re-run: it updates the source and reuses the venv.

  --repo URL          git clone URL on each worker instead of copying this checkout
  --ref REF           branch, tag or commit to check out with --repo (default: the
                      remote's default branch)
  --source DIR        checkout to copy (default: $JR_ROOT)
  --gcs URL           stage the tarball through gs://bucket/prefix (one upload, then
                      every worker downloads; faster than scp for large slices)
  --python PY         interpreter for the venv (default python3.11; installed with apt
                      when missing: the TPU images ship Ubuntu 22.04's python3.10)
  --remote-dir DIR    install directory on the workers, relative to home
                      (default $REMOTE_DIR; env JAXRL_TPU_REMOTE_DIR)
  --no-check          skip the final check (every worker starts jax.distributed and
                      prints 'process i/n, D devices (L local, tpu)')
$JR_COMMON_HELP
EOF
}

REPO="" REF="" SOURCE=$JR_ROOT GCS="" PY=python3.11 CHECK=1
jr_split_args "$@"
set -- "${JR_ARGS[@]+"${JR_ARGS[@]}"}"
while (($#)); do
  if jr_common_flag "$@"; then shift "$JR_SHIFT"; continue; fi
  case "$1" in
    --repo) jr_need_value "$@"; REPO=$2; shift 2 ;;
    --ref) jr_need_value "$@"; REF=$2; shift 2 ;;
    --source) jr_need_value "$@"; SOURCE=$2; shift 2 ;;
    --gcs) jr_need_value "$@"; GCS=${2%/}; shift 2 ;;
    --python) jr_need_value "$@"; PY=$2; shift 2 ;;
    --remote-dir) jr_need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    --no-check) CHECK=0; shift ;;
    *) jr_bad_arg "$1" ;;
  esac
done

jr_require_name
[[ -z $GCS ]] || jr_require_gcs --gcs "$GCS"
[[ -z $REF || -n $REPO ]] || jr_die "--ref needs --repo (a copied checkout has no refs)"
[[ -z $REPO || -z $GCS ]] || jr_die "--gcs stages a copied checkout; it does not apply to --repo"
[[ $PY =~ ^[A-Za-z0-9._/-]+$ ]] || jr_die "--python '$PY' is not an interpreter name or path"
JAX_VERSION=$(jr_jax_pin)
dir=$(jr_quote "$REMOTE_DIR")
tarball=jaxrl_scale-src.tgz

# 1. The source on every worker.
if [[ -n $REPO ]]; then
  # Fetch into an existing clone so the venv inside it survives a re-run.
  checkout="git -C $dir checkout --quiet --force --detach"
  if [[ -n $REF ]]; then
    ref=$(jr_quote "$REF")
    checkout+=" origin/$ref 2>/dev/null || $checkout $ref"
  else
    checkout+=" origin/HEAD"
  fi
  jr_ssh all "set -e; if [ -d $dir/.git ]; then git -C $dir fetch --quiet --tags origin; \
else git clone --quiet $(jr_quote "$REPO") $dir; fi; $checkout"
else
  [[ -f $SOURCE/pyproject.toml ]] || jr_die "--source '$SOURCE' has no pyproject.toml"
  local_tar=${TMPDIR:-/tmp}/$tarball
  jr_run tar -czf "$local_tar" --exclude=./.venv --exclude=./.git --exclude=./runs \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude='*.egg-info' -C "$SOURCE" .
  if [[ -n $GCS ]]; then
    jr_run gsutil -q cp "$local_tar" "$GCS/$tarball"
    fetch="gsutil -q cp $(jr_quote "$GCS/$tarball") $tarball; "
  else
    jr_scope
    jr_run gcloud compute tpus tpu-vm scp "$local_tar" "$TPU_NAME:$tarball" --worker=all \
      "${JR_SCOPE[@]}"
    fetch=""
  fi
  jr_ssh all "set -e; ${fetch}mkdir -p $dir; tar -xzf $tarball -C $dir; rm -f $tarball"
fi

# 2. Python 3.11 venv with the package and the TPU build of the pinned jax.
install="set -e; if ! command -v $PY >/dev/null; then sudo apt-get update -qq; \
sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PY $PY-venv; fi; \
cd $dir; [ -x .venv/bin/python ] || $PY -m venv .venv; \
.venv/bin/pip install -q --upgrade pip; \
.venv/bin/pip install -q -e . $(jr_quote "jax[tpu]==$JAX_VERSION")"
jr_ssh all "$install"

# 3. Every worker must see the whole slice; run on all workers at once (pods need that).
if ((CHECK)); then
  check="from jaxrl_scale.parallel import distributed as d; d.maybe_initialize(); print(d.describe())"
  jr_ssh all "cd $dir && JAXRL_DISTRIBUTED=auto .venv/bin/python -c $(jr_quote "$check")"
fi
jr_log "next: tpu_scripts/launch.sh --name $TPU_NAME --gcs gs://BUCKET/runs -- CONFIG [k=v ...]"
