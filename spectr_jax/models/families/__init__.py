"""The registry of decoder families: one module each (palm, llama, gemma, gpt2), each
holding its `Family` records (`FAMILIES`); `register_family` adds another.

A config's family is `ModelConfig.family`; a Hugging Face checkpoint's is the family whose
`model_types` hold its config.json's model_type.
"""

from typing import Any

from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import gemma, gpt2, llama, palm
from spectr_jax.models.family import Family

_REGISTRY: dict[str, Family] = {}


def register_family(family: Family) -> Family:
  """Adds `family` (a `Family` instance) to the registry; returns it.

  Raises:
    ValueError: another family has its name or one of its model_types.
  """
  if not family.name:
    raise ValueError("a family needs a name")
  known = _REGISTRY.get(family.name)
  if known is not None and known is not family:
    raise ValueError(f"a family named {family.name!r} is registered already")
  for other in _REGISTRY.values():
    taken = set(other.model_types) & set(family.model_types)
    if other is not family and taken:
      raise ValueError(f"model_type {sorted(taken)[0]!r} belongs to the {other.name} family")
  _REGISTRY[family.name] = family
  return family


for _family in (*palm.FAMILIES, *llama.FAMILIES, *gemma.FAMILIES, *gpt2.FAMILIES):
  register_family(_family)


def registered_families() -> tuple[Family, ...]:
  """Every registered family, in registration order (the built-in ones first)."""
  return tuple(_REGISTRY.values())


def get_family(name: str) -> Family:
  """The family named `name`; ValueError names the registered ones."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown model family {name!r}; known families: {', '.join(_REGISTRY)}")
  return _REGISTRY[name]


def family_of(config: ModelConfig) -> Family:
  """The family of `config`, its options checked (`Family.options_of`)."""
  family = get_family(config.family)
  family.options_of(config)
  return family


def family_for_model_type(model_type: Any) -> Family | None:
  """The family that loads Hugging Face checkpoints of `model_type`, or None."""
  return next((f for f in _REGISTRY.values() if model_type in f.model_types), None)


def expected_num_params(config: ModelConfig) -> int:
  """Returns the parameter count of the config's decoder in closed form (its family's)."""
  return family_of(config).num_params(config)
