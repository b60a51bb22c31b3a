"""Open-weight checkpoints in the Hugging Face layout, loaded into the project's decoder.

`load_pretrained(directory)` reads `config.json` and `model.safetensors` (or the shards
listed by `model.safetensors.index.json`) of a Llama-like (llama, mistral), Qwen2, Gemma,
Gemma 2 or GPT-2 model, maps every tensor onto the parameter tree of `Transformer`, and
returns a `ModelBundle` that the engine decodes like a trained pair. Tensors move to the
device one at a time (read, reshape, cast, `jax.device_put`, dropped), so the host never
holds more than the largest tensor beyond the device copy.

Nothing wrong loads in silence: every config.json value the loader reads is checked (sizes
are bounded positive integers, epsilons positive finite numbers, RoPE settings in the
transformers 4.x and 5.x forms understood and agreeing), keys it neither reads nor knows
to be irrelevant (IGNORED_KEYS) are logged, the layer count is checked against the tensor
names before anything is built, each safetensors header against its file's size, and each
tensor read is checked to be finite. docs/MODELS.md lists what each family reads and what
is not supported.
"""

import dataclasses
import json
import math
import pathlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from absl import logging
from flax import traverse_util
from jax.sharding import NamedSharding
from safetensors import SafetensorError, safe_open

from spectr_jax import sharding
from spectr_jax.models.bundle import ModelBundle
from spectr_jax.models.config import ModelConfig, RopeScaling

# The cache capacity S when max_len is not given: max_position_embeddings, at most this.
DEFAULT_MAX_LEN = 4096

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "gemma", "gemma2")
MODEL_TYPES = (*_LLAMA_LIKE, "gpt2")

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")

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
# Per model_type, every config.json key known not to change the model beyond the ones the
# loader reads. Any other unread key is logged as a warning naming it (docs/MODELS.md lists
# these keys, generated from this constant and checked by tests/test_pretrained.py).
IGNORED_KEYS: dict[str, frozenset[str]] = {
  model_type: frozenset(_IGNORED_BY_EVERY_FAMILY + extra)
  for model_type, extra in {
    # pretraining_tp only slices the matmuls; is_llama_config and rope_interleaved are
    # nanotron's (transformers ignores both and rotates the two halves of each head).
    "llama": ("pretraining_tp", "is_llama_config", "rope_interleaved"),
    "mistral": (),
    # max_window_layers matters only with use_sliding_window, which is refused.
    "qwen2": ("max_window_layers",),
    # Gemma and Gemma 2: hidden_act is unused beside hidden_activation (read without it).
    "gemma": ("hidden_act",),
    "gemma2": ("hidden_act", "cache_implementation"),
    # n_ctx duplicates n_positions; the rest are dropout, classification-head and
    # generation settings, and an attention reordering that changes rounding only.
    "gpt2": (
      "n_ctx",
      "attn_pdrop",
      "embd_pdrop",
      "resid_pdrop",
      "summary_activation",
      "summary_first_dropout",
      "summary_proj_to_labels",
      "summary_type",
      "summary_use_proj",
      "task_specific_params",
      "reorder_and_upcast_attn",
    ),
  }.items()
}

# Upper bounds of the size fields: far above any released model, they stop a typo (1e9
# layers) before anything is built from it.
_SIZE_LIMITS = {
  **dict.fromkeys(
    ("num_hidden_layers", "n_layer", "num_attention_heads", "num_key_value_heads", "n_head"),
    1 << 12,
  ),
  **dict.fromkeys(("hidden_size", "n_embd", "head_dim", "intermediate_size", "n_inner"), 1 << 20),
  "vocab_size": 1 << 24,
  **dict.fromkeys(
    (
      "max_position_embeddings",
      "n_positions",
      "sliding_window",
      "sliding_window_size",
      "original_max_position_embeddings",
    ),
    1 << 30,
  ),
}

# RoPE types understood, with the keys each takes besides rope_type / type / rope_theta /
# partial_rotary_factor (in rope_scaling, transformers 4.x, or rope_parameters, 5.x).
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_ROPE_TYPES = {"default": (), "llama3": _LLAMA3_KEYS}
_DEFAULT_ROPE_THETA = 10000.0

# Tensors that real checkpoints carry but that are no parameters: skipped by name.
_BUFFERS = (
  r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq",  # RoPE frequencies (recomputed)
  r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",  # GPT-2's causal mask buffers
)
_TIED_HEAD = "lm_head.weight"  # a redundant copy of the embedding in some tied checkpoints
# The layer index in a stored tensor name, and the config.json key of the layer count.
_LAYER_INDEX = {
  "gpt2": (re.compile(r"(?:transformer\.)?h\.(\d+)\."), "n_layer"),
  "llama-like": (re.compile(r"(?:model\.)?layers\.(\d+)\."), "num_hidden_layers"),
}

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


class CheckpointFormatError(ValueError):
  """A checkpoint directory that does not hold a model this loader supports."""


# A function of one stored tensor returning the parameters made of it: {path: array}.
Convert = Callable[[np.ndarray], dict[tuple[str, ...], np.ndarray]]


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One tensor of the layout: its name (family prefix removed), stored shape, conversion."""

  name: str
  shape: tuple[int, ...]
  convert: Convert


@dataclasses.dataclass(frozen=True)
class _Stored:
  """One tensor of a safetensors file as its header describes it."""

  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]


class _ReadKeys(Mapping):
  """config.json as a read-only mapping that records every key looked up (found or not)."""

  def __init__(self, hf: Mapping[str, Any]):
    self._hf = hf
    self.read: set[str] = set()

  def __getitem__(self, key: str) -> Any:
    self.read.add(key)
    return self._hf[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._hf)

  def __len__(self) -> int:
    return len(self._hf)


# config.json values, each checked and named in the error.


def _get(hf: Mapping[str, Any], key: str, default: Any = ..., name: str | None = None) -> Any:
  """hf[key]; absent or null gives default (none: an error naming `name`, default key)."""
  value = hf.get(key)
  if value is None:
    if default is ...:
      raise CheckpointFormatError(f"config.json has no {name or key!r}")
    return default
  return value


def _size(hf: Mapping[str, Any], key: str, default: Any = ..., name: str | None = None) -> Any:
  """A size field: an integer in [1, its limit] (not a bool, float or string)."""
  value = _get(hf, key, default, name)
  limit = _SIZE_LIMITS[key]
  if value is not None and (
    isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit
  ):
    raise CheckpointFormatError(
      f"config.json: {name or key} must be an integer in [1, {limit}], got {value!r}"
    )
  return value


def _positive(hf: Mapping[str, Any], key: str, default: Any = ..., name: str | None = None) -> Any:
  """A positive finite number (an epsilon, a RoPE base or factor, a soft-cap) as a float."""
  value = _get(hf, key, default, name)
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
    raise CheckpointFormatError(
      f"config.json: {name or key} must be a positive finite number, got {value!r}"
    )
  return float(value)


def _flag(hf: Mapping[str, Any], key: str, default: bool) -> bool:
  value = _get(hf, key, default)
  if not isinstance(value, bool):
    raise CheckpointFormatError(f"config.json: {key} must be true or false, got {value!r}")
  return value


def _present(hf: Mapping[str, Any], key: str) -> None:
  """Refuses a config without `key` (where transformers would fill in a default)."""
  if key not in hf:
    raise CheckpointFormatError(
      f"config.json has no {key!r} (a {hf['model_type']} config states it; null for none)"
    )


def _unsupported(message: str) -> CheckpointFormatError:
  return CheckpointFormatError(f"not supported: {message}")


# RoPE: transformers 4.x writes rope_theta and rope_scaling, 5.x only rope_parameters.


def _rope_dict(rope: Any, source: str) -> tuple[float | None, RopeScaling | None]:
  """(rope_theta or None, the scaling) of one rope_scaling or rope_parameters dict."""
  if not isinstance(rope, dict):
    raise CheckpointFormatError(f"config.json: {source} must be an object, got {rope!r}")
  per_layer = [key for key, value in rope.items() if isinstance(value, dict)]
  if per_layer:
    raise _unsupported(
      f"{source} per layer type ({', '.join(per_layer)}): one RoPE for every layer only"
    )
  kind = rope.get("rope_type", rope.get("type", "default"))
  if "type" in rope and rope.get("type") != kind:
    raise CheckpointFormatError(
      f"config.json: {source} has rope_type {kind!r} and type {rope['type']!r}"
    )
  if kind not in _ROPE_TYPES:
    raise _unsupported(
      f"{source} rope_type {kind!r} (only {' and '.join(map(repr, _ROPE_TYPES))} are)"
    )
  known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *_ROPE_TYPES[kind]}
  unknown = sorted(set(rope) - known)
  if unknown:
    raise _unsupported(f"{source}.{unknown[0]} with rope_type {kind!r}")
  partial = rope.get("partial_rotary_factor")
  if partial is not None and partial != 1.0:
    raise _unsupported(f"{source}.partial_rotary_factor {partial!r} (RoPE on every dimension)")
  theta = _positive(rope, "rope_theta", None, f"{source}.rope_theta")
  if kind == "default":
    return theta, None
  factors = {key: _positive(rope, key, name=f"{source}.{key}") for key in _LLAMA3_KEYS[:3]}
  original = _size(rope, _LLAMA3_KEYS[3], name=f"{source}.{_LLAMA3_KEYS[3]}")
  try:
    scaling = RopeScaling(**factors, original_max_len=original)
  except ValueError as error:
    raise CheckpointFormatError(f"config.json: {source}: {error}") from error
  return theta, scaling


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
  """rope_base and rope_scaling from either form; where both forms are there, they agree."""
  partial = hf.get("partial_rotary_factor")
  if partial is not None and partial != 1.0:
    raise _unsupported(f"partial_rotary_factor {partial!r} (RoPE on every dimension)")
  thetas = {"rope_theta": _positive(hf, "rope_theta", None)}
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


def _layer_types(hf: Mapping[str, Any], num_layers: int) -> list[str] | None:
  """config.json's layer_types (transformers 5.x writes it), one entry per layer, or None."""
  layer_types = hf.get("layer_types")
  if layer_types is not None and (
    not isinstance(layer_types, list) or len(layer_types) != num_layers
  ):
    raise CheckpointFormatError(
      f"config.json: layer_types must list one type per layer ({num_layers}), got "
      f"{str(layer_types)[:80]}"
    )
  return layer_types


def _sliding(hf: Mapping[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
  """The sliding-window fields: Mistral's window on every layer, Gemma 2's on the even ones
  (or what layer_types says, if it says that), none elsewhere."""
  layer_types = _layer_types(hf, num_layers)
  window = None
  if model_type == "qwen2":
    if _flag(hf, "use_sliding_window", False):
      raise _unsupported("Qwen2's use_sliding_window (sliding layers from max_window_layers on)")
    _size(hf, "sliding_window", None)  # named but switched off, as in transformers
  elif model_type in ("mistral", "gemma2"):
    if model_type == "gemma2":
      _present(hf, "sliding_window")
    window = _size(hf, "sliding_window", None)
    other = _size(hf, "sliding_window_size", None)
    if other is not None and other != window:
      raise CheckpointFormatError(
        f"config.json: sliding_window {window} and sliding_window_size {other} differ"
      )
  if model_type == "gemma2":
    even = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if layer_types is None or layer_types == even:
      return dict(sliding_window=window, sliding_window_layers="even")
    if set(layer_types) == {"full_attention"}:
      return dict(sliding_window=None)
    raise _unsupported(f"layer_types {layer_types} (only Gemma 2's alternation is)")
  uniform = "sliding_attention" if window is not None else "full_attention"
  if layer_types is not None and set(layer_types) != {uniform}:
    raise _unsupported(
      f"layer_types {sorted(set(layer_types))} in a {model_type} config with sliding_window "
      f"{window} (only {uniform!r} on every layer is)"
    )
  return dict(sliding_window=window)


# The families.


def _llama_like_fields(hf: Mapping[str, Any], model_type: str) -> dict[str, Any]:
  d = _size(hf, "hidden_size")
  h = _size(hf, "num_attention_heads")
  hk = _size(hf, "num_key_value_heads", h)
  head_dim = _size(hf, "head_dim", None)
  if head_dim is None:
    if d % h:
      raise CheckpointFormatError(
        f"config.json: hidden_size {d} is no multiple of num_attention_heads {h} (and there "
        "is no head_dim)"
      )
    head_dim = d // h
  if h % hk:
    raise CheckpointFormatError(
      f"config.json: num_attention_heads ({h}) must be a multiple of num_key_value_heads ({hk})"
    )
  gemma = model_type in ("gemma", "gemma2")
  if gemma:  # transformers 4.x reads hidden_activation; 5.x's Gemma config has hidden_act
    key = "hidden_activation" if hf.get("hidden_activation") is not None else "hidden_act"
    activation = _get(hf, key, "gelu_pytorch_tanh")
    if activation not in _TANH_GELU:
      raise _unsupported(f"{key} {activation!r} (Gemma's MLP is tanh-GELU here)")
  else:
    activation = _get(hf, "hidden_act", "silu")
    if activation != "silu":
      raise _unsupported(f"hidden_act {activation!r} (the {model_type} MLP is SwiGLU)")
  if _flag(hf, "use_bidirectional_attention", False):
    raise _unsupported("use_bidirectional_attention (the decoder is causal)")
  # Qwen2's q/k/v projections always have biases (transformers reads no attention_bias).
  attention_bias = model_type == "qwen2" or _flag(hf, "attention_bias", False)
  num_layers = _size(hf, "num_hidden_layers")
  fields = dict(
    vocab_size=_size(hf, "vocab_size"),
    d_model=d,
    num_layers=num_layers,
    num_heads=h,
    num_kv_heads=hk,
    head_dim=head_dim,
    mlp_dim=_size(hf, "intermediate_size"),
    norm_eps=_positive(hf, "rms_norm_eps", 1e-6),
    **_rope(hf),
    block="sequential",
    norm="rms_offset" if gemma else "rms",
    mlp="geglu" if gemma else "swiglu",
    qkv_bias=attention_bias,
    out_bias=attention_bias and model_type != "qwen2",
    mlp_bias=_flag(hf, "mlp_bias", False),
    embed_scale=gemma,
    tied_embedding=_flag(hf, "tie_word_embeddings", gemma),
    scale_logits=False,
    **_sliding(hf, model_type, num_layers),
  )
  if model_type == "gemma2":
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
      _present(hf, key)
    fields.update(
      post_norms=True,
      query_scale=_positive(hf, "query_pre_attn_scalar") ** -0.5,
      attn_softcap=_positive(hf, "attn_logit_softcapping", None),
      final_softcap=_positive(hf, "final_logit_softcapping", None),
    )
  return fields


def _gpt2_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  d = _size(hf, "n_embd")
  h = _size(hf, "n_head")
  if d % h:
    raise CheckpointFormatError(f"config.json: n_embd {d} is no multiple of n_head {h}")
  activation = _get(hf, "activation_function", "gelu_new")
  if activation not in _TANH_GELU:
    raise _unsupported(f"activation_function {activation!r} (GPT-2's MLP is tanh-GELU here)")
  if _flag(hf, "scale_attn_by_inverse_layer_idx", False) or not _flag(
    hf, "scale_attn_weights", True
  ):
    raise _unsupported("GPT-2 attention scaling other than 1 / sqrt(head_dim)")
  return dict(
    vocab_size=_size(hf, "vocab_size"),
    d_model=d,
    num_layers=_size(hf, "n_layer"),
    num_heads=h,
    num_kv_heads=h,
    head_dim=d // h,
    mlp_dim=_size(hf, "n_inner", 4 * d),
    norm_eps=_positive(hf, "layer_norm_epsilon", 1e-5),
    block="sequential",
    norm="layernorm",
    mlp="gelu",
    positions="learned",
    num_positions=_size(hf, "n_positions"),
    qkv_bias=True,
    out_bias=True,
    mlp_bias=True,
    tied_embedding=_flag(hf, "tie_word_embeddings", True),
    scale_logits=False,
  )


def _dtype_name(hf: Mapping[str, Any], dtype: Any) -> str:
  stored = hf.get("torch_dtype"), hf.get("dtype")  # transformers 5.x writes "dtype"
  if dtype is None:
    dtype = stored[0] or stored[1] or "float32"
  name = str(dtype).removeprefix("torch.") if isinstance(dtype, str) else np.dtype(dtype).name
  if name not in _DTYPES:
    raise _unsupported(f"dtype {name!r} (use one of {tuple(_DTYPES)})")
  return name


def config_from_hf(
  hf: Mapping[str, Any], dtype: Any = None, max_len: int | None = None
) -> ModelConfig:
  """The `ModelConfig` of a Hugging Face config.json dict.

  Every value read is checked before use (errors name the key); keys that are neither read
  nor in IGNORED_KEYS are logged as a warning naming them.

  Args:
    hf: the parsed config.json (transformers 4.x or 5.x form).
    dtype: the compute (and parameter) dtype; None = the checkpoint's torch_dtype.
    max_len: S, the KV-cache capacity; None = min(max_position_embeddings, DEFAULT_MAX_LEN);
      past max_position_embeddings RoPE models extrapolate, GPT-2 refuses.

  Returns:
    The config (logits over all vocab_size embedding rows; restrict with output_vocab_size).

  Raises:
    CheckpointFormatError: for an unknown model_type, a feature this decoder lacks, or a
      value that is missing, malformed or out of bounds.
  """
  if not isinstance(hf, Mapping):
    raise CheckpointFormatError(f"config.json must be a JSON object, got {type(hf).__name__}")
  hf = _ReadKeys(hf)
  model_type = hf.get("model_type")
  if model_type not in MODEL_TYPES:
    raise CheckpointFormatError(
      f"unknown model_type {model_type!r}; known model types: {', '.join(MODEL_TYPES)}"
    )
  for key in ("num_local_experts", "num_experts", "n_routed_experts"):
    if hf.get(key):
      raise _unsupported(f"mixture-of-experts layers ({key} = {hf[key]})")
  if hf.get("quantization_config"):
    raise _unsupported("quantized checkpoints (quantization_config)")
  dtype_name = _dtype_name(hf, dtype)
  fields = _gpt2_fields(hf) if model_type == "gpt2" else _llama_like_fields(hf, model_type)
  positions = fields.get("num_positions") or _size(hf, "max_position_embeddings")
  if max_len is None:
    max_len = min(positions, DEFAULT_MAX_LEN)
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    raise CheckpointFormatError(f"max_len must be an integer >= 1, got {max_len!r}")
  # RoPE extrapolates past the trained context (at the user's word); a table cannot.
  if model_type == "gpt2" and max_len > positions:
    raise CheckpointFormatError(
      f"max_len {max_len} exceeds GPT-2's n_positions = {positions} (its position table)"
    )
  unread = sorted(set(hf) - hf.read - IGNORED_KEYS[model_type])
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


def _linear(
  name: str,
  path: tuple[str, ...],
  in_shape: tuple[int, ...],
  out_shape: tuple[int, ...],
  stored_out_in: bool = True,
) -> _Tensor:
  """A weight stored (out, in) (torch Linear) or (in, out) (GPT-2 Conv1D) -> in x out."""
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  shape = (n_out, n_in) if stored_out_in else (n_in, n_out)

  def convert(w):
    return {path: (w.T if stored_out_in else w).reshape(in_shape + out_shape)}

  return _Tensor(name, shape, convert)


def _vector(name: str, path: tuple[str, ...], shape: tuple[int, ...]) -> _Tensor:
  return _Tensor(name, (math.prod(shape),), lambda w: {path: w.reshape(shape)})


def _table(name: str, path: tuple[str, ...], shape: tuple[int, ...]) -> _Tensor:
  return _Tensor(name, shape, lambda w: {path: w})


def _llama_like_tensors(model_type: str, cfg: ModelConfig) -> list[_Tensor]:
  """The layout of LlamaForCausalLM and its relatives (names without "model.")."""
  d, h, hk, dh, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
  tensors = [_table("embed_tokens.weight", ("embed", "embedding"), (cfg.vocab_size, d))]
  # The norm before the MLP is post_attention_layernorm, except in Gemma 2 (a post-norm).
  norms = {"input_layernorm": "norm", "post_attention_layernorm": "mlp_norm"}
  if model_type == "gemma2":
    norms = {
      "input_layernorm": "norm",
      "post_attention_layernorm": "post_attn_norm",
      "pre_feedforward_layernorm": "mlp_norm",
      "post_feedforward_layernorm": "post_mlp_norm",
    }
  for i in range(cfg.num_layers):
    p, b = f"layers.{i}.", f"block_{i}"
    attn, mlp = p + "self_attn.", p + "mlp."
    tensors += [
      _linear(attn + "q_proj.weight", (b, "w_q"), (d,), (h, dh)),
      _linear(attn + "k_proj.weight", (b, "w_k"), (d,), (hk, dh)),
      _linear(attn + "v_proj.weight", (b, "w_v"), (d,), (hk, dh)),
      _linear(attn + "o_proj.weight", (b, "w_o"), (h, dh), (d,)),
      _linear(mlp + "gate_proj.weight", (b, "w_gate"), (d,), (f,)),
      _linear(mlp + "up_proj.weight", (b, "w_up"), (d,), (f,)),
      _linear(mlp + "down_proj.weight", (b, "w_down"), (f,), (d,)),
    ]
    tensors += [_vector(p + f"{hf}.weight", (b, ours, "scale"), (d,)) for hf, ours in norms.items()]
    if cfg.qkv_bias:
      tensors += [
        _vector(attn + "q_proj.bias", (b, "b_q"), (h, dh)),
        _vector(attn + "k_proj.bias", (b, "b_k"), (hk, dh)),
        _vector(attn + "v_proj.bias", (b, "b_v"), (hk, dh)),
      ]
    if cfg.out_bias:
      tensors.append(_vector(attn + "o_proj.bias", (b, "b_o"), (d,)))
    if cfg.mlp_bias:
      tensors += [
        _vector(mlp + "gate_proj.bias", (b, "b_gate"), (f,)),
        _vector(mlp + "up_proj.bias", (b, "b_up"), (f,)),
        _vector(mlp + "down_proj.bias", (b, "b_down"), (d,)),
      ]
  tensors.append(_vector("norm.weight", ("final_norm", "scale"), (d,)))
  return tensors


def _split_qkv(block: str, shape: tuple[int, ...]) -> Convert:
  """GPT-2's fused c_attn [q | k | v] along its last axis -> w_q, w_k, w_v (or biases)."""
  names = ("w_q", "w_k", "w_v") if len(shape) == 3 else ("b_q", "b_k", "b_v")

  def convert(w):
    return {(block, n): x.reshape(shape) for n, x in zip(names, np.split(w, 3, -1), strict=True)}

  return convert


def _gpt2_tensors(cfg: ModelConfig) -> list[_Tensor]:
  """The layout of GPT2LMHeadModel (names without "transformer."); Conv1D stores (in, out)."""
  d, h, dh, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.mlp_dim
  tensors = [
    _table("wte.weight", ("embed", "embedding"), (cfg.vocab_size, d)),
    _table("wpe.weight", ("pos_embed", "embedding"), (cfg.num_positions, d)),
  ]
  for i in range(cfg.num_layers):
    p, b = f"h.{i}.", f"block_{i}"
    tensors += [
      _Tensor(p + "attn.c_attn.weight", (d, 3 * d), _split_qkv(b, (d, h, dh))),
      _Tensor(p + "attn.c_attn.bias", (3 * d,), _split_qkv(b, (h, dh))),
      _linear(p + "attn.c_proj.weight", (b, "w_o"), (h, dh), (d,), stored_out_in=False),
      _vector(p + "attn.c_proj.bias", (b, "b_o"), (d,)),
      _linear(p + "mlp.c_fc.weight", (b, "w_up"), (d,), (f,), stored_out_in=False),
      _vector(p + "mlp.c_fc.bias", (b, "b_up"), (f,)),
      _linear(p + "mlp.c_proj.weight", (b, "w_down"), (f,), (d,), stored_out_in=False),
      _vector(p + "mlp.c_proj.bias", (b, "b_down"), (d,)),
    ]
    for hf, ours in (("ln_1", "norm"), ("ln_2", "mlp_norm")):
      tensors.append(_vector(p + f"{hf}.weight", (b, ours, "scale"), (d,)))
      tensors.append(_vector(p + f"{hf}.bias", (b, ours, "bias"), (d,)))
  tensors.append(_vector("ln_f.weight", ("final_norm", "scale"), (d,)))
  tensors.append(_vector("ln_f.bias", ("final_norm", "bias"), (d,)))
  return tensors


def _layout(model_type: str, cfg: ModelConfig) -> tuple[str, list[_Tensor]]:
  """(the prefix of the body's names, the tensors) of a model type."""
  if model_type == "gpt2":
    prefix, tensors = "transformer.", _gpt2_tensors(cfg)
  else:
    prefix, tensors = "model.", _llama_like_tensors(model_type, cfg)
  if not cfg.tied_embedding:
    tensors.append(_table(_TIED_HEAD, ("out_embedding",), (cfg.vocab_size, cfg.d_model)))
  return prefix, tensors


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


def _check_layer_count(model_type: str, num_layers: int, stored: Mapping[str, _Stored]) -> None:
  """Refuses a layer count that the tensor names contradict (before any layout is built)."""
  pattern, key = _LAYER_INDEX["gpt2" if model_type == "gpt2" else "llama-like"]
  found = sorted({int(m.group(1)) for name in stored if (m := pattern.match(name))})
  if found != list(range(num_layers)):
    held = f"{len(found)} layers ({found[0]}..{found[-1]})" if found else "no layers"
    raise CheckpointFormatError(
      f"config.json has {key} = {num_layers}, but the safetensors hold {held}"
    )


def _match(
  stored: Mapping[str, _Stored], prefix: str, tensors: list[_Tensor], tied: bool
) -> dict[str, str]:
  """{layout name: stored name}; raises for a missing or an unexpected tensor."""
  wanted = {t.name for t in tensors}
  names, unexpected = {}, []
  for name in stored:
    short = name.removeprefix(prefix)
    if short in wanted and short not in names:
      names[short] = name
    elif not any(re.fullmatch(p, name) for p in _BUFFERS) and not (tied and name == _TIED_HEAD):
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
    mesh: place each tensor on this mesh by `sharding.RULES` as it is read (a target
      larger than one device's memory never sits on one device); None = the default
      device.

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
  hf = _read_json(path / "config.json")
  config = config_from_hf(hf, dtype, max_len)
  stored = _stored_tensors(path)  # headers only: no tensor data is read here
  _check_layer_count(hf["model_type"], config.num_layers, stored)
  prefix, tensors = _layout(hf["model_type"], config)
  names = _match(stored, prefix, tensors, config.tied_embedding)
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
  flat = {}
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
      if mesh is None:
        flat[param_path] = jax.device_put(value)
      else:
        spec = sharding.logical_spec(sharding.param_axes(param_path), value.shape, mesh)
        flat[param_path] = sharding.put(value, NamedSharding(mesh, spec))
    del stored_array
  return ModelBundle(config=config, params=traverse_util.unflatten_dict(flat))
