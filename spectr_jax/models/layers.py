"""The decoder's interchangeable pieces: norms, rotary positions, MLP activations, soft-caps.

Letters beyond the package legend: Dh head width, F MLP width, X any leading shape.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models.config import ModelConfig, RopeScaling


class OffsetRMSNorm(nn.Module):
  """RMSNorm with the scale stored as an offset from 1: x / rms(x) * (1 + w) (Gemma).

  Computed in float32 and cast to `dtype`. The scale initialises to 0 (a unit scale).
  """

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_XxD: jax.Array) -> jax.Array:
    scale_D = self.param("scale", nn.initializers.zeros, (x_XxD.shape[-1],), self.param_dtype)
    x_XxD = x_XxD.astype(jnp.float32)
    mean_square_Xx1 = jnp.mean(jnp.square(x_XxD), axis=-1, keepdims=True)
    y_XxD = x_XxD * jax.lax.rsqrt(mean_square_Xx1 + self.epsilon)
    return (y_XxD * (1.0 + scale_D.astype(jnp.float32))).astype(self.dtype)


def make_norm(config: ModelConfig, name: str | None = None) -> nn.Module:
  """Returns the norm module of `config.norm` (params "scale", and "bias" for LayerNorm)."""
  kwargs = dict(
    epsilon=config.norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32, name=name
  )
  if config.norm == "rms":
    return nn.RMSNorm(**kwargs)
  if config.norm == "layernorm":
    return nn.LayerNorm(use_fast_variance=False, **kwargs)
  return OffsetRMSNorm(**kwargs)


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


def mlp_activation(config: ModelConfig, x_XxF: jax.Array) -> jax.Array:
  """The MLP nonlinearity: silu for SwiGLU, tanh-approximated GELU otherwise."""
  if config.mlp == "swiglu":
    return jax.nn.silu(x_XxF)
  return jax.nn.gelu(x_XxF, approximate=True)


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(x / cap), or x unchanged when cap is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)
