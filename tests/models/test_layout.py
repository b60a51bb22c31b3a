"""Tests of the parameter layouts (`spectr_jax.models.layout`): the per-layer layout of
older runs and checkpoints maps onto the decoder's stacked, fused one and back, and a
decode holds its weights in the compute dtype."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from spectr_jax.models import (
  ModelBundle,
  ModelConfig,
  for_decoding,
  init_params,
  is_per_layer,
  stack_layers,
  unstack_layers,
)
from spectr_jax.models.families import gemma, gpt2, llama
from spectr_jax.models.layout import SCAN_MIN_LAYERS, LayerStacker, is_split, scans

FAMILIES = {
  "palm": {},
  "llama": dict(family="llama", options=llama.LlamaOptions(True, True, True), num_kv_heads=2),
  "gpt2": dict(family="gpt2", rope_base=None, options=gpt2.GPT2Options(32), num_kv_heads=4),
  "gemma2": dict(family="gemma2", options=gemma.Gemma2Options(query_scale=0.3), sliding_window=3),
  "mqa": dict(num_kv_heads=1),
}


def _config(**overrides) -> ModelConfig:
  fields = dict(
    vocab_size=37,
    d_model=16,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    mlp_dim=24,
    max_len=16,
  )
  return ModelConfig(**{**fields, **overrides})


def _random(shapes, seed: int = 0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), shapes)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_per_layer_and_stacked_layouts_map_onto_each_other(family):
  config = _config(**FAMILIES[family])
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  params = _random(shapes)
  old = unstack_layers(params, config)
  assert is_per_layer(old) and not is_per_layer(params)
  assert sorted(k for k in old if k.startswith("block_")) == ["block_0", "block_1", "block_2"]
  back = stack_layers(old, config)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  # The same maps on shapes alone (the abstract trees orbax restores into).
  old_shapes = unstack_layers(shapes, config)
  assert jax.tree.map(np.shape, old) == jax.tree.map(lambda x: x.shape, old_shapes)
  assert jax.tree.map(lambda x: x.shape, stack_layers(old_shapes, config)) == jax.tree.map(
    lambda x: x.shape, shapes
  )


def test_the_per_layer_projections_are_the_fused_ones_sliced():
  """w_qkv holds, per key/value head n, query heads n G .. n G + G - 1, then k_n, v_n;
  w_gate_up the gate then the up projection."""
  config = _config(num_heads=6, num_kv_heads=2)  # G = 3
  params = _random(jax.eval_shape(lambda: init_params(config, jax.random.key(0))))
  old = unstack_layers(params, config)["block_1"]
  w_qkv = params["layers"]["w_qkv"][1]  # D x Hk x (G + 2) x Dh
  for head in range(6):
    np.testing.assert_array_equal(old["w_q"][:, head], w_qkv[:, head // 3, head % 3])
  np.testing.assert_array_equal(old["w_k"], w_qkv[:, :, 3])
  np.testing.assert_array_equal(old["w_v"], w_qkv[:, :, 4])
  np.testing.assert_array_equal(old["w_gate"], params["layers"]["w_gate_up"][1, :, 0])
  np.testing.assert_array_equal(old["w_up"], params["layers"]["w_gate_up"][1, :, 1])


def test_stacking_refuses_missing_layers():
  config = _config()
  old = unstack_layers(init_params(config, jax.random.key(0)), config)
  del old["block_1"]
  with pytest.raises(ValueError, match=r"hold layers \[0, 2\], the config 3"):
    stack_layers(old, config)


def test_a_decode_holds_its_weights_in_the_compute_dtype():
  config = _config(dtype="bfloat16")
  params = init_params(config, jax.random.key(0))
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  cast = ModelBundle(config, params).for_decoding(scan_layers=True)
  assert {x.dtype for x in jax.tree.leaves(cast.params)} == {jnp.dtype(jnp.bfloat16)}
  np.testing.assert_array_equal(
    cast.params["layers"]["w_o"], params["layers"]["w_o"].astype(jnp.bfloat16)
  )
  # Idempotent, and a no-op (the same arrays) where nothing is to change.
  again = cast.for_decoding(scan_layers=True)
  assert all(
    a is b for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(cast.params), strict=True)
  )
  f32 = dataclasses.replace(config, dtype="float32")
  same = for_decoding(params, f32, scan_layers=True)
  assert all(a is b for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(params), strict=True))
  # Per-layer parameters are stacked on the way; shapes map like arrays.
  stacked = for_decoding(unstack_layers(params, config), config, scan_layers=True)
  assert jax.tree.structure(stacked) == jax.tree.structure(params)
  shapes = for_decoding(jax.eval_shape(lambda: params), config)
  assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}


def test_an_unrolled_decode_holds_its_layers_split():
  """Below `SCAN_MIN_LAYERS` a decode unrolls the stack and holds each layer apart (no
  layer slices a stacked weight); stacked, split and per-layer layouts convert both ways."""
  config = _config()
  assert config.num_layers < SCAN_MIN_LAYERS and not scans(config)
  params = init_params(config, jax.random.key(0))
  split = ModelBundle(config, params).for_decoding()
  assert is_split(split.params) and "layers" not in split.params
  assert sorted(k for k in split.params if k.startswith("layers_")) == [
    "layers_0",
    "layers_1",
    "layers_2",
  ]
  np.testing.assert_array_equal(split.params["layers_1"]["w_o"], params["layers"]["w_o"][1])
  restacked = split.for_decoding(scan_layers=True).params
  for a, b in zip(jax.tree.leaves(restacked), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(
    jax.tree.leaves(unstack_layers(split.params, config)),
    jax.tree.leaves(unstack_layers(params, config)),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)
  tokens = jnp.asarray([[1, 5, 9, 2, 7]], jnp.int32)
  np.testing.assert_allclose(
    split.decoder.logits(split.params, tokens),
    ModelBundle(config, params).decoder.logits(params, tokens),
    rtol=1e-5,
    atol=1e-5,
  )


def test_bf16_decoding_logits_follow_the_float32_ones():
  """The same weights cast to bfloat16 once (no cast per use) give logits close to the
  float32 model's: the cast moves each weight by at most 2^-8 relatively."""
  config = _config(num_layers=2)
  params = init_params(config, jax.random.key(1))
  bf16 = ModelBundle(dataclasses.replace(config, dtype="bfloat16"), params).for_decoding()
  tokens = jnp.asarray([[1, 5, 9, 2, 7]], jnp.int32)
  full = ModelBundle(config, params).decoder.logits(params, tokens)
  half = bf16.decoder.logits(bf16.params, tokens)
  assert half.dtype == jnp.float32
  np.testing.assert_allclose(half, full, atol=0.15)


def test_the_loaders_stacker_takes_per_layer_parameters_one_at_a_time():
  """`LayerStacker` (the checkpoint loader's): per-layer parameters in any order give
  `stack_layers`' result; a layer left incomplete is named."""
  config = _config(**FAMILIES["llama"])
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  params = _random(shapes, seed=3)
  flat = traverse_util.flatten_dict(unstack_layers(params, config))
  order = np.random.default_rng(0).permutation(len(flat))
  stacker = LayerStacker(shapes, config, np.float32)
  paths = list(flat)
  for i in order:
    stacker.add(paths[i], flat[paths[i]])
  built = stacker.params()
  assert jax.tree.structure(built) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(built), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  partial = LayerStacker(shapes, config, np.float32)
  for path in paths:
    if path != ("block_2", "w_up"):
      partial.add(path, flat[path])
  with pytest.raises(ValueError, match=r"layers \[2\] of the per-layer parameters"):
    partial.params()
