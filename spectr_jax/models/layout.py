"""Parameter layouts: the stacked, fused layout the decoder runs on, the per-layer layout
of checkpoints written before it, and the weights a decode holds.

The decoder's layout (`transformer.Transformer`): every block parameter under "layers"
with a leading axis of Y layers; q, k and v fused as w_qkv (D x Hk x (G + 2) x Dh: per
key/value head its G query heads, its key, its value) and a gated MLP's gate and up as
w_gate_up (D x 2 x F), with their biases b_qkv and b_gate_up.

The per-layer layout (spectr-jax runs saved before the stack, and what the Hugging Face
loaders read): "block_<i>" per layer, with w_q (D x H x Dh), w_k, w_v (D x Hk x Dh),
b_q, b_k, b_v, w_gate and w_up (D x F), b_gate, b_up, and the rest as in the stack.
`stack_layers` maps it onto the decoder's layout and `unstack_layers` back; both work on
arrays or on shapes (`jax.ShapeDtypeStruct`).

Decoding holds the weights in the compute dtype (`for_decoding`): the matmuls then read
them as they are, with no convert per use, and a bfloat16 model holds half the bytes.
Training keeps float32 master weights and casts per use.

A decode whose stack runs unrolled holds the layers split ("layers_<i>", each one layer
of the stack without the leading axis: `split_layers`): an unrolled layer that sliced the
stacked arrays would copy its weights on every call (XLA's CPU and GPU backends
materialise a slice that feeds a matmul), and the program would hold a second copy of the
model. A scanned stack reads one layer per iteration (`scans` says which a model runs).
"""

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax.models.config import ModelConfig

_LAYER = re.compile(r"block_(\d+)$")
_SPLIT = re.compile(r"layers_(\d+)$")

# Stacks of at least this many layers run under `lax.scan` by default (one compiled layer);
# shallower ones unrolled (docs/PERFORMANCE.md, "Programs").
SCAN_MIN_LAYERS = 8


def scans(config: ModelConfig, scan_layers: bool | None = None, platform: str = "") -> bool:
  """Whether a model of `config` runs its stack under `lax.scan`: `scan_layers`, or when
  None: on a GPU (`platform`; "" = this process's default backend) never (there each
  layer of a scanned stack is sliced out of the stacked weights by a copy, every call,
  and the loop's thunks fall outside the CUDA graph the round runs in), elsewhere when it
  has at least `SCAN_MIN_LAYERS` layers (docs/ACCELERATORS.md)."""
  if scan_layers is not None:
    return bool(scan_layers)
  platform = platform or jax.default_backend()
  return platform not in ("gpu", "cuda", "rocm") and config.num_layers >= SCAN_MIN_LAYERS


def is_split(params: Mapping[str, Any]) -> bool:
  """Whether `params` holds its layers split ("layers_0", ...: `split_layers`)."""
  return any(_SPLIT.match(str(key)) for key in params)


def is_per_layer(params: Mapping[str, Any]) -> bool:
  """Whether `params` is in the per-layer layout ("block_0", ...)."""
  return any(_LAYER.match(str(key)) for key in params)


def _xp(x):
  """numpy for host arrays, jax.numpy otherwise (a loader keeps host arrays on the host)."""
  return np if isinstance(x, np.ndarray) else jnp


def _shape_only(x) -> bool:
  return isinstance(x, jax.ShapeDtypeStruct)


def _stack(parts, axis: int):
  """Stacks arrays (or shapes) along a new axis."""
  if _shape_only(parts[0]):
    shape = list(parts[0].shape)
    shape.insert(axis % (len(shape) + 1), len(parts))
    return jax.ShapeDtypeStruct(tuple(shape), parts[0].dtype)
  return _xp(parts[0]).stack(parts, axis=axis)


def _concat(parts, axis: int):
  """Concatenates arrays (or shapes) along an existing axis."""
  if _shape_only(parts[0]):
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    return jax.ShapeDtypeStruct(tuple(shape), parts[0].dtype)
  return _xp(parts[0]).concatenate(parts, axis=axis)


def _reshape(x, shape: tuple[int, ...]):
  if _shape_only(x):
    return jax.ShapeDtypeStruct(shape, x.dtype)
  return x.reshape(shape)


def _take(x, index, axis: int):
  """x[..., index, ...] along `axis` (an int or a slice), for arrays or shapes."""
  if _shape_only(x):
    shape = list(x.shape)
    if isinstance(index, slice):
      shape[axis] = len(range(*index.indices(shape[axis])))
    else:
      del shape[axis]
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)
  where = [slice(None)] * x.ndim
  where[axis] = index
  return x[tuple(where)]


def _fuse_block(block: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """One layer's parameters: per-projection -> fused (w_qkv, w_gate_up and biases)."""
  hk, g = config.num_kv_heads, config.num_groups
  out = dict(block)
  for kind, lead in (("w", 1), ("b", 0)):  # weights have D before the heads, biases not
    names = [f"{kind}_{n}" for n in "qkv"]
    if not all(n in block for n in names):
      continue
    q, k, v = (out.pop(n) for n in names)
    shape = q.shape[:lead] + (hk, g, q.shape[-1])
    kv_shape = k.shape[:lead] + (hk, 1, k.shape[-1])
    parts = [_reshape(q, shape), _reshape(k, kv_shape), _reshape(v, kv_shape)]
    out[f"{kind}_qkv"] = _concat(parts, axis=lead + 1)
  for kind, lead in (("w", 1), ("b", 0)):
    gate, up = f"{kind}_gate", f"{kind}_up"
    if gate in block:
      out[f"{kind}_gate_up"] = _stack([out.pop(gate), out.pop(up)], axis=lead)
  return out


def _split_block(block: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """One layer's parameters: fused -> per-projection (the inverse of `_fuse_block`)."""
  h, g = config.num_heads, config.num_groups
  out = dict(block)
  for kind, lead in (("w", 1), ("b", 0)):
    if f"{kind}_qkv" in block:
      qkv = out.pop(f"{kind}_qkv")
      q = _take(qkv, slice(0, g), lead + 1)
      out[f"{kind}_q"] = _reshape(q, qkv.shape[:lead] + (h, qkv.shape[-1]))
      out[f"{kind}_k"] = _take(qkv, g, lead + 1)
      out[f"{kind}_v"] = _take(qkv, g + 1, lead + 1)
    if f"{kind}_gate_up" in block:
      gate_up = out.pop(f"{kind}_gate_up")
      out[f"{kind}_gate"], out[f"{kind}_up"] = _take(gate_up, 0, lead), _take(gate_up, 1, lead)
  return out


def _map_leaves(fn, *trees):
  """fn over the leaves of nested dicts (arrays and shapes are leaves)."""
  if isinstance(trees[0], Mapping):
    return {key: _map_leaves(fn, *(t[key] for t in trees)) for key in trees[0]}
  return fn(*trees)


def stack_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """The per-layer layout -> the decoder's (fused projections, layers stacked).

  Args:
    params: parameters (or shapes) in the per-layer layout; parameters that are no
      layer's pass unchanged.
    config: their model config.

  Returns:
    The parameters in the decoder's layout.

  Raises:
    ValueError: the layers are not block_0 .. block_<Y-1> of config.num_layers.
  """
  layers = sorted(
    (int(m.group(1)), key) for key in params if (m := _LAYER.match(str(key))) is not None
  )
  if [i for i, _ in layers] != list(range(config.num_layers)):
    raise ValueError(
      f"per-layer parameters hold layers {[i for i, _ in layers]}, the config "
      f"{config.num_layers} (block_0 .. block_{config.num_layers - 1})"
    )
  blocks = [_fuse_block(params[key], config) for _, key in layers]
  out = {key: value for key, value in params.items() if not _LAYER.match(str(key))}
  out["layers"] = _map_leaves(lambda *xs: _stack(list(xs), axis=0), *blocks)
  return out


class LayerStacker:
  """Builds the decoder's layout from per-layer parameters given one at a time (a
  loader's tensors, in any order): a layer's parameters are fused as soon as all of them
  are in and written into stacked host arrays allocated once, so the host holds the
  model once plus the layers still incomplete.

  Args:
    shapes: the decoder-layout parameters' shapes (`jax.ShapeDtypeStruct`s, e.g. an
      abstract `init_params`); the arrays are allocated in `dtype`.
    config: the model config.
    dtype: the numpy dtype of the parameters.
  """

  def __init__(self, shapes: Mapping[str, Any], config: ModelConfig, dtype):
    self._config = config
    self._layers = _map_leaves(lambda x: np.empty(x.shape, dtype), shapes["layers"])
    one_layer = _map_leaves(lambda x: _take(x, 0, 0), shapes["layers"])
    self._per_layer = len(jax.tree.leaves(_split_block(one_layer, config)))
    self._pending: dict[int, dict[str, Any]] = {}
    self._done: set[int] = set()
    self._rest: dict[tuple[str, ...], Any] = {}

  def add(self, path: tuple[str, ...], value: np.ndarray) -> None:
    """Adds the parameter at `path` of the per-layer layout (e.g. ("block_3", "w_q"))."""
    match = _LAYER.match(str(path[0]))
    if match is None:
      self._rest[path] = value
      return
    layer = int(match.group(1))
    block = self._pending.setdefault(layer, {})
    where = block
    for key in path[1:-1]:
      where = where.setdefault(key, {})
    where[path[-1]] = value
    if len(jax.tree.leaves(block)) == self._per_layer:
      fused = _fuse_block(self._pending.pop(layer), self._config)

      def write(stacked, x, layer=layer):
        stacked[layer] = x

      _map_leaves(write, self._layers, fused)
      self._done.add(layer)

  def params(self) -> dict[str, Any]:
    """The parameters in the decoder's layout (host arrays).

    Raises:
      ValueError: a layer is incomplete or missing.
    """
    missing = sorted(set(range(self._config.num_layers)) - self._done)
    if missing:
      raise ValueError(f"layers {missing} of the per-layer parameters are incomplete or missing")
    out: dict[str, Any] = {}
    for path, value in self._rest.items():
      where = out
      for key in path[:-1]:
        where = where.setdefault(key, {})
      where[path[-1]] = value
    out["layers"] = self._layers
    return out


def unstack_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """The decoder's layout, stacked or split -> the per-layer layout (the inverse of
  `stack_layers`)."""
  if not is_split(params):
    params = split_layers(params, config)
  out = {key: value for key, value in params.items() if not _SPLIT.match(str(key))}
  for i in range(config.num_layers):
    out[f"block_{i}"] = _split_block(params[f"layers_{i}"], config)
  return out


def split_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """The stacked layers -> one entry per layer ("layers_<i>": layer i of every stacked
  parameter), for an unrolled stack; works on arrays, shapes and logical-axes tuples
  (whose leading "layers" name goes)."""
  out = {key: value for key, value in params.items() if key != "layers"}
  for i in range(config.num_layers):
    out[f"layers_{i}"] = _map_leaves(
      lambda x, i=i: x[1:] if isinstance(x, tuple) else _take(x, i, 0), params["layers"]
    )
  return out


def join_layers(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """The inverse of `split_layers` (arrays or shapes)."""
  split = [params[f"layers_{i}"] for i in range(config.num_layers)]
  out = {key: value for key, value in params.items() if not _SPLIT.match(str(key))}
  out["layers"] = _map_leaves(lambda *xs: _stack(list(xs), axis=0), *split)
  return out


def for_decoding(
  params: Any, config: ModelConfig, scan_layers: bool | None = None, platform: str = ""
) -> Any:
  """The parameters as a decode holds them: every float in the compute dtype (cast once
  here, so no round converts a weight), the layers stacked for a scanned stack and split
  for an unrolled one (`scans(config, scan_layers, platform)`).

  Arrays stay where they are (a sharded array keeps its sharding); host arrays stay on
  the host.
  """
  if is_per_layer(params):
    params = stack_layers(params, config)
  scanned = scans(config, scan_layers, platform)
  if scanned and is_split(params):
    params = join_layers(params, config)
  elif not scanned and "layers" in params:
    params = split_layers(params, config)
  dtype = config.compute_dtype

  def cast(x):
    if _shape_only(x):
      return jax.ShapeDtypeStruct(x.shape, dtype if _floating(x) else x.dtype, sharding=x.sharding)
    if not _floating(x) or x.dtype == dtype:
      return x
    return x.astype(dtype)

  return jax.tree.map(cast, params)


def _floating(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)
