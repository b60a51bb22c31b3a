"""A draft head of the embedded pair's target: `--config configs/head.py[:ARG]`.

The head (`spectr_jax.models.head`) reads the target's last-layer features and shares its
embedding. It is trained by distillation against the frozen target on corpus rows and on
rows the target samples (`spectr_jax.distill`, docs/MODELS.md, "Draft heads"). With
`separate`, the same recipe trains the head's comparison draft instead: a separate model
of the same cost per draft token (parameters and FLOPs), reading tokens only.

  python -m experiments.train --config configs/target.py   # $SPECTR_WORKDIR/target
  python -m experiments.train --config configs/head.py --workdir $SPECTR_WORKDIR/head

ARG (comma-separated, see `configs.common.parse_arg`):
  test              the tiny test target's head (seconds; the tests set the workdirs);
  separate          the separate draft of equal cost;
  steps=N           optimizer steps (0 = the default);
  source, path, seed as in configs/common.py.
"""

import ml_collections

from configs import common, target

# Equal cost per draft token on the embedded target (d_model 192, vocabulary 4096, the
# output layer tied to the embedding): the head's fc [2D -> D] and one block with a
# 384-wide MLP, and a separate one-block model of the target's width with a 512-wide
# MLP, both about 1.18M multiply-adds per token (docs/MODELS.md, "Draft heads").
HEAD = {"num_layers": 1, "mlp_dim": 384}
SEPARATE = {"d_model": 192, "num_layers": 1, "num_heads": 3, "mlp_dim": 512}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the head's (or its comparison draft's) training config."""
  arg = common.parse_arg(
    arg, test=False, separate=False, steps=0, source="embedded", path="", seed=0
  )
  base = f"source={arg.source},path={arg.path},seed={arg.seed}" + (",test" if arg.test else "")
  c = target.get_config(base)  # The target's data (a head reads the target's tokens).
  c.model = "draft-tiny" if arg.separate else "head"
  c.model_overrides = dict(SEPARATE if arg.separate else HEAD)
  if arg.test:
    c.model = "draft-test" if arg.separate else "head"
    c.model_overrides = {} if arg.separate else {"num_layers": 1}
  c.num_steps = 6 if arg.test else 400
  c.learning_rate = 3e-3
  c.warmup_steps = 2 if arg.test else 40
  c.eval_every = 3 if arg.test else 100
  c.checkpoint_every = 3 if arg.test else 100
  c.log_every = 3 if arg.test else 20
  if arg.steps:
    c.num_steps = arg.steps
  suffix = "-test" if arg.test else ("" if arg.source == "embedded" else f"-{arg.source}")
  c.distill.target_workdir = "target" + suffix  # The frozen target's run directory.
  c.distill.divergence = "forward_kl"
  c.distill.data = "corpus:1,target:1"  # Half the rows sampled from the target.
  # A head also trains on its own output (two unrolled steps): measured better at every
  # K x L cell (docs/HEADS.md). The separate draft reads no features: one step.
  c.distill.head_steps = 1 if arg.separate else 2
  if arg.test:
    common.shrink_distill(c.distill)
  return c
