"""The decoding cells of the distillation ablation: `--config configs/distill_sweep.py:draft=DIR`.

Single-draft speculative decoding at L = 4 and 8 and SpecTr (K-SEQ, rho*) at K = 8,
L = 4 and 8, temperature 1, 64 new tokens, on a "trained" pair: the draft in DIR (a
distilled run, or the plain draft) with the embedded pair's target. Each seed draws its
own held-out prompts (those of the docs grid in docs/REPRODUCTION.md, seed for seed).

ARG (comma-separated, see `configs.common.parse_arg`):
  draft=DIR     the draft's run directory (relative to $SPECTR_WORKDIR unless absolute);
  target=DIR    the target's (default: the embedded pair's, "target");
  prompts=N     prompts per seed (default 100);
  seeds=N       seeds 0..N-1 (default 3).
Results: $SPECTR_WORKDIR/experiments/distill-<DIR's name>/.
"""

import pathlib

import ml_collections

from configs import common, lm1b_spectr
from spectr_jax.pair_config import PairConfig


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the sweep config (`spectr_jax.config.SweepConfig.from_dict` converts it)."""
  arg = common.parse_arg(arg, draft="draft", target="target", prompts=100, seeds=3)
  c = lm1b_spectr.get_config()
  c.name = "distill-" + pathlib.Path(arg.draft).name  # Results folder name.
  c.pair = PairConfig.defaults()  # "trained": existing run directories, read as they are.
  c.pair.draft_workdir = arg.draft  # The draft under test.
  c.pair.target_workdir = arg.target  # The frozen target it was distilled against.
  c.methods = ("sd", "kseq")  # sd at K = 1, K-SEQ (SpecTr) at K = 8.
  c.num_drafts = (1, 8)
  c.draft_lens = (4, 8)
  c.seeds = tuple(range(arg.seeds))
  c.prompts.num_prompts = arg.prompts
  c.batch_size = 50
  return c
