#!/usr/bin/env bash
# Creates .venv (when missing) and installs spectr-jax with its test extras into it, and
# the extras named in SPECTR_EXTRAS (e.g. SPECTR_EXTRAS=tpu: libtpu for compile-only TPU
# targets, as .ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test${SPECTR_EXTRAS:+,$SPECTR_EXTRAS}]"
