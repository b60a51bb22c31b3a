"""Open-weight draft/target pairs: the ARG items `pair=NAME,draft_dir=DIR,target_dir=DIR`.

Any sweep config takes them (`configs/lm1b_spectr.py`, `configs/rho_ablation.py`):

  python -m experiments.sweep --config \\
    configs/lm1b_spectr.py:pair=qwen2.5,draft_dir=/ckpt/Qwen2.5-0.5B,target_dir=/ckpt/Qwen2.5-7B

The directories are Hugging Face checkpoints the user brings (config.json, safetensors,
tokenizer.json; nothing is downloaded); relative paths are relative to the current
directory, and without draft_dir / target_dir they default to models/<name> below it.
A pretrained pair is never trained. Prompts are the starts of the embedded held-out news
sentences (or the sweep's source=...), tokenized by the pair's tokenizer. Sizes are for
one accelerator of the memory named in each entry (docs/EXPERIMENTS.md has the memory
arithmetic); `pair=pretrained` takes any two directories with the generic sizes.
"""

import copy
import json
from typing import Any

import ml_collections

from spectr_jax.models import ModelConfig, config_from_hf
from spectr_jax.pair_config import PairConfig
from spectr_jax.sweep_config import SweepConfig
from spectr_jax.testing import hf_checkpoints

# name: (draft, target, what the sizes below are meant for, batch size, cache capacity S).
PAIRS: dict[str, tuple[str, str, str, int, int]] = {
  "smollm2": ("SmolLM2-135M", "SmolLM2-1.7B", "one 16 GB GPU", 64, 256),
  "qwen2.5": ("Qwen2.5-0.5B", "Qwen2.5-7B", "one 40 GB GPU", 32, 256),
  "llama3": ("Llama-3.2-1B", "Llama-3.1-8B", "one 40 GB GPU", 32, 256),
  "gemma2": ("gemma-2-2b", "gemma-2-9b", "one 80 GB GPU (256k vocabulary)", 16, 256),
  "gpt2": ("gpt2", "gpt2-xl", "one 16 GB GPU", 64, 256),
  "llama3-70b": ("Llama-3.1-8B", "Llama-3.1-70B", "a TPU v5p slice, model axis 4", 32, 512),
  "gemma2-27b": (
    "gemma-2-2b",
    "gemma-2-27b",
    "a TPU v5p slice, model axis 4 (256k vocabulary)",
    16,
    512,
  ),  # fmt: skip
  "pretrained": ("draft", "target", "one 40 GB GPU", 32, 256),
}
ARGS: dict[str, Any] = dict(pair="", draft_dir="", target_dir="")

_LLAMA3 = dict(model_type="llama", rope_theta=500000.0, max_position_embeddings=131072)
_LLAMA3_SCALING = dict(
  low_freq_factor=1.0,
  high_freq_factor=4.0,
  original_max_position_embeddings=8192,
  rope_type="llama3",
)
_GEMMA2 = dict(
  model_type="gemma2",
  head_dim=256,
  query_pre_attn_scalar=256,
  sliding_window=4096,
  attn_logit_softcapping=50.0,
  final_logit_softcapping=30.0,
  vocab_size=256000,
  max_position_embeddings=8192,
)
# Qwen2.5 names a window but switches it off (use_sliding_window false).
_QWEN2 = dict(
  model_type="qwen2",
  rope_theta=1e6,
  max_position_embeddings=32768,
  sliding_window=32768,
  use_sliding_window=False,
)
_GPT2 = dict(model_type="gpt2", n_positions=1024, n_ctx=1024, vocab_size=50257)
# The published config.json sizes of the checkpoints above (public facts, enough for
# `models.config_from_hf`): scripts/memory_plan.py plans a pair's memory from these when
# its directories hold no config.json yet (nothing is read but config.json either way).
# The one copy of these numbers: HUB_SHAPES below is built (random
# checkpoints of the real sizes, checked against the hub's parameter counts) from them.
PUBLISHED: dict[str, dict[str, Any]] = {
  "SmolLM2-135M": dict(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    rope_scaling=None,
    max_position_embeddings=8192,
    torch_dtype="bfloat16",
  ),
  "SmolLM2-1.7B": dict(
    model_type="llama",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=24,
    num_attention_heads=32,
    num_key_value_heads=32,
    head_dim=64,
    vocab_size=49152,
    tie_word_embeddings=True,
    rope_theta=130000.0,
    rope_scaling=None,
    max_position_embeddings=8192,
    torch_dtype="bfloat16",
  ),
  "Qwen2.5-0.5B": dict(
    _QWEN2,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
  ),
  "Qwen2.5-7B": dict(
    _QWEN2,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
  ),
  "Llama-3.2-1B": dict(
    _LLAMA3,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=128256,
    tie_word_embeddings=True,
    rope_scaling=dict(_LLAMA3_SCALING, factor=32.0),
    torch_dtype="bfloat16",
  ),
  "Llama-3.1-8B": dict(
    _LLAMA3,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    tie_word_embeddings=False,
    rope_scaling=dict(_LLAMA3_SCALING, factor=8.0),
    torch_dtype="bfloat16",
  ),
  "Llama-3.1-70B": dict(
    _LLAMA3,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    tie_word_embeddings=False,
    rope_scaling=dict(_LLAMA3_SCALING, factor=8.0),
    torch_dtype="bfloat16",
  ),
  "gemma-2-2b": dict(
    _GEMMA2,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    torch_dtype="float32",
  ),
  "gemma-2-9b": dict(
    _GEMMA2,
    hidden_size=3584,
    intermediate_size=14336,
    num_hidden_layers=42,
    num_attention_heads=16,
    num_key_value_heads=8,
    torch_dtype="float32",
  ),
  "gemma-2-27b": dict(
    _GEMMA2,
    hidden_size=4608,
    intermediate_size=36864,
    num_hidden_layers=46,
    num_attention_heads=32,
    num_key_value_heads=16,
    head_dim=128,
    query_pre_attn_scalar=144,
    torch_dtype="bfloat16",
  ),
  "gpt2": dict(_GPT2, n_embd=768, n_layer=12, n_head=12),
  "gpt2-xl": dict(_GPT2, n_embd=1600, n_layer=48, n_head=25),
}


def apply(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
  """Turns sweep config `c` into a sweep over the pretrained pair `arg.pair` (in place).

  Args:
    c: a sweep ConfigDict (`configs/lm1b_spectr.py`).
    arg: the parsed ARG with `pair`, `draft_dir`, `target_dir`, `source`, `path`,
      `runlocal`, `test`.
  """
  if arg.pair not in PAIRS:
    raise ValueError(f"unknown pretrained pair {arg.pair!r}; known: {', '.join(PAIRS)}")
  draft, target, _, batch_size, max_len = PAIRS[arg.pair]
  c.name += f"-{arg.pair}"  # Results of each pair in their own folder.
  c.pair = PairConfig.defaults()
  c.pair.kind = "pretrained"  # Hugging Face checkpoint directories, never trained.
  c.pair.draft_workdir = arg.draft_dir or f"models/{draft}"
  c.pair.target_workdir = arg.target_dir or f"models/{target}"
  c.pair.max_len = max_len  # KV-cache capacity S: prompt + new tokens + L + 1 must fit.
  c.pair.text = arg.source  # Held-out sentences that prompts start (tokenized here).
  c.pair.text_path = arg.path  # Their directory (lm1b_text / tfds).
  if arg.runlocal or arg.test:  # CPU: tiny test checkpoints, a few cells in seconds.
    c.pair.max_len = 0  # The loader's default (the checkpoint's positions).
    c.methods = ("autoregressive", "sd", "kseq")
    c.num_drafts = (1, 4) if arg.runlocal else (1, 2)
    c.draft_lens = (4,) if arg.runlocal else (2,)
    return
  c.prompts.prompt_len = 16  # Prompt tokens after BOS (subword tokenizers split finer).
  c.batch_size = batch_size  # Prompts per engine call (a 256k vocabulary takes fewer).


# The hub's parameter count of each checkpoint in PUBLISHED (keyed, like it, by the
# checkpoint's directory name).
_HUB_PARAMETERS = {
  "SmolLM2-135M": 134_515_008,
  "SmolLM2-1.7B": 1_711_376_384,
  "Qwen2.5-0.5B": 494_032_768,
  "Qwen2.5-7B": 7_615_616_512,
  "Llama-3.2-1B": 1_235_814_400,
  "Llama-3.1-8B": 8_030_261_248,
  "Llama-3.1-70B": 70_553_706_496,
  "gemma-2-2b": 2_614_341_888,
  "gemma-2-9b": 9_241_705_984,
  "gemma-2-27b": 27_227_128_320,
  "gpt2": 124_439_808,
  "gpt2-xl": 1_557_611_200,
}
# Keys of PUBLISHED that are no shape: model_type is the family, torch_dtype is what
# write_checkpoint is told to store.
_NOT_SHAPES = ("model_type", "torch_dtype")


def _hub_shapes() -> dict[str, tuple[str, dict, int]]:
  published = PUBLISHED
  if set(published) != set(_HUB_PARAMETERS):
    raise ValueError(
      f"parameter counts for {sorted(_HUB_PARAMETERS)}, PUBLISHED has {sorted(published)}"
    )
  shapes = {}
  for name, hf in published.items():
    keys = {k: copy.deepcopy(v) for k, v in hf.items() if k not in _NOT_SHAPES}
    shapes[name] = (hf["model_type"], keys, _HUB_PARAMETERS[name])
  return shapes


# The published shapes of the example pairs (PUBLISHED, by directory
# name): (family, config keys, parameter count as the hub reports it). Random weights at
# real sizes for load and speed measurements.
HUB_SHAPES: dict[str, tuple[str, dict, int]] = _hub_shapes()


def hub_config(name: str, **overrides) -> tuple[str, dict]:
  """(family, config) with the shapes of a published model (a key of HUB_SHAPES).

  Only the sizes, RoPE and caps are the model's; token ids stay the test tokenizer's, so
  write_checkpoint(directory, *hub_config(name), return_weights=False) writes a random
  checkpoint of the real size.

  Args:
    name: e.g. "Llama-3.2-1B" or "gemma-2-2b".
    **overrides: config keys to set after the model's (e.g. num_hidden_layers=2).
  Returns:
    (family, config dict).
  """
  if name not in HUB_SHAPES:
    raise ValueError(f"unknown model {name!r}; expected one of {tuple(HUB_SHAPES)}")
  family, keys, _ = HUB_SHAPES[name]
  return family, hf_checkpoints.tiny_config(family, **{**keys, **overrides})


def model_configs(config: SweepConfig) -> tuple[ModelConfig, ModelConfig]:
  """The (draft, target) model configs of the sweep's pair, without loading weights."""
  pair = config.pair
  if pair.kind != "pretrained":
    found = pair.model_configs()
    if len(found) != 2:
      raise ValueError("the pair's training configs are missing (an incomplete 'trained' pair)")
    return found[0], found[1]
  configs = []
  for workdir in pair.workdirs:
    path = workdir / "config.json"
    if path.is_file():
      hf = json.loads(path.read_text())
    elif workdir.name in PUBLISHED:
      hf = PUBLISHED[workdir.name]
    else:
      raise ValueError(
        f"no {path} and no published sizes for {workdir.name!r} (known: {', '.join(PUBLISHED)})"
      )
    configs.append(config_from_hf(hf, pair.dtype or None, pair.max_len or None))
  return configs[0], configs[1]
