#!/usr/bin/env bash
# Sets up .venv and runs lint plus the test suite on two pytest workers (pytest-xdist; a
# test file stays on one worker, so its module fixtures are built once; the heaviest files
# start first, in the order tests/conftest.py collects them). Programs compile
# without most of XLA's optimisations (quick compiles), except in the tests marked
# `numerics` (float32 at LLM vocabularies) or `execution_bound` (mostly running compiled
# programs, e.g. the large-sample engine laws), which get XLA's default CPU build
# (tests/conftest.py). Extra arguments go to pytest (e.g. `scripts/test.sh --runslow`
# for the slow statistical and end-to-end tests); for one file in this process:
# `.venv/bin/python -m pytest -n 0 tests/verify/test_verify.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check spectr_jax tests configs experiments scripts examples
.venv/bin/ruff format --check spectr_jax tests configs experiments scripts examples
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
