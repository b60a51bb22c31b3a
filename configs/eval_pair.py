"""Evaluation of the embedded pair: `--config configs/eval_pair.py[:runlocal]`."""

import ml_collections

from configs import common
from spectr_jax.evaluate import EvalConfig


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the pair-evaluation config; "runlocal" (or "test") shrinks it to seconds."""
  arg = common.parse_arg(arg, runlocal=False, test=False)
  c = EvalConfig.defaults()  # What is measured: fields documented in spectr_jax.config.
  # Where the pair is and where the figures go (read by experiments/eval_pair.py):
  c.draft_workdir = ""  # The draft's run directory ("" = $SPECTR_WORKDIR/draft).
  c.target_workdir = ""  # The target's run directory ("" = $SPECTR_WORKDIR/target).
  c.output = ""  # JSON file for the results ("" = <target_workdir>/pair_eval.json).
  if arg.runlocal or arg.test:
    c.eval_rows = 16
    c.batch_size = 8
    c.num_prompts = 4
    c.num_tokens = 4
  return c
