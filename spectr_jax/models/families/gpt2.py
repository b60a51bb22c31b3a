"""GPT-2 (Hugging Face model_type "gpt2"): a learned position table added to the
embeddings (no RoPE), LayerNorm with bias, a tanh-GELU MLP without gate, biases on every
projection; its checkpoints fuse q | k | v into one Conv1D stored (in, out).
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax.models import family, hf, layers
from spectr_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class GPT2Options:
  """Attributes: num_positions: the rows of the learned position table (n_positions)."""

  num_positions: int

  def __post_init__(self):
    if self.num_positions < 1:
      raise ValueError(f"num_positions must be >= 1, got {self.num_positions}")


def layer_norm(config: ModelConfig, name: str | None = None) -> nn.LayerNorm:
  """LayerNorm with scale and bias."""
  return nn.LayerNorm(
    epsilon=config.norm_eps,
    dtype=config.compute_dtype,
    param_dtype=jnp.float32,
    use_fast_variance=False,
    scale_init=layers.logical(nn.initializers.ones, "embed"),
    bias_init=layers.logical(nn.initializers.zeros, "embed"),
    name=name,
  )


class PositionTable(nn.Embed):
  """The learned positions: row `pos` of the table (positions past it read its last row:
  jnp.take would fill NaN there, and padding positions reach it)."""

  def __call__(self, pos: jax.Array) -> jax.Array:
    return super().__call__(jnp.minimum(pos, self.num_embeddings - 1))


class Block(layers.SequentialBlock):
  """GPT-2's block: LayerNorm, biased attention, a biased tanh-GELU MLP."""

  def make_norm(self, name: str) -> nn.Module:
    return layer_norm(self.config, name)

  def attention(self, y_XxD: jax.Array, pos_X: jax.Array, attend: layers.Attend):
    return self.self_attention(
      y_XxD, pos_X, attend, qkv_bias=True, out_bias=True, window=layers.window(self.config)
    )

  def feed_forward(self, y_XxD: jax.Array) -> jax.Array:
    return self.mlp(y_XxD, layers.gelu_tanh, gated=False, bias=True)


def _split_qkv(block: str, shape: tuple[int, ...]) -> hf.Convert:
  """The fused c_attn [q | k | v] along its last axis -> w_q, w_k, w_v (or biases)."""
  names = ("w_q", "w_k", "w_v") if len(shape) == 3 else ("b_q", "b_k", "b_v")

  def convert(w):
    return {(block, n): x.reshape(shape) for n, x in zip(names, np.split(w, 3, -1), strict=True)}

  return convert


class GPT2(family.Family):
  """GPT-2 (`ModelConfig.family` "gpt2", `GPT2Options`; configs have no rope_base)."""

  name = "gpt2"
  options = GPT2Options
  block = Block
  model_types = ("gpt2",)
  hf_prefix = "transformer."
  hf_layer_key = "n_layer"
  hf_layer_pattern = re.compile(r"(?:transformer\.)?h\.(\d+)\.")
  hf_buffers = (r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",)  # causal mask buffers
  # n_ctx duplicates n_positions; the rest are dropout, classification-head and
  # generation settings, and an attention reordering that changes rounding only.
  hf_ignored = {
    "gpt2": (
      "n_ctx",
      "attn_pdrop",
      "embd_pdrop",
      "resid_pdrop",
      "summary_activation",
      "summary_first_dropout",
      "summary_proj_to_labels",
      "summary_type",
      "summary_use_proj",
      "task_specific_params",
      "reorder_and_upcast_attn",
    )
  }

  def position_embedding(self, config: ModelConfig) -> nn.Module:
    return PositionTable(
      self.options_of(config).num_positions,
      config.d_model,
      embedding_init=layers.logical(nn.initializers.normal(0.02), "positions", "embed"),
      dtype=config.compute_dtype,
      param_dtype=jnp.float32,
    )

  def norm(self, config: ModelConfig, name: str | None = None) -> nn.Module:
    return layer_norm(config, name)

  def num_params(self, config: ModelConfig) -> int:
    d = config.d_model
    block = 4 * d + family.attention_params(config, qkv_bias=True, out_bias=True)
    block += family.mlp_params(config, gated=False, bias=True)
    positions = self.options_of(config).num_positions
    return family.embedding_params(config, positions) + 2 * d + config.num_layers * block

  def hf_fields(self, config_json: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    del model_type
    d = hf.size(config_json, "n_embd", hf.WIDTH)
    h = hf.size(config_json, "n_head", hf.COUNT)
    if d % h:
      raise hf.CheckpointFormatError(f"config.json: n_embd {d} is no multiple of n_head {h}")
    activation = hf.get(config_json, "activation_function", "gelu_new")
    if activation not in hf.TANH_GELU:
      raise hf.unsupported(f"activation_function {activation!r} (GPT-2's MLP is tanh-GELU here)")
    if hf.flag(config_json, "scale_attn_by_inverse_layer_idx", False) or not hf.flag(
      config_json, "scale_attn_weights", True
    ):
      raise hf.unsupported("GPT-2 attention scaling other than 1 / sqrt(head_dim)")
    return dict(
      vocab_size=hf.size(config_json, "vocab_size", hf.VOCAB),
      d_model=d,
      num_layers=hf.size(config_json, "n_layer", hf.COUNT),
      num_heads=h,
      num_kv_heads=h,
      head_dim=d // h,
      mlp_dim=hf.size(config_json, "n_inner", hf.WIDTH, 4 * d),
      norm_eps=hf.positive(config_json, "layer_norm_epsilon", 1e-5),
      rope_base=None,
      family=self.name,
      options=GPT2Options(num_positions=hf.size(config_json, "n_positions", hf.POSITIONS)),
      tied_embedding=hf.flag(config_json, "tie_word_embeddings", True),
    )

  def hf_positions(self, config_json: Mapping[str, Any], fields: Mapping[str, Any]) -> int:
    del config_json
    return fields["options"].num_positions

  def hf_check_max_len(self, max_len: int, positions: int) -> None:
    # RoPE extrapolates past the trained context (at the user's word); a table cannot.
    if max_len > positions:
      raise hf.CheckpointFormatError(
        f"max_len {max_len} exceeds GPT-2's n_positions = {positions} (its position table)"
      )

  def hf_tensors(self, model_type: str, config: ModelConfig) -> list[hf.Tensor]:
    """The layout of GPT2LMHeadModel (names without "transformer."); Conv1D stores (in, out)."""
    del model_type
    d, h, dh, f = config.d_model, config.num_heads, config.head_dim, config.mlp_dim
    tensors = [
      hf.table("wte.weight", ("embed", "embedding"), (config.vocab_size, d)),
      hf.table(
        "wpe.weight", ("pos_embed", "embedding"), (self.options_of(config).num_positions, d)
      ),
    ]
    for i in range(config.num_layers):
      p, b = f"h.{i}.", f"block_{i}"
      tensors += [
        hf.Tensor(p + "attn.c_attn.weight", (d, 3 * d), _split_qkv(b, (d, h, dh))),
        hf.Tensor(p + "attn.c_attn.bias", (3 * d,), _split_qkv(b, (h, dh))),
        hf.linear(p + "attn.c_proj.weight", (b, "w_o"), (h, dh), (d,), stored_out_in=False),
        hf.vector(p + "attn.c_proj.bias", (b, "b_o"), (d,)),
        hf.linear(p + "mlp.c_fc.weight", (b, "w_up"), (d,), (f,), stored_out_in=False),
        hf.vector(p + "mlp.c_fc.bias", (b, "b_up"), (f,)),
        hf.linear(p + "mlp.c_proj.weight", (b, "w_down"), (f,), (d,), stored_out_in=False),
        hf.vector(p + "mlp.c_proj.bias", (b, "b_down"), (d,)),
      ]
      for stored, ours in (("ln_1", "norm"), ("ln_2", "mlp_norm")):
        tensors.append(hf.vector(p + f"{stored}.weight", (b, ours, "scale"), (d,)))
        tensors.append(hf.vector(p + f"{stored}.bias", (b, ours, "bias"), (d,)))
    tensors.append(hf.vector("ln_f.weight", ("final_norm", "scale"), (d,)))
    tensors.append(hf.vector("ln_f.bias", ("final_norm", "bias"), (d,)))
    return tensors


FAMILIES = (GPT2(),)
