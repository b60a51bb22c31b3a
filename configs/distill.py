"""A draft distilled against the embedded pair's target: `--config configs/distill.py[:ARG]`.

The draft of `configs/draft.py` (same model, 0.59M parameters), started from the plain
draft's final checkpoint and trained to match the frozen target's next-token
distributions (`spectr_jax.distill`, docs/DISTILLATION.md). Both runs must exist:

  python -m experiments.train --config configs/target.py   # $SPECTR_WORKDIR/target
  python -m experiments.train --config configs/draft.py    # $SPECTR_WORKDIR/draft
  python -m experiments.train --config configs/distill.py --workdir DIR

ARG (comma-separated, see `configs.common.parse_arg`):
  runlocal          the shorter distillation of the main job (fewer steps);
  test              the tiny test models (seconds; the tests set the workdirs);
  divergence=NAME   forward_kl, reverse_kl, tv or jsd (default: the docs' best);
  data=SPEC         corpus, target, on_policy or a mix "corpus:1+on_policy:1" ('+'
                    separates the items here, since ',' separates ARG's);
  steps=N           optimizer steps (0 = the variant's default);
  scratch           train from a fresh initialisation instead of the plain draft;
  source, path, seed as in configs/common.py.
"""

import ml_collections

from configs import common, draft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the distillation run's config (`spectr_jax.config.TrainConfig.from_dict`)."""
  arg = common.parse_arg(
    arg,
    runlocal=False,
    test=False,
    source="embedded",
    path="",
    seed=0,
    divergence="forward_kl",
    data="corpus",
    steps=0,
    scratch=False,
  )
  base = f"source={arg.source},path={arg.path},seed={arg.seed}" + (",test" if arg.test else "")
  c = draft.get_config(base)  # The plain draft's model and data (runlocal sizes the steps only).
  suffix = "-test" if arg.test else ("" if arg.source == "embedded" else f"-{arg.source}")
  c.num_steps = 200  # Distillation steps after the plain draft's.
  c.learning_rate = 2e-3  # Peak learning rate (the plain draft's is 5e-3).
  c.warmup_steps = 20
  c.eval_every = 100
  c.checkpoint_every = 50
  c.log_every = 10
  if arg.runlocal:
    c.num_steps = 100
  if arg.test:
    c.num_steps = 6
    c.warmup_steps = 2
    c.eval_every = 3
    c.checkpoint_every = 3
    c.log_every = 3
  if arg.steps:
    c.num_steps = arg.steps
  c.distill.target_workdir = "target" + suffix  # The frozen target's run directory.
  c.distill.init_workdir = "" if arg.scratch else "draft" + suffix  # Start from this run.
  c.distill.divergence = arg.divergence
  c.distill.data = arg.data.replace("+", ",")  # Row sources: corpus, target, on_policy, a mix.
  if arg.test:
    common.shrink_distill(c.distill)
  return c
