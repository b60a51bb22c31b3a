#!/usr/bin/env bash
# The main job: sets up .venv, then prints the exact acceptance of every verifier on the
# SPEC examples and synthetic pairs, checked by Monte Carlo. (Becomes the K x L sweep on
# the embedded LM pair once the decoding engine lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python experiments/acceptance_demo.py "$@"
