"""The K-SEQ split-factor ablation: `--config configs/rho_ablation.py[:ARG]`.

Two parts on the same pair and prompts (ARG as in `configs/lm1b_spectr.py`):
  sweep:    block-level decoding with K-SEQ at rho*, rho = K and fixed rho values, beside
            SpecInfer, the optimal verifier (where this build has it), single-draft and
            autoregressive decoding;
  analysis: per position along target samples, the exact acceptance of each strategy,
            the optimal-transport bound alpha*, the gap and how often a fixed rho is
            invalid (its residual would be negative).
"""

import ml_collections

from configs import common, lm1b_spectr
from spectr_jax import methods
from spectr_jax.sweep_config import RhoAblationConfig


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the ablation config (`spectr_jax.config.RhoAblationConfig.from_dict`)."""
  parsed = common.parse_arg(arg, **lm1b_spectr.ARGS)
  c = RhoAblationConfig.defaults()  # Every field, documented in spectr_jax.config.
  c.sweep = lm1b_spectr.get_config(arg)  # The decoding sweep: pair, prompts, sampling.
  c.sweep.name = c.sweep.name.replace("lm1b_spectr", "rho_ablation")  # Its results dir.
  c.sweep.rhos = ("star", "k", 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0)  # Strategies (rho <= K).
  c.sweep.num_drafts = (2, 4, 8)  # K of the decoding sweep.
  c.sweep.draft_lens = (4,)  # L of the decoding sweep.
  c.sweep.methods = tuple(  # K-SEQ and the token-level reference methods.
    m for m in lm1b_spectr.METHODS if methods.get(m).level != "block"
  )
  if parsed.runlocal:
    c.sweep.rhos = ("star", "k", 1.0, 1.5, 2.0, 3.0)
    c.sweep.num_drafts = (4,)
    c.analysis.num_prompts = 32
    c.analysis.num_tokens = 32
    c.analysis.batch_size = 16
  if parsed.test:
    c.sweep.rhos = ("star", "k", 1.0)
    c.sweep.methods = ("autoregressive", "sd", "kseq")
    c.sweep.num_drafts = (2,)
    c.sweep.draft_lens = (2,)
    c.analysis.num_drafts = (2, 4)
    c.analysis.num_prompts = 3
    c.analysis.num_tokens = 4
    c.analysis.batch_size = 2
  return c
