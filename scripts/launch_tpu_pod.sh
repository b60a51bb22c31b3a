#!/usr/bin/env bash
# Runs one command on every worker of a Cloud TPU VM pod (`gcloud compute tpus tpu-vm ssh
# --worker=all`): multi-host JAX runs the same program in one process per worker. The
# entry points call `sharding.maybe_initialize_distributed()`, which sees the pod's
# TPU_WORKER_HOSTNAMES and calls `jax.distributed.initialize()`; the sweep then splits its
# prompts over the chips of all workers, and process 0 writes the results.
#
# Usage:
#   scripts/launch_tpu_pod.sh --tpu=NAME --zone=ZONE [--project=ID] [--dir=DIR] [--copy]
#       [--mesh-model=N] [--dry-run] -- COMMAND [ARG...]
#
#   --copy        first ship this checkout's HEAD (git archive) to DIR on every worker and
#                 run scripts/setup.sh there, plus jax[tpu] at this checkout's jax version.
#   --dir         the checkout on the workers (default: spectr-jax, in the home directory).
#   --mesh-model  the mesh's "model" axis: appends --config.mesh_model=N to COMMAND (an
#                 entry point with a --config file), so parameters and caches are split
#                 over groups of N chips and rows over the devices / N groups (choose N
#                 with scripts/memory_plan.py; N = the chips of one worker keeps the
#                 model-parallel collectives within a host).
#   --dry-run     print the commands instead of running them.
#
# COMMAND runs in DIR on every worker, e.g.
#   scripts/launch_tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b --copy --mesh-model=4 -- \
#     env SPECTR_WORKDIR=/mnt/disk/spectr .venv/bin/python -m experiments.sweep \
#     --config configs/pod_llama_v4_32.py
# Every worker needs the trained pair under its $SPECTR_WORKDIR (a shared disk, or copied
# there first; see docs/EXPERIMENTS.md). Results stay on worker 0.
set -euo pipefail
cd "$(dirname "$0")/.."

tpu="" zone="" project="" dir="spectr-jax" copy=0 dry_run=0 mesh_model=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tpu=*) tpu="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --dir=*) dir="${1#*=}" ;;
    --copy) copy=1 ;;
    --mesh-model=*) mesh_model="${1#*=}" ;;
    --dry-run) dry_run=1 ;;
    --) shift; break ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$tpu" ] || [ -z "$zone" ] || [ $# -eq 0 ]; then
  echo "usage: $0 --tpu=NAME --zone=ZONE [--project=ID] [--dir=DIR] [--copy] [--mesh-model=N] [--dry-run] -- COMMAND..." >&2
  exit 2
fi
if [ -n "$mesh_model" ]; then
  if ! [[ "$mesh_model" =~ ^[1-9][0-9]*$ ]]; then
    echo "--mesh-model must be a positive integer, got '$mesh_model'" >&2
    exit 2
  fi
  set -- "$@" --config.mesh_model="$mesh_model"
fi

# Prints a command (quoting only the words that need it) or runs it.
run() {
  if [ "$dry_run" = 1 ]; then
    local out=() word
    for word in "$@"; do
      if [[ "$word" =~ ^[A-Za-z0-9_./:=@%+,~-]+$ ]]; then out+=("$word"); else out+=("${word@Q}"); fi
    done
    echo "${out[*]}"
  else
    "$@"
  fi
}

scope=(--zone="$zone" --worker=all)
if [ -n "$project" ]; then scope+=(--project="$project"); fi
command_line="$(printf '%q ' "$@")"

if [ "$copy" = 1 ]; then
  archive="${TMPDIR:-/tmp}/spectr-jax-$$.tar.gz"
  jax_version="$(.venv/bin/python -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
  run git archive --format=tar.gz -o "$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$tpu:spectr-jax.tar.gz" "${scope[@]}"
  run gcloud compute tpus tpu-vm ssh "$tpu" "${scope[@]}" --command="mkdir -p $dir && tar -xzf spectr-jax.tar.gz -C $dir && cd $dir && bash scripts/setup.sh && .venv/bin/python -m pip install --quiet 'jax[tpu]${jax_version:+==$jax_version}'"
fi
run gcloud compute tpus tpu-vm ssh "$tpu" "${scope[@]}" --command="cd $dir && ${command_line% }"
