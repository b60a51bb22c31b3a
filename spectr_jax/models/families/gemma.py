"""Gemma and Gemma 2 (Hugging Face model_type "gemma", "gemma2"): the Llama layout with
RMSNorm of scale 1 + w, GeGLU (tanh-GELU gate), embeddings times sqrt(D) and a tied
output layer; Gemma 2 adds post-norms on the attention and MLP outputs, its own query
scale, soft-capped attention scores and logits, and a sliding window on the even layers
(`Gemma2Options`).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import hf, layers
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import llama


class OffsetRMSNorm(nn.Module):
  """RMSNorm with the scale stored as an offset from 1: x / rms(x) * (1 + w).

  Computed in float32 and cast to `dtype`. The scale initialises to 0 (a unit scale).
  """

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_XxD: jax.Array) -> jax.Array:
    init = layers.logical(nn.initializers.zeros, "embed")
    scale_D = self.param("scale", init, (x_XxD.shape[-1],), self.param_dtype)
    x_XxD = x_XxD.astype(jnp.float32)
    mean_square_Xx1 = jnp.mean(jnp.square(x_XxD), axis=-1, keepdims=True)
    y_XxD = x_XxD * jax.lax.rsqrt(mean_square_Xx1 + self.epsilon)
    return (y_XxD * (1.0 + scale_D.astype(jnp.float32))).astype(self.dtype)


def offset_rms_norm(config: ModelConfig, name: str | None = None) -> OffsetRMSNorm:
  """Gemma's norm of the config."""
  return OffsetRMSNorm(
    epsilon=config.norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32, name=name
  )


class ScaledEmbed(nn.Embed):
  """The token embedding times sqrt(D), rounded to the compute dtype (as transformers
  does); the tied output layer (`attend`) reads the table unscaled."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    return super().__call__(inputs) * jnp.asarray(self.features**0.5, self.dtype)


class Block(llama.Block):
  """Gemma's block: Llama's with Gemma's norm and GeGLU."""

  def make_norm(self, name: str) -> nn.Module:
    return offset_rms_norm(self.config, name)

  def feed_forward(self, y_XxD: jax.Array) -> jax.Array:
    opts = self.config.options or llama.LlamaOptions()
    return self.mlp(y_XxD, layers.gelu_tanh, bias=opts.mlp_bias)


@dataclasses.dataclass(frozen=True)
class Gemma2Options(llama.LlamaOptions):
  """Gemma 2's options beside the biases.

  Attributes:
    query_scale: the factor of the queries (None: head_dim ** -0.5; Gemma 2 uses
      query_pre_attn_scalar ** -0.5).
    attn_softcap: attention scores become c * tanh(score / c), or None.
    final_softcap: logits become c * tanh(logit / c), or None.
  """

  query_scale: float | None = None
  attn_softcap: float | None = None
  final_softcap: float | None = None

  def __post_init__(self):
    for name in ("query_scale", "attn_softcap", "final_softcap"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"{name} must be positive (or None), got {value}")


def layer_window(config: ModelConfig) -> layers.Window | None:
  """Gemma 2's sliding window: on the even layers (0-based)."""
  return layers.window(config, every=2)


class Gemma2Block(Block):
  """Gemma 2's block: Gemma's with post-norms, the query scale, soft-capped scores and
  the window on the even layers."""

  def attention(self, y_XxD: jax.Array, pos_X: jax.Array, attend: layers.Attend):
    opts = self.config.options or Gemma2Options()
    return self.self_attention(
      y_XxD,
      pos_X,
      attend,
      qkv_bias=opts.qkv_bias,
      out_bias=opts.out_bias,
      query_scale=opts.query_scale,
      window=layer_window(self.config),
      softcap=opts.attn_softcap,
    )

  def post_norm(self, x_XxD: jax.Array, name: str) -> jax.Array:
    return offset_rms_norm(self.config, name)(x_XxD)


class Gemma(llama.Llama):
  """Gemma (`ModelConfig.family` "gemma"; options: the biases, `llama.LlamaOptions`)."""

  name = "gemma"
  block = Block
  model_types = ("gemma",)
  # hidden_act is unused beside hidden_activation (read where that is absent).
  hf_ignored = {"gemma": ("hidden_act",)}
  tied_by_default = True

  def embedding(self, config: ModelConfig) -> nn.Module:
    return ScaledEmbed(
      config.vocab_size,
      config.d_model,
      embedding_init=layers.logical(nn.initializers.normal(1.0), "vocab", "embed"),
      dtype=config.compute_dtype,
      param_dtype=jnp.float32,
    )

  def norm(self, config: ModelConfig, name: str | None = None) -> nn.Module:
    return offset_rms_norm(config, name)

  def hf_check_activation(self, config_json: Mapping[str, Any], model_type: str) -> None:
    # transformers 4.x reads hidden_activation; 5.x's Gemma config has hidden_act.
    key = "hidden_activation" if config_json.get("hidden_activation") is not None else "hidden_act"
    activation = hf.get(config_json, key, "gelu_pytorch_tanh")
    if activation not in hf.TANH_GELU:
      raise hf.unsupported(f"{key} {activation!r} (Gemma's MLP is tanh-GELU here)")


class Gemma2(Gemma):
  """Gemma 2 (`ModelConfig.family` "gemma2", `Gemma2Options`)."""

  name = "gemma2"
  options = Gemma2Options
  block = Gemma2Block
  model_types = ("gemma2",)
  hf_ignored = {"gemma2": ("hidden_act", "cache_implementation")}
  # The norm before the MLP is pre_feedforward_layernorm (post_attention_layernorm is a
  # post-norm here).
  hf_norms = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "post_mlp_norm",
  }

  def finish_logits(self, config: ModelConfig, logits_XxV: jax.Array) -> jax.Array:
    return layers.softcap(logits_XxV.astype(jnp.float32), self.options_of(config).final_softcap)

  def num_params(self, config: ModelConfig) -> int:
    return super().num_params(config) + config.num_layers * 2 * config.d_model

  def hf_window(self, config_json: Mapping[str, Any], model_type: str, num_layers: int):
    """The window of the even layers (or what layer_types says, if it says that)."""
    types = hf.layer_types(config_json, num_layers)
    hf.present(config_json, "sliding_window")
    window = hf.window(config_json)
    even = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if types is None or types == even:
      return window
    if set(types) == {"full_attention"}:
      return None
    raise hf.unsupported(f"layer_types {types} (only Gemma 2's alternation is)")

  def hf_options(
    self, config_json: Mapping[str, Any], model_type: str, biases: llama.LlamaOptions
  ) -> Gemma2Options:
    # transformers fills in 50, 30 (and a 4096 window) where these are absent.
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
      hf.present(config_json, key)
    return Gemma2Options(
      **dataclasses.asdict(biases),
      query_scale=hf.positive(config_json, "query_pre_attn_scalar") ** -0.5,
      attn_softcap=hf.positive(config_json, "attn_logit_softcapping", None),
      final_softcap=hf.positive(config_json, "final_logit_softcapping", None),
    )


FAMILIES = (Gemma(), Gemma2())
