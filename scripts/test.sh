#!/usr/bin/env bash
# Sets up .venv and runs lint plus the test suite. Extra arguments go to pytest
# (e.g. `scripts/test.sh --runslow` for the slow statistical and end-to-end tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check spectr_jax tests configs experiments scripts
.venv/bin/ruff format --check spectr_jax tests configs experiments scripts
.venv/bin/python -m pytest -q "$@"
