"""Open-weight checkpoints in the Hugging Face layout, loaded into the project's decoder.

`load_pretrained(directory)` reads `config.json` and `model.safetensors` (or the shards
listed by `model.safetensors.index.json`) of a model whose model_type a family loads
(spectr_jax/models/families/: llama, mistral, qwen2, gemma, gemma2, gpt2), maps every
tensor onto the per-layer parameter tree by the family's layout, stacks the layers and
fuses the projections into the decoder's layout (`spectr_jax.models.layout`), and returns
a `ModelBundle` that the engine decodes like a trained pair. Tensors are read, reshaped
and cast on the host one at a time, and each layer is fused into stacked host arrays as
soon as its tensors are in (`layout.LayerStacker`): the host holds the model once, in the
load dtype, until each stacked parameter is placed on the device (or mesh).

Nothing wrong loads in silence: every config.json value the loader reads is checked (sizes
are bounded positive integers, epsilons positive finite numbers, RoPE settings in the
transformers 4.x and 5.x forms understood and agreeing: `spectr_jax.models.hf`), keys it
neither reads nor knows to be irrelevant (IGNORED_KEYS) are logged, the layer count is
checked against the tensor names before anything is built, each safetensors header
against its file's size, and each tensor read is checked to be finite. docs/MODELS.md
lists what each family reads and what is not supported.
"""

import dataclasses
import functools
import json
import math
import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from absl import logging
from flax import traverse_util
from jax.sharding import NamedSharding
from safetensors import SafetensorError, safe_open

from spectr_jax import sharding
from spectr_jax.models import hf, layout
from spectr_jax.models.bundle import ModelBundle, init_params, param_axes
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import family_for_model_type, registered_families
from spectr_jax.models.family import Family
from spectr_jax.models.hf import CheckpointFormatError

# The cache capacity S when max_len is not given: max_position_embeddings, at most this.
DEFAULT_MAX_LEN = 4096

# The model types of the built-in families, in their order.
MODEL_TYPES = tuple(t for family in registered_families() for t in family.model_types)

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

# config.json keys that no family reads and that do not change the model (bookkeeping,
# token ids, which spectr_jax.data.HFTokenizer reads, and training or generation switches).
_IGNORED_BY_EVERY_FAMILY = (
  "_name_or_path",
  "architectures",
  "transformers_version",
  "transformers.js_config",
  "bos_token_id",
  "eos_token_id",
  "pad_token_id",
  "initializer_range",
  "use_cache",
  "attention_dropout",
)


def _ignored_keys(family: Family, model_type: str) -> frozenset[str]:
  return frozenset(_IGNORED_BY_EVERY_FAMILY + tuple(family.hf_ignored.get(model_type, ())))


# Per model_type, every config.json key known not to change the model beyond the ones the
# loader reads (each family's `hf_ignored` and those of every family). Any other unread key
# is logged as a warning naming it (docs/MODELS.md lists these keys, generated from this
# constant and checked by tests/models/test_pretrained.py).
IGNORED_KEYS: dict[str, frozenset[str]] = {
  t: _ignored_keys(family, t) for family in registered_families() for t in family.model_types
}

_TIED_HEAD = "lm_head.weight"  # the untied output layer; a copy of the embedding if tied

# Bytes per element of the safetensors dtypes; parameters must be one of the float ones.
_SAFETENSORS_ITEMSIZE = {
  **dict.fromkeys(("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2"), 1),
  **dict.fromkeys(("U16", "I16", "F16", "BF16"), 2),
  **dict.fromkeys(("U32", "I32", "F32"), 4),
  **dict.fromkeys(("U64", "I64", "F64"), 8),
}
_SAFETENSORS_FLOATS = ("F16", "BF16", "F32", "F64")
_FINITE_CHUNK = 1 << 22  # elements per finiteness test (a bounded temporary)
# The exponent bits of the 16-bit floats: a value is NaN or infinite exactly where they are
# all set (IEEE 754). This test is ~9x (bfloat16) to ~17x (float16) faster than np.isfinite
# on them; on float32 / float64 np.isfinite is the faster one.
_EXPONENT_BITS_16 = {"bfloat16": 0x7F80, "float16": 0x7C00}


@dataclasses.dataclass(frozen=True)
class _Stored:
  """One tensor of a safetensors file as its header describes it."""

  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]


class _ReadKeys(Mapping):
  """config.json as a read-only mapping that records every key looked up (found or not)."""

  def __init__(self, hf_config: Mapping[str, Any]):
    self._hf = hf_config
    self.read: set[str] = set()

  def __getitem__(self, key: str) -> Any:
    self.read.add(key)
    return self._hf[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._hf)

  def __len__(self) -> int:
    return len(self._hf)


def _dtype_name(config_json: Mapping[str, Any], dtype: Any) -> str:
  stored = config_json.get("torch_dtype"), config_json.get("dtype")  # 5.x writes "dtype"
  if dtype is None:
    dtype = stored[0] or stored[1] or "float32"
  name = str(dtype).removeprefix("torch.") if isinstance(dtype, str) else np.dtype(dtype).name
  if name not in _DTYPES:
    raise hf.unsupported(f"dtype {name!r} (use one of {tuple(_DTYPES)})")
  return name


def _family(model_type: Any) -> Family:
  family = family_for_model_type(model_type)
  if family is None:
    known = [t for f in registered_families() for t in f.model_types]
    raise CheckpointFormatError(
      f"unknown model_type {model_type!r}; known model types: {', '.join(known)}"
    )
  return family


def config_from_hf(
  hf_config: Mapping[str, Any], dtype: Any = None, max_len: int | None = None
) -> ModelConfig:
  """The `ModelConfig` of a Hugging Face config.json dict.

  Every value read is checked before use (errors name the key); keys that are neither read
  nor in IGNORED_KEYS are logged as a warning naming them.

  Args:
    hf_config: the parsed config.json (transformers 4.x or 5.x form).
    dtype: the compute (and parameter) dtype; None = the checkpoint's torch_dtype.
    max_len: S, the KV-cache capacity; None = min(max_position_embeddings, DEFAULT_MAX_LEN);
      past max_position_embeddings RoPE models extrapolate, GPT-2 refuses.

  Returns:
    The config (logits over all vocab_size embedding rows; restrict with output_vocab_size).

  Raises:
    CheckpointFormatError: for an unknown model_type, a feature this decoder lacks, or a
      value that is missing, malformed or out of bounds.
  """
  if not isinstance(hf_config, Mapping):
    raise CheckpointFormatError(
      f"config.json must be a JSON object, got {type(hf_config).__name__}"
    )
  config_json = _ReadKeys(hf_config)
  model_type = config_json.get("model_type")
  family = _family(model_type)
  for key in ("num_local_experts", "num_experts", "n_routed_experts"):
    if config_json.get(key):
      raise hf.unsupported(f"mixture-of-experts layers ({key} = {config_json[key]})")
  if config_json.get("quantization_config"):
    raise hf.unsupported("quantized checkpoints (quantization_config)")
  dtype_name = _dtype_name(config_json, dtype)
  fields = family.hf_fields(config_json, model_type)
  positions = family.hf_positions(config_json, fields)
  if max_len is None:
    max_len = min(positions, DEFAULT_MAX_LEN)
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    raise CheckpointFormatError(f"max_len must be an integer >= 1, got {max_len!r}")
  family.hf_check_max_len(max_len, positions)
  unread = sorted(set(config_json) - config_json.read - _ignored_keys(family, model_type))
  if unread:
    logging.warning(
      "config.json (%s) has keys the loader neither reads nor knows to be irrelevant, so the "
      "model may differ from what they say: %s (docs/MODELS.md lists the keys it ignores)",
      model_type,
      ", ".join(unread),
    )
  try:
    return ModelConfig(max_len=max_len, dtype=dtype_name, **fields)
  except ValueError as error:
    raise CheckpointFormatError(f"config.json: {error}") from error


def _layout(family: Family, model_type: str, config: ModelConfig) -> list[hf.Tensor]:
  """The tensors of a model: the family's body, and the untied output layer."""
  tensors = family.hf_tensors(model_type, config)
  if not config.tied_embedding:
    tensors.append(hf.table(_TIED_HEAD, ("out_embedding",), (config.vocab_size, config.d_model)))
  return tensors


# Files: JSON, safetensors headers, tensors.


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    raise FileNotFoundError(f"no {path.name} in {path.parent}")
  try:
    value = json.loads(path.read_text())
  except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
    raise CheckpointFormatError(f"{path} is not valid JSON: {error}") from error
  if not isinstance(value, dict):
    raise CheckpointFormatError(f"{path} must hold a JSON object, not a {type(value).__name__}")
  return value


def _damaged(file: pathlib.Path, message: str) -> CheckpointFormatError:
  return CheckpointFormatError(f"{file} is not a whole safetensors file: {message}")


def _read_header(file: pathlib.Path) -> dict[str, _Stored]:
  """The tensors of one safetensors file, its header checked against the file's size.

  Reads the header only: an 8-byte little-endian length, then that many bytes of JSON with
  each tensor's dtype, shape and data_offsets (into the data that follows, without holes).
  """
  size = file.stat().st_size
  with open(file, "rb") as f:
    length = int.from_bytes(f.read(8), "little")
    if size < 8 or length > size - 8:
      raise _damaged(file, f"{size} bytes cannot hold the header of {length} bytes it announces")
    raw = f.read(length)
  try:
    header = json.loads(raw)
  except ValueError as error:
    raise _damaged(file, f"its header is not JSON ({error})") from error
  if not isinstance(header, dict):
    raise _damaged(file, "its header is not a JSON object")
  tensors, spans = {}, []
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype, shape, (start, stop) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
      numbers = (*shape, start, stop)
      valid = dtype in _SAFETENSORS_ITEMSIZE and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
      )
    except (TypeError, KeyError, ValueError):
      valid = False
    if not valid:
      raise _damaged(file, f"tensor {name!r} has the header entry {entry!r}")
    nbytes = math.prod(shape) * _SAFETENSORS_ITEMSIZE[dtype]
    if stop - start != nbytes:
      raise _damaged(
        file,
        f"tensor {name!r} ({dtype} {list(shape)}, {nbytes} bytes) spans bytes [{start}, {stop})",
      )
    tensors[name] = _Stored(file, dtype, shape)
    spans.append((start, stop, name))
  end = 0
  for start, stop, name in sorted(spans):
    if start != end:
      raise _damaged(file, f"tensor {name!r} starts at byte {start} of the data, not {end}")
    end = stop
  if 8 + length + end != size:
    raise _damaged(file, f"{size} bytes, but its header accounts for {8 + length + end}")
  return tensors


def _stored_tensors(directory: pathlib.Path) -> dict[str, _Stored]:
  """{stored tensor name: its file, dtype and shape} from model.safetensors or the index;
  every file's header checked against its size."""
  index = directory / "model.safetensors.index.json"
  single = directory / "model.safetensors"
  if not index.is_file():
    if single.is_file():
      return _read_header(single)
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {directory}")
  weight_map = _read_json(index).get("weight_map")
  if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
    raise CheckpointFormatError(f"{index} has no weight_map of tensor names to file names")
  files = {name: directory / file for name, file in weight_map.items()}
  headers = {}
  for file in sorted(set(files.values())):
    if not file.is_file():
      raise FileNotFoundError(f"{file.name}, listed in {index.name}, is missing in {directory}")
    headers[file] = _read_header(file)
  for name, file in files.items():
    if name not in headers[file]:
      raise CheckpointFormatError(f"tensor {name!r}, listed in {index.name}, is not in {file}")
  return {name: headers[file][name] for name, file in files.items()}


def _check_layer_count(family: Family, num_layers: int, stored: Mapping[str, _Stored]) -> None:
  """Refuses a layer count that the tensor names contradict (before any layout is built)."""
  pattern, key = family.hf_layer_pattern, family.hf_layer_key
  found = sorted({int(m.group(1)) for name in stored if (m := pattern.match(name))})
  if found != list(range(num_layers)):
    held = f"{len(found)} layers ({found[0]}..{found[-1]})" if found else "no layers"
    raise CheckpointFormatError(
      f"config.json has {key} = {num_layers}, but the safetensors hold {held}"
    )


def _match(
  stored: Mapping[str, _Stored], prefix: str, tensors: list[hf.Tensor], tied: bool
) -> dict[str, str]:
  """{layout name: stored name}; raises for a missing or an unexpected tensor."""
  wanted = {t.name for t in tensors}
  # Buffers (tensors that real checkpoints carry but that are no parameters) of any family.
  buffers = [p for family in registered_families() for p in family.hf_buffers]
  names, unexpected = {}, []
  for name in stored:
    short = name.removeprefix(prefix)
    if short in wanted and short not in names:
      names[short] = name
    elif not any(re.fullmatch(p, name) for p in buffers) and not (tied and name == _TIED_HEAD):
      unexpected.append(name)
  if unexpected:
    name = unexpected[0]
    raise CheckpointFormatError(
      f"unexpected tensor {name!r} in {stored[name].file.name} ({len(unexpected)} in all): not "
      "part of this model_type / config.json (or stored twice)"
    )
  missing = [t.name for t in tensors if t.name not in names]
  if missing:
    listed = ", ".join(repr(n if n == _TIED_HEAD else prefix + n) for n in missing[:3])
    shards = ", ".join(sorted({s.file.name for s in stored.values()}))
    raise CheckpointFormatError(f"missing tensor {listed} ({len(missing)} in all) in {shards}")
  return names


def _read_tensor(name: str, file: pathlib.Path) -> np.ndarray:
  # One open per tensor: closing unmaps the file, so its pages leave this process.
  try:
    with safe_open(file, framework="numpy") as f:
      return f.get_tensor(name)
  except SafetensorError as error:
    raise CheckpointFormatError(f"{file}: cannot read tensor {name!r}: {error}") from error


def _all_finite(x: np.ndarray) -> bool:
  """No NaN or infinity in x (a compact array: ravel is a view), in bounded chunks."""
  flat = x.ravel(order="K")
  chunks = range(0, flat.size, _FINITE_CHUNK)
  exponent = _EXPONENT_BITS_16.get(flat.dtype.name)
  if exponent is None:
    return all(np.isfinite(flat[i : i + _FINITE_CHUNK]).all() for i in chunks)
  bits = flat.view(np.uint16)
  return all((bits[i : i + _FINITE_CHUNK] & np.uint16(exponent)).max() != exponent for i in chunks)


def load_pretrained(
  directory: str | pathlib.Path,
  dtype: Any = None,
  max_len: int | None = None,
  mesh: jax.sharding.Mesh | None = None,
) -> ModelBundle:
  """Loads a Hugging Face-format checkpoint directory into the project's decoder.

  Args:
    directory: holds config.json and model.safetensors, or model.safetensors.index.json
      with its shards (tokenizer.json is read by `spectr_jax.data.HFTokenizer`).
    dtype: the parameter and compute dtype ("float32", "bfloat16", "float16"); None = the
      checkpoint's torch_dtype. Logits are float32 in every case.
    max_len: S, the KV-cache capacity; None = min(max_position_embeddings, DEFAULT_MAX_LEN).
    mesh: place each parameter on this mesh by `sharding.RULES` and its logical axes
      (`param_axes`): a target larger than one device's memory never sits on one
      device (the host holds it once, in `dtype`, while its layers are stacked); None =
      the default device.

  Returns:
    The `ModelBundle`: the config (logits over all embedding rows) and the parameters.

  Raises:
    FileNotFoundError: config.json or a weights file is missing.
    CheckpointFormatError: unknown model_type, unsupported feature, a bad config.json
      value, a safetensors file whose header does not match its size, a layer count the
      tensor names contradict, a missing, unexpected, misshapen or non-float tensor, or a
      tensor holding NaN or infinity (also after the cast to dtype).
  """
  path = pathlib.Path(directory).expanduser()
  if not path.is_dir():
    raise FileNotFoundError(
      f"{path} is not a directory: a pretrained model is read from a local Hugging Face "
      "checkpoint directory (config.json, model.safetensors); nothing is downloaded at run "
      "time"
    )
  config_json = _read_json(path / "config.json")
  config = config_from_hf(config_json, dtype, max_len)
  model_type = config_json["model_type"]
  family = _family(model_type)
  stored = _stored_tensors(path)  # headers only: no tensor data is read here
  _check_layer_count(family, config.num_layers, stored)
  tensors = _layout(family, model_type, config)
  names = _match(stored, family.hf_prefix, tensors, config.tied_embedding)
  for t in tensors:
    name = names[t.name]
    s = stored[name]
    if s.dtype not in _SAFETENSORS_FLOATS:
      raise CheckpointFormatError(
        f"tensor {name!r} in {s.file.name} is {s.dtype}, not a float type "
        f"({', '.join(_SAFETENSORS_FLOATS)})"
      )
    if s.shape != t.shape:
      raise CheckpointFormatError(
        f"tensor {name!r} in {s.file.name} has shape {s.shape}; config.json implies {t.shape}"
      )
  np_dtype = _DTYPES[config.dtype]
  shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
  stacker = layout.LayerStacker(shapes, config, np_dtype)
  for t in tensors:
    name = names[t.name]
    file = stored[name].file
    stored_array = _read_tensor(name, file)
    if not _all_finite(stored_array):
      raise CheckpointFormatError(f"tensor {name!r} in {file.name} holds NaN or infinity")
    for param_path, value in t.convert(stored_array).items():
      with np.errstate(over="ignore"):  # an overflow to float16 is refused just below
        value = np.asarray(value, np_dtype)
      if np_dtype == np.float16 and stored_array.dtype != np.float16 and not _all_finite(value):
        raise CheckpointFormatError(
          f"tensor {name!r} in {file.name} has values beyond the range of float16"
        )
      stacker.add(param_path, value)
    del stored_array
  # The tensors map onto the per-layer layout; the stacker fuses each layer's projections
  # into the decoder's stacked arrays on the host, which are placed one at a time.
  flat = traverse_util.flatten_dict(stacker.params())
  del stacker
  axes = None if mesh is None else sharding.axes_by_path(param_axes(config))
  for path in list(flat):
    if mesh is None:
      flat[path] = jax.device_put(flat[path])
    else:
      spec = sharding.logical_spec(axes[path], flat[path].shape, mesh)
      flat[path] = sharding.put(flat[path], NamedSharding(mesh, spec))
  return ModelBundle(config=config, params=traverse_util.unflatten_dict(flat))
