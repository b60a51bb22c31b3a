"""Shared pieces of the training configs: argument parsing and the config skeleton.

Configs are loaded by path (`--config configs/target.py:runlocal`) and import this
module as `configs.common`, so entry points run from the repository root with
`python -m experiments.<name>`.
"""

from typing import Any

import ml_collections


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
  c = ml_collections.ConfigDict()
  c.model = model  # Named model size.
  c.model_overrides = dict(model_overrides)  # ModelConfig fields that replace the named ones.
  c.data = ml_collections.ConfigDict()
  c.data.source = arg.source  # "embedded" (BBC News), "lm1b_text" (a directory) or "tfds".
  c.data.path = arg.path  # Directory of lm1b_text / TFDS data_dir; unused by "embedded".
  c.data.heldout_fraction = 0.05  # Share of articles held out (embedded; flat LM1B dirs).
  c.data.max_train_sentences = 0  # Keep at most this many training sentences (0 = all).
  c.data.vocab_size = 4096  # SentencePiece vocabulary size, also the model's.
  c.data.tokenizer_type = "unigram"  # SentencePiece model type: "unigram" or "bpe".
  c.data.tokenizer_sentences = 2_000_000  # Training sentences used to fit the tokenizer.
  c.data.tokenizer_threads = 2  # SentencePiece trainer threads (part of the cache key).
  c.data.character_coverage = 1.0  # Share of characters the vocabulary must cover.
  c.data.seq_len = 128  # Model input tokens per training row.
  c.data.cache_dir = ""  # Tokenizer and token cache ("" = $SPECTR_WORKDIR/data).
  c.seed = arg.seed  # Seeds the initial parameters and the batch order.
  c.batch_size = batch_size  # Rows per optimizer step.
  c.num_steps = num_steps  # Optimizer steps of the whole run.
  c.learning_rate = learning_rate  # Peak AdamW learning rate.
  c.warmup_steps = warmup_steps  # Linear warm-up steps before the cosine decay.
  c.min_lr_ratio = 0.1  # The cosine decay ends at learning_rate * min_lr_ratio.
  c.weight_decay = 0.1  # Decoupled weight decay on matrices.
  c.adam_b1 = 0.9  # AdamW beta1.
  c.adam_b2 = 0.95  # AdamW beta2.
  c.grad_clip_norm = 1.0  # Global gradient-norm clip.
  c.eval_every = 100  # Steps between held-out evaluations.
  c.eval_rows = 512  # Held-out rows per evaluation (0 = all).
  c.checkpoint_every = 100  # Steps between checkpoints.
  c.keep_checkpoints = 3  # Recent checkpoints kept.
  c.log_every = 20  # Steps between progress lines.
  c.num_devices = 1  # The mesh's "data" axis: rows split over it (0 = all devices left).
  c.mesh_model = 1  # The mesh's "model" axis: weights split over it (sharding.RULES).
  c.fsdp = False  # Also split parameters and optimizer state over "data".
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
