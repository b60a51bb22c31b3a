"""PaLM-style decoders, the models the project trains: parallel blocks
x + attn(norm(x)) + mlp(norm(x)), RMSNorm, RoPE, SwiGLU, no biases, logits / sqrt(D)."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import family, layers
from spectr_jax.models.config import ModelConfig


class ParallelBlock(layers.Block):
  """PaLM's block: attention and MLP both read the same normalised input."""

  @nn.compact
  def __call__(
    self, x_XxD: jax.Array, pos_X: jax.Array, attend: layers.Attend
  ) -> tuple[jax.Array, Any]:
    y_XxD = layers.rms_norm(self.config, "norm")(x_XxD)
    attn_XxD, kv = self.self_attention(y_XxD, pos_X, attend, window=layers.window(self.config))
    return x_XxD + attn_XxD + self.mlp(y_XxD, jax.nn.silu), kv


class PaLM(family.Family):
  """The default family (`ModelConfig.family` "palm"); it loads no checkpoints."""

  name = "palm"
  block = ParallelBlock

  def finish_logits(self, config: ModelConfig, logits_XxV: jax.Array) -> jax.Array:
    return (logits_XxV * config.d_model**-0.5).astype(jnp.float32)

  def num_params(self, config: ModelConfig) -> int:
    d = config.d_model
    block = d + family.attention_params(config) + family.mlp_params(config)
    return family.embedding_params(config) + d + config.num_layers * block


FAMILIES = (PaLM(),)
