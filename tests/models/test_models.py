"""Tests of the decoder protocol, the families' configs, the speculative KV cache, and
a new family added as one module (tests/toy_family.py).

Every cache test compares against the plain causal forward (`Decoder.logits`) of the full
sequence, which is the definition of what prefill/extend/commit/rollback must compute.
"""

import dataclasses
import functools
import inspect
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import engine, rounds, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import (
  Decoder,
  KVCache,
  ModelBundle,
  ModelConfig,
  RopeScaling,
  commit,
  count_params,
  decoder,
  expected_num_params,
  get_model_config,
  init_params,
  layers,
  model_config_names,
  param_axes,
  register_family,
  reset_tails,
  rollback,
)
from spectr_jax.models import family as family_lib
from spectr_jax.models.families import gemma, gpt2, llama
from tests import toy_family

VOCAB = 61
ATOL = 1e-4
WIDTH = 20  # padded length of the reference sequences
ROWS = 4  # padded number of reference sequences (one compiled reference forward)
PROMPT_WIDTH = 13  # padded prompt length (fewer prefill compilations)


_commit = jax.jit(commit)
_rollback = jax.jit(rollback)


def _config(num_kv_heads: int, **overrides) -> ModelConfig:
  fields = dict(
    vocab_size=VOCAB,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=num_kv_heads,
    head_dim=8,
    mlp_dim=64,
    max_len=16,
  )
  return ModelConfig(**{**fields, **overrides})


def _numpy_params(config: ModelConfig, seed: int = 0):
  """Random parameters of the right structure without compiling the (slow on CPU) init."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))

  def fill(x):
    if x.ndim == 1:
      return jnp.ones(x.shape, x.dtype)
    return jnp.asarray(rng.normal(size=x.shape) / np.sqrt(x.shape[0]), x.dtype)

  params = jax.tree.map(fill, shapes)
  params["embed"]["embedding"] = jnp.asarray(rng.normal(size=shapes["embed"]["embedding"].shape))
  return params


class _Harness:
  """A tiny model with jitted forward, prefill and extend, and a reference forward."""

  def __init__(self, config: ModelConfig):
    self.config = config
    self.decoder = decoder(config)
    self.params = _numpy_params(config)
    self.forward = jax.jit(functools.partial(self.decoder.logits, self.params))
    self.prefill = jax.jit(functools.partial(self.decoder.prefill, self.params))
    self.extend = jax.jit(functools.partial(self.decoder.extend, self.params))

  def reference(self, seqs: list[list[int]]) -> np.ndarray:
    """Full-forward logits of each sequence, right-padded to WIDTH: len(seqs) x WIDTH x V."""
    tokens = np.zeros((ROWS, WIDTH), np.int32)
    for i, seq in enumerate(seqs):
      tokens[i, : len(seq)] = seq
    return np.asarray(self.forward(jnp.asarray(tokens)))[: len(seqs)]


@functools.cache
def _harness(num_kv_heads: int) -> _Harness:
  return _Harness(_config(num_kv_heads))


@pytest.fixture
def harness() -> _Harness:
  """Grouped-query attention: 4 query heads on 2 key/value heads."""
  return _harness(2)


@pytest.fixture(params=[1, 2], ids=["mqa", "gqa2"])
def any_harness(request) -> _Harness:
  """Multi-query (1 key/value head) and grouped-query (2) attention."""
  return _harness(request.param)


def _tokens(seed: int, shape: tuple[int, ...]) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


def _prefill(h: _Harness, prompts: list[list[int]], num_tails: int, tail_capacity: int):
  """Prefills right-padded prompts; returns (logits, cache)."""
  tokens = np.zeros((len(prompts), PROMPT_WIDTH), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, : len(p)] = p
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  cache = h.decoder.init_cache(len(prompts), num_tails, tail_capacity)
  return h.prefill(jnp.asarray(tokens), lengths, cache)


def _prompts(seed: int, lengths: list[int]) -> list[list[int]]:
  return [list(_tokens(seed + i, (n,))) for i, n in enumerate(lengths)]


# Configs.


def test_unknown_config_name_lists_the_known_names():
  with pytest.raises(ValueError, match="known names: draft-test, target-test"):
    get_model_config("target-huge", vocab_size=4096)


def test_config_rejects_bad_head_split():
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    _config(num_kv_heads=3)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(rope_base=None, rope_scaling=RopeScaling(8, 1, 4, 16)), "rope_scaling needs rotary"),
    (dict(head_dim=7), "head_dim must be even"),
    (dict(sliding_window=0), "sliding_window must be positive"),
    (dict(rope_base=-1.0), "rope_base must be positive"),
    (dict(family=""), "family must be a family's name"),
    (dict(options={"qkv_bias": True}), "options must be hashable"),
  ],
)
def test_config_rejects_bad_common_fields(overrides, message):
  with pytest.raises(ValueError, match=message):
    _config(num_kv_heads=2, **overrides)
  with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
    RopeScaling(factor=8, low_freq_factor=4, high_freq_factor=4, original_max_len=16)
  _config(num_kv_heads=2, rope_base=None, head_dim=7)  # no rotation: any head width


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(family="bert"), "unknown model family 'bert'; known families: palm, llama, gemma"),
    (dict(options=llama.LlamaOptions()), "the palm family takes no options, got LlamaOptions"),
    (dict(family="gemma", options=gemma.Gemma2Options()), "gemma family takes LlamaOptions"),
    (dict(family="gpt2", rope_base=None), "the gpt2 family needs GPT2Options options"),
  ],
)
def test_family_and_options_are_checked_when_the_decoder_is_built(overrides, message):
  with pytest.raises(ValueError, match=message):
    decoder(_config(num_kv_heads=2, **overrides))
  with pytest.raises(ValueError, match="attn_softcap must be positive"):
    gemma.Gemma2Options(attn_softcap=0.0)
  with pytest.raises(ValueError, match="num_positions must be >= 1"):
    gpt2.GPT2Options(num_positions=0)


_BIASES = llama.LlamaOptions(qkv_bias=True, out_bias=True, mlp_bias=True)


@pytest.mark.parametrize(
  "overrides",
  [
    dict(family="gpt2", options=gpt2.GPT2Options(num_positions=9), rope_base=None),
    dict(family="llama", options=_BIASES, tied_embedding=False),
    dict(family="gemma", options=_BIASES),
    dict(family="gemma2", options=gemma.Gemma2Options(mlp_bias=True, attn_softcap=5.0),
         tied_embedding=False, head_dim=6),
    dict(family="toy"),
  ],
  ids=["gpt2", "llama-biased", "gemma-biased", "gemma2", "toy"],
)  # fmt: skip
def test_family_parameter_counts_have_the_closed_form(overrides):
  register_family(toy_family.FAMILY)
  config = _config(num_kv_heads=2, **overrides)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  assert count_params(shapes) == expected_num_params(config)


def test_sliding_window_layers():
  config = _config(num_kv_heads=2, num_layers=3, sliding_window=4, family="gemma2")
  assert gemma.layer_window(config) == layers.Window(4, every=2)


def test_overrides_replace_named_fields():
  config = get_model_config("draft-tiny", 4096, max_len=99, dtype="bfloat16")
  assert (config.max_len, config.compute_dtype) == (99, jnp.bfloat16)


@pytest.mark.parametrize(
  "name, low, high",
  [
    ("draft-tiny", 0.4e6, 0.7e6),
    ("target-small", 3e6, 5e6),
    ("draft-base", 15e6, 25e6),
    ("target-base", 80e6, 120e6),
    ("target-large", 350e6, 450e6),
  ],
)
def test_named_sizes_have_the_intended_parameter_counts(name, low, high):
  config = get_model_config(name, vocab_size=4096)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  assert count_params(shapes) == expected_num_params(config)
  assert low <= count_params(shapes) <= high


def test_all_names_build():
  for name in model_config_names():
    config = get_model_config(name, vocab_size=4096)
    assert config.num_heads % config.num_kv_heads == 0


# The plain forward.


def test_forward_shapes_and_params(any_harness):
  logits = any_harness.forward(jnp.asarray(_tokens(0, (3, 7))))
  assert logits.shape == (3, 7, VOCAB) and logits.dtype == jnp.float32
  assert count_params(any_harness.params) == expected_num_params(any_harness.config)
  hk = any_harness.config.num_kv_heads
  assert any_harness.params["layers"]["w_qkv"].shape == (2, 32, hk, 4 // hk + 2, 8)


def test_future_tokens_do_not_change_past_logits(any_harness):
  tokens = _tokens(1, (2, 9))
  changed = tokens.copy()
  changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB
  a = any_harness.forward(jnp.asarray(tokens))
  b = any_harness.forward(jnp.asarray(changed))
  np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
  assert not np.allclose(a[:, 5:], b[:, 5:], atol=1e-3)


def test_output_vocab_size_keeps_the_first_logits_exactly(harness):
  tokens = jnp.asarray(_tokens(3, (2, 5)))
  full = harness.forward(tokens)
  config = dataclasses.replace(harness.config, output_vocab_size=VOCAB - 3)
  cut = decoder(config).logits(harness.params, tokens)
  assert config.num_logits == cut.shape[-1] == VOCAB - 3
  np.testing.assert_allclose(cut, full[..., : VOCAB - 3], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="output_vocab_size"):
    dataclasses.replace(harness.config, output_vocab_size=VOCAB + 1)


def test_init_params_makes_every_param_in_float32():
  config = _config(2, num_layers=1, dtype="bfloat16")
  params = init_params(config, jax.random.key(0))
  assert count_params(params) == expected_num_params(config)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  assert float(jnp.std(params["embed"]["embedding"])) == pytest.approx(1.0, abs=0.2)


def test_bfloat16_compute_runs_with_float32_logits():
  config = _config(1, dtype="bfloat16")
  params = _numpy_params(config)
  logits = jax.jit(decoder(config).logits)(params, jnp.asarray(_tokens(2, (1, 4))))
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))
  cache = decoder(config).init_cache(1, 2, 3)
  assert cache.prefix_k.dtype == jnp.bfloat16


def test_bundle_crosses_jit_with_static_config(harness):
  bundle = ModelBundle(config=harness.config, params=harness.params)
  tokens = jnp.asarray(_tokens(3, (1, 5)))

  @jax.jit
  def run(bundle, tokens):
    return bundle.decoder.logits(bundle.params, tokens)

  np.testing.assert_allclose(run(bundle, tokens), harness.forward(tokens), atol=1e-6)
  flax_forward = bundle.model.apply({"params": bundle.params}, tokens)  # the module itself
  np.testing.assert_allclose(flax_forward, harness.forward(tokens), atol=1e-6)


# The cache against the full forward.


def test_prefill_then_token_by_token_equals_full_forward(harness):
  prompts = _prompts(10, [3, 6])
  cont = _tokens(20, (2, 5))
  logits, cache = _prefill(harness, prompts, num_tails=1, tail_capacity=5)
  ref = harness.reference([p + list(c) for p, c in zip(prompts, cont, strict=True)])
  for b, p in enumerate(prompts):
    np.testing.assert_allclose(logits[b, : len(p)], ref[b, : len(p)], atol=ATOL)
  np.testing.assert_array_equal(cache.prefix_len, [3, 6])
  for t in range(5):
    logits, cache = harness.extend(jnp.asarray(cont[:, None, t : t + 1]), cache)
    for b, p in enumerate(prompts):
      np.testing.assert_allclose(logits[b, 0, 0], ref[b, len(p) + t], atol=ATOL)
  np.testing.assert_array_equal(cache.tail_len, [[5], [5]])


def test_autoregressive_decoding_with_commit_after_each_token(harness):
  prompts = _prompts(30, [2, 5])
  cont = _tokens(40, (2, 4))
  _, cache = _prefill(harness, prompts, num_tails=1, tail_capacity=1)
  ref = harness.reference([p + list(c) for p, c in zip(prompts, cont, strict=True)])
  for t in range(4):
    logits, cache = harness.extend(jnp.asarray(cont[:, None, t : t + 1]), cache)
    cache = _commit(cache, jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.int32))
    for b, p in enumerate(prompts):
      np.testing.assert_allclose(logits[b, 0, 0], ref[b, len(p) + t], atol=ATOL)
  np.testing.assert_array_equal(cache.prefix_len, [6, 9])


def test_extend_several_tokens_at_once(harness):
  prompts = _prompts(50, [4, 1])
  cont = _tokens(60, (2, 6))
  _, cache = _prefill(harness, prompts, num_tails=1, tail_capacity=6)
  ref = harness.reference([p + list(c) for p, c in zip(prompts, cont, strict=True)])
  for start, stop in ((0, 4), (4, 6)):
    logits, cache = harness.extend(jnp.asarray(cont[:, None, start:stop]), cache)
    for b, p in enumerate(prompts):
      np.testing.assert_allclose(logits[b, 0], ref[b, len(p) + start : len(p) + stop], atol=ATOL)


def test_k_tails_each_equal_the_full_forward_of_prefix_plus_tail(any_harness):
  prompts = _prompts(70, [5, 2, 7])
  tails = _tokens(80, (3, 4, 3))  # B x K x T, fed as T=2 then T=1
  _, cache = _prefill(any_harness, prompts, num_tails=4, tail_capacity=3)
  first, cache = any_harness.extend(jnp.asarray(tails[:, :, :2]), cache)
  second, cache = any_harness.extend(jnp.asarray(tails[:, :, 2:]), cache)
  logits = np.concatenate([first, second], axis=2)
  for b, p in enumerate(prompts):
    ref = any_harness.reference([p + list(tail) for tail in tails[b]])
    np.testing.assert_allclose(logits[b], ref[:, len(p) : len(p) + 3], atol=ATOL)


def test_ragged_num_new_tokens(harness):
  prompts = _prompts(90, [3, 4])
  step1 = _tokens(100, (2, 2, 3))
  step2 = _tokens(110, (2, 2, 2))
  num_new = jnp.asarray([3, 1], jnp.int32)
  _, cache = _prefill(harness, prompts, num_tails=2, tail_capacity=5)
  logits1, cache = harness.extend(jnp.asarray(step1), cache, num_new)
  np.testing.assert_array_equal(cache.tail_len, [[3, 3], [1, 1]])
  logits2, cache = harness.extend(jnp.asarray(step2), cache)
  for b, p in enumerate(prompts):
    n = int(num_new[b])
    ref = harness.reference([p + list(step1[b, k, :n]) + list(step2[b, k]) for k in range(2)])
    np.testing.assert_allclose(logits1[b, :, :n], ref[:, len(p) : len(p) + n], atol=ATOL)
    np.testing.assert_allclose(logits2[b], ref[:, len(p) + n : len(p) + n + 2], atol=ATOL)


def test_logits_at_one_position_per_row_equal_the_full_extend(harness):
  """`extend(..., logits_at_B=)` (the draft's first call of a round) gives the logits of
  the chosen token of each row, and the same cache, as the full extend."""
  prompts = _prompts(120, [3, 5])
  tokens = jnp.asarray(_tokens(130, (2, 3, 2)))
  num_new, at = jnp.asarray([2, 1], jnp.int32), jnp.asarray([1, 0], jnp.int32)
  _, cache = _prefill(harness, prompts, num_tails=3, tail_capacity=4)
  full, full_cache = harness.extend(tokens, cache, num_new)
  one, one_cache = harness.extend(tokens, cache, num_new, at)
  assert one.shape == (2, 3, VOCAB)
  for b in range(2):
    np.testing.assert_allclose(one[b], full[b, :, int(at[b])], atol=ATOL)
  for x, y in zip(jax.tree.leaves(one_cache), jax.tree.leaves(full_cache), strict=True):
    np.testing.assert_array_equal(x, y)


def test_commit_then_continue_equals_full_forward_of_committed_sequence(any_harness):
  prompts = _prompts(120, [4, 2, 13])
  drafts = _tokens(130, (3, 3, 4))
  tail_idx = np.array([2, 0, 1])
  num = np.array([2, 4, 3])  # row 2 fills S = 16 exactly; the rest of its window is dropped
  _, cache = _prefill(any_harness, prompts, num_tails=3, tail_capacity=4)
  _, cache = any_harness.extend(jnp.asarray(drafts), cache)
  cache = _commit(cache, jnp.asarray(tail_idx), jnp.asarray(num))
  np.testing.assert_array_equal(cache.prefix_len, [6, 6, 16])
  np.testing.assert_array_equal(cache.tail_len, np.zeros((3, 3)))
  nxt = _tokens(140, (3, 3, 2))
  logits, cache = any_harness.extend(jnp.asarray(nxt), cache)
  for b, p in enumerate(prompts):
    kept = p + list(drafts[b, tail_idx[b], : num[b]])
    ref = any_harness.reference([kept + list(nxt[b, k]) for k in range(3)])
    np.testing.assert_allclose(logits[b], ref[:, len(kept) : len(kept) + 2], atol=ATOL)


def test_rollback_then_continue_equals_full_forward_of_new_sequence(harness):
  prompts = _prompts(150, [6, 8])
  drafts = _tokens(160, (2, 1, 3))
  _, cache = _prefill(harness, prompts, num_tails=1, tail_capacity=3)
  _, cache = harness.extend(jnp.asarray(drafts), cache)
  cache = _commit(cache, jnp.zeros(2, jnp.int32), jnp.asarray([3, 2]))
  new_len = jnp.asarray([4, 20])  # row 0 rolls back into its prompt; row 1 stays at 10
  cache = _rollback(cache, new_len)
  np.testing.assert_array_equal(cache.prefix_len, [4, 10])
  other = _tokens(170, (2, 1, 3))
  logits, cache = harness.extend(jnp.asarray(other), cache)
  seqs = [prompts[0][:4], prompts[1] + list(drafts[1, 0, :2])]
  ref = harness.reference([s + list(o[0]) for s, o in zip(seqs, other, strict=True)])
  for b, s in enumerate(seqs):
    np.testing.assert_allclose(logits[b, 0], ref[b, len(s) : len(s) + 3], atol=ATOL)


# The cache functions on their own.


def _random_cache(b: int, k: int, s: int, r: int, prefix_len: list[int]) -> KVCache:
  rng = np.random.default_rng(0)
  prefix = (2, b, s, 1, 3)
  tail = (2, b, k, r, 1, 3)
  return KVCache(
    prefix_k=jnp.asarray(rng.normal(size=prefix), jnp.float32),
    prefix_v=jnp.asarray(rng.normal(size=prefix), jnp.float32),
    prefix_len=jnp.asarray(prefix_len, jnp.int32),
    tail_k=jnp.asarray(rng.normal(size=tail), jnp.float32),
    tail_v=jnp.asarray(rng.normal(size=tail), jnp.float32),
    tail_len=jnp.full((b, k), r, jnp.int32),
  )


def test_commit_writes_only_the_window_and_never_past_capacity():
  cache = _random_cache(b=3, k=2, s=8, r=3, prefix_len=[0, 4, 7])
  tail_idx, num = jnp.asarray([1, 0, 1]), jnp.asarray([3, 2, 1])
  new = jax.jit(commit, donate_argnums=0)(jax.tree.map(jnp.copy, cache), tail_idx, num)
  assert (new.B, new.K, new.S, new.R) == (3, 2, 8, 3)
  np.testing.assert_array_equal(new.prefix_len, [3, 6, 8])
  np.testing.assert_array_equal(new.tail_len, np.zeros((3, 2)))
  for b, (start, i) in enumerate([(0, 1), (4, 0), (7, 1)]):
    end = min(start + 3, 8)
    for name in ("k", "v"):
      old_prefix = np.asarray(getattr(cache, f"prefix_{name}"))[:, b]
      new_prefix = np.asarray(getattr(new, f"prefix_{name}"))[:, b]
      window = np.asarray(getattr(cache, f"tail_{name}"))[:, b, i]
      np.testing.assert_array_equal(new_prefix[:, :start], old_prefix[:, :start])
      np.testing.assert_array_equal(new_prefix[:, start:end], window[:, : end - start])
      np.testing.assert_array_equal(new_prefix[:, end:], old_prefix[:, end:])


def test_rollback_and_reset_tails_move_only_lengths():
  cache = _random_cache(b=2, k=2, s=8, r=3, prefix_len=[5, 2])
  rolled = _rollback(cache, jnp.asarray([3, 6]))
  np.testing.assert_array_equal(rolled.prefix_len, [3, 2])
  np.testing.assert_array_equal(rolled.tail_len, np.zeros((2, 2)))
  np.testing.assert_array_equal(rolled.prefix_k, cache.prefix_k)
  reset = reset_tails(cache)
  np.testing.assert_array_equal(reset.prefix_len, cache.prefix_len)
  np.testing.assert_array_equal(reset.tail_len, np.zeros((2, 2)))


# The decoder protocol and the family registry.


def test_decoders_are_static_and_follow_the_protocol(harness):
  a, b = decoder(harness.config), decoder(dataclasses.replace(harness.config))
  assert isinstance(a, Decoder) and a == b and hash(a) == hash(b)
  assert a.num_logits == VOCAB
  cache = a.init_cache(2, 3, 4, cache_len=11)
  assert (cache.B, cache.K, cache.R, cache.S) == (2, 3, 4, 11)
  assert a.init_cache(1, 1, 1).S == harness.config.max_len


def test_the_round_and_the_engine_name_no_model_class():
  for module in (rounds, engine):
    source = inspect.getsource(module)
    assert "Transformer" not in source and ".apply(" not in source, module.__name__


@pytest.mark.parametrize(
  "overrides",
  [
    dict(),
    dict(family="llama", options=_BIASES, tied_embedding=False),
    dict(family="gpt2", options=gpt2.GPT2Options(num_positions=9), rope_base=None),
    dict(family="gemma2", options=gemma.Gemma2Options()),
    dict(family="toy"),
  ],
  ids=["palm", "llama", "gpt2", "gemma2", "toy"],
)
def test_param_axes_name_every_dimension_of_every_parameter(overrides):
  register_family(toy_family.FAMILY)
  config = _config(num_kv_heads=2, **overrides)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  by_path = sharding.axes_by_path(param_axes(config))
  leaves = jax.tree_util.tree_leaves_with_path(shapes)
  assert len(by_path) == len(leaves)
  for path, x in leaves:
    assert len(by_path[tuple(k.key for k in path)]) == x.ndim
  assert by_path[("layers", "w_qkv")] == ("layers", "embed", "kv_heads", "qkv", "head_dim")
  assert by_path[("embed", "embedding")] == ("vocab", "embed")


class _BareBlock(layers.Block):
  """A block whose parameter has no logical axes."""

  @nn.compact
  def __call__(self, x_XxD, pos_X, attend):
    del pos_X, attend
    return x_XxD * self.param("w_new", nn.initializers.ones, (self.config.d_model,)), None


class _Bare(family_lib.Family):
  name = "bare-test"
  block = _BareBlock


_BARE = _Bare()


def test_a_parameter_created_without_logical_axes_is_refused():
  register_family(_BARE)
  with pytest.raises(
    ValueError, match="parameter layers/w_new of the bare-test family was created without"
  ):
    param_axes(_config(num_kv_heads=2, family="bare-test"))


def test_the_registry_refuses_a_second_family_of_a_name_or_model_type():
  with pytest.raises(ValueError, match="a family named 'palm' is registered already"):
    register_family(type("Other", (toy_family.Toy,), {"name": "palm"})())
  with pytest.raises(ValueError, match="model_type 'qwen2' belongs to the llama family"):
    register_family(type("Qwen", (toy_family.Toy,), {"name": "q", "model_types": ("qwen2",)})())
  assert register_family(toy_family.FAMILY) is register_family(toy_family.FAMILY)


@pytest.mark.slow
def test_a_family_added_as_one_module_decodes_in_the_engine_and_shards_by_its_axes():
  """tests/toy_family.py, registered: greedy K-SEQ decoding of it (with a PaLM draft)
  equals greedy decoding of its full forward, and its new `gate` parameter is placed by
  the logical axes it was created with."""
  register_family(toy_family.FAMILY)
  config = get_model_config("target-test", VOCAB, family="toy")
  target = ModelBundle(config, init_params(config, jax.random.key(3)))
  draft_config = get_model_config("draft-test", VOCAB)
  draft = ModelBundle(draft_config, init_params(draft_config, jax.random.key(4)))
  prompts = jnp.asarray([[5, 6, 7], [8, 9, 0]], jnp.int32)
  lengths = jnp.asarray([3, 2])
  out = engine.generate(
    jax.random.key(0),
    DecodeSpec(method="kseq", num_drafts=2, draft_len=3, max_new_tokens=6, temperature=0.0),
    draft=draft,
    target=target,
    prompts=prompts,
    prompt_lengths=lengths,
  )
  forward = jax.jit(target.decoder.logits)
  for row in range(2):
    seq = list(np.asarray(prompts[row, : lengths[row]]))
    for _ in range(6):
      seq.append(int(jnp.argmax(forward(target.params, jnp.asarray([seq]))[0, -1])))
    np.testing.assert_array_equal(np.asarray(out.tokens_BxT[row]), seq[-6:])
  mesh = sharding.make_mesh(4, 2)
  axes = param_axes(config)
  placed = sharding.shard_params(target.params, mesh, axes=axes)
  assert placed["layers"]["gate"].sharding.spec == jax.sharding.PartitionSpec()
  qkv_spec = jax.sharding.PartitionSpec(None, None, "model")
  assert placed["layers"]["w_qkv"].sharding.spec == qkv_spec
  text = sharding.describe(target.params, mesh, axes=axes)
  assert re.search(r"\n  layers/gate +\(2, 64\) +\('layers', 'embed'\) +P\(\)\n", text), text
