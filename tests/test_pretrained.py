"""Tests of `load_pretrained`: tiny HF-layout checkpoints against the float64 reference.

The checkpoints (tests/hf_checkpoints.py) and the reference forward (tests/hf_reference.py)
import no project code. Every family detail is shown to matter: the reference with that
detail dropped is farther from the loaded model than the tolerance.
"""

import dataclasses
import functools
import json
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import sharding
from spectr_jax.models import (
  CheckpointFormatError,
  ModelBundle,
  Transformer,
  commit,
  config_from_hf,
  count_params,
  expected_num_params,
  init_cache,
  init_params,
  load_pretrained,
)
from tests import hf_checkpoints, hf_reference

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
  return jax.jit(lambda params, tokens: Transformer(config).apply({"params": params}, tokens))


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


@pytest.mark.parametrize("name", sorted(hf_checkpoints.HUB_SHAPES))
def test_published_configs_map_to_the_published_parameter_counts(name):
  family, hf = hf_checkpoints.hub_config(name)
  config = config_from_hf(hf)
  assert expected_num_params(config) == hf_checkpoints.HUB_SHAPES[name][2]
  assert config.max_len == min(hf.get("max_position_embeddings", 1024), 4096)


# The KV cache against the full forward.


@pytest.mark.parametrize("family", [*hf_checkpoints.FAMILIES, "mistral"])
def test_cache_prefill_extend_commit_equals_the_full_forward(family):
  if family == "mistral":  # Llama with a sliding window on every layer (not in the reference).
    directory = _mkdtemp()
    config = hf_checkpoints.tiny_config("llama", model_type="mistral", sliding_window=2)
    hf_checkpoints.write_checkpoint(directory, "llama", config, tokenizer=False)
    bundle = load_pretrained(directory)
    assert (bundle.config.layer_window(0), bundle.config.layer_window(1)) == (2, 2)
  else:
    bundle, _ = _loaded(family)
  model, variables = Transformer(bundle.config), {"params": bundle.params}
  prefill = jax.jit(functools.partial(model.apply, method=Transformer.prefill))
  extend = jax.jit(functools.partial(model.apply, method=Transformer.extend))
  rng = np.random.default_rng(1)
  prompts_BxP = rng.integers(0, 320, (2, 7)).astype(np.int32)
  lengths = np.array([7, 5])
  tails_BxKxT = rng.integers(0, 320, (2, 3, 3)).astype(np.int32)
  more_BxKxT = rng.integers(0, 320, (2, 3, 3)).astype(np.int32)
  keep_tail, keep_num = np.array([2, 0]), np.array([2, 1])
  cache = init_cache(bundle.config, 2, 3, 3)
  _, cache = prefill(variables, prompts_BxP, jnp.asarray(lengths), cache)
  first, cache = extend(variables, jnp.asarray(tails_BxKxT), cache)
  cache = jax.jit(commit)(cache, jnp.asarray(keep_tail), jnp.asarray(keep_num))
  second, _ = extend(variables, jnp.asarray(more_BxKxT), cache)
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
    np.asarray(as_f32.params["block_0"]["w_q"]),
    np.asarray(bundle.params["block_0"]["w_q"], np.float32),
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
  want = sharding.param_shardings(single.params, mesh)
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
  assert config_from_hf(hf_checkpoints.hub_config("gpt2")[1]).max_len == 1024
  with pytest.raises(CheckpointFormatError, match="max_len 65 exceeds GPT-2's n_positions = 64"):
    config_from_hf(hf_checkpoints.tiny_config("gpt2"), max_len=65)  # n_positions 64


def test_learned_positions_past_the_table_read_its_last_row():
  bundle, _ = _loaded("gpt2")  # n_positions = 64
  tokens_1xT = np.random.default_rng(2).integers(0, 320, (1, 70)).astype(np.int32)
  logits = jax.jit(bundle.model.apply)({"params": bundle.params}, jnp.asarray(tokens_1xT))
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
    ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling type 'yarn'"),
    ("llama", dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    ("llama", dict(num_local_experts=8), "mixture-of-experts"),
    ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
    ("gemma", dict(hidden_activation="gelu"), "hidden_activation 'gelu'"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "attention scaling"),
    ("gpt2", dict(torch_dtype="int8"), "dtype 'int8'"),
    ("llama", dict(num_key_value_heads=3), "multiple of num_kv_heads"),
  ],
)
def test_unsupported_features_are_refused_plainly(family, changes, message):
  with pytest.raises(CheckpointFormatError, match=message):
    config_from_hf(hf_checkpoints.tiny_config(family, **changes))
