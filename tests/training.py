"""Shared pieces of the training tests: the small test configs of the embedded pair."""

import dataclasses

from spectr_jax.train_config import TrainConfig


def small_config(module, cache_dir: str, **changes) -> TrainConfig:
  """The "test" config of a config module (`configs.target`, `configs.draft`), its data
  cached in `cache_dir`, with `changes` applied."""
  config = TrainConfig.from_dict(module.get_config("test").to_dict())
  config = dataclasses.replace(config, data=dataclasses.replace(config.data, cache_dir=cache_dir))
  return dataclasses.replace(config, **changes)
