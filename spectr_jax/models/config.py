"""Model hyper-parameters: a frozen dataclass and the named sizes (no JAX: the config
boundary, `spectr_jax.config`, builds these without importing it)."""

import dataclasses
from typing import Any

import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy)
import numpy as np

_BLOCKS = ("parallel", "sequential")
_NORMS = ("rms", "rms_offset", "layernorm")
_MLPS = ("swiglu", "geglu", "gelu")
_POSITIONS = ("rope", "learned")
_SLIDING_LAYERS = ("all", "even")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1's rescaling of the rotary frequencies (Hugging Face "rope_type": "llama3").

  Wavelengths below original_max_len / high_freq_factor are kept, those above
  original_max_len / low_freq_factor are stretched by `factor`, and those between are
  interpolated smoothly.

  Attributes:
    factor: the stretch of the low frequencies.
    low_freq_factor: original_max_len / low_freq_factor is the longest kept-apart wavelength.
    high_freq_factor: original_max_len / high_freq_factor is the shortest stretched one.
    original_max_len: the context length the model was pre-trained at.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_len: int

  def __post_init__(self):
    if not self.factor > 0 or not self.high_freq_factor > self.low_freq_factor > 0:
      raise ValueError(
        "rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0, got "
        f"{self.factor}, {self.high_freq_factor}, {self.low_freq_factor}"
      )
    if self.original_max_len < 1:
      raise ValueError(f"original_max_len must be >= 1, got {self.original_max_len}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the decoder: the PaLM-style default and the open-weight families.

  The defaults are the PaLM-style model the project trains (parallel blocks, RMSNorm,
  RoPE, SwiGLU, no biases, tied embedding, logits / sqrt(D)); the family fields switch on
  what Llama, Qwen2, Gemma, Gemma 2 and GPT-2 need (docs/MODELS.md lists which).

  Attributes:
    vocab_size: V, the number of embedding rows (token ids).
    d_model: D, the width of the residual stream.
    num_layers: N, the number of blocks.
    num_heads: H, the number of query heads.
    num_kv_heads: Hk, the number of key/value heads shared by groups of H // Hk query
      heads (1 = multi-query attention, H = multi-head attention).
    head_dim: Dh, the width of one head (independent of D).
    mlp_dim: F, the hidden width of the MLP.
    max_len: S, the capacity of the KV-cache prefix (prompt plus committed tokens).
    rope_base: the base of the rotary position embedding frequencies.
    norm_eps: the epsilon of the norms.
    dtype: the compute dtype name ("float32", "bfloat16"); parameters are float32 when
      initialised here (a loaded checkpoint keeps its own dtype).
    output_vocab_size: the logits cover ids [0, output_vocab_size) only (None: all
      vocab_size); a pair whose embeddings have padding rows past its tokenizer's
      vocabulary is restricted to the real tokens this way.
    block: "parallel" (PaLM: x + attn(norm(x)) + mlp(norm(x))) or "sequential"
      (pre-norm: x += attn(norm(x)), then x += mlp(mlp_norm(x))).
    norm: "rms" (RMSNorm, scale w), "rms_offset" (RMSNorm with scale 1 + w, Gemma) or
      "layernorm" (LayerNorm with bias, GPT-2).
    post_norms: also normalise the attention and MLP outputs before the residual add
      (Gemma 2; sequential blocks only).
    mlp: "swiglu" (silu(x W_gate) * x W_up), "geglu" (tanh-GELU gate, Gemma) or "gelu"
      (tanh-GELU(x W_up), GPT-2), each followed by W_down.
    positions: "rope" (rotary) or "learned" (a table of num_positions rows added to the
      embedding, GPT-2; positions past it read the last row).
    num_positions: the rows of the learned position table (learned positions only).
    rope_scaling: Llama 3.1's frequency rescaling, or None.
    qkv_bias: biases on the query, key and value projections (Qwen2, GPT-2).
    out_bias: a bias on the attention output projection (GPT-2).
    mlp_bias: biases on the MLP projections (GPT-2).
    query_scale: the factor of the queries (None: head_dim ** -0.5; Gemma 2 uses
      query_pre_attn_scalar ** -0.5).
    attn_softcap: attention scores become c * tanh(score / c) (Gemma 2), or None.
    final_softcap: logits become c * tanh(logit / c) (Gemma 2), or None.
    sliding_window: a key is visible to a query only when q_pos - k_pos < window on the
      sliding layers, or None (every layer attends to the whole prefix).
    sliding_window_layers: which layers slide: "all" (Mistral) or "even" (layer index
      0, 2, 4, ...; Gemma 2).
    embed_scale: multiply the embeddings by sqrt(D) (rounded to the compute dtype; Gemma).
    tied_embedding: the output layer is the input embedding (else a separate V x D
      `out_embedding`).
    scale_logits: divide the logits by sqrt(D) (the PaLM-style models).
  """

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  num_kv_heads: int = 1
  max_len: int = 512
  rope_base: float = 10000.0
  norm_eps: float = 1e-6
  dtype: str = "float32"
  output_vocab_size: int | None = None
  block: str = "parallel"
  norm: str = "rms"
  post_norms: bool = False
  mlp: str = "swiglu"
  positions: str = "rope"
  num_positions: int | None = None
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False
  out_bias: bool = False
  mlp_bias: bool = False
  query_scale: float | None = None
  attn_softcap: float | None = None
  final_softcap: float | None = None
  sliding_window: int | None = None
  sliding_window_layers: str = "all"
  embed_scale: bool = False
  tied_embedding: bool = True
  scale_logits: bool = True

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    np.dtype(self.dtype)
    if self.output_vocab_size is not None and not 1 <= self.output_vocab_size <= self.vocab_size:
      raise ValueError(
        f"output_vocab_size must lie in [1, vocab_size = {self.vocab_size}], "
        f"got {self.output_vocab_size}"
      )
    for name, known in (
      ("block", _BLOCKS),
      ("norm", _NORMS),
      ("mlp", _MLPS),
      ("positions", _POSITIONS),
      ("sliding_window_layers", _SLIDING_LAYERS),
    ):
      if getattr(self, name) not in known:
        raise ValueError(f"{name} must be one of {known}, got {getattr(self, name)!r}")
    if self.positions == "rope" and self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    if (self.positions == "learned") != (self.num_positions is not None):
      raise ValueError("num_positions is given exactly when positions == 'learned'")
    if self.num_positions is not None and self.num_positions < 1:
      raise ValueError(f"num_positions must be >= 1, got {self.num_positions}")
    if self.rope_scaling is not None and self.positions != "rope":
      raise ValueError("rope_scaling needs rotary positions")
    if self.post_norms and self.block != "sequential":
      raise ValueError("post_norms needs sequential blocks")
    for name in ("query_scale", "attn_softcap", "final_softcap", "sliding_window"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"{name} must be positive (or None), got {value}")

  @property
  def compute_dtype(self) -> np.dtype:
    """The dtype of activations and of the KV cache."""
    return np.dtype(self.dtype)

  @property
  def num_logits(self) -> int:
    """V as the decoder sees it: the last dimension of the logits."""
    return self.vocab_size if self.output_vocab_size is None else self.output_vocab_size

  @property
  def num_groups(self) -> int:
    """G, the number of query heads that share one key/value head."""
    return self.num_heads // self.num_kv_heads

  @property
  def gated_mlp(self) -> bool:
    """Whether the MLP has a gate projection (SwiGLU, GeGLU)."""
    return self.mlp != "gelu"

  def layer_window(self, layer: int) -> int | None:
    """The sliding window of layer `layer` (0-based), None where it sees the whole prefix."""
    if self.sliding_window_layers == "even" and layer % 2:
      return None
    return self.sliding_window


# Named sizes. Parameter counts at V = 4096 are in docs/CACHE.md and checked by the tests.
_SIZES: dict[str, dict[str, Any]] = {
  "draft-test": dict(
    d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64, max_len=64
  ),
  "target-test": dict(
    d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=128, max_len=64
  ),
  "draft-tiny": dict(
    d_model=96, num_layers=2, num_heads=1, num_kv_heads=1, head_dim=64, mlp_dim=256, max_len=256
  ),
  "target-small": dict(
    d_model=256, num_layers=4, num_heads=4, num_kv_heads=1, head_dim=64, mlp_dim=1024, max_len=256
  ),
  "draft-base": dict(
    d_model=512, num_layers=6, num_heads=8, num_kv_heads=1, head_dim=64, mlp_dim=1536, max_len=512
  ),
  "target-base": dict(
    d_model=768, num_layers=12, num_heads=12, num_kv_heads=1, head_dim=64, mlp_dim=3072, max_len=512
  ),
  "target-large": dict(
    d_model=1024,
    num_layers=26,
    num_heads=8,
    num_kv_heads=2,
    head_dim=128,
    mlp_dim=4096,
    max_len=512,
  ),
}


def get_model_config(name: str, vocab_size: int, **overrides: Any) -> ModelConfig:
  """Returns the named model size.

  Args:
    name: one of "draft-test", "target-test" (unit tests), "draft-tiny", "target-small"
      (CPU experiments), "draft-base", "target-base", "target-large" (accelerators).
    vocab_size: V, taken from the tokenizer.
    **overrides: fields of `ModelConfig` that replace the named values (e.g. max_len).

  Returns:
    The frozen `ModelConfig`.

  Raises:
    ValueError: for an unknown name.
  """
  if name not in _SIZES:
    raise ValueError(f"unknown model config {name!r}; known names: {', '.join(_SIZES)}")
  return ModelConfig(vocab_size=vocab_size, **{**_SIZES[name], **overrides})


def model_config_names() -> tuple[str, ...]:
  """Returns the names `get_model_config` accepts."""
  return tuple(_SIZES)


def expected_num_params(config: ModelConfig) -> int:
  """Returns the parameter count of `Transformer(config)` in closed form.

  Args:
    config: the model config.

  Returns:
    The embedding(s) + the final norm + N * (the block's norms + attention + MLP).
  """
  d, dh, h, hk, f = (
    config.d_model,
    config.head_dim,
    config.num_heads,
    config.num_kv_heads,
    config.mlp_dim,
  )
  attention = 2 * d * h * dh + 2 * d * hk * dh
  attention += (h + 2 * hk) * dh * config.qkv_bias + d * config.out_bias
  num_mlp_in = 2 if config.gated_mlp else 1
  mlp = (num_mlp_in + 1) * d * f + (num_mlp_in * f + d) * config.mlp_bias
  norm = 2 * d if config.norm == "layernorm" else d
  block_norms = (1 if config.block == "parallel" else 2) + 2 * config.post_norms
  embeddings = config.vocab_size * d * (1 if config.tied_embedding else 2)
  embeddings += (config.num_positions or 0) * d
  return embeddings + norm + config.num_layers * (block_norms * norm + attention + mlp)
