"""Evaluation of the embedded pair: `--config configs/eval_pair.py[:runlocal]`."""

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the pair-evaluation config; "runlocal" (or "test") shrinks it to seconds."""
  arg = common.parse_arg(arg, runlocal=False, test=False)
  c = ml_collections.ConfigDict()
  c.draft_workdir = ""  # The draft's run directory ("" = $SPECTR_WORKDIR/draft).
  c.target_workdir = ""  # The target's run directory ("" = $SPECTR_WORKDIR/target).
  c.output = ""  # JSON file for the results ("" = <target_workdir>/pair_eval.json).
  c.eval_rows = 0  # Held-out rows for perplexity and teacher-forced acceptance (0 = all).
  c.batch_size = 32  # Rows per forward pass.
  c.num_prompts = 64  # Held-out sentence starts for the sampled acceptance.
  c.prompt_len = 8  # Sentence tokens per prompt (after BOS).
  c.num_tokens = 32  # Tokens sampled from the target after each prompt.
  c.temperature = 1.0  # Sampling temperature (also applied to the draft).
  c.seed = 0  # Selects the prompts and seeds the sampling.
  if arg.runlocal or arg.test:
    c.eval_rows = 16
    c.batch_size = 8
    c.num_prompts = 4
    c.num_tokens = 4
  return c
