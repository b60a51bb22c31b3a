"""The paper's LM1B table: `--config configs/lm1b_spectr.py[:ARG]`.

SpecTr (K drafts) against single-draft speculative decoding and autoregressive decoding
over K in {1, 2, 4, 8} and L in {2, 4, 8}, temperature 1, 1000 prompts, 3 seeds.

ARG (comma-separated, see `configs.common.parse_arg`):
  runlocal         the grid and prompt set shrunk for a 2-core CPU (the main job);
  test             the tiny test pair and a 6-cell grid (seconds; used by the tests);
  source=NAME      the data of the pair: embedded (default), lm1b_text or tfds;
  path=DIR         the LM1B text directory (lm1b_text) or TFDS data_dir (tfds);
  plain_draft      decode with the plain draft (trained on the data) instead of the
                   default, that draft distilled against the target (configs/distill.py);
  head             decode with a draft head reading the target's features
                   (configs/head.py, in $SPECTR_WORKDIR/head);
  head_separate    decode with the head's separate draft of equal cost (head-separate);
  pair=NAME,draft_dir=DIR,target_dir=DIR
                   an open-weight pair instead of the embedded one (configs/pretrained.py:
                   smollm2, qwen2.5, llama3, gemma2, gpt2 or any two directories).
The draft is the plain draft ($SPECTR_WORKDIR/draft) distilled against the target
($SPECTR_WORKDIR/target) into draft-distill (runlocal: 100 steps, draft-distill-runlocal);
each source has its own pair ($SPECTR_WORKDIR/draft-<source>, ...). A missing pair is an
error naming the command that trains it, unless --config.pair.train_missing=True (the
main job, scripts/reproduce.sh, passes it).
"""

import ml_collections

from configs import common, distill, draft, head, pretrained, target
from spectr_jax import methods, sweep_config

# Every registered method: the paper's, the optimal verifier, the block-level verifiers
# (docs/BLOCK_VERIFICATION.md) and any added to `spectr_jax.methods`.
METHODS = methods.names()

# The ARG items every sweep config takes (configs/rho_ablation.py too).
ARGS = dict(
  runlocal=False,
  test=False,
  source="embedded",
  path="",
  plain_draft=False,
  head=False,
  head_separate=False,
)
ARGS.update(pretrained.ARGS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the sweep config (`spectr_jax.config.SweepConfig.from_dict` converts it)."""
  arg = common.parse_arg(arg, **ARGS)
  pair_arg = "test" if arg.test else f"source={arg.source},path={arg.path}"
  suffix = "-test" if arg.test else ("" if arg.source == "embedded" else f"-{arg.source}")
  c = sweep_config.SweepConfig.defaults()  # Every field, documented in SweepConfig.
  c.name = "lm1b_spectr" + suffix + ("-plain" if arg.plain_draft else "")
  c.pair.kind = "embedded"  # Trained by this repository from the configs below.
  c.pair.target = target.get_config(pair_arg)
  c.pair.target_workdir = "target" + suffix
  if arg.head or arg.head_separate:  # A draft head, or its separate draft of equal cost.
    c.name += "-head" + ("-separate" if arg.head_separate else "")
    c.pair.draft = head.get_config(pair_arg + (",separate" if arg.head_separate else ""))
    c.pair.draft_workdir = "head" + ("-separate" if arg.head_separate else "") + suffix
  elif arg.test or arg.plain_draft:  # The test pair and the baseline: the plain draft.
    c.pair.draft = draft.get_config(pair_arg)
    c.pair.draft_workdir = "draft" + suffix
  else:  # The draft distilled against the target (docs/DISTILLATION.md), from the plain one.
    distill_arg = pair_arg + (",runlocal" if arg.runlocal else "")  # runlocal: 100 steps.
    c.pair.draft = distill.get_config(distill_arg)
    c.pair.draft_workdir = "draft-distill" + ("-runlocal" if arg.runlocal else "") + suffix
    c.pair.draft_base = draft.get_config(pair_arg)  # The plain draft it starts from (in
    # $SPECTR_WORKDIR/draft<suffix>; the ARG item plain_draft decodes with it instead).
  c.prompts.num_prompts = 1000
  if arg.runlocal:
    c.name += "-runlocal"
    c.draft_lens = (4, 8)
    c.methods = ("autoregressive", "sd", "block", "kseq")
    c.prompts.num_prompts = 32
    c.decode.max_new_tokens = 48
    c.batch_size = 16
  if arg.test:
    c.methods = ("autoregressive", "sd", "kseq")
    c.num_drafts = (1, 2)
    c.draft_lens = (2,)
    c.seeds = (0, 1)
    c.prompts.num_prompts = 3
    c.prompts.prompt_len = 4
    c.decode.max_new_tokens = 6
    c.batch_size = 2
    c.compilation_cache = ""
  if arg.pair:
    pretrained.apply(c, arg)
  return c
