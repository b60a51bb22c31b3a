#!/usr/bin/env bash
# Sets up .venv and runs lint plus the test suite on two pytest workers (pytest-xdist; a
# test file stays on one worker, so its module fixtures are built once). The suite runs
# in two passes: everything but the float32-at-LLM-vocabulary tests (marker `numerics`)
# and the tests that mostly run compiled programs (marker `execution_bound`: the large-
# sample engine laws) compiled without LLVM's optimisation passes (quick compiles,
# tests/conftest.py), then those two groups with XLA's default CPU build (the values
# users get; programs that run 2x faster). Extra
# arguments go to both passes (e.g. `scripts/test.sh --runslow` for the slow statistical
# and end-to-end tests); for one file in this process: `.venv/bin/python -m pytest -n 0
# tests/test_verify.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check spectr_jax tests configs experiments scripts
.venv/bin/ruff format --check spectr_jax tests configs experiments scripts
# pytest's exit status 5 means "no test selected" (a file without `numerics` tests).
run() { "$@" || { status=$?; [ "$status" -eq 5 ] || exit "$status"; }; }
optimised="numerics or execution_bound"
run .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not ($optimised)" "$@"
run env SPECTR_TEST_OPTIMIZED=1 .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "$optimised" "$@"
