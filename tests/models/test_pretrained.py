"""Tests of `load_pretrained`: tiny HF-layout checkpoints against the float64 reference.

The checkpoints (spectr_jax/testing/hf_checkpoints.py) and the reference forward
(tests/hf_reference.py) import no other project code. Every family detail is shown to
matter: the reference with that detail dropped is farther from the loaded model than the
tolerance.
"""

import dataclasses
import functools
import json
import logging
import math
import pathlib
import re
import tempfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from configs import pretrained as published
from spectr_jax import sharding
from spectr_jax.models import (
  CheckpointFormatError,
  ModelBundle,
  config_from_hf,
  count_params,
  decoder,
  expected_num_params,
  init_params,
  load_pretrained,
  param_axes,
  pretrained,
)
from spectr_jax.testing import hf_checkpoints
from tests import hf_reference

RTOL = 1e-4  # relative to the largest reference logit
T = 12  # sequence length: longer than gemma2's window of 4 and llama3's original 16 / 2
ROWS = 12  # the batch of every full forward
_TOKENS_BxT = np.random.default_rng(0).integers(0, 320, (2, T)).astype(np.int32)
_ROOT = tempfile.TemporaryDirectory(prefix="test_pretrained-")  # removed at exit


def _mkdtemp() -> pathlib.Path:
  return pathlib.Path(tempfile.mkdtemp(dir=_ROOT.name))


@functools.cache
def _checkpoint(family: str, dtype: str = "float32", **kw) -> tuple[pathlib.Path, dict]:
  """A tiny checkpoint of `family` (written once per session); (directory, weights)."""
  directory = _mkdtemp()
  weights = hf_checkpoints.write_checkpoint(directory, family, dtype=dtype, tokenizer=False, **kw)
  return directory, weights


@functools.cache
def _forward(config):
  return jax.jit(decoder(config).logits)


def _logits(bundle: ModelBundle, tokens_BxT=_TOKENS_BxT) -> np.ndarray:
  """The full causal forward, float64 numpy (rows padded to ROWS: one compilation)."""
  padded_BxT = np.zeros((ROWS, tokens_BxT.shape[1]), np.int32)
  padded_BxT[: len(tokens_BxT)] = tokens_BxT
  logits = _forward(bundle.config)(bundle.params, jnp.asarray(padded_BxT))
  return np.asarray(logits, np.float64)[: len(tokens_BxT)]


@functools.cache
def _loaded(family: str) -> tuple[ModelBundle, np.ndarray]:
  """The float32 load of the family's checkpoint and its logits of _TOKENS_BxT."""
  bundle = load_pretrained(_checkpoint(family)[0])
  return bundle, _logits(bundle)


def _reference(family: str, drop: str | None = None) -> np.ndarray:
  config, weights = hf_checkpoints.tiny_config(family), _checkpoint(family)[1]
  return hf_reference.forward(family, config, weights, _TOKENS_BxT, drop=drop)


def _break(directory: pathlib.Path, **changes) -> None:
  """Rewrites config.json with some keys changed."""
  path = directory / "config.json"
  path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# Logits against the reference.


@pytest.mark.parametrize("family", hf_checkpoints.FAMILIES)
def test_logits_equal_the_float64_reference(family):
  bundle, logits = _loaded(family)
  ref = _reference(family)
  assert logits.shape == ref.shape == (2, T, 320)
  np.testing.assert_allclose(logits, ref, rtol=0, atol=RTOL * np.abs(ref).max())
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bundle.params))


@pytest.mark.parametrize(
  "family, feature",
  [(family, feature) for family, feats in hf_reference.FEATURES.items() for feature in feats],
)
def test_every_family_detail_changes_the_logits(family, feature):
  _, logits = _loaded(family)
  dropped = _reference(family, drop=feature)
  assert np.abs(logits - dropped).max() > 10 * RTOL * np.abs(dropped).max()


@pytest.mark.parametrize("family", hf_checkpoints.FAMILIES)
def test_parameter_tree_matches_the_config(family):
  bundle, _ = _loaded(family)
  expected = jax.eval_shape(functools.partial(init_params, bundle.config), jax.random.key(0))
  assert jax.tree.structure(bundle.params) == jax.tree.structure(expected)
  assert jax.tree.map(jnp.shape, bundle.params) == jax.tree.map(jnp.shape, expected)
  count = hf_checkpoints.parameter_count(family, hf_checkpoints.tiny_config(family))
  assert count_params(bundle.params) == expected_num_params(bundle.config) == count


@pytest.mark.parametrize("name", sorted(published.HUB_SHAPES))
def test_published_configs_map_to_the_published_parameter_counts(name):
  family, hf = published.hub_config(name)
  config = config_from_hf(hf)
  assert expected_num_params(config) == published.HUB_SHAPES[name][2]
  assert config.max_len == min(hf.get("max_position_embeddings", 1024), 4096)


# The KV cache against the full forward.


@pytest.mark.parametrize("family", [*hf_checkpoints.FAMILIES, "mistral"])
def test_cache_prefill_extend_commit_equals_the_full_forward(family):
  if family == "mistral":  # Llama with a sliding window on every layer (not in the reference).
    directory = _mkdtemp()
    hf_checkpoints.write_tiny(directory, "mistral")
    bundle = load_pretrained(directory)
    assert (bundle.config.family, bundle.config.sliding_window) == ("llama", 2)  # every layer
  else:
    bundle, _ = _loaded(family)
  model = decoder(bundle.config)
  prefill = jax.jit(functools.partial(model.prefill, bundle.params))
  extend = jax.jit(functools.partial(model.extend, bundle.params))
  rng = np.random.default_rng(1)
  prompts_BxP = rng.integers(0, 320, (2, 7)).astype(np.int32)
  lengths = np.array([7, 5])
  tails_BxKxT = rng.integers(0, 320, (2, 3, 3)).astype(np.int32)
  more_BxKxT = rng.integers(0, 320, (2, 3, 3)).astype(np.int32)
  keep_tail, keep_num = np.array([2, 0]), np.array([2, 1])
  cache = model.init_cache(2, 3, 3)
  _, cache = prefill(prompts_BxP, jnp.asarray(lengths), cache)
  first, cache = extend(jnp.asarray(tails_BxKxT), cache)
  cache = jax.jit(model.commit)(cache, jnp.asarray(keep_tail), jnp.asarray(keep_num))
  second, _ = extend(jnp.asarray(more_BxKxT), cache)
  seqs, checks = [], []  # every continued sequence, right-padded to T in one forward
  for b in range(2):
    prompt = list(prompts_BxP[b, : lengths[b]])
    kept = prompt + list(tails_BxKxT[b, keep_tail[b], : keep_num[b]])
    for k in range(3):
      checks.append((first[b, k], len(seqs), len(prompt)))
      seqs.append(prompt + list(tails_BxKxT[b, k]))
      checks.append((second[b, k], len(seqs), len(kept)))
      seqs.append(kept + list(more_BxKxT[b, k]))
  full = _logits(bundle, np.array([s + [0] * (T - len(s)) for s in seqs]))
  atol = RTOL * np.abs(full).max()
  for got, row, start in checks:
    np.testing.assert_allclose(got, full[row, start : start + len(got)], rtol=0, atol=atol)


# Dtypes, layouts and capacity.


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_bfloat16_checkpoint_loads_as_bfloat16(family):
  directory, weights = _checkpoint(family, "bfloat16")
  bundle = load_pretrained(directory)
  assert bundle.config.compute_dtype == jnp.bfloat16
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bundle.params))
  logits = _logits(bundle)
  as_f32 = load_pretrained(directory, dtype="float32")
  np.testing.assert_array_equal(
    np.asarray(as_f32.params["layers"]["w_qkv"]),
    np.asarray(bundle.params["layers"]["w_qkv"], np.float32),
  )
  ref = hf_reference.forward(family, hf_checkpoints.tiny_config(family), weights, _TOKENS_BxT)
  np.testing.assert_allclose(_logits(as_f32), ref, rtol=0, atol=RTOL * np.abs(ref).max())
  error = np.abs(logits - ref).max() / np.abs(ref).max()
  assert 1e-4 < error < 0.05, error  # bf16 compute: visibly rounded, still the same model


def test_sharded_checkpoint_with_buffers_loads_the_same_params():
  directory = _mkdtemp()
  hf_checkpoints.write_checkpoint(directory, "llama", num_shards=3, buffers=True, tokenizer=False)
  assert (directory / "model.safetensors.index.json").is_file()
  sharded = load_pretrained(directory)
  single, _ = _loaded("llama")
  jax.tree.map(np.testing.assert_array_equal, sharded.params, single.params)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_loading_onto_a_mesh_places_each_tensor_by_the_rules(family):
  """With a mesh every tensor lands on its rule's sharding as it is read, values equal."""
  mesh = sharding.make_mesh(4, 2)
  directory = _mkdtemp()
  hf_checkpoints.write_checkpoint(directory, family, tokenizer=False)
  placed = load_pretrained(directory, mesh=mesh)
  single = load_pretrained(directory)
  want = sharding.param_shardings(single.params, mesh, axes=param_axes(single.config))
  jax.tree.map(lambda x, s: np.testing.assert_equal(x.sharding, s), placed.params, want)
  jax.tree.map(np.testing.assert_array_equal, placed.params, single.params)
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(placed.params))


def test_gpt2_prefix_buffers_and_redundant_head_are_accepted():
  directory = _mkdtemp()
  hf_checkpoints.write_checkpoint(
    directory,
    "gpt2",
    buffers=True,
    redundant_lm_head=True,
    prefix="transformer.",
    tokenizer=False,
  )
  loaded = load_pretrained(directory)
  plain, _ = _loaded("gpt2")
  jax.tree.map(np.testing.assert_array_equal, loaded.params, plain.params)


def test_max_len_is_the_cache_capacity():
  qwen2 = hf_checkpoints.tiny_config("qwen2")  # max_position_embeddings 64
  assert config_from_hf(qwen2).max_len == 64
  assert config_from_hf(qwen2, max_len=20).max_len == 20
  assert config_from_hf(qwen2, max_len=128).max_len == 128  # RoPE extrapolates
  assert config_from_hf(published.hub_config("gpt2")[1]).max_len == 1024
  with pytest.raises(CheckpointFormatError, match="max_len 65 exceeds GPT-2's n_positions = 64"):
    config_from_hf(hf_checkpoints.tiny_config("gpt2"), max_len=65)  # n_positions 64


def test_learned_positions_past_the_table_read_its_last_row():
  bundle, _ = _loaded("gpt2")  # n_positions = 64
  tokens_1xT = np.random.default_rng(2).integers(0, 320, (1, 70)).astype(np.int32)
  logits = jax.jit(bundle.decoder.logits)(bundle.params, jnp.asarray(tokens_1xT))
  assert bool(jnp.all(jnp.isfinite(logits)))  # jnp.take would have filled NaN


def test_output_vocab_size_restricts_a_loaded_model():
  bundle, logits = _loaded("gemma2")
  cut = bundle.replace(config=dataclasses.replace(bundle.config, output_vocab_size=300))
  np.testing.assert_allclose(_logits(cut), logits[..., :300], rtol=1e-6, atol=1e-6)


# Broken directories.


def _copy(family: str, **kw) -> pathlib.Path:
  directory = _mkdtemp()
  hf_checkpoints.write_checkpoint(directory, family, tokenizer=False, **kw)
  return directory


def test_missing_files_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="no config.json in"):
    load_pretrained(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(hf_checkpoints.tiny_config("llama")))
  with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index"):
    load_pretrained(tmp_path)
  directory = _copy("llama", num_shards=2)
  (directory / "model-00002-of-00002.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors, listed in"):
    load_pretrained(directory)


def test_unknown_model_type_lists_the_known_ones():
  directory = _copy("llama")
  _break(directory, model_type="mixtral")
  with pytest.raises(CheckpointFormatError, match="unknown model_type 'mixtral'; known .*gpt2"):
    load_pretrained(directory)
  assert issubclass(CheckpointFormatError, ValueError)


def test_missing_unexpected_and_misshapen_tensors_are_named():
  name = "model.layers.1.mlp.up_proj.weight"
  with pytest.raises(CheckpointFormatError, match=f"missing tensor '{name}'"):
    load_pretrained(_copy("llama", drop_tensors=[name]))
  with pytest.raises(CheckpointFormatError, match="missing tensor 'lm_head.weight'"):
    load_pretrained(_copy("llama", drop_tensors=["lm_head.weight"]))
  extra = {"model.layers.0.mlp.extra.weight": np.zeros((2, 2), np.float32)}
  with pytest.raises(CheckpointFormatError, match="unexpected tensor 'model.layers.0.mlp.extra"):
    load_pretrained(_copy("qwen2", extra_tensors=extra))
  wrong = {"h.0.attn.c_attn.weight": np.zeros((32, 64), np.float32)}
  with pytest.raises(
    CheckpointFormatError,
    match=r"'h.0.attn.c_attn.weight' in model.safetensors has shape \(32, 64\); config.json "
    r"implies \(32, 96\)",
  ):
    load_pretrained(_copy("gpt2", extra_tensors=wrong))


@pytest.mark.parametrize(
  "family, changes, message",
  [
    (
      "llama",
      dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
      "rope_scaling rope_type 'yarn'",
    ),
    ("llama", dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    ("llama", dict(num_local_experts=8), "mixture-of-experts"),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
    ("gemma", dict(hidden_activation="gelu"), "hidden_activation 'gelu'"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "attention scaling"),
    ("gpt2", dict(torch_dtype="int8"), "dtype 'int8'"),
    (
      "llama",
      dict(num_key_value_heads=3),
      r"num_attention_heads \(4\) must be a multiple of num_key_",
    ),
  ],
)
def test_unsupported_features_are_refused_plainly(family, changes, message):
  with pytest.raises(CheckpointFormatError, match=message):
    config_from_hf(hf_checkpoints.tiny_config(family, **changes))


# RoPE settings: the transformers 4.x keys (rope_theta, rope_scaling) and the 5.x ones
# (rope_parameters only).


def _llama_rope(**rope_keys) -> dict:
  """The tiny llama config with no RoPE keys but `rope_keys`."""
  config = hf_checkpoints.tiny_config("llama", **rope_keys)
  for key in ("rope_theta", "rope_scaling"):
    if key not in rope_keys:
      del config[key]
  return config


_LLAMA3 = hf_checkpoints.tiny_config("llama")["rope_scaling"]  # factor 4, original 16


@pytest.mark.parametrize("family, overrides", [("llama", {}), ("qwen2", {"rope_theta": 1e6})])
def test_transformers5_rope_parameters_load_the_model_the_old_keys_load(family, overrides):
  """A llama3-scaled Llama and a Qwen2 with theta 1e6, config.json written as transformers
  4.x and 5.x write it: the same config and logits, far from those of the default RoPE."""
  config = hf_checkpoints.tiny_config(family, **overrides)
  old, new = _mkdtemp(), _mkdtemp()
  for directory, transformers5 in ((old, False), (new, True)):
    hf_checkpoints.write_checkpoint(
      directory, family, config, tokenizer=False, transformers5=transformers5
    )
  written = json.loads((new / "config.json").read_text())
  assert "rope_parameters" in written and not {"rope_theta", "rope_scaling"} & set(written)
  bundle, bundle5 = load_pretrained(old), load_pretrained(new)
  assert bundle5.config == bundle.config
  logits = _logits(bundle)
  np.testing.assert_array_equal(_logits(bundle5), logits)
  plain = dataclasses.replace(bundle.config, rope_base=10000.0, rope_scaling=None)
  assert plain != bundle.config  # what the 5.x form read as before: the default RoPE
  off = np.abs(_logits(bundle.replace(config=plain)) - logits).max()
  assert off > 0.1 * np.abs(logits).max(), off


def _warnings_of(hf: dict, caplog, **kw) -> tuple[object, str]:
  """(config_from_hf(hf), the warnings it logged)."""
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    config = config_from_hf(hf, **kw)
  return config, caplog.text


def _test_configs(family: str) -> list[tuple[str, str, dict]]:
  """(name, family of the layout, config) of the tiny and published-size configs."""
  if family == "mistral":  # the Llama layout with Mistral's keys (no pretraining_tp)
    config = hf_checkpoints.tiny_config("llama", model_type="mistral", sliding_window=4)
    del config["pretraining_tp"]
    return [("mistral", "llama", config)]
  configs = [(family, family, hf_checkpoints.tiny_config(family))]
  for name, (hub_family, _, _) in sorted(published.HUB_SHAPES.items()):
    if hub_family == family:
      configs.append((name, family, published.hub_config(name)[1]))
  return configs


@pytest.mark.parametrize("family", [*hf_checkpoints.FAMILIES, "mistral"])
def test_both_config_forms_of_every_test_config_read_alike_without_warnings(family, caplog):
  """The tiny and published-size configs of every family, in the 4.x form, the 5.x form and
  both at once (agreeing): one config, and every key read or known to be irrelevant."""
  for name, layout, config in _test_configs(family):
    config5 = hf_checkpoints.as_transformers5(layout, config)
    expected, text = _warnings_of(config, caplog)
    assert text == "", (name, text)
    for form in (config5, {**config, **config5}):
      got, text = _warnings_of(form, caplog)
      assert got == expected and text == "", (name, text)
    if family == "gpt2":  # no RoPE to read: the 5.x form only renames torch_dtype
      assert expected.rope_base is None and expected.rope_scaling is None
      assert set(config5) - set(config) == {"dtype"}


@pytest.mark.parametrize(
  "config, message",
  [
    (
      _llama_rope(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 20.0}),
      r"not supported: rope_parameters rope_type 'yarn'",
    ),
    (
      _llama_rope(rope_scaling={"type": "linear", "factor": 2.0}),
      r"not supported: rope_scaling rope_type 'linear'",
    ),
    (  # Gemma 3 style: one dict per layer type
      _llama_rope(
        rope_parameters={
          "full_attention": {"rope_type": "default", "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        }
      ),
      r"not supported: rope_parameters per layer type \(full_attention, sliding_attention\)",
    ),
    (
      _llama_rope(rope_theta=1e4, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
      r"states rope_theta twice, differently \(rope_theta: 10000.0; "
      r"rope_parameters.rope_theta: 1000000.0\)",
    ),
    (
      _llama_rope(rope_scaling={**_LLAMA3, "factor": 8.0}, rope_parameters=_LLAMA3),
      r"states RoPE scaling twice, differently \(rope_scaling: RopeScaling\(factor=8.0.*; "
      r"rope_parameters: RopeScaling\(factor=4.0",
    ),
    (
      _llama_rope(rope_scaling=None, rope_parameters=_LLAMA3),
      r"states RoPE scaling twice, differently \(rope_scaling: None; rope_parameters: RopeSc",
    ),
    (
      _llama_rope(rope_parameters={**_LLAMA3, "beta_fast": 32}),
      r"not supported: rope_parameters.beta_fast with rope_type 'llama3'",
    ),
    (
      _llama_rope(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
      r"not supported: rope_parameters.partial_rotary_factor 0.5",
    ),
    (
      _llama_rope(rope_parameters={k: v for k, v in _LLAMA3.items() if k != "low_freq_factor"}),
      r"config.json has no 'rope_parameters.low_freq_factor'",
    ),
    (
      _llama_rope(rope_parameters={**_LLAMA3, "original_max_position_embeddings": 16.5}),
      r"rope_parameters.original_max_position_embeddings must be an integer in \[1, \d+\], "
      r"got 16.5",
    ),
    (
      _llama_rope(rope_parameters={"rope_type": "default", "rope_theta": "1e6"}),
      r"rope_parameters.rope_theta must be a positive finite number, got '1e6'",
    ),
    (_llama_rope(rope_parameters=[1e6]), r"rope_parameters must be an object, got \[1000000.0\]"),
  ],
)
def test_rope_settings_not_understood_are_refused_by_key(config, message):
  with pytest.raises(CheckpointFormatError, match=message):
    config_from_hf(config)


# config.json keys: read, known to be irrelevant (IGNORED_KEYS, listed in docs/MODELS.md),
# or logged.


def test_keys_neither_read_nor_ignored_are_logged_by_name(caplog):
  config = hf_checkpoints.tiny_config("llama", sliding_window=4, new_switch=True)
  expected = config_from_hf(hf_checkpoints.tiny_config("llama"))
  got, text = _warnings_of(config, caplog)
  assert got == expected  # a warning, not an error: real configs carry harmless keys
  assert "has keys the loader neither reads nor knows to be irrelevant" in text
  assert "new_switch, sliding_window (docs/MODELS.md" in text
  # the dtype keys count as read even where the dtype argument overrides them
  _, text = _warnings_of(hf_checkpoints.tiny_config("llama"), caplog, dtype="bfloat16")
  assert text == ""


def _ignored_keys_table() -> str:
  """docs/MODELS.md's table of IGNORED_KEYS: keys of every family, then each family's own."""
  every = frozenset.intersection(*pretrained.IGNORED_KEYS.values())
  rows = [("every family", every)]
  rows += [(t, pretrained.IGNORED_KEYS[t] - every) for t in pretrained.MODEL_TYPES]
  lines = ["| model_type | config.json keys known not to change the model (not read) |"]
  lines.append("|---|---|")
  for name, keys in rows:
    lines.append(f"| {name} | {', '.join(f'`{k}`' for k in sorted(keys)) or '-'} |")
  return "\n".join(lines)


def test_docs_list_the_ignored_keys():
  assert set(pretrained.IGNORED_KEYS) == set(pretrained.MODEL_TYPES)
  doc = (pathlib.Path(__file__).parents[2] / "docs" / "MODELS.md").read_text()
  table = _ignored_keys_table()
  assert table in doc, f"docs/MODELS.md should hold this table:\n{table}"


# Values checked before anything is built from them (every error names the key).


_BAD_SIZES = (0, -1, 2.5, 8.0, "8", True, None, 10**12, 1e9)


@pytest.mark.parametrize(
  "family, key",
  [
    *[
      ("llama", key)
      for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
      )
    ],
    ("gemma2", "sliding_window"),
    ("qwen2", "sliding_window"),
    *[("gpt2", key) for key in ("n_embd", "n_layer", "n_head", "n_inner", "n_positions")],
  ],
)
def test_size_fields_must_be_bounded_positive_integers(family, key):
  optional = key in ("num_key_value_heads", "head_dim", "n_inner") or family == "qwen2"
  for value in _BAD_SIZES:
    config = hf_checkpoints.tiny_config(family, **{key: value})
    if family == "gemma2" and value is None:
      continue  # a null window is no window
    if value is None:
      if optional:
        config_from_hf(config)  # null: the default
        continue
      message = f"config.json has no '{key}'"
    else:
      message = (
        rf"config.json: {key} must be an integer in \[1, \d+\], got {re.escape(repr(value))}"
      )
    with pytest.raises(CheckpointFormatError, match=message):
      config_from_hf(config)


@pytest.mark.parametrize(
  "family, changes, message",
  [
    *[
      ("llama", {"rms_norm_eps": v}, rf"rms_norm_eps must be a positive finite number, got {m}")
      for v, m in (("x", "'x'"), (0, "0"), (-1e-6, "-1e-06"), (math.inf, "inf"), (True, "True"))
    ],
    ("llama", {"rms_norm_eps": math.nan}, "rms_norm_eps must be a positive finite number"),
    ("gpt2", {"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon must be a positive finite"),
    ("llama", {"rope_theta": "x"}, "rope_theta must be a positive finite number, got 'x'"),
    ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a positive finite"),
    ("gemma2", {"attn_logit_softcapping": -5.0}, "attn_logit_softcapping must be a positive"),
    ("llama", {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ("llama", {"attention_bias": 0}, "attention_bias must be true or false, got 0"),
    ("qwen2", {"use_sliding_window": "no"}, "use_sliding_window must be true or false"),
    ("llama", {"head_dim": None, "hidden_size": 30}, "hidden_size 30 is no multiple of num_att"),
    ("gpt2", {"n_head": 5}, "n_embd 32 is no multiple of n_head 5"),
    ("gemma2", {"sliding_window_size": 8}, "sliding_window 4 and sliding_window_size 8 differ"),
    ("qwen2", {"layer_types": ["full_attention"]}, r"layer_types must list one type per layer"),
    ("qwen2", {"layer_types": ["sliding_attention"] * 2}, r"layer_types \['sliding_attention'\]"),
    (
      "gemma",
      {"hidden_activation": None, "hidden_act": "gelu"},
      "not supported: hidden_act 'gelu'",
    ),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
  ],
)
def test_other_values_are_checked_by_key(family, changes, message):
  with pytest.raises(CheckpointFormatError, match=message):
    config_from_hf(hf_checkpoints.tiny_config(family, **changes))


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "final_logit_softcapping"])
def test_gemma2_keys_with_a_transformers_default_must_be_stated(key):
  config = hf_checkpoints.tiny_config("gemma2")
  del config[key]
  with pytest.raises(CheckpointFormatError, match=f"config.json has no '{key}'"):
    config_from_hf(config)
  assert config_from_hf({**config, key: None}).options.final_softcap == (
    None if key == "final_logit_softcapping" else 3.0
  )


@pytest.mark.parametrize("family, key", [("llama", "num_hidden_layers"), ("gpt2", "n_layer")])
def test_layer_count_is_checked_against_the_tensor_names_before_anything_is_read(
  family, key, monkeypatch
):
  directory = _copy(family)
  monkeypatch.setattr(pretrained, "safe_open", None)  # reading any tensor would fail
  for value in (1, 3, 4096):
    _break(directory, **{key: value})
    with pytest.raises(
      CheckpointFormatError,
      match=rf"config.json has {key} = {value}, but the safetensors hold 2 layers \(0..1\)",
    ):
      load_pretrained(directory)
  for value in (10**9, 1e9):
    _break(directory, **{key: value})
    with pytest.raises(CheckpointFormatError, match=rf"config.json: {key} must be an integer in"):
      load_pretrained(directory)


def test_head_counts_are_checked_against_the_tensor_shapes_before_anything_is_read(monkeypatch):
  directory = _copy("llama")  # 4 heads of 8, 2 kv heads
  monkeypatch.setattr(pretrained, "safe_open", None)
  for key, value, name, shape in (
    ("num_attention_heads", 8, "q_proj", r"\(64, 32\)"),
    ("num_key_value_heads", 4, "k_proj", r"\(32, 32\)"),
  ):
    _break(directory, **{key: value})
    with pytest.raises(
      CheckpointFormatError, match=rf"'model.layers.0.self_attn.{name}.weight' .* implies {shape}"
    ):
      load_pretrained(directory)
    _break(directory, **{key: hf_checkpoints.tiny_config("llama")[key]})


def test_json_files_that_are_not_objects_are_named():
  directory = _copy("llama")
  (directory / "config.json").write_text("[1, 2]")
  with pytest.raises(
    CheckpointFormatError, match=r"/config.json must hold a JSON object, not a list"
  ):
    load_pretrained(directory)
  with pytest.raises(CheckpointFormatError, match="config.json must be a JSON object, got list"):
    config_from_hf([1, 2])
  directory = _copy("llama", num_shards=2)
  (directory / "model.safetensors.index.json").write_text('"model-00001-of-00002.safetensors"')
  with pytest.raises(CheckpointFormatError, match=r"index.json must hold a JSON object, not a str"):
    load_pretrained(directory)


# Safetensors files: the header against the file, and every tensor finite.


def _rewrite_header(path: pathlib.Path, change) -> None:
  """Rewrites a safetensors file with change(header) applied to its header, data as before."""
  data = path.read_bytes()
  length = int.from_bytes(data[:8], "little")
  header = json.loads(data[8 : 8 + length])
  change(header)
  raw = json.dumps(header).encode()
  raw += b" " * (-len(raw) % 8)
  path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :])


def _set(header, name, **entry):
  header[name].update(entry)


def test_safetensors_files_that_their_headers_do_not_match_are_named(monkeypatch):
  directory = _copy("llama", num_shards=2)
  shard = directory / "model-00002-of-00002.safetensors"
  data = shard.read_bytes()
  length = int.from_bytes(data[:8], "little")
  header = json.loads(data[8 : 8 + length])
  del header["__metadata__"]
  name, other = [k for k, v in header.items() if v["shape"] == [32]][:2]
  entry = header[name]
  monkeypatch.setattr(pretrained, "safe_open", None)  # all found from the headers
  cases = [
    (data[:-1], rf"{len(data) - 1} bytes, but its header accounts for {len(data)}"),
    (data + bytes(8), rf"{len(data) + 8} bytes, but its header accounts for {len(data)}"),
    (data[:5], r"5 bytes cannot hold the header"),
    (data[: 8 + length - 1], rf"{7 + length} bytes cannot hold the header of {length} bytes"),
    (data[:8] + b"{" * length + data[8 + length :], "its header is not JSON"),
  ]
  for broken, message in cases:
    shard.write_bytes(broken)
    with pytest.raises(
      CheckpointFormatError,
      match=rf"model-00002-of-00002.safetensors is not a whole safetensors file: {message}",
    ):
      load_pretrained(directory)
  start, stop = entry["data_offsets"]
  for change, message in (
    (lambda h: _set(h, name, shape=[7]), rf"tensor '{re.escape(name)}' \({entry['dtype']} \[7\]"),
    (lambda h: _set(h, name, dtype="F64"), rf"tensor '{re.escape(name)}' \(F64"),
    (lambda h: _set(h, name, dtype="Q4"), rf"tensor '{re.escape(name)}' has the header entry"),
    (lambda h: _set(h, other, data_offsets=[start, stop]), r"starts at byte"),
  ):
    shard.write_bytes(data)
    _rewrite_header(shard, change)
    with pytest.raises(CheckpointFormatError, match=f"00002.safetensors is not a whole.*{message}"):
      load_pretrained(directory)
  shard.write_bytes(data)
  index = directory / "model.safetensors.index.json"
  spec = json.loads(index.read_text())
  spec["weight_map"][name] = "model-00001-of-00002.safetensors"
  index.write_text(json.dumps(spec))
  with pytest.raises(
    CheckpointFormatError,
    match=rf"tensor '{re.escape(name)}', listed in model.safetensors.index.json, is not in .*"
    "model-00001-of-00002.safetensors",
  ):
    load_pretrained(directory)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_non_finite_tensors_are_refused_by_name_and_extreme_finite_ones_load(dtype):
  name = "model.layers.1.mlp.down_proj.weight"
  finfo = ml_dtypes.finfo({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype])
  for value, finite in (
    (np.nan, False),
    (np.inf, False),
    (-np.inf, False),
    (finfo.max, True),
    (-finfo.max, True),
    (finfo.smallest_subnormal, True),
  ):
    weight = np.zeros((32, 64), np.float32)
    weight[3, 5] = value
    directory = _copy("llama", dtype=dtype, extra_tensors={name: weight})
    if finite:
      assert load_pretrained(directory).params["layers"]["w_down"][1, 5, 3] == np.float32(value)
      continue
    with pytest.raises(
      CheckpointFormatError, match=f"tensor '{name}' in model.safetensors holds NaN or infinity"
    ):
      load_pretrained(directory)


def test_values_beyond_float16_are_refused_when_loading_as_float16():
  name = "model.embed_tokens.weight"
  embedding = np.zeros((320, 32), np.float32)
  embedding[7, 1] = 1e5  # float16's largest is 65504
  directory = _copy("llama", extra_tensors={name: embedding})
  assert load_pretrained(directory).config.dtype == "float32"
  with pytest.raises(
    CheckpointFormatError, match=f"tensor '{name}' in model.safetensors has values beyond the"
  ):
    load_pretrained(directory, dtype="float16")


def test_tensors_that_are_not_floats_are_refused_by_name():
  directory = _copy("gpt2")
  name = "h.0.attn.c_proj.bias"
  _rewrite_header(directory / "model.safetensors", lambda h: _set(h, name, dtype="I32"))
  with pytest.raises(CheckpointFormatError, match=f"tensor '{name}' in model.safetensors is I32"):
    load_pretrained(directory)
