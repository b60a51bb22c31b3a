"""Llama-like decoders (Hugging Face model_type "llama", "mistral", "qwen2"): sequential
pre-norm blocks, RMSNorm, RoPE (with Llama 3.1's scaling), SwiGLU, grouped-query
attention; Qwen2's q/k/v biases and Llama's optional attention / MLP biases are
`LlamaOptions`; Mistral's window slides on every layer.

The Hugging Face layout here (`model.layers.i.{self_attn, mlp, ...}`) is Gemma's too
(`families.gemma` builds on `Llama`).
"""

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax

from spectr_jax.models import family, hf, layers
from spectr_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class LlamaOptions:
  """The biases of a Llama-like model.

  Attributes:
    qkv_bias: biases on the query, key and value projections (Qwen2; attention_bias).
    out_bias: a bias on the attention output projection (attention_bias).
    mlp_bias: biases on the MLP projections (mlp_bias).
  """

  qkv_bias: bool = False
  out_bias: bool = False
  mlp_bias: bool = False


class Block(layers.SequentialBlock):
  """Llama's block: RMSNorm, attention with the options' biases, SwiGLU."""

  def make_norm(self, name: str) -> nn.Module:
    return layers.rms_norm(self.config, name)

  def attention(self, y_XxD: jax.Array, pos_X: jax.Array, attend: layers.Attend):
    opts = self.config.options or LlamaOptions()
    return self.self_attention(
      y_XxD,
      pos_X,
      attend,
      qkv_bias=opts.qkv_bias,
      out_bias=opts.out_bias,
      window=layers.window(self.config),
    )

  def feed_forward(self, y_XxD: jax.Array) -> jax.Array:
    opts = self.config.options or LlamaOptions()
    return self.mlp(y_XxD, jax.nn.silu, bias=opts.mlp_bias)


class Llama(family.Family):
  """Llama, Mistral, Qwen2 (`ModelConfig.family` "llama").

  Attributes (beside `family.Family`'s):
    tied_by_default: tie_word_embeddings where config.json does not say.
    hf_norms: {stored norm name: the block's norm}.
  """

  name = "llama"
  options = LlamaOptions
  block = Block
  model_types = ("llama", "mistral", "qwen2")
  hf_prefix = "model."
  hf_layer_key = "num_hidden_layers"
  hf_layer_pattern = re.compile(r"(?:model\.)?layers\.(\d+)\.")
  hf_buffers = (r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)  # RoPE frequencies
  hf_ignored = {
    # pretraining_tp only slices the matmuls; is_llama_config and rope_interleaved are
    # nanotron's (transformers ignores both and rotates the two halves of each head).
    "llama": ("pretraining_tp", "is_llama_config", "rope_interleaved"),
    "mistral": (),
    # max_window_layers matters only with use_sliding_window, which is refused.
    "qwen2": ("max_window_layers",),
  }
  tied_by_default = False
  hf_norms = {"input_layernorm": "norm", "post_attention_layernorm": "mlp_norm"}

  def num_params(self, config: ModelConfig) -> int:
    opts = self.options_of(config)
    d = config.d_model
    block = 2 * d + family.attention_params(config, opts.qkv_bias, opts.out_bias)
    block += family.mlp_params(config, bias=opts.mlp_bias)
    return family.embedding_params(config) + d + config.num_layers * block

  def hf_check_activation(self, config_json: Mapping[str, Any], model_type: str) -> None:
    """Refuses an MLP activation other than the family's."""
    activation = hf.get(config_json, "hidden_act", "silu")
    if activation != "silu":
      raise hf.unsupported(f"hidden_act {activation!r} (the {model_type} MLP is SwiGLU)")

  def hf_window(self, config_json: Mapping[str, Any], model_type: str, num_layers: int):
    """The sliding window: Mistral's on every layer, none elsewhere."""
    types = hf.layer_types(config_json, num_layers)
    window = None
    if model_type == "qwen2":
      if hf.flag(config_json, "use_sliding_window", False):
        raise hf.unsupported(
          "Qwen2's use_sliding_window (sliding layers from max_window_layers on)"
        )
      hf.size(
        config_json, "sliding_window", hf.POSITIONS, None
      )  # named but off, as in transformers
    elif model_type == "mistral":
      window = hf.window(config_json)
    hf.check_uniform_layers(types, model_type, window)
    return window

  def hf_options(self, config_json: Mapping[str, Any], model_type: str, biases: LlamaOptions):
    """The options of the config: the biases read with the shared keys."""
    del config_json, model_type
    return biases

  def hf_fields(self, config_json: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    d = hf.size(config_json, "hidden_size", hf.WIDTH)
    h = hf.size(config_json, "num_attention_heads", hf.COUNT)
    hk = hf.size(config_json, "num_key_value_heads", hf.COUNT, h)
    head_dim = hf.size(config_json, "head_dim", hf.WIDTH, None)
    if head_dim is None:
      if d % h:
        raise hf.CheckpointFormatError(
          f"config.json: hidden_size {d} is no multiple of num_attention_heads {h} (and there "
          "is no head_dim)"
        )
      head_dim = d // h
    if h % hk:
      raise hf.CheckpointFormatError(
        f"config.json: num_attention_heads ({h}) must be a multiple of num_key_value_heads ({hk})"
      )
    self.hf_check_activation(config_json, model_type)
    if hf.flag(config_json, "use_bidirectional_attention", False):
      raise hf.unsupported("use_bidirectional_attention (the decoder is causal)")
    # Qwen2's q/k/v projections always have biases (transformers reads no attention_bias).
    attention_bias = model_type == "qwen2" or hf.flag(config_json, "attention_bias", False)
    num_layers = hf.size(config_json, "num_hidden_layers", hf.COUNT)
    fields = dict(
      vocab_size=hf.size(config_json, "vocab_size", hf.VOCAB),
      d_model=d,
      num_layers=num_layers,
      num_heads=h,
      num_kv_heads=hk,
      head_dim=head_dim,
      mlp_dim=hf.size(config_json, "intermediate_size", hf.WIDTH),
      norm_eps=hf.positive(config_json, "rms_norm_eps", 1e-6),
      **hf.rope(config_json),
      family=self.name,
    )
    biases = LlamaOptions(
      qkv_bias=attention_bias,
      out_bias=attention_bias and model_type != "qwen2",
      mlp_bias=hf.flag(config_json, "mlp_bias", False),
    )
    fields.update(
      tied_embedding=hf.flag(config_json, "tie_word_embeddings", self.tied_by_default),
      sliding_window=self.hf_window(config_json, model_type, num_layers),
    )
    fields["options"] = self.hf_options(config_json, model_type, biases)
    return fields

  def hf_tensors(self, model_type: str, config: ModelConfig) -> list[hf.Tensor]:
    """The layout of LlamaForCausalLM and its relatives (names without "model.")."""
    del model_type
    opts = self.options_of(config)
    d, h, hk = config.d_model, config.num_heads, config.num_kv_heads
    dh, f = config.head_dim, config.mlp_dim
    tensors = [hf.table("embed_tokens.weight", ("embed", "embedding"), (config.vocab_size, d))]
    for i in range(config.num_layers):
      p, b = f"layers.{i}.", f"block_{i}"
      attn, mlp = p + "self_attn.", p + "mlp."
      tensors += [
        hf.linear(attn + "q_proj.weight", (b, "w_q"), (d,), (h, dh)),
        hf.linear(attn + "k_proj.weight", (b, "w_k"), (d,), (hk, dh)),
        hf.linear(attn + "v_proj.weight", (b, "w_v"), (d,), (hk, dh)),
        hf.linear(attn + "o_proj.weight", (b, "w_o"), (h, dh), (d,)),
        hf.linear(mlp + "gate_proj.weight", (b, "w_gate"), (d,), (f,)),
        hf.linear(mlp + "up_proj.weight", (b, "w_up"), (d,), (f,)),
        hf.linear(mlp + "down_proj.weight", (b, "w_down"), (f,), (d,)),
      ]
      tensors += [
        hf.vector(p + f"{stored}.weight", (b, ours, "scale"), (d,))
        for stored, ours in self.hf_norms.items()
      ]
      if opts.qkv_bias:
        tensors += [
          hf.vector(attn + "q_proj.bias", (b, "b_q"), (h, dh)),
          hf.vector(attn + "k_proj.bias", (b, "b_k"), (hk, dh)),
          hf.vector(attn + "v_proj.bias", (b, "b_v"), (hk, dh)),
        ]
      if opts.out_bias:
        tensors.append(hf.vector(attn + "o_proj.bias", (b, "b_o"), (d,)))
      if opts.mlp_bias:
        tensors += [
          hf.vector(mlp + "gate_proj.bias", (b, "b_gate"), (f,)),
          hf.vector(mlp + "up_proj.bias", (b, "b_up"), (f,)),
          hf.vector(mlp + "down_proj.bias", (b, "b_down"), (d,)),
        ]
    tensors.append(hf.vector("norm.weight", ("final_norm", "scale"), (d,)))
    return tensors


FAMILIES = (Llama(),)
