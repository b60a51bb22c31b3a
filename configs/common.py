"""Shared pieces of the training configs: argument parsing and the config skeleton.

Configs are loaded by path (`--config configs/target.py:runlocal`) and import this
module as `configs.common`, so entry points run from the repository root with
`python -m experiments.<name>`.
"""

from typing import Any

import ml_collections

from spectr_jax.train_config import TrainConfig


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses a big_vision style config argument such as "runlocal,source=lm1b_text".

  Args:
    arg: comma-separated `name` (sets True) or `name=value` items; None or "" for none.
    **defaults: the accepted names with their defaults; values are cast to their type.

  Returns:
    A ConfigDict of the defaults with the given items applied.
  """
  values = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    name, _, value = item.partition("=")
    if name not in values:
      raise ValueError(f"unknown config argument {name!r}; known: {', '.join(values)}")
    kind = type(values[name])
    if kind is bool:
      values[name] = value.lower() not in ("0", "false", "no") if value else True
    else:
      values[name] = kind(value)
  return ml_collections.ConfigDict(values)


def train_config(
  arg: str | None,
  model: str,
  model_overrides: dict[str, Any],
  batch_size: int,
  num_steps: int,
  learning_rate: float,
  warmup_steps: int,
) -> ml_collections.ConfigDict:
  """Returns a training config; "runlocal" (or "test") in `arg` shrinks it to seconds.

  Args:
    arg: the config argument: runlocal, test, source=..., path=..., seed=....
    model: the named model size (`spectr_jax.models.get_model_config`).
    model_overrides: `ModelConfig` fields replacing the named ones.
    batch_size: rows per step.
    num_steps: optimizer steps.
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up steps.

  Returns:
    The ConfigDict that `spectr_jax.config.TrainConfig.from_dict` converts.
  """
  arg = parse_arg(arg, runlocal=False, test=False, source="embedded", path="", seed=0)
  small = arg.runlocal or arg.test
  c = TrainConfig.defaults()  # Every field, documented in spectr_jax.config.TrainConfig.
  c.model = model
  c.model_overrides = dict(model_overrides)
  c.data.source = arg.source  # "embedded" (BBC News), "lm1b_text" (a directory) or "tfds".
  c.data.path = arg.path  # Directory of lm1b_text / TFDS data_dir; unused by "embedded".
  c.seed = arg.seed
  c.batch_size = batch_size
  c.num_steps = num_steps
  c.learning_rate = learning_rate
  c.warmup_steps = warmup_steps
  c.eval_every = 100
  c.checkpoint_every = 100
  if small:
    c.model = model.split("-")[0] + "-test"
    c.model_overrides = {}
    c.data.max_train_sentences = 2000
    c.data.vocab_size = 512
    c.data.seq_len = 32
    c.batch_size = 8
    c.num_steps = 20
    c.warmup_steps = 5
    c.eval_every = 10
    c.eval_rows = 16
    c.checkpoint_every = 10
    c.log_every = 5
  return c


def shrink_distill(distill: ml_collections.ConfigDict) -> None:
  """Shrinks a distillation block to the test pair's seconds (sampled rows and the
  held-out alignment metrics)."""
  distill.prompt_len = 4
  distill.sample_tokens = 12
  distill.eval_prompts = 4
  distill.eval_tokens = 8
