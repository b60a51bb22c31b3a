"""Tiny random checkpoints in each family's exact Hugging Face layout (test fixtures).

`write_checkpoint` writes a directory as the Hugging Face hub serves it: `config.json`,
`generation_config.json`, `model.safetensors` (or `model-0000i-of-0000n.safetensors` with
`model.safetensors.index.json`) and `tokenizer.json`, with the family's tensor names, shapes
(torch Linear weights (out, in); GPT-2 Conv1D weights (in, out) with the fused c_attn) and
dtypes. `tiny_config` gives small configs in which every family detail changes the logits
(soft-caps that clip, a sliding window shorter than a 12-token sequence, llama3 rope
scaling with all three frequency regimes, ...). Nothing else of `spectr_jax` is imported
here: these files and `tests/hf_reference.py` are the independent side of the loader
tests. Configs of the published sizes: `configs.pretrained.hub_config`.
"""

import copy
import json
import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

FAMILIES = ("llama", "qwen2", "gemma", "gemma2", "gpt2")

# Special tokens of the test tokenizer, ids 0..3; the 256 byte-level symbols follow, then merges.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<eot>")
PAD_ID, BOS_ID, EOS_ID, EOT_ID = range(4)
# Tokens the test tokenizer holds (fewer than the tiny configs' 320 embedding rows).
TOKENIZER_SIZE = 300

_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}

_TINY = {
  "llama": {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    # Head dim 8, theta 20: wavelengths 6.3 (kept, < 16 / 2), 13.3 (smoothed), 28 and 59
    # (divided by the factor, > 16 / 1), so every llama3 regime occurs within 12 tokens.
    "rope_theta": 20.0,
    "rope_scaling": {
      "factor": 4.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 2.0,
      "original_max_position_embeddings": 16,
      "rope_type": "llama3",
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
  },
  "qwen2": {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000.0,
    "rope_scaling": None,
    # As in the Qwen2.5 configs: a window is named but switched off (must not be applied).
    "sliding_window": 4,
    "use_sliding_window": False,
    "max_window_layers": 2,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
  },
  "gemma": {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
  },
  "gemma2": {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 5.0,
    "final_logit_softcapping": 3.0,
    "query_pre_attn_scalar": 8,
    "sliding_window": 4,
    "cache_implementation": "hybrid",
    "tie_word_embeddings": True,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
  },
  "gpt2": {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 320,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 64,
    "n_ctx": 64,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "bos_token_id": EOS_ID,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
  },
}

# Families whose generation_config.json lists several stop ids (Llama 3.x, Gemma, Qwen2.5).
_EOS_LIST_FAMILIES = ("llama", "qwen2", "gemma", "gemma2")


def tiny_config(family: str, **overrides) -> dict:
  """A config.json dict of a tiny model of `family` whose family details all bite.

  Args:
    family: one of FAMILIES.
    **overrides: top-level config keys to set (None is written as JSON null).
  Returns:
    A fresh dict (deep copy), safe to mutate.
  """
  if family not in _TINY:
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
  config = copy.deepcopy(_TINY[family])
  config.update(copy.deepcopy(overrides))
  return config


def as_transformers5(family: str, config: dict) -> dict:
  """`config` in the form transformers 5.x writes config.json.

  RoPE settings live only in "rope_parameters" (rope_theta, rope_type and, for llama3, the
  four scaling keys; no top-level rope_theta or rope_scaling), the dtype is "dtype" (not
  torch_dtype), Qwen2 (a switched-off window written as null) and Gemma 2 list
  "layer_types", and Gemma / Gemma 2 state "use_bidirectional_attention" (null). GPT-2 has
  no RoPE: only its dtype key changes.

  Args:
    family: one of FAMILIES.
    config: a config.json dict in the transformers 4.x form (tiny_config, hub_config).
  Returns:
    A fresh dict.
  """
  out = copy.deepcopy(config)
  if "torch_dtype" in out:
    out["dtype"] = out.pop("torch_dtype")
  out["transformers_version"] = "5.0.0"
  if family == "gpt2":
    return out
  rope = {"rope_theta": out.pop("rope_theta", 10000.0), "rope_type": "default"}
  scaling = out.pop("rope_scaling", None)
  if scaling:
    rope.update({k: v for k, v in scaling.items() if k != "type"})
    rope["rope_type"] = scaling.get("rope_type", scaling.get("type"))
  out["rope_parameters"] = rope
  n = out["num_hidden_layers"]
  if family == "qwen2":
    if not out.get("use_sliding_window"):
      out["sliding_window"] = None
    out["layer_types"] = ["full_attention"] * n
  if family in ("gemma", "gemma2"):
    out["use_bidirectional_attention"] = None
  if family == "gemma2":
    out["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
  return out


def parameter_count(family: str, config: dict) -> int:
  """The number of parameters of the layout (no buffers, no redundant lm_head)."""
  return sum(math.prod(shape) for shape in tensor_shapes(family, config).values())


def _decoder_dims(config: dict) -> tuple[int, int, int, int, int]:
  d = config["hidden_size"]
  h = config["num_attention_heads"]
  hkv = config.get("num_key_value_heads") or h
  dh = config.get("head_dim") or d // h
  return d, h, hkv, dh, config["intermediate_size"]


def tensor_shapes(
  family: str,
  config: dict,
  *,
  buffers: bool = False,
  redundant_lm_head: bool = False,
  prefix: str = "",
) -> dict[str, tuple[int, ...]]:
  """The tensors a Hugging Face checkpoint of `family` stores, in order, with their shapes.

  Args:
    family: one of FAMILIES.
    config: the config.json dict.
    buffers: also list the non-parameter buffers older checkpoints carry (llama-like
      `self_attn.rotary_emb.inv_freq`; GPT-2 `attn.bias` causal mask and `attn.masked_bias`).
    redundant_lm_head: for tied models, also list an `lm_head.weight` (a copy of the
      embedding, as some tied checkpoints store it).
    prefix: GPT-2 only: "" (the hub's gpt2 files) or "transformer." (GPT2LMHeadModel's
      state dict).
  Returns:
    {name: shape}.
  """
  v = config["vocab_size"]
  shapes: dict[str, tuple[int, ...]] = {}
  if family == "gpt2":
    d, n_pos = config["n_embd"], config["n_positions"]
    f = config.get("n_inner") or 4 * d
    p = prefix
    shapes[f"{p}wte.weight"] = (v, d)
    shapes[f"{p}wpe.weight"] = (n_pos, d)
    for i in range(config["n_layer"]):
      b = f"{p}h.{i}."
      shapes.update({b + "ln_1.weight": (d,), b + "ln_1.bias": (d,)})
      if buffers:
        shapes[b + "attn.bias"] = (1, 1, n_pos, n_pos)
        shapes[b + "attn.masked_bias"] = ()
      shapes.update({b + "attn.c_attn.weight": (d, 3 * d), b + "attn.c_attn.bias": (3 * d,)})
      shapes.update({b + "attn.c_proj.weight": (d, d), b + "attn.c_proj.bias": (d,)})
      shapes.update({b + "ln_2.weight": (d,), b + "ln_2.bias": (d,)})
      shapes.update({b + "mlp.c_fc.weight": (d, f), b + "mlp.c_fc.bias": (f,)})
      shapes.update({b + "mlp.c_proj.weight": (f, d), b + "mlp.c_proj.bias": (d,)})
    shapes[f"{p}ln_f.weight"] = (d,)
    shapes[f"{p}ln_f.bias"] = (d,)
    if redundant_lm_head:
      shapes["lm_head.weight"] = (v, d)
    return shapes
  if family not in _TINY:
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
  d, h, hkv, dh, f = _decoder_dims(config)
  shapes["model.embed_tokens.weight"] = (v, d)
  for i in range(config["num_hidden_layers"]):
    b = f"model.layers.{i}."
    shapes[b + "self_attn.q_proj.weight"] = (h * dh, d)
    shapes[b + "self_attn.k_proj.weight"] = (hkv * dh, d)
    shapes[b + "self_attn.v_proj.weight"] = (hkv * dh, d)
    if family == "qwen2":
      shapes[b + "self_attn.q_proj.bias"] = (h * dh,)
      shapes[b + "self_attn.k_proj.bias"] = (hkv * dh,)
      shapes[b + "self_attn.v_proj.bias"] = (hkv * dh,)
    shapes[b + "self_attn.o_proj.weight"] = (d, h * dh)
    if buffers:
      shapes[b + "self_attn.rotary_emb.inv_freq"] = (dh // 2,)
    shapes[b + "mlp.gate_proj.weight"] = (f, d)
    shapes[b + "mlp.up_proj.weight"] = (f, d)
    shapes[b + "mlp.down_proj.weight"] = (d, f)
    shapes[b + "input_layernorm.weight"] = (d,)
    shapes[b + "post_attention_layernorm.weight"] = (d,)
    if family == "gemma2":
      shapes[b + "pre_feedforward_layernorm.weight"] = (d,)
      shapes[b + "post_feedforward_layernorm.weight"] = (d,)
  shapes["model.norm.weight"] = (d,)
  # transformers' defaults when the key is absent: Llama / Qwen2 untied, Gemma tied
  tied = config.get("tie_word_embeddings", family in ("gemma", "gemma2"))
  if not tied or redundant_lm_head:
    shapes["lm_head.weight"] = (v, d)
  return shapes


def _init(family: str, config: dict, name: str, shape: tuple[int, ...], seed: int, scale: float):
  """(mean, std) of a random tensor, or its fixed value (a buffer)."""
  leaf = name.rsplit(".", 2)
  kind, module = leaf[-1], leaf[-2]
  if name.endswith("rotary_emb.inv_freq"):
    dh = shape[0] * 2
    return config["rope_theta"] ** (-np.arange(0, dh, 2) / dh)
  if name.endswith("attn.masked_bias"):
    return np.asarray(-1e4)
  if name.endswith("attn.bias") and len(shape) == 4:
    return np.tril(np.ones(shape[-2:]))[None, None]
  if "norm" in module or module.startswith("ln_"):
    offset = kind == "weight" and family not in ("gemma", "gemma2")  # gemma stores w of 1 + w
    return (1.0 if offset else 0.0), 0.1
  if kind == "bias":
    return 0.0, 0.2
  if module in ("embed_tokens", "wte", "wpe", "lm_head"):
    return 0.0, scale / math.sqrt(shape[-1])
  fan_in = shape[0] if family == "gpt2" else shape[-1]  # Conv1D stores (in, out)
  return 0.0, scale / math.sqrt(fan_in)


def _tensor(family, config, name, shape, seed, scale, dtype, chunk=1 << 22):
  """One tensor in dtype, a function of (seed, name) only (so layouts agree), drawn in
  chunks so no float32 copy of a large tensor is ever held."""
  init = _init(family, config, name, shape, seed, scale)
  if isinstance(init, np.ndarray):
    return init.astype(dtype)
  mean, std = init
  key = name.removeprefix("transformer.")  # GPT-2 with and without the prefix agree
  rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
  out = np.empty(shape, dtype)
  flat = out.reshape(-1)
  for start in range(0, flat.size, chunk):
    noise = rng.standard_normal(min(chunk, flat.size - start), dtype=np.float32)
    flat[start : start + noise.size] = (mean + std * noise).astype(dtype)
  return out


def write_tokenizer(directory, num_tokens: int) -> None:
  """Writes `tokenizer.json`: a byte-level BPE (GPT-2 / Llama 3 / Qwen style) of num_tokens.

  Ids 0..3 are SPECIAL_TOKENS (<pad>, <bos>, <eos>, <eot>), 4..259 the 256 byte symbols,
  the rest merges trained on a fixed text, so any text round-trips.

  Args:
    directory: the checkpoint directory (created if missing).
    num_tokens: the vocabulary size, at least 260.
  """
  base = len(SPECIAL_TOKENS) + 256
  if num_tokens < base:
    raise ValueError(f"num_tokens={num_tokens} < {base} (specials + 256 byte symbols)")
  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=num_tokens,
    special_tokens=list(SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  words = (
    "the quick brown fox jumps over the lazy dog while speculative decoding drafts several "
    "tokens that a larger target model verifies in one call so the output law is exact "
  ).split()
  corpus = [" ".join(words[i:] + words[:i]) + f" {i} {i * 37 % 1000}" for i in range(len(words))]
  tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
  if tokenizer.get_vocab_size() != num_tokens:
    raise ValueError(f"trained {tokenizer.get_vocab_size()} tokens, wanted {num_tokens}")
  Path(directory).mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(Path(directory) / "tokenizer.json"))


def _generation_config(family: str, config: dict) -> dict:
  eos = config.get("eos_token_id")
  if family in _EOS_LIST_FAMILIES:
    eos_ids = list(eos) if isinstance(eos, list) else [eos]
    eos = eos_ids + [EOT_ID] if EOT_ID not in eos_ids else eos_ids
  out = {"_from_model_config": True, "bos_token_id": config.get("bos_token_id")}
  out["eos_token_id"] = eos
  if "pad_token_id" in config:
    out["pad_token_id"] = config["pad_token_id"]
  out["transformers_version"] = config.get("transformers_version", "4.44.0")
  return out


def _split(names: list[str], sizes: list[int], num_shards: int) -> list[list[str]]:
  """Contiguous groups of names with about equal byte totals (every group non-empty)."""
  if not 1 <= num_shards <= len(names):
    raise ValueError(f"num_shards={num_shards} must be in [1, {len(names)}]")
  total, groups, acc = sum(sizes), [[] for _ in range(num_shards)], 0
  for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
    g = min(int(acc * num_shards / max(total, 1)), num_shards - 1)
    g = max(g, num_shards - (len(names) - i))  # leave one name for each later shard
    g = min(g, sum(1 for grp in groups if grp))  # never skip a shard
    groups[g].append(name)
    acc += size
  return groups


def family_params(fast: Sequence[str] = ("gemma2", "mistral")) -> list:
  """pytest parameters of every family and "mistral" (`write_tiny`): those in `fast`
  unmarked, the others marked slow (run with --runslow)."""
  import pytest  # a test helper; the rest of this module needs no pytest

  return [
    pytest.param(f, marks=() if f in fast else pytest.mark.slow) for f in [*FAMILIES, "mistral"]
  ]


def write_tiny(directory, family: str) -> None:
  """The tiny checkpoint of `family` without a tokenizer; "mistral" is Llama's layout
  with model_type mistral and a sliding window of 2 on every layer."""
  if family == "mistral":
    config = tiny_config("llama", model_type="mistral", sliding_window=2)
    write_checkpoint(directory, "llama", config, tokenizer=False)
  else:
    write_checkpoint(directory, family, tokenizer=False)


def write_checkpoint(
  directory,
  family: str,
  config: dict | None = None,
  *,
  seed: int = 0,
  dtype: str = "float32",
  num_shards: int = 1,
  tokenizer: bool | int = True,
  extra_tensors: dict[str, np.ndarray] | None = None,
  drop_tensors: Sequence[str] = (),
  buffers: bool = False,
  redundant_lm_head: bool = False,
  prefix: str = "",
  scale: float = 1.0,
  generation_config: dict | None = None,
  transformers5: bool = False,
  return_weights: bool = True,
) -> dict[str, np.ndarray]:
  """Writes a random checkpoint of `family` in the Hugging Face layout to `directory`.

  Tensors are drawn per name from (seed, name) (std scale / sqrt(fan_in) for matrices,
  scale / sqrt(D) for embeddings, norms 1 + 0.1 N (gemma: 0.1 N of the (1 + w) scale),
  biases 0.2 N), so single-file and sharded checkpoints of one seed hold the same values.
  They are generated (in chunks, straight into dtype) and written shard by shard, so a large
  checkpoint never sits in memory whole (pass return_weights=False then): Llama-3.2-1B's
  shapes in bf16, 4 shards, write in ~45 s at ~0.7 GB peak RSS on this CPU.

  Args:
    directory: created if missing.
    family: one of FAMILIES.
    config: the config.json dict (default tiny_config(family)); torch_dtype is set to dtype.
    seed: the random seed.
    dtype: "float32" or "bfloat16" (values rounded to nearest bf16 as torch does).
    num_shards: 1 writes model.safetensors; n > 1 writes model-0000i-of-0000n.safetensors
      and model.safetensors.index.json.
    tokenizer: write tokenizer.json (True: min(TOKENIZER_SIZE, vocab_size) tokens; an int:
      that many tokens; False: none).
    extra_tensors: {name: array} written too (cast to dtype): a new name goes after the
      layout's (in the last shard), a layout name replaces that tensor (e.g. a wrong shape).
    drop_tensors: names left out (each must be one the layout holds).
    buffers, redundant_lm_head, prefix: as in tensor_shapes.
    scale: multiplies the std of matrices and embeddings.
    generation_config: the generation_config.json dict (default: bos and eos from config,
      eos a list [eos, <eot>] for the llama / qwen2 / gemma families).
    transformers5: write config.json as transformers 5.x does (as_transformers5: RoPE
      settings in rope_parameters only); the tensors are the same.
    return_weights: return the values (False returns {}).
  Returns:
    {HF name: float64 array} of every tensor written (buffers and extras included), holding
    the values as stored (after bf16 rounding).
  """
  if dtype not in _DTYPES:
    raise ValueError(f"dtype {dtype!r} not in {tuple(_DTYPES)}")
  config = tiny_config(family) if config is None else copy.deepcopy(config)
  config["torch_dtype"] = dtype
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  shapes = tensor_shapes(
    family, config, buffers=buffers, redundant_lm_head=redundant_lm_head, prefix=prefix
  )
  # the layout without the redundant head: an lm_head.weight outside it copies the embedding
  own = tensor_shapes(family, config, prefix=prefix)
  missing = [name for name in drop_tensors if name not in shapes]
  if missing:
    raise ValueError(f"drop_tensors not in the {family} layout: {missing}")
  for name in drop_tensors:
    del shapes[name]
  extra = dict(extra_tensors or {})
  names = list(shapes) + [name for name in extra if name not in shapes]
  np_dtype = _DTYPES[dtype]
  itemsize = np.dtype(np_dtype).itemsize

  def size(name):
    return itemsize * (np.size(extra[name]) if name in extra else math.prod(shapes[name]))

  def value(name):
    if name in extra:
      return np.asarray(extra[name]).astype(np_dtype, copy=False)
    if name == "lm_head.weight" and name not in own:  # a copy of the embedding
      embed = "wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
      return _tensor(family, config, embed, shapes[name], seed, scale, np_dtype)
    return _tensor(family, config, name, shapes[name], seed, scale, np_dtype)

  groups = _split(names, [size(n) for n in names], num_shards)
  weights, weight_map = {}, {}
  for i, group in enumerate(groups):
    file = (
      "model.safetensors"
      if num_shards == 1
      else f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
    )
    shard = {name: np.asarray(value(name), order="C") for name in group}
    save_file(shard, str(directory / file), metadata={"format": "pt"})
    for name, array in shard.items():
      weight_map[name] = file
      if return_weights:
        weights[name] = array.astype(np.float64)
    del shard
  if num_shards > 1:
    index = {"metadata": {"total_size": sum(size(n) for n in names)}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
  written = as_transformers5(family, config) if transformers5 else config
  (directory / "config.json").write_text(json.dumps(written, indent=2))
  gen = _generation_config(family, config) if generation_config is None else generation_config
  (directory / "generation_config.json").write_text(json.dumps(gen, indent=2))
  if tokenizer:
    count = min(TOKENIZER_SIZE, config["vocab_size"]) if tokenizer is True else int(tokenizer)
    write_tokenizer(directory, count)
  return weights
