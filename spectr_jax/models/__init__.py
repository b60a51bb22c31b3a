"""Decoder LMs (draft and target) and their speculative-decoding KV cache.

The PaLM-style models the project trains, and open-weight checkpoints (Llama, Qwen2,
Gemma, Gemma 2, GPT-2) loaded with `load_pretrained`: one family module each under
families/ (docs/MODELS.md, "Adding a family"), all behind the `Decoder` protocol.

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity.

Usage:
  config = get_model_config("target-small", vocab_size=4096)
  model = decoder(config)
  params = model.init_params(jax.random.key(0))  # float32, for training
  params = for_decoding(params, config)  # the compute dtype, for decoding
  logits_BxTxV = model.logits(params, tokens_BxT)
  cache = model.init_cache(batch_size=B, num_tails=K, tail_capacity=L + 1)
  logits_BxPxV, cache = model.prefill(params, tokens_BxP, lengths_B, cache)
  logits_BxKxTxV, cache = model.extend(params, tokens_BxKxT, cache)
  cache = model.commit(cache, tail_idx_B, num_B)
"""

import importlib

# Loaded on first use, so the config boundary can import `ModelConfig` without JAX.
_EXPORTS = {
  "CheckpointFormatError": "hf",
  "Decoder": "protocol",
  "Family": "family",
  "HeadConfig": "config",
  "KVCache": "cache",
  "ModelBundle": "bundle",
  "ModelConfig": "config",
  "RopeScaling": "config",
  "Transformer": "transformer",
  "ancestor_mask": "attention",
  "check_params": "bundle",
  "commit": "cache",
  "commit_nodes": "cache",
  "config_from_hf": "pretrained",
  "count_params": "bundle",
  "decoder": "protocol",
  "expected_num_params": "families",
  "family_of": "families",
  "get_model_config": "config",
  "init_cache": "cache",
  "for_decoding": "layout",
  "init_params": "bundle",
  "load_pretrained": "pretrained",
  "is_per_layer": "layout",
  "is_split": "layout",
  "model_config_names": "config",
  "param_axes": "bundle",
  "register_family": "families",
  "reset_tails": "cache",
  "split_layers": "layout",
  "stack_layers": "layout",
  "unstack_layers": "layout",
  "rollback": "cache",
  "take_tails": "cache",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"spectr_jax.models.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'spectr_jax.models' has no attribute {name!r}")
