"""Target model of the embedded pair: `--config configs/target.py[:runlocal]`."""

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the target's training config (see `configs.common.train_config`)."""
  return common.train_config(
    arg,
    model="target-small",
    model_overrides={"d_model": 192, "num_heads": 3, "mlp_dim": 768},
    batch_size=32,
    num_steps=300,
    learning_rate=3e-3,
    warmup_steps=30,
  )
