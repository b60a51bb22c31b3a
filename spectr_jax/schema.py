"""The config machinery every layer's schemas share: frozen dataclasses built from nested
mappings (`build`), written back as dicts, with a ConfigDict of their defaults for config
files (`Schema`)."""

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

__all__ = ["KEY_WHEN_SET", "STORED_AS", "Schema", "build", "integers"]

# Metadata of a config field whose default value is left out of a cell's key
# (`experiment.Cell.as_record`).
KEY_WHEN_SET = "key_when_set"
# Metadata of a renamed config field: the name records hold it under (and config files
# written before the rename use; `build` takes either).
STORED_AS = "stored_as"


def _dataclass_of(hint: Any) -> tuple[type | None, bool]:
  """(the dataclass a field type names, whether None is allowed) for `X` or `X | None`."""
  if dataclasses.is_dataclass(hint):
    return hint, False
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = typing.get_args(hint)
    found = [a for a in args if dataclasses.is_dataclass(a)]
    if len(found) == 1:
      return found[0], type(None) in args
  return None, False


def build(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
  """An instance of the config dataclass `cls` from a nested mapping (a
  `ConfigDict.to_dict()` or saved JSON): nested config fields are built from their
  mappings (an optional one from an empty mapping or None is None), tuple fields from
  sequences, mapping fields from mappings; the classes validate in `__post_init__`.

  Raises:
    ValueError: naming a field that `cls` (at `where`, e.g. "SweepConfig.decoding") lacks.
  """
  where = where or cls.__name__
  upgrade = getattr(cls, "upgrade", None)
  if upgrade is not None:  # a schema's reading of mappings written before a change
    values = upgrade(dict(values))
  fields = dataclasses.fields(cls)
  renamed = {f.metadata[STORED_AS]: f.name for f in fields if STORED_AS in f.metadata}
  values = {renamed.get(name, name): value for name, value in values.items()}
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(values) - fields
  if unknown:
    raise ValueError(f"unknown {where} fields {sorted(unknown)}; known: {sorted(fields)}")
  hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
  for name, value in values.items():
    hint = hints[name]
    nested, optional = _dataclass_of(hint)
    if nested is not None and not isinstance(value, nested):
      if optional and not value:
        values[name] = None
      elif isinstance(value, Mapping):
        values[name] = build(nested, value, f"{where}.{name}")
      else:
        raise ValueError(f"{where}.{name} must be a mapping of {nested.__name__} fields")
    elif typing.get_origin(hint) is tuple and not isinstance(value, str | bytes):
      values[name] = tuple(value)
    elif typing.get_origin(hint) in (Mapping, dict) and isinstance(value, Mapping):
      values[name] = dict(value)
  return cls(**values)


def _plain(value: Any) -> Any:
  """Mappings as dicts, recursively (for JSON and ConfigDicts)."""
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  return value


class Schema:
  """What every config dataclass here shares: `from_dict`, `to_dict` and `defaults`."""

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]):
    """Builds the config from a nested mapping (see `build`)."""
    return build(cls, values)

  def to_dict(self) -> dict[str, Any]:
    """A JSON-able nested dict; `from_dict` inverts it."""
    return _plain(dataclasses.asdict(self))

  @classmethod
  def defaults(cls) -> ml_collections.ConfigDict:
    """A ConfigDict of every field at its default (nested configs nested): the skeleton
    a config file starts from."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    values = {}
    for f in dataclasses.fields(cls):
      nested, optional = _dataclass_of(hints[f.name])
      if nested is not None and not optional and dataclasses.is_dataclass(f.default):
        values[f.name] = dataclasses.asdict(f.default)  # the field's own default instance
      elif nested is not None and not optional:
        # A nested config's own field defaults (no instance is built: nothing is read).
        values[f.name] = (
          nested.defaults().to_dict()
          if issubclass(nested, Schema)
          else dataclasses.asdict(nested())
        )
      elif f.default is not dataclasses.MISSING:
        values[f.name] = f.default
      elif f.default_factory is not dataclasses.MISSING:
        values[f.name] = f.default_factory()
      else:
        raise TypeError(f"{cls.__name__}.{f.name} has no default")
    return ml_collections.ConfigDict(_plain(values))


def integers(name: str, values: Sequence[Any], low: int) -> None:
  """Raises a clear error unless every value is an integer >= low (bools refused)."""
  for value in values:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"every value of {name} must be an integer >= {low}, got {value!r}")
