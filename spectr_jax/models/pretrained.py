"""Open-weight checkpoints in the Hugging Face layout, loaded into the project's decoder.

`load_pretrained(directory)` reads `config.json` and `model.safetensors` (or the shards
listed by `model.safetensors.index.json`) of a Llama-like (llama, mistral), Qwen2, Gemma,
Gemma 2 or GPT-2 model, maps every tensor onto the parameter tree of `Transformer`, and
returns a `ModelBundle` that the engine decodes like a trained pair. Tensors move to the
device one at a time (read, reshape, cast, `jax.device_put`, dropped), so the host never
holds more than the largest tensor beyond the device copy. docs/MODELS.md lists what each
family reads and what is not supported.
"""

import contextlib
import dataclasses
import json
import math
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import traverse_util
from jax.sharding import NamedSharding
from safetensors import safe_open

from spectr_jax import sharding
from spectr_jax.models.bundle import ModelBundle
from spectr_jax.models.config import ModelConfig, RopeScaling

# The cache capacity S when max_len is not given: max_position_embeddings, at most this.
DEFAULT_MAX_LEN = 4096

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "gemma", "gemma2")
MODEL_TYPES = (*_LLAMA_LIKE, "gpt2")

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")

# Tensors that real checkpoints carry but that are no parameters: skipped by name.
_BUFFERS = (
  r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq",  # RoPE frequencies (recomputed)
  r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",  # GPT-2's causal mask buffers
)
_TIED_HEAD = "lm_head.weight"  # a redundant copy of the embedding in some tied checkpoints


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


def _get(hf: Mapping[str, Any], key: str, default: Any = ...) -> Any:
  value = hf.get(key)
  if value is None:
    if default is ...:
      raise CheckpointFormatError(f"config.json has no {key!r}")
    return default
  return value


def _unsupported(message: str) -> CheckpointFormatError:
  return CheckpointFormatError(f"not supported: {message}")


def _rope_scaling(hf: Mapping[str, Any]) -> RopeScaling | None:
  scaling = hf.get("rope_scaling")
  if not scaling:
    return None
  kind = scaling.get("rope_type", scaling.get("type"))
  if kind == "default":
    return None
  if kind != "llama3":
    raise _unsupported(f"rope_scaling type {kind!r} (only 'llama3' and 'default' are)")
  return RopeScaling(
    factor=float(scaling["factor"]),
    low_freq_factor=float(scaling["low_freq_factor"]),
    high_freq_factor=float(scaling["high_freq_factor"]),
    original_max_len=int(scaling["original_max_position_embeddings"]),
  )


def _gemma2_sliding(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
  """Gemma 2's window on the even layers (or what `layer_types` says, if it says that)."""
  window = hf.get("sliding_window")
  layer_types = hf.get("layer_types")
  if layer_types is None:
    return dict(sliding_window=window, sliding_window_layers="even")
  even = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
  if list(layer_types) == even:
    return dict(sliding_window=window, sliding_window_layers="even")
  if set(layer_types) == {"full_attention"}:
    return dict(sliding_window=None)
  raise _unsupported(f"layer_types {layer_types} (only Gemma 2's alternation is)")


def _llama_like_fields(hf: Mapping[str, Any], model_type: str) -> dict[str, Any]:
  d = _get(hf, "hidden_size")
  h = _get(hf, "num_attention_heads")
  gemma = model_type in ("gemma", "gemma2")
  if gemma:
    activation = _get(hf, "hidden_activation", "gelu_pytorch_tanh")
    if activation not in _TANH_GELU:
      raise _unsupported(f"hidden_activation {activation!r} (Gemma's MLP is tanh-GELU here)")
  elif _get(hf, "hidden_act", "silu") != "silu":
    raise _unsupported(f"hidden_act {hf['hidden_act']!r} (the {model_type} MLP is SwiGLU)")
  attention_bias = model_type == "qwen2" or bool(hf.get("attention_bias"))
  fields = dict(
    vocab_size=_get(hf, "vocab_size"),
    d_model=d,
    num_layers=_get(hf, "num_hidden_layers"),
    num_heads=h,
    num_kv_heads=_get(hf, "num_key_value_heads", h),
    head_dim=_get(hf, "head_dim", d // h),
    mlp_dim=_get(hf, "intermediate_size"),
    rope_base=float(_get(hf, "rope_theta", 10000.0)),
    norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)),
    rope_scaling=_rope_scaling(hf),
    block="sequential",
    norm="rms_offset" if gemma else "rms",
    mlp="geglu" if gemma else "swiglu",
    qkv_bias=attention_bias,
    out_bias=attention_bias and model_type != "qwen2",
    mlp_bias=bool(hf.get("mlp_bias")),
    embed_scale=gemma,
    tied_embedding=bool(_get(hf, "tie_word_embeddings", gemma)),
    scale_logits=False,
  )
  if model_type == "qwen2" and hf.get("use_sliding_window"):
    raise _unsupported("Qwen2's use_sliding_window (sliding layers from max_window_layers on)")
  if model_type == "mistral":
    fields["sliding_window"] = hf.get("sliding_window")
  if model_type == "gemma2":
    fields.update(
      post_norms=True,
      query_scale=float(_get(hf, "query_pre_attn_scalar")) ** -0.5,
      attn_softcap=hf.get("attn_logit_softcapping"),
      final_softcap=hf.get("final_logit_softcapping"),
      **_gemma2_sliding(hf, fields["num_layers"]),
    )
  return fields


def _gpt2_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  d = _get(hf, "n_embd")
  h = _get(hf, "n_head")
  activation = _get(hf, "activation_function", "gelu_new")
  if activation not in _TANH_GELU:
    raise _unsupported(f"activation_function {activation!r} (GPT-2's MLP is tanh-GELU here)")
  if hf.get("scale_attn_by_inverse_layer_idx") or not _get(hf, "scale_attn_weights", True):
    raise _unsupported("GPT-2 attention scaling other than 1 / sqrt(head_dim)")
  return dict(
    vocab_size=_get(hf, "vocab_size"),
    d_model=d,
    num_layers=_get(hf, "n_layer"),
    num_heads=h,
    num_kv_heads=h,
    head_dim=d // h,
    mlp_dim=_get(hf, "n_inner", 4 * d),
    norm_eps=float(_get(hf, "layer_norm_epsilon", 1e-5)),
    block="sequential",
    norm="layernorm",
    mlp="gelu",
    positions="learned",
    num_positions=_get(hf, "n_positions"),
    qkv_bias=True,
    out_bias=True,
    mlp_bias=True,
    tied_embedding=bool(_get(hf, "tie_word_embeddings", True)),
    scale_logits=False,
  )


def _dtype_name(hf: Mapping[str, Any], dtype: Any) -> str:
  if dtype is None:
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
  name = str(dtype).removeprefix("torch.") if isinstance(dtype, str) else np.dtype(dtype).name
  if name not in _DTYPES:
    raise _unsupported(f"dtype {name!r} (use one of {tuple(_DTYPES)})")
  return name


def config_from_hf(
  hf: Mapping[str, Any], dtype: Any = None, max_len: int | None = None
) -> ModelConfig:
  """The `ModelConfig` of a Hugging Face config.json dict.

  Args:
    hf: the parsed config.json.
    dtype: the compute (and parameter) dtype; None = the checkpoint's torch_dtype.
    max_len: S, the KV-cache capacity; None = min(max_position_embeddings, DEFAULT_MAX_LEN);
      past max_position_embeddings RoPE models extrapolate, GPT-2 refuses.

  Returns:
    The config (logits over all vocab_size embedding rows; restrict with output_vocab_size).

  Raises:
    CheckpointFormatError: for an unknown model_type or a feature this decoder lacks.
  """
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
  fields = _gpt2_fields(hf) if model_type == "gpt2" else _llama_like_fields(hf, model_type)
  positions = fields.get("num_positions") or _get(hf, "max_position_embeddings")
  if max_len is None:
    max_len = min(positions, DEFAULT_MAX_LEN)
  if max_len < 1:
    raise CheckpointFormatError(f"max_len must be >= 1, got {max_len}")
  # RoPE extrapolates past the trained context (at the user's word); a table cannot.
  if model_type == "gpt2" and max_len > positions:
    raise CheckpointFormatError(
      f"max_len {max_len} exceeds GPT-2's n_positions = {positions} (its position table)"
    )
  try:
    return ModelConfig(max_len=max_len, dtype=_dtype_name(hf, dtype), **fields)
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


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    raise FileNotFoundError(f"no {path.name} in {path.parent}")
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as error:
    raise CheckpointFormatError(f"{path} is not valid JSON: {error}") from error


def _tensor_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
  """{stored tensor name: its safetensors file} from model.safetensors or the index."""
  index = directory / "model.safetensors.index.json"
  if index.is_file():
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointFormatError(f"{index} has no weight_map")
    files = {name: directory / file for name, file in weight_map.items()}
  elif (directory / "model.safetensors").is_file():
    with safe_open(directory / "model.safetensors", framework="numpy") as f:
      return {name: directory / "model.safetensors" for name in f.keys()}
  else:
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {directory}")
  for file in sorted(set(files.values())):
    if not file.is_file():
      raise FileNotFoundError(f"{file.name}, listed in {index.name}, is missing in {directory}")
  return files


def _match(
  files: Mapping[str, pathlib.Path], prefix: str, tensors: list[_Tensor], tied: bool
) -> dict[str, str]:
  """{layout name: stored name}; raises for a missing or an unexpected tensor."""
  wanted = {t.name for t in tensors}
  stored, unexpected = {}, []
  for name in files:
    short = name.removeprefix(prefix)
    if short in wanted and short not in stored:
      stored[short] = name
    elif not any(re.fullmatch(p, name) for p in _BUFFERS) and not (tied and name == _TIED_HEAD):
      unexpected.append(name)
  if unexpected:
    name = unexpected[0]
    raise CheckpointFormatError(
      f"unexpected tensor {name!r} in {files[name].name} ({len(unexpected)} in all): not part "
      "of this model_type / config.json (or stored twice)"
    )
  missing = [t.name for t in tensors if t.name not in stored]
  if missing:
    names = ", ".join(repr(n if n == _TIED_HEAD else prefix + n) for n in missing[:3])
    shards = ", ".join(sorted({f.name for f in files.values()}))
    raise CheckpointFormatError(f"missing tensor {names} ({len(missing)} in all) in {shards}")
  return stored


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
    CheckpointFormatError: unknown model_type, unsupported feature, missing or
      unexpected tensor, or a tensor whose shape config.json contradicts.
  """
  path = pathlib.Path(directory).expanduser()
  hf = _read_json(path / "config.json")
  config = config_from_hf(hf, dtype, max_len)
  prefix, tensors = _layout(hf["model_type"], config)
  files = _tensor_files(path)
  stored = _match(files, prefix, tensors, config.tied_embedding)
  np_dtype = _DTYPES[config.dtype]
  flat = {}
  with contextlib.ExitStack() as stack:  # headers only: no tensor data is read here
    headers = {
      file: stack.enter_context(safe_open(file, framework="numpy"))
      for file in sorted(set(files.values()))
    }
    for t in tensors:
      name = stored[t.name]
      shape = tuple(headers[files[name]].get_slice(name).get_shape())
      if shape != t.shape:
        raise CheckpointFormatError(
          f"tensor {name!r} in {files[name].name} has shape {shape}; config.json implies {t.shape}"
        )
  for t in tensors:
    name = stored[t.name]
    # One open per tensor: closing unmaps the file, so its pages leave this process.
    with safe_open(files[name], framework="numpy") as f:
      stored_array = f.get_tensor(name)
    for param_path, value in t.convert(stored_array).items():
      value = np.asarray(value, np_dtype)
      if mesh is None:
        flat[param_path] = jax.device_put(value)
      else:
        spec = sharding.logical_spec(sharding.param_axes(param_path), value.shape, mesh)
        flat[param_path] = sharding.put(value, NamedSharding(mesh, spec))
    del stored_array
  return ModelBundle(config=config, params=traverse_util.unflatten_dict(flat))
