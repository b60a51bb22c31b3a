"""The field's methods beside ours: `--config configs/field_methods.py[:ARG]`.

Run by `experiments.rho_ablation` (a decoding sweep and the per-position analysis on the
same pair and prompts; docs/BLOCK_VERIFICATION.md and docs/WITHOUT_REPLACEMENT.md show
what it printed):
  sweep:    block efficiency of the multi-draft verifiers at K in {2, 4, 8} and
            L in {4, 8}, 3 seeds x 100 prompts: Thomas & Pal's greedy multi-path block
            verification (gbv_tp) beside gbv, optimal and K-SEQ at rho*, and recursive
            rejection without replacement (rrs, on drafts without replacement) and
            Traversal Verification (traversal, on the same trees) beside the i.i.d.
            verifiers specinfer, K-SEQ and optimal; the report's paired gains
            compare each with the methods its registry record names;
  analysis: per position along target samples, each token-level method's exact
            acceptance beside the bound of its own drafting scheme.

ARG as in `configs/lm1b_spectr.py` (the embedded distilled pair of the main job by
default; `test` shrinks everything to seconds).
"""

import ml_collections

from configs import common, lm1b_spectr
from spectr_jax.sweep_config import RhoAblationConfig

METHODS = ("kseq", "specinfer", "optimal", "rrs", "traversal", "gbv", "gbv_tp")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config (`spectr_jax.config.RhoAblationConfig.from_dict` converts it)."""
  parsed = common.parse_arg(arg, **lm1b_spectr.ARGS)
  c = RhoAblationConfig.defaults()  # Every field, documented in spectr_jax.config.
  c.sweep = lm1b_spectr.get_config(arg or "runlocal")  # The main job's pair and sampling.
  c.sweep.name = c.sweep.name.replace("lm1b_spectr", "field_methods")  # Its results dir.
  c.sweep.methods = METHODS
  c.sweep.rhos = ("star",)  # K-SEQ at its exact split factor only.
  c.sweep.num_drafts = (2, 4, 8)
  c.sweep.draft_lens = (4, 8)
  c.sweep.seeds = (0, 1, 2)
  c.sweep.prompts.num_prompts = 100
  c.sweep.batch_size = 25
  c.analysis.num_drafts = (2, 4, 8)
  c.analysis.num_prompts = 100
  c.analysis.num_tokens = 32
  c.analysis.batch_size = 25
  if parsed.test:
    c.sweep.num_drafts = (2,)
    c.sweep.draft_lens = (2,)
    c.sweep.seeds = (0,)
    c.sweep.prompts.num_prompts = 3
    c.sweep.batch_size = 3
    c.analysis.num_drafts = (2,)
    c.analysis.num_prompts = 3
    c.analysis.num_tokens = 4
    c.analysis.batch_size = 3
  return c
