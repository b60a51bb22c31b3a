"""Draft model of the embedded pair: `--config configs/draft.py[:runlocal]`."""

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the draft's training config (see `configs.common.train_config`)."""
  return common.train_config(
    arg,
    model="draft-tiny",
    model_overrides={},
    batch_size=32,
    num_steps=300,
    learning_rate=5e-3,
    warmup_steps=30,
  )
