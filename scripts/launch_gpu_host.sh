#!/usr/bin/env bash
# Runs a command on this GPU host: one process that sees every local GPU, so the sweep's
# data mesh splits the prompts over all of them (`config.shard`). With --setup it first
# creates .venv (scripts/setup.sh) and installs JAX's CUDA 12 wheels at the same version.
#
# Usage: scripts/launch_gpu_host.sh [--setup] [--gpus=0,1,...] [--mesh-model=N] [--dry-run] \
#          -- COMMAND [ARG...]
#   e.g. scripts/launch_gpu_host.sh --setup --mesh-model=2 -- \
#          .venv/bin/python -m experiments.sweep --config configs/lm1b_spectr.py:pair=llama3
#   --mesh-model=N appends --config.mesh_model=N to COMMAND (an entry point with a --config
#   file): parameters and caches split over groups of N GPUs, rows over the GPUs / N
#   groups (choose N with scripts/memory_plan.py).
#
# Several GPU hosts: start the same command on each host under SLURM (`srun`), with
# JAX_NUM_PROCESSES set to the number of processes; `sharding.maybe_initialize_distributed`
# then calls `jax.distributed.initialize()`, which reads the cluster from SLURM.
set -euo pipefail
cd "$(dirname "$0")/.."

setup=0 gpus="" dry_run=0 mesh_model=""
while [ $# -gt 0 ]; do
  case "$1" in
    --setup) setup=1 ;;
    --gpus=*) gpus="${1#*=}" ;;
    --mesh-model=*) mesh_model="${1#*=}" ;;
    --dry-run) dry_run=1 ;;
    --) shift; break ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
if [ $# -eq 0 ]; then
  echo "usage: $0 [--setup] [--gpus=0,1,...] [--mesh-model=N] [--dry-run] -- COMMAND..." >&2
  exit 2
fi
if [ -n "$mesh_model" ]; then
  if ! [[ "$mesh_model" =~ ^[1-9][0-9]*$ ]]; then
    echo "--mesh-model must be a positive integer, got '$mesh_model'" >&2
    exit 2
  fi
  set -- "$@" --config.mesh_model="$mesh_model"
fi

# Prints a command (shell-quoted) or runs it.
run() {
  if [ "$dry_run" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [ "$setup" = 1 ]; then
  run bash scripts/setup.sh
  jax_version="$(.venv/bin/python -c 'import jax; print(jax.__version__)')"
  run .venv/bin/python -m pip install --quiet "jax[cuda12]==$jax_version"
fi
env_vars=(JAX_PLATFORMS=cuda)
if [ -n "$gpus" ]; then env_vars+=(CUDA_VISIBLE_DEVICES="$gpus"); fi
run env "${env_vars[@]}" "$@"
