"""PaLM-style decoder LMs (draft and target) and their speculative-decoding KV cache.

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity.

Usage:
  config = get_model_config("target-small", vocab_size=4096)
  model = Transformer(config)
  params = init_params(config, jax.random.key(0))
  logits_BxTxV = model.apply({"params": params}, tokens_BxT)
  cache = init_cache(config, batch_size=B, num_tails=K, tail_capacity=L + 1)
  logits_BxTxV, cache = model.apply(
    {"params": params}, tokens_BxT, lengths_B, cache, method=Transformer.prefill)
  logits_BxKxTxV, cache = model.apply(
    {"params": params}, tokens_BxKxT, cache, method=Transformer.extend)
  cache = commit(cache, tail_idx_B, num_B)
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax.models.cache import KVCache, commit, init_cache, reset_tails, rollback
from spectr_jax.models.config import (
  ModelConfig,
  count_params,
  expected_num_params,
  get_model_config,
  model_config_names,
)
from spectr_jax.models.transformer import Transformer


@struct.dataclass
class ModelBundle:
  """A model config with its parameters: what training returns and decoding takes.

  Attributes:
    config: the hyper-parameters (static: not a pytree leaf, so a bundle can cross jit).
    params: the flax parameter pytree of `Transformer(config)`.
  """

  config: ModelConfig = struct.field(pytree_node=False)
  params: Any

  @property
  def model(self) -> Transformer:
    """The flax module of this config."""
    return Transformer(self.config)


def init_params(config: ModelConfig, key: jax.Array) -> Any:
  """Returns freshly initialised parameters of `Transformer(config)`.

  Args:
    config: the model config.
    key: a PRNG key.

  Returns:
    The parameter pytree (the "params" collection), float32.
  """
  tokens_1x1 = jnp.zeros((1, 1), jnp.int32)
  return jax.jit(Transformer(config).init)(key, tokens_1x1)["params"]


__all__ = [
  "KVCache",
  "ModelBundle",
  "ModelConfig",
  "Transformer",
  "commit",
  "count_params",
  "expected_num_params",
  "get_model_config",
  "init_cache",
  "init_params",
  "model_config_names",
  "reset_tails",
  "rollback",
]
