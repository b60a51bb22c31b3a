"""Deprecated: the schemas live with their layers now (issue 49).

  schema         Schema, build, integers: the machinery every schema shares
  decode_spec    DecodeSpec (decoding)
  train_config   TrainConfig, DistillConfig (training)
  pair_config    PairConfig (pairs)
  sweep_config   SweepConfig with its DecodeSpec template and Prompts, AnalysisConfig,
                 RhoAblationConfig (the runner)
  evaluate       EvalConfig
  memory         DEVICE_MEMORY, device_memory_bytes
  cli            parse_flags

`from spectr_jax.config import X` still works, with a DeprecationWarning naming X's module.
`DecodeSettings`, the settings block the sweep template replaced, is kept here for old
calls (`SweepConfig(decoding=DecodeSettings(...))`).
"""

import dataclasses
import importlib
import warnings

__all__ = ["DecodeSettings"]

_MOVED = {
  "Schema": "schema",
  "build": "schema",
  "KEY_WHEN_SET": "schema",
  "STORED_AS": "schema",
  "DecodeSpec": "decode_spec",
  "LAYER_STACKS": "decode_spec",
  "TrainConfig": "train_config",
  "DistillConfig": "train_config",
  "saved_train_config": "train_config",
  "DIVERGENCES": "train_config",
  "DISTILL_SOURCES": "train_config",
  "PairConfig": "pair_config",
  "PAIR_KINDS": "pair_config",
  "resolve": "pair_config",
  "SweepConfig": "sweep_config",
  "AnalysisConfig": "sweep_config",
  "RhoAblationConfig": "sweep_config",
  "METHODS": "sweep_config",
  "SWEEP_BRANCHINGS": "sweep_config",
  "rhos_for": "sweep_config",
  "EvalConfig": "evaluate",
  "GIB": "memory",
  "DEVICE_MEMORY": "memory",
  "device_memory_bytes": "memory",
  "parse_flags": "cli",
}


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """Deprecated: a sweep's settings before its `DecodeSpec` template; `SweepConfig`
  folds it into `decode` and `prompts` (field meanings: `decode_spec.DecodeSpec`,
  `sweep_config.Prompts`)."""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_prompts: int = 32
  prompt_len: int = 8
  max_new_tokens: int = 64
  stop_at_eos: bool = False
  dedup: bool = False
  branching: str = ""
  layer_stack: str = "auto"
  drafting: str = ""
  adaptive: float = 0.0
  node_budget: float = 0.0

  def __post_init__(self):
    warnings.warn(
      "config.DecodeSettings is deprecated: a SweepConfig holds decode (a DecodeSpec "
      "template, method '') and prompts (sweep_config.Prompts)", DeprecationWarning,
      stacklevel=3,
    )  # fmt: skip


def __getattr__(name: str):
  if name in _MOVED:
    module = f"spectr_jax.{_MOVED[name]}"
    warnings.warn(
      f"spectr_jax.config.{name} is deprecated: import it from {module}", DeprecationWarning,
      stacklevel=2,
    )  # fmt: skip
    return getattr(importlib.import_module(module), name)
  raise AttributeError(f"module 'spectr_jax.config' has no attribute {name!r}")
