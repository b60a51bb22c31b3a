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

from configs import common, distill, draft, pretrained, target
from spectr_jax import config as config_lib

# The paper's methods, the optimal verifier and the block-level verifiers
# (docs/BLOCK_VERIFICATION.md), as far as this build has them.
METHODS = tuple(
  m
  for m in ("autoregressive", "sd", "kseq", "specinfer", "optimal", "block", "gbv")
  if m in config_lib.METHODS
)

# The ARG items every sweep config takes (configs/rho_ablation.py too).
ARGS = dict(runlocal=False, test=False, source="embedded", path="", plain_draft=False)
ARGS.update(pretrained.ARGS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the sweep config (`spectr_jax.config.SweepConfig.from_dict` converts it)."""
  arg = common.parse_arg(arg, **ARGS)
  pair_arg = "test" if arg.test else f"source={arg.source},path={arg.path}"
  suffix = "-test" if arg.test else ("" if arg.source == "embedded" else f"-{arg.source}")
  c = ml_collections.ConfigDict()
  c.name = "lm1b_spectr" + suffix + ("-plain" if arg.plain_draft else "")  # Results go to
  # $SPECTR_WORKDIR/experiments/<name>.
  c.results_dir = ""  # Overrides that directory (relative to $SPECTR_WORKDIR unless absolute).
  c.pair = ml_collections.ConfigDict()
  c.pair.kind = "embedded"  # "embedded" (trained here), "trained" (run dirs) or "pretrained".
  c.pair.target = target.get_config(pair_arg)  # Training config of the target.
  c.pair.target_workdir = "target" + suffix  # The target's run directory.
  c.pair.train_missing = False  # Train a model whose final checkpoint is missing.
  if arg.test or arg.plain_draft:  # The test pair and the baseline: the plain draft.
    c.pair.draft = draft.get_config(pair_arg)  # Training config of the draft.
    c.pair.draft_workdir = "draft" + suffix  # The draft's run directory (under $SPECTR_WORKDIR).
  else:  # The draft distilled against the target (docs/DISTILLATION.md), from the plain one.
    distill_arg = pair_arg + (",runlocal" if arg.runlocal else "")  # runlocal: 100 steps.
    c.pair.draft = distill.get_config(distill_arg)  # Training config of the draft.
    c.pair.draft_workdir = "draft-distill" + ("-runlocal" if arg.runlocal else "") + suffix
    c.pair.draft_base = draft.get_config(pair_arg)  # The plain draft it starts from (in
    # $SPECTR_WORKDIR/draft<suffix>; the ARG item plain_draft decodes with it instead).
  c.methods = METHODS  # Decoding methods.
  c.num_drafts = (1, 2, 4, 8)  # K (K = 1 is "sd"; multi-draft methods take K >= 2).
  c.draft_lens = (2, 4, 8)  # L, draft tokens per round.
  c.rhos = ("star",)  # K-SEQ split factors: "star", "k" or numbers >= 1.
  c.seeds = (0, 1, 2)  # Each seed draws its own prompt set and decoding randomness.
  c.decoding = ml_collections.ConfigDict()
  c.decoding.temperature = 1.0  # Sampling temperature of both models.
  c.decoding.top_k = 0  # Keep the top_k most likely tokens (0 = all).
  c.decoding.top_p = 1.0  # Nucleus mass (1.0 = no truncation).
  c.decoding.num_prompts = 1000  # Held-out sentence starts decoded per seed.
  c.decoding.prompt_len = 8  # Sentence tokens per prompt (after BOS).
  c.decoding.max_new_tokens = 64  # Tokens generated per prompt.
  c.decoding.stop_at_eos = False  # Stop a row at EOS (False: decode on into the next sentence).
  c.batch_size = 200  # Prompts per engine call (split over all devices when shard).
  c.shard = True  # Split each batch over all devices of all hosts (a data mesh).
  c.mesh_model = 1  # Devices per "model" group: parameters and caches split by the rules
  # of spectr_jax.sharding (rows go over the data = devices / mesh_model groups).
  c.device_memory = ""  # Memory per device for the check before compiling: a name of
  # spectr_jax.memory.DEVICE_MEMORY ("tpu-v5e", "h100", ...), GiB ("16"), or "" = what the
  # device reports (none on CPU: the arithmetic is printed, not checked).
  c.compilation_cache = "jax_cache"  # Persistent XLA cache dir ("" = none).
  if arg.runlocal:
    c.name += "-runlocal"
    c.draft_lens = (4, 8)
    c.methods = ("autoregressive", "sd", "block", "kseq")
    c.decoding.num_prompts = 32
    c.decoding.max_new_tokens = 48
    c.batch_size = 16
  if arg.test:
    c.methods = ("autoregressive", "sd", "kseq")
    c.num_drafts = (1, 2)
    c.draft_lens = (2,)
    c.seeds = (0, 1)
    c.decoding.num_prompts = 3
    c.decoding.prompt_len = 4
    c.decoding.max_new_tokens = 6
    c.batch_size = 2
    c.compilation_cache = ""
  if arg.pair:
    pretrained.apply(c, arg)
  return c
