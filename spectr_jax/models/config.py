"""Model hyper-parameters: a frozen dataclass and the named sizes."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of the PaLM-style decoder.

  Attributes:
    vocab_size: V, the number of token ids (the embedding is tied with the output layer).
    d_model: D, the width of the residual stream.
    num_layers: N, the number of parallel blocks.
    num_heads: H, the number of query heads.
    num_kv_heads: Hk, the number of key/value heads shared by groups of H // Hk query
      heads (1 = multi-query attention, H = multi-head attention).
    head_dim: Dh, the width of one head.
    mlp_dim: F, the hidden width of the SwiGLU MLP.
    max_len: S, the capacity of the KV-cache prefix (prompt plus committed tokens).
    rope_base: the base of the rotary position embedding frequencies.
    norm_eps: the epsilon of RMSNorm.
    dtype: the compute dtype name ("float32", "bfloat16"); parameters are float32.
    output_vocab_size: the logits cover ids [0, output_vocab_size) only (None: all
      vocab_size); a pair whose embeddings have padding rows past its tokenizer's
      vocabulary is restricted to the real tokens this way.
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

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    jnp.dtype(self.dtype)
    if self.output_vocab_size is not None and not 1 <= self.output_vocab_size <= self.vocab_size:
      raise ValueError(
        f"output_vocab_size must lie in [1, vocab_size = {self.vocab_size}], "
        f"got {self.output_vocab_size}"
      )

  @property
  def compute_dtype(self) -> jnp.dtype:
    """The dtype of activations and of the KV cache."""
    return jnp.dtype(self.dtype)

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


def count_params(params: Any) -> int:
  """Returns the total number of scalars in a parameter pytree."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def expected_num_params(config: ModelConfig) -> int:
  """Returns the parameter count of `Transformer(config)` in closed form.

  Args:
    config: the model config.

  Returns:
    V*D (tied embedding) + D (final norm) + N * (D (norm) + attention + SwiGLU MLP).
  """
  d, dh = config.d_model, config.head_dim
  attention = 2 * d * config.num_heads * dh + 2 * d * config.num_kv_heads * dh
  mlp = 3 * d * config.mlp_dim
  return config.vocab_size * d + d + config.num_layers * (d + attention + mlp)
