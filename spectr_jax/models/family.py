"""A decoder family: what it gives the shared `Transformer`, and how its Hugging Face
checkpoints map onto that (the base class; each family is one module of
spectr_jax/models/families/, registered there).

The shared Transformer composes, for a config of family F: F's token embedding, F's
additive position embedding (if any), N of F's blocks, F's final norm, the output layer
(tied or not, common to all) and F's logits transform. Everything a family has that the
others lack (its block and layers, its options, its config.json keys and tensor names)
stays in its module.
"""

import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import hf, layers
from spectr_jax.models.config import ModelConfig


class Family:
  """The base of the families: defaults for the pieces most families share.

  Attributes:
    name: `ModelConfig.family` of this family's configs.
    options: the frozen dataclass of `ModelConfig.options` (None: the family takes none);
      a config's options of another type are refused.
    block: the block module (`layers.Block`), built as block(config, layer=i).
    model_types: the Hugging Face model_type values this family loads (none: the family
      has no checkpoints to load).
    hf_prefix: the optional prefix of the stored tensor names ("model.", "transformer.").
    hf_layer_key: the config.json key of the layer count.
    hf_layer_pattern: the layer index in a stored tensor name (group 1).
    hf_buffers: stored tensors that are no parameters (regular expressions), skipped.
    hf_ignored: per model_type, config.json keys known not to change the model (beside
      those of every family, `pretrained.IGNORED_KEYS`).
  """

  name: str = ""
  options: type | None = None
  block: type[layers.Block]
  model_types: tuple[str, ...] = ()
  hf_prefix: str = ""
  hf_layer_key: str = ""
  hf_layer_pattern: re.Pattern | None = None
  hf_buffers: tuple[str, ...] = ()
  hf_ignored: Mapping[str, tuple[str, ...]] = {}

  def options_of(self, config: ModelConfig) -> Any:
    """The config's options (the family's defaults for None); other types are refused."""
    if config.options is None:
      if self.options is None:
        return None
      try:
        return self.options()
      except TypeError as error:  # a field without default
        raise ValueError(
          f"the {self.name} family needs {self.options.__name__} options ({error})"
        ) from None
    if self.options is None or type(config.options) is not self.options:
      takes = "no" if self.options is None else self.options.__name__
      raise ValueError(
        f"the {self.name} family takes {takes} options, got {type(config.options).__name__}"
      )
    return config.options

  # The model.

  def embedding(self, config: ModelConfig) -> nn.Module:
    """The token embedding: an `nn.Embed` of V x D ("embed"; its `attend` is the tied
    output layer)."""
    return layers.embedding(config)

  def position_embedding(self, config: ModelConfig) -> nn.Module | None:
    """A module of positions_X -> X x D added to the token embeddings ("pos_embed"), or
    None (positions enter the attention: RoPE)."""
    del config
    return None

  def norm(self, config: ModelConfig, name: str | None = None) -> nn.Module:
    """The norm (the final norm; the blocks choose their own)."""
    return layers.rms_norm(config, name)

  def finish_logits(self, config: ModelConfig, logits_XxV: jax.Array) -> jax.Array:
    """The logits in the compute dtype -> the model's logits, float32."""
    del config
    return logits_XxV.astype(jnp.float32)

  def num_params(self, config: ModelConfig) -> int:
    """The parameter count of the config's decoder in closed form."""
    raise NotImplementedError(f"the {self.name} family has no parameter count")

  # Hugging Face checkpoints.

  def hf_fields(self, config_json: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The `ModelConfig` fields of a config.json (but max_len and dtype), every value
    checked (`hf`); raises `hf.CheckpointFormatError` naming the key."""
    raise NotImplementedError(f"the {self.name} family reads no config.json")

  def hf_positions(self, config_json: Mapping[str, Any], fields: Mapping[str, Any]) -> int:
    """The context length the model was trained at (the default cache capacity)."""
    del fields
    return hf.size(config_json, "max_position_embeddings", hf.POSITIONS)

  def hf_check_max_len(self, max_len: int, positions: int) -> None:
    """Refuses a cache capacity the model cannot run at (RoPE extrapolates: no limit)."""
    del max_len, positions

  def hf_tensors(self, model_type: str, config: ModelConfig) -> list[hf.Tensor]:
    """The stored tensors of the body (names without `hf_prefix`; the untied output layer
    `lm_head.weight` is common and added by the loader)."""
    raise NotImplementedError(f"the {self.name} family has no tensor layout")


# Closed-form parameter counts of the shared pieces (for `Family.num_params`).


def embedding_params(config: ModelConfig, num_positions: int = 0) -> int:
  """The token embedding, the untied output layer, a learned position table."""
  tables = 1 if config.tied_embedding else 2
  return (tables * config.vocab_size + num_positions) * config.d_model


def attention_params(config: ModelConfig, qkv_bias: bool = False, out_bias: bool = False) -> int:
  """w_q, w_k, w_v, w_o and their biases (`layers.Block.self_attention`)."""
  d, dh, h, hk = config.d_model, config.head_dim, config.num_heads, config.num_kv_heads
  return 2 * d * h * dh + 2 * d * hk * dh + (h + 2 * hk) * dh * qkv_bias + d * out_bias


def mlp_params(config: ModelConfig, gated: bool = True, bias: bool = False) -> int:
  """w_gate (gated), w_up, w_down and their biases (`layers.Block.mlp`)."""
  d, f = config.d_model, config.mlp_dim
  num_in = 2 if gated else 1
  return (num_in + 1) * d * f + (num_in * f + d) * bias
