"""A model config with its parameters, and fresh parameters for a config."""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax.models.config import ModelConfig
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
