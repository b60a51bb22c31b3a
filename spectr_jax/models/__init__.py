"""Decoder LMs (draft and target) and their speculative-decoding KV cache.

The PaLM-style models the project trains, and open-weight checkpoints (Llama, Qwen2,
Gemma, Gemma 2, GPT-2) loaded with `load_pretrained` into the same decoder.

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

from spectr_jax.models.bundle import ModelBundle, init_params
from spectr_jax.models.cache import KVCache, commit, init_cache, reset_tails, rollback
from spectr_jax.models.config import (
  ModelConfig,
  RopeScaling,
  count_params,
  expected_num_params,
  get_model_config,
  model_config_names,
)
from spectr_jax.models.pretrained import CheckpointFormatError, config_from_hf, load_pretrained
from spectr_jax.models.transformer import Transformer

__all__ = [
  "CheckpointFormatError",
  "KVCache",
  "ModelBundle",
  "ModelConfig",
  "RopeScaling",
  "Transformer",
  "commit",
  "config_from_hf",
  "count_params",
  "expected_num_params",
  "get_model_config",
  "init_cache",
  "init_params",
  "load_pretrained",
  "model_config_names",
  "reset_tails",
  "rollback",
]
