"""Model hyper-parameters: a frozen dataclass and the named sizes (no JAX: the config
boundary, `spectr_jax.config`, builds these without importing it)."""

import dataclasses
from typing import Any

import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy)
import numpy as np


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
  """Hyper-parameters of the decoder: the fields every family shares, the family's name
  and the family's own options.

  The defaults are the PaLM-style model the project trains (family "palm": parallel
  blocks, RMSNorm, RoPE, SwiGLU, no biases, tied embedding, logits / sqrt(D)). The
  open-weight families (docs/MODELS.md) keep what only they have in `options`.

  Attributes:
    vocab_size: V, the number of embedding rows (token ids).
    d_model: D, the width of the residual stream.
    num_layers: Y, the number of blocks.
    num_heads: H, the number of query heads.
    num_kv_heads: Hk, key/value heads, each shared by H // Hk query heads (1: multi-query).
    head_dim: Dh, the width of one head (independent of D).
    mlp_dim: F, the hidden width of the MLP.
    max_len: S, the KV-cache prefix capacity (prompt plus committed tokens).
    rope_base: the rotary embedding's base, or None (no rotation, e.g. GPT-2).
    rope_scaling: Llama 3.1's frequency rescaling, or None.
    norm_eps: the epsilon of the norms.
    dtype: the compute dtype name ("float32", "bfloat16"); parameters initialised here
      are float32, a loaded checkpoint keeps its own dtype.
    output_vocab_size: logits cover ids [0, output_vocab_size) only (None: vocab_size);
      drops the padding rows past a tokenizer's vocabulary.
    tied_embedding: the output layer is the input embedding (else `out_embedding`).
    sliding_window: a key is visible to a query only when q_pos - k_pos < window, on
      the layers the family slides (all, or Gemma 2's even ones); None: no window.
    family: the decoder family's name (`spectr_jax.models.families`): "palm", "llama",
      "gemma", "gemma2", "gpt2" or a registered one.
    options: the family's own frozen options (e.g. `LlamaOptions`), or None for the
      family's defaults; hashable, like the whole config.
  """

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  num_kv_heads: int = 1
  max_len: int = 512
  rope_base: float | None = 10000.0
  rope_scaling: RopeScaling | None = None
  norm_eps: float = 1e-6
  dtype: str = "float32"
  output_vocab_size: int | None = None
  tied_embedding: bool = True
  sliding_window: int | None = None
  family: str = "palm"
  options: Any = None

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
    for name in ("rope_base", "sliding_window"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"{name} must be positive (or None), got {value}")
    if self.rope_base is not None and self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.rope_scaling is not None and self.rope_base is None:
      raise ValueError("rope_scaling needs rotary positions (a rope_base)")
    if not isinstance(self.family, str) or not self.family:
      raise ValueError(f"family must be a family's name, got {self.family!r}")
    try:
      hash(self.options)
    except TypeError as error:
      raise ValueError(
        f"options must be hashable (a frozen dataclass), got {type(self.options).__name__}"
      ) from error

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


@dataclasses.dataclass(frozen=True)
class HeadConfig(ModelConfig):
  """A draft head's hyper-parameters (`spectr_jax.models.head`): its target's, with
  num_layers counting the head's own blocks."""

  @classmethod
  def of(cls, target: ModelConfig, num_layers: int = 1, **overrides: Any) -> "HeadConfig":
    """The head of `target` with `num_layers` blocks (`overrides`: other fields that
    differ from the target's, e.g. mlp_dim; never d_model or the vocabulary, which the
    head shares with its target)."""
    shared = {"d_model", "vocab_size", "output_vocab_size"} & set(overrides)
    if shared:
      raise ValueError(f"a head shares {sorted(shared)} with its target: they are not options")
    fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(ModelConfig)}
    return cls(**{**fields, "num_layers": num_layers, **overrides})


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
