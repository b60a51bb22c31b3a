"""What every Hugging Face family shares: checked config.json values, the RoPE and
sliding-window keys, and the pieces of a tensor layout (no JAX).

Each family module (spectr_jax/models/families/) reads its own config.json keys with
these helpers, so every value is checked before use and every error is a
`CheckpointFormatError` naming the key; `spectr_jax.models.pretrained` reads the files.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from spectr_jax.models.config import RopeScaling

# Upper bounds of the size fields: far above any released model, they stop a typo (1e9
# layers) before anything is built from it.
COUNT = 1 << 12  # layers, heads
WIDTH = 1 << 20  # hidden, head and MLP widths
VOCAB = 1 << 24  # embedding rows
POSITIONS = 1 << 30  # context lengths and windows

# The names of the tanh-approximated GELU in config.json (Gemma's and GPT-2's MLPs).
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")

# RoPE types understood, with the keys each takes besides rope_type / type / rope_theta /
# partial_rotary_factor (in rope_scaling, transformers 4.x, or rope_parameters, 5.x).
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_ROPE_TYPES = {"default": (), "llama3": _LLAMA3_KEYS}
_DEFAULT_ROPE_THETA = 10000.0


class CheckpointFormatError(ValueError):
  """A checkpoint directory that does not hold a model this loader supports."""


def unsupported(message: str) -> CheckpointFormatError:
  """The error of a feature the decoder does not have ("not supported: ...")."""
  return CheckpointFormatError(f"not supported: {message}")


# config.json values, each checked and named in the error.


def get(hf: Mapping[str, Any], key: str, default: Any = ..., name: str | None = None) -> Any:
  """hf[key]; absent or null gives default (none: an error naming `name`, default key)."""
  value = hf.get(key)
  if value is None:
    if default is ...:
      raise CheckpointFormatError(f"config.json has no {name or key!r}")
    return default
  return value


def size(
  hf: Mapping[str, Any], key: str, limit: int, default: Any = ..., name: str | None = None
) -> Any:
  """A size field: an integer in [1, limit] (not a bool, float or string)."""
  value = get(hf, key, default, name)
  if value is not None and (
    isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit
  ):
    raise CheckpointFormatError(
      f"config.json: {name or key} must be an integer in [1, {limit}], got {value!r}"
    )
  return value


def positive(hf: Mapping[str, Any], key: str, default: Any = ..., name: str | None = None) -> Any:
  """A positive finite number (an epsilon, a RoPE base or factor, a soft-cap) as a float."""
  value = get(hf, key, default, name)
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
    raise CheckpointFormatError(
      f"config.json: {name or key} must be a positive finite number, got {value!r}"
    )
  return float(value)


def flag(hf: Mapping[str, Any], key: str, default: bool) -> bool:
  """A switch: true, false, or null / absent for `default`."""
  value = get(hf, key, default)
  if not isinstance(value, bool):
    raise CheckpointFormatError(f"config.json: {key} must be true or false, got {value!r}")
  return value


def present(hf: Mapping[str, Any], key: str) -> None:
  """Refuses a config without `key` (where transformers would fill in a default)."""
  if key not in hf:
    raise CheckpointFormatError(
      f"config.json has no {key!r} (a {hf['model_type']} config states it; null for none)"
    )


# RoPE: transformers 4.x writes rope_theta and rope_scaling, 5.x only rope_parameters.


def _rope_dict(rope: Any, source: str) -> tuple[float | None, RopeScaling | None]:
  """(rope_theta or None, the scaling) of one rope_scaling or rope_parameters dict."""
  if not isinstance(rope, dict):
    raise CheckpointFormatError(f"config.json: {source} must be an object, got {rope!r}")
  per_layer = [key for key, value in rope.items() if isinstance(value, dict)]
  if per_layer:
    raise unsupported(
      f"{source} per layer type ({', '.join(per_layer)}): one RoPE for every layer only"
    )
  kind = rope.get("rope_type", rope.get("type", "default"))
  if "type" in rope and rope.get("type") != kind:
    raise CheckpointFormatError(
      f"config.json: {source} has rope_type {kind!r} and type {rope['type']!r}"
    )
  if kind not in _ROPE_TYPES:
    raise unsupported(
      f"{source} rope_type {kind!r} (only {' and '.join(map(repr, _ROPE_TYPES))} are)"
    )
  known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *_ROPE_TYPES[kind]}
  unknown = sorted(set(rope) - known)
  if unknown:
    raise unsupported(f"{source}.{unknown[0]} with rope_type {kind!r}")
  partial = rope.get("partial_rotary_factor")
  if partial is not None and partial != 1.0:
    raise unsupported(f"{source}.partial_rotary_factor {partial!r} (RoPE on every dimension)")
  theta = positive(rope, "rope_theta", None, f"{source}.rope_theta")
  if kind == "default":
    return theta, None
  factors = {key: positive(rope, key, name=f"{source}.{key}") for key in _LLAMA3_KEYS[:3]}
  original = size(rope, _LLAMA3_KEYS[3], POSITIONS, name=f"{source}.{_LLAMA3_KEYS[3]}")
  try:
    scaling = RopeScaling(**factors, original_max_len=original)
  except ValueError as error:
    raise CheckpointFormatError(f"config.json: {source}: {error}") from error
  return theta, scaling


def rope(hf: Mapping[str, Any]) -> dict[str, Any]:
  """rope_base and rope_scaling from either form; where both forms are there, they agree."""
  partial = hf.get("partial_rotary_factor")
  if partial is not None and partial != 1.0:
    raise unsupported(f"partial_rotary_factor {partial!r} (RoPE on every dimension)")
  thetas = {"rope_theta": positive(hf, "rope_theta", None)}
  scalings = {}
  for source in ("rope_scaling", "rope_parameters"):
    if source in hf and (hf[source] is not None or source == "rope_scaling"):
      # rope_scaling: null states "no scaling"; rope_parameters: null states nothing.
      theta, scaling = _rope_dict(hf[source] or {}, source)
      thetas[f"{source}.rope_theta"] = theta
      scalings[source] = scaling
  stated = {source: theta for source, theta in thetas.items() if theta is not None}
  for what, values in (("rope_theta", stated), ("RoPE scaling", scalings)):
    if len(set(values.values())) > 1:
      listed = "; ".join(f"{source}: {value}" for source, value in values.items())
      raise CheckpointFormatError(f"config.json states {what} twice, differently ({listed})")
  return dict(
    rope_base=next(iter(stated.values()), _DEFAULT_ROPE_THETA),
    rope_scaling=next(iter(scalings.values()), None),
  )


# Sliding windows and the per-layer attention types of transformers 5.x.


def layer_types(hf: Mapping[str, Any], num_layers: int) -> list[str] | None:
  """config.json's layer_types (transformers 5.x writes it), one entry per layer, or None."""
  types = hf.get("layer_types")
  if types is not None and (not isinstance(types, list) or len(types) != num_layers):
    raise CheckpointFormatError(
      f"config.json: layer_types must list one type per layer ({num_layers}), got {str(types)[:80]}"
    )
  return types


def window(hf: Mapping[str, Any]) -> int | None:
  """sliding_window (and sliding_window_size, which some configs carry, agreeing)."""
  value = size(hf, "sliding_window", POSITIONS, None)
  other = size(hf, "sliding_window_size", POSITIONS, None)
  if other is not None and other != value:
    raise CheckpointFormatError(
      f"config.json: sliding_window {value} and sliding_window_size {other} differ"
    )
  return value


def check_uniform_layers(types: list[str] | None, model_type: str, sliding: int | None) -> None:
  """Refuses layer_types other than one attention type on every layer: the window's
  ("sliding_attention") or, without one, "full_attention"."""
  uniform = "sliding_attention" if sliding is not None else "full_attention"
  if types is not None and set(types) != {uniform}:
    raise unsupported(
      f"layer_types {sorted(set(types))} in a {model_type} config with sliding_window "
      f"{sliding} (only {uniform!r} on every layer is)"
    )


# Tensor layouts: how each stored tensor becomes parameters.

# A function of one stored tensor returning the parameters made of it: {path: array}.
Convert = Callable[[np.ndarray], dict[tuple[str, ...], np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One tensor of a layout: its name (family prefix removed), stored shape, conversion."""

  name: str
  shape: tuple[int, ...]
  convert: Convert


def linear(
  name: str,
  path: tuple[str, ...],
  in_shape: tuple[int, ...],
  out_shape: tuple[int, ...],
  stored_out_in: bool = True,
) -> Tensor:
  """A weight stored (out, in) (torch Linear) or (in, out) (GPT-2 Conv1D) -> in x out."""
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  shape = (n_out, n_in) if stored_out_in else (n_in, n_out)

  def convert(w):
    return {path: (w.T if stored_out_in else w).reshape(in_shape + out_shape)}

  return Tensor(name, shape, convert)


def vector(name: str, path: tuple[str, ...], shape: tuple[int, ...]) -> Tensor:
  """A bias or norm scale, stored flat."""
  return Tensor(name, (math.prod(shape),), lambda w: {path: w.reshape(shape)})


def table(name: str, path: tuple[str, ...], shape: tuple[int, ...]) -> Tensor:
  """An embedding table, stored as it is used."""
  return Tensor(name, shape, lambda w: {path: w})
