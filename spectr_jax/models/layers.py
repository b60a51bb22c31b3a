"""The decoder's shared pieces: parameters with logical axes, the token embedding, RMSNorm,
rotary positions, soft-caps, and the base of the families' blocks (attention and MLP).

Every parameter is created with the logical axis name of each dimension (`logical`, as
MaxText's `nn.with_logical_partitioning`): `init` returns it boxed in `Logical`, the
models' `param_axes` reads the names from an abstract init, and parameters themselves are
plain arrays (`flax.core.meta.unbox`). A new layer therefore needs no sharding table
entry; `spectr_jax.sharding.RULES` maps the logical names to mesh axes:

  embed      model width D           vocab      embedding and output rows V
  heads      query heads H           kv_heads   key/value heads Hk
  head_dim   Dh                      mlp        MLP width F
  positions  rows of a learned position table
  layers     the stacked layers Y (added by the layer stack, `transformer.Transformer`)
  qkv        a key/value head's G queries, its key and its value (G + 2, fused w_qkv)
  gate_up    the gate and up halves of a gated MLP's fused input projection (2)

Projections that read the same input are one matmul each: q, k and v (`w_qkv`, grouped by
key/value head, so sharding the key/value heads keeps every group on one device) and a
gated MLP's gate and up (`w_gate_up`). Checkpoints stored per projection map onto these
in `spectr_jax.models.layout`.

Letters beyond the package legend: Dh head width, F MLP width, G query heads per key/value
head, X any leading shape.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.core import meta

from spectr_jax.models.config import ModelConfig, RopeScaling


class Logical(struct.PyTreeNode, meta.AxisMetadata):
  """A parameter as `init` creates it: its value and the logical name of each dimension.

  Unlike flax's `LogicallyPartitioned`, unboxing never adds a sharding constraint: where a
  parameter lives is decided once, by `spectr_jax.sharding` from these names.
  """

  value: Any
  names: tuple[str, ...] = struct.field(pytree_node=False)

  def unbox(self) -> Any:
    return self.value

  def replace_boxed(self, val: Any) -> "Logical":
    return self.replace(value=val)

  def add_axis(self, index: int, params: dict[Any, Any]) -> "Logical":
    """The parameter stacked by a lifted transform (the layer stack's `nn.scan`): the new
    dimension is named by its `nn.PARTITION_NAME` metadata."""
    names = list(self.names)
    names.insert(index, params[nn.PARTITION_NAME])
    return self.replace(names=tuple(names))

  def remove_axis(self, index: int, params: dict[Any, Any]) -> "Logical":
    del params
    return self.replace(names=self.names[:index] + self.names[index + 1 :])


@dataclasses.dataclass(frozen=True)
class Window:
  """A sliding attention window: a query at position t sees keys at positions > t - size,
  on the layers whose index is a multiple of `every` (1: every layer; Gemma 2: 2)."""

  size: int
  every: int = 1


# attend(q_XxHxDh, k_XxHkxDh, v_XxHkxDh, *, window, softcap) -> (o_XxHxDh, kv): the attention
# of one layer in the calling mode (`spectr_jax.models.attention`: the causal forward, the
# tails or a token tree against a cached prefix), window a `Window` or None; kv is what that
# mode keeps of the layer (its new keys and values, written to the cache after the stack).
Attend = Callable[..., tuple[jax.Array, Any]]


def logical(init: Callable[..., jax.Array], *names: str) -> Callable[..., Logical]:
  """The initializer `init` with each dimension of its result named (`Logical`)."""

  def boxed(*args, **kwargs) -> Logical:
    value = init(*args, **kwargs)
    if len(names) != value.ndim:
      raise ValueError(f"logical axes {names} do not match a parameter of shape {value.shape}")
    return Logical(value, names)

  return boxed


def embedding(config: ModelConfig, name: str | None = None) -> nn.Embed:
  """The V x D token embedding (initialised N(0, 1); computed in the compute dtype)."""
  return nn.Embed(
    config.vocab_size,
    config.d_model,
    embedding_init=logical(nn.initializers.normal(1.0), "vocab", "embed"),
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    name=name,
  )


def rms_norm(config: ModelConfig, name: str | None = None) -> nn.RMSNorm:
  """RMSNorm with scale w (param "scale", initialised to 1)."""
  return nn.RMSNorm(
    epsilon=config.norm_eps,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    scale_init=logical(nn.initializers.ones, "embed"),
    name=name,
  )


def _llama3_frequencies(freq_Half: jax.Array, scaling: RopeScaling) -> jax.Array:
  """Llama 3.1's rescaled frequencies: long wavelengths / factor, a smooth band between."""
  wavelen_Half = 2 * math.pi / freq_Half
  long_wavelen = scaling.original_max_len / scaling.low_freq_factor
  short_wavelen = scaling.original_max_len / scaling.high_freq_factor
  stretched_Half = jnp.where(wavelen_Half > long_wavelen, freq_Half / scaling.factor, freq_Half)
  smooth_Half = (scaling.original_max_len / wavelen_Half - scaling.low_freq_factor) / (
    scaling.high_freq_factor - scaling.low_freq_factor
  )
  smoothed_Half = (1 - smooth_Half) * freq_Half / scaling.factor + smooth_Half * freq_Half
  between_Half = (wavelen_Half >= short_wavelen) & (wavelen_Half <= long_wavelen)
  return jnp.where(between_Half, smoothed_Half, stretched_Half)


def rope_frequencies(config: ModelConfig) -> jax.Array:
  """The Dh / 2 rotary frequencies base^(-i / (Dh / 2)), float32, rescaled if configured."""
  half = config.head_dim // 2
  freq_Half = config.rope_base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if config.rope_scaling is not None:
    freq_Half = _llama3_frequencies(freq_Half, config.rope_scaling)
  return freq_Half


def rope(x_XxHxDh: jax.Array, pos_X: jax.Array, freq_Half: jax.Array) -> jax.Array:
  """Rotates the two halves of every head by the angles pos * freq (in float32)."""
  angle_XxHalf = pos_X.astype(jnp.float32)[..., None] * freq_Half
  sin = jnp.sin(angle_XxHalf)[..., None, :]
  cos = jnp.cos(angle_XxHalf)[..., None, :]
  x1, x2 = jnp.split(x_XxHxDh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_XxHxDh.dtype)


def window(config: ModelConfig, every: int = 1) -> Window | None:
  """The config's sliding window on the layers whose index is a multiple of `every`."""
  return None if config.sliding_window is None else Window(config.sliding_window, every)


def gelu_tanh(x: jax.Array) -> jax.Array:
  """The tanh-approximated GELU (Gemma's GeGLU gate, GPT-2's MLP)."""
  return jax.nn.gelu(x, approximate=True)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(x / cap), or x unchanged when cap is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)


class Block(nn.Module):
  """The base of the families' decoder blocks: attention and MLP over parameters with
  logical axes, for a family's `__call__(x_XxD, pos_X, attend) -> (x_XxD, kv)` (under
  `nn.compact`) to compose. The layer stack (`transformer.Transformer`) stacks every
  block parameter along a leading "layers" axis.

  `attend` (`Attend`) is the attention of this layer in the calling mode.

  Attributes:
    config: the model hyper-parameters.
  """

  config: ModelConfig

  def weight(
    self, name: str, shape: tuple[int, ...], axes: tuple[str, ...], in_axis=0, out_axis=-1
  ) -> jax.Array:
    """A weight (created float32, LeCun-normal over in_axis) named `name`, in the compute
    dtype (no operation when it is stored in it: `layout.for_decoding`)."""
    init = logical(nn.initializers.lecun_normal(in_axis=in_axis, out_axis=out_axis), *axes)
    return self.param(name, init, shape, jnp.float32).astype(self.config.compute_dtype)

  def bias(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...]) -> jax.Array:
    """A bias (created float32, zeros) named `name`, in the compute dtype."""
    bias = self.param(name, logical(nn.initializers.zeros, *axes), shape, jnp.float32)
    return bias.astype(self.config.compute_dtype)

  def self_attention(
    self,
    y_XxD: jax.Array,
    pos_X: jax.Array,
    attend: Attend,
    *,
    qkv_bias: bool = False,
    out_bias: bool = False,
    query_scale: float | None = None,
    window: Window | None = None,
    softcap: float | None = None,
  ) -> tuple[jax.Array, Any]:
    """Grouped-query self-attention: w_qkv (b_qkv with qkv_bias), w_o (b_o with out_bias),
    queries times query_scale (None: Dh^-1/2), RoPE where the config has a rope_base,
    `attend` with the window and soft-cap of the scores.

    w_qkv is D x Hk x (G + 2) x Dh: for key/value head n, its G query heads (query head
    n G + g), then its key, then its value."""
    cfg = self.config
    d, h, hk, g, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim
    axes = ("embed", "kv_heads", "qkv", "head_dim")
    w_qkv = self.weight("w_qkv", (d, hk, g + 2, dh), axes, 0, (1, 2, 3))
    w_o = self.weight("w_o", (h, dh, d), ("heads", "head_dim", "embed"), (0, 1), 2)
    qkv_XxHkxG2xDh = jnp.einsum("...d,dngk->...ngk", y_XxD, w_qkv)
    if qkv_bias:
      qkv_XxHkxG2xDh = qkv_XxHkxG2xDh + self.bias("b_qkv", (hk, g + 2, dh), axes[1:])
    q_XxHxDh = qkv_XxHkxG2xDh[..., :g, :].reshape(*y_XxD.shape[:-1], h, dh)
    k_XxHkxDh, v_XxHkxDh = qkv_XxHkxG2xDh[..., g, :], qkv_XxHkxG2xDh[..., g + 1, :]
    q_XxHxDh = q_XxHxDh * (dh**-0.5 if query_scale is None else query_scale)
    if cfg.rope_base is not None:
      freq_Half = rope_frequencies(cfg)
      q_XxHxDh = rope(q_XxHxDh, pos_X, freq_Half)
      k_XxHkxDh = rope(k_XxHkxDh, pos_X, freq_Half)
    o_XxHxDh, kv = attend(q_XxHxDh, k_XxHkxDh, v_XxHkxDh, window=window, softcap=softcap)
    attn_XxD = jnp.einsum("...hk,hkd->...d", o_XxHxDh.astype(w_o.dtype), w_o)
    if out_bias:
      attn_XxD = attn_XxD + self.bias("b_o", (d,), ("embed",))
    return attn_XxD, kv

  def mlp(
    self,
    y_XxD: jax.Array,
    activation: Callable[[jax.Array], jax.Array],
    *,
    gated: bool = True,
    bias: bool = False,
  ) -> jax.Array:
    """activation(y W_gate) * y W_up (gated: SwiGLU, GeGLU; W_gate and W_up are the two
    halves of w_gate_up, D x 2 x F) or activation(y W_up), then W_down; b_gate_up or b_up,
    and b_down, with `bias`."""
    d, f = self.config.d_model, self.config.mlp_dim
    if gated:
      w_in = self.weight("w_gate_up", (d, 2, f), ("embed", "gate_up", "mlp"), 0, (1, 2))
      in_XxCxF = jnp.einsum("...d,dcf->...cf", y_XxD, w_in)
      if bias:
        in_XxCxF = in_XxCxF + self.bias("b_gate_up", (2, f), ("gate_up", "mlp"))
      hidden_XxF = activation(in_XxCxF[..., 0, :]) * in_XxCxF[..., 1, :]
    else:
      up_XxF = y_XxD @ self.weight("w_up", (d, f), ("embed", "mlp"))
      if bias:
        up_XxF = up_XxF + self.bias("b_up", (f,), ("mlp",))
      hidden_XxF = activation(up_XxF)
    out_XxD = hidden_XxF @ self.weight("w_down", (f, d), ("mlp", "embed"))
    if bias:
      out_XxD = out_XxD + self.bias("b_down", (d,), ("embed",))
    return out_XxD


class SequentialBlock(Block):
  """A pre-norm block: x += attn(norm(x)), then x += mlp(mlp_norm(x)) (Llama, Gemma,
  GPT-2). A family says which norm, attention and MLP (`make_norm`, `attention`,
  `feed_forward`), and may normalise each output before the residual add (`post_norm`,
  Gemma 2)."""

  def make_norm(self, name: str) -> nn.Module:
    """The family's norm module named `name`."""
    raise NotImplementedError

  def attention(self, y_XxD: jax.Array, pos_X: jax.Array, attend: Attend):
    """The family's self-attention of the normalised input: (attn_XxD, kv)."""
    return self.self_attention(y_XxD, pos_X, attend, window=window(self.config))

  def feed_forward(self, y_XxD: jax.Array) -> jax.Array:
    """The family's MLP of the normalised input."""
    raise NotImplementedError

  def post_norm(self, x_XxD: jax.Array, name: str) -> jax.Array:
    """What the attention and MLP outputs go through before the residual add (nothing)."""
    del name
    return x_XxD

  @nn.compact
  def __call__(self, x_XxD: jax.Array, pos_X: jax.Array, attend: Attend) -> tuple[jax.Array, Any]:
    attn_XxD, kv = self.attention(self.make_norm("norm")(x_XxD), pos_X, attend)
    x_XxD = x_XxD + self.post_norm(attn_XxD, "post_attn_norm")
    mlp_XxD = self.feed_forward(self.make_norm("mlp_norm")(x_XxD))
    return x_XxD + self.post_norm(mlp_XxD, "post_mlp_norm"), kv
