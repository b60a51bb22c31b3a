#!/usr/bin/env bash
# The main job: sets up .venv, trains the embedded draft/target pair when its checkpoints
# are missing, runs the K x L sweep and the rho ablation, and prints their tables (the
# plots are written beside them). Results resume: a rerun only reports what is done.
#
# Usage: scripts/reproduce.sh [CONFIG_ARG]   (default "runlocal": sized for a 2-core CPU;
#        "full" runs the paper's grid, 1000 prompts x 3 seeds; see docs/EXPERIMENTS.md)
# Everything goes to $SPECTR_WORKDIR (default ~/.cache/spectr_jax): the pair in draft/ and
# target/, results in experiments/<config name>/, compiled programs in jax_cache/.
set -euo pipefail
cd "$(dirname "$0")/.."
ARG="${1:-runlocal}"
[ "$ARG" = full ] && ARG=""
start=$(date +%s)
bash scripts/setup.sh
PYTHON=.venv/bin/python
"$PYTHON" -m experiments.sweep --config "configs/lm1b_spectr.py${ARG:+:$ARG}" \
  --config.pair.train_missing=True
"$PYTHON" -m experiments.rho_ablation --config "configs/rho_ablation.py${ARG:+:$ARG}" \
  --config.sweep.pair.train_missing=True
for config in lm1b_spectr rho_ablation; do
  "$PYTHON" -m experiments.report --config "configs/${config}.py${ARG:+:$ARG}"
done
echo "main job: $(($(date +%s) - start)) s wall"
