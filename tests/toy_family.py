"""A decoder family in one module, as docs/MODELS.md ("Adding a family") describes: a block
with a parameter no other family has, a `Family` record, nothing else.

tests/models/test_models.py registers it and decodes it with the engine, shards it by the logical
axes its parameters were created with, and counts its parameters.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import family, layers
from spectr_jax.models.config import ModelConfig


class Block(layers.Block):
  """x + gate * attn(norm(x)), then x + relu-MLP(mlp_norm(x)): `gate` is a D-vector that
  exists in no other family (and needs no sharding table entry)."""

  @nn.compact
  def __call__(
    self, x_XxD: jax.Array, pos_X: jax.Array, attend: layers.Attend
  ) -> tuple[jax.Array, Any]:
    cfg = self.config
    attn_XxD, kv = self.self_attention(layers.rms_norm(cfg, "norm")(x_XxD), pos_X, attend)
    init = layers.logical(nn.initializers.ones, "embed")
    gate_D = self.param("gate", init, (cfg.d_model,), jnp.float32).astype(cfg.compute_dtype)
    x_XxD = x_XxD + gate_D * attn_XxD
    mlp_XxD = self.mlp(layers.rms_norm(cfg, "mlp_norm")(x_XxD), jax.nn.relu, gated=False)
    return x_XxD + mlp_XxD, kv


class Toy(family.Family):
  """The toy family (`ModelConfig.family` "toy")."""

  name = "toy"
  block = Block

  def num_params(self, config: ModelConfig) -> int:
    d = config.d_model
    block = 3 * d + family.attention_params(config) + family.mlp_params(config, gated=False)
    return family.embedding_params(config) + d + config.num_layers * block


FAMILY = Toy()
