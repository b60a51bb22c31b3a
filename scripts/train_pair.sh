#!/usr/bin/env bash
# Trains the embedded draft/target pair (each skipped when its final checkpoint exists,
# resumed when a run was interrupted) and evaluates the pair; without CONFIG_ARG it then
# distills the draft the runlocal sweep decodes with ($SPECTR_WORKDIR/draft-distill-runlocal,
# configs/distill.py:runlocal, docs/DISTILLATION.md).
# Usage: scripts/train_pair.sh [CONFIG_ARG]   (e.g. `runlocal` for a seconds-long smoke run)
# Runs go to $SPECTR_WORKDIR/{draft,target}[-CONFIG_ARG] (default ~/.cache/spectr_jax);
# the figures are printed and written to <target run>/pair_eval.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
WORKDIR="${SPECTR_WORKDIR:-$HOME/.cache/spectr_jax}"
ARG="${1:-}"
SUFFIX="${ARG:+-${ARG//[^A-Za-z0-9_=.]/_}}"
for role in draft target; do
  start=$(date +%s)
  "$PYTHON" -m experiments.train --config "configs/${role}.py${ARG:+:$ARG}" \
    --workdir "$WORKDIR/${role}${SUFFIX}"
  echo "${role}: $(($(date +%s) - start)) s wall (including data loading and compilation)"
done
"$PYTHON" -m experiments.eval_pair --config "configs/eval_pair.py${ARG:+:$ARG}" \
  --config.draft_workdir="$WORKDIR/draft${SUFFIX}" \
  --config.target_workdir="$WORKDIR/target${SUFFIX}"
if [ -z "$ARG" ]; then
  start=$(date +%s)
  "$PYTHON" -m experiments.train --config configs/distill.py:runlocal \
    --workdir "$WORKDIR/draft-distill-runlocal"
  echo "draft-distill-runlocal: $(($(date +%s) - start)) s wall"
fi
