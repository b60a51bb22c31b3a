#!/usr/bin/env bash
# Creates .venv-gpu: spectr-jax with jax's CUDA 12 plugin (about 5 GB of CUDA wheels), for
# compile-only NVIDIA targets on a machine without a GPU (docs/ACCELERATORS.md). Not part
# of CI (too large); the programs it builds are checked by hand:
#   bash scripts/setup_gpu_compile.sh
#   PYTHONPATH=$PWD .venv-gpu/bin/python scripts/program_report.py --target gpu:h100
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv-gpu/bin/python ]; then
  "$PYTHON" -m venv .venv-gpu
fi
.venv-gpu/bin/python -m pip install --quiet --upgrade pip
.venv-gpu/bin/python -m pip install --quiet -e . "jax[cuda12]"
