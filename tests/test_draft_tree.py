"""The draft of a tree round: each distinct prefix computed once per depth (issue 27).

Every drafting scheme run with the decoder's `take_tails` (`tree=True` rounds) against
the same scheme on K tails: the same tokens, the same p and the same cache tails within
float32 rounding, and the positions the round pays for (two pending tokens once, then at
each depth the smallest of `tree.draft_widths` that holds every row's distinct
prefixes), counted here from the drafted tokens. On the PaLM test models (i.i.d. paths
that share prefixes, a static tree, the proportional tree, greedy drafts), every Hugging
Face family (sliding windows that bite, soft-caps) and a (data, model) mesh. Two broken
variants, every tail given tail 0's computation and tails shared on their first token
only, miss the K-tail draft by far more than the tolerance.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import drafting, sampling, sharding, tree
from spectr_jax.models import decoder, load_pretrained, take_tails
from tests import hf_checkpoints, test_models

ATOL = test_models.ATOL
K, L = 4, 4


def _draft(model, scheme, temperature, take, params, prompts_BxP, lengths_B, pending_Bx2,
           num_pending_B, key_B):  # fmt: skip
  """Prefill, then one round's drafts on K tails of L + 1 slots (`take`: take_tails)."""
  cache = sharding.constrain_cache(model.init_cache(prompts_BxP.shape[0], K, L + 1, 32))
  _, cache = model.prefill(params, prompts_BxP, lengths_B, cache)
  probs = functools.partial(sampling.transform_probs, temperature=temperature)
  return scheme(model.extend, params, cache, pending_Bx2, num_pending_B, key_B, probs,
                num_drafts=K, draft_len=L, take_tails=take)  # fmt: skip


def _inputs(vocab: int, seed: int = 0, rows: int = 4):
  """Ragged prompts (the prefix the draft has seen) and 1 or 2 pending tokens per row."""
  rng = np.random.default_rng(seed)
  lengths_B = rng.integers(2, 9, rows)
  return dict(
    prompts_BxP=jnp.asarray(rng.integers(0, vocab, (rows, 8)), jnp.int32),
    lengths_B=jnp.asarray(lengths_B, jnp.int32),
    pending_Bx2=jnp.asarray(rng.integers(0, vocab, (rows, 2)), jnp.int32),
    num_pending_B=jnp.asarray(1 + np.arange(rows) % 2, jnp.int32),
    key_B=jax.random.split(jax.random.key(seed), rows),
  )


def _run(model, params, inputs, scheme, temperature, take):
  run = jax.jit(functools.partial(_draft, model, scheme, temperature, take))
  return run(params, **inputs)


def _positions(tokens_BxKxL) -> int:
  """What the distinct draft pays: the pending tokens once, then per depth t < L the
  smallest compiled width that holds every row's distinct prefixes of t tokens."""
  tokens_BxKxL = np.asarray(tokens_BxKxL)
  widths = tree.draft_widths(K)
  total = 2
  for t in range(1, L):
    need = max(len({tuple(path[:t]) for path in row}) for row in tokens_BxKxL)
    total += min(w for w in widths if w >= need)
  return total


def _check(full, distinct, atol=ATOL):
  """The distinct draft equals the K-tail draft: tokens, p, cache tails and lengths."""
  np.testing.assert_array_equal(distinct.tokens_BxKxL, full.tokens_BxKxL)
  np.testing.assert_allclose(distinct.p_BxKxLxV, full.p_BxKxLxV, rtol=0, atol=atol)
  np.testing.assert_array_equal(distinct.cache.tail_len, full.cache.tail_len)
  np.testing.assert_array_equal(distinct.cache.prefix_len, full.cache.prefix_len)
  # Slots past a tail's length are stale (never attended): compared where valid.
  valid_BxKxR = np.arange(full.cache.R) < np.asarray(full.cache.tail_len)[..., None]
  assert valid_BxKxR.any(-1).all()
  for name in ("tail_k", "tail_v"):
    got, want = (np.asarray(getattr(c.cache, name)) for c in (distinct, full))
    np.testing.assert_allclose(got[:, valid_BxKxR], want[:, valid_BxKxR], rtol=0, atol=atol)
  assert int(full.positions) == K * (L + 1)
  assert int(distinct.positions) == _positions(full.tokens_BxKxL) < K * (L + 1)


_SCHEMES = {
  "iid": (drafting.iid, 0.5),
  "iid_greedy": (drafting.iid, 0.0),
  "wor_2_2_1_1": (functools.partial(drafting.without_replacement, branching=(2, 2, 1, 1)), 1.0),
  "proportional": (
    functools.partial(drafting.without_replacement, branching=drafting.PROPORTIONAL),
    0.5,
  ),
}


@functools.cache
def _palm():
  config = test_models._config(2, max_len=32)
  return decoder(config), test_models._numpy_params(config)


@pytest.mark.parametrize("name", sorted(_SCHEMES))
def test_distinct_draft_equals_the_draft_on_k_tails(name):
  """i.i.d. paths at temperature 0.5 share prefixes at some depths (fewer widths than
  K), greedy paths all agree (width 1), the (2, 2, 1, 1) tree has 2 nodes at depth 1,
  the proportional tree a shape of its own; wide or narrow, each is the K-tail draft."""
  model, params = _palm()
  scheme, temperature = _SCHEMES[name]
  inputs = _inputs(test_models.VOCAB)
  full = _run(model, params, inputs, scheme, temperature, None)
  distinct = _run(model, params, inputs, scheme, temperature, model.take_tails)
  _check(full, distinct)
  if name == "iid_greedy":
    assert int(distinct.positions) == 2 + (L - 1)


_first_equal = tree.first_equal


def _first_token_only(paths_BxKxA):
  return _first_equal(paths_BxKxA[..., :1])


@pytest.mark.parametrize("variant", ["tail_0_for_all", "first_token_only"])
def test_a_broken_distinct_draft_misses_the_draft_on_k_tails(variant, monkeypatch):
  """The check the distinct draft passes fails on each broken variant."""
  model, params = _palm()
  scheme, temperature = _SCHEMES["iid"]
  inputs = _inputs(test_models.VOCAB)
  full = _run(model, params, inputs, scheme, temperature, None)
  take = model.take_tails
  if variant == "tail_0_for_all":
    take = lambda cache, tails_BxW: take_tails(cache, jnp.zeros_like(tails_BxW))  # noqa: E731
  else:
    monkeypatch.setattr(tree, "first_equal", _first_token_only)
  broken = _run(model, params, inputs, scheme, temperature, take)
  error = np.abs(np.asarray(broken.p_BxKxLxV) - np.asarray(full.p_BxKxLxV)).max()
  assert error > 10 * ATOL, error


def test_take_tails_selects_spreads_and_shares_the_prefix():
  cache = test_models._random_cache(b=2, k=3, s=5, r=4, prefix_len=[2, 5])
  cache = cache.replace(tail_len=jnp.asarray([[1, 2, 3], [4, 0, 2]], jnp.int32))
  for tails_BxW in ([[2], [0]], [[1, 1, 0, 2, 2], [0, 0, 0, 0, 1]], [[2, 0, 1], [1, 2, 0]]):
    index_BxW = np.asarray(tails_BxW)
    got = jax.jit(take_tails)(cache, jnp.asarray(index_BxW))
    assert got.K == index_BxW.shape[1] and (got.S, got.R) == (cache.S, cache.R)
    for b, row in enumerate(index_BxW):
      for name in ("tail_k", "tail_v"):
        np.testing.assert_array_equal(getattr(got, name)[:, b], getattr(cache, name)[:, b, row])
      np.testing.assert_array_equal(got.tail_len[b], cache.tail_len[b, row])
    for name in ("prefix_k", "prefix_v", "prefix_len"):
      np.testing.assert_array_equal(getattr(got, name), getattr(cache, name))


def test_first_equal_and_the_draft_widths():
  paths_BxKxA = jnp.asarray([[[1, 2], [1, 3], [1, 2], [0, 0]], [[5, 5], [5, 5], [5, 5], [5, 5]]])
  np.testing.assert_array_equal(tree.first_equal(paths_BxKxA), [[0, 1, 0, 3], [0, 0, 0, 0]])
  assert tree.draft_widths(1) == (1,)
  assert tree.draft_widths(4) == (1, 2, 4)
  assert tree.draft_widths(8) == (1, 2, 4, 8)
  assert tree.draft_widths(16) == (1, 4, 8, 16)
  with pytest.raises(ValueError, match="num_drafts"):
    tree.draft_widths(0)


# Gemma 2 (soft-caps, alternating windows) and Mistral (a window that bites) in the fast
# tier; the other families with --runslow.
@pytest.mark.parametrize(
  "family",
  [
    pytest.param(f, marks=() if f in ("gemma2", "mistral") else pytest.mark.slow)
    for f in [*hf_checkpoints.FAMILIES, "mistral"]
  ],
)
def test_every_family_drafts_each_distinct_prefix_once(family, tmp_path):
  """Llama (llama3 rope scaling), Qwen2 (biases), Gemma, Gemma 2 (soft-caps, a window of
  4 on the even layers), GPT-2 (learned positions) and Mistral (a window of 2 on every
  layer, shorter than the draft): the distinct i.i.d. draft is the K-tail draft."""
  if family == "mistral":
    config = hf_checkpoints.tiny_config("llama", model_type="mistral", sliding_window=2)
    hf_checkpoints.write_checkpoint(tmp_path, "llama", config, tokenizer=False)
  else:
    hf_checkpoints.write_checkpoint(tmp_path, family, tokenizer=False)
  bundle = load_pretrained(tmp_path)
  model = decoder(bundle.config)
  inputs = _inputs(bundle.config.vocab_size, seed=1)
  scheme, temperature = drafting.iid, 0.3
  full = _run(model, bundle.params, inputs, scheme, temperature, None)
  distinct = _run(model, bundle.params, inputs, scheme, temperature, model.take_tails)
  scale = np.abs(np.asarray(full.p_BxKxLxV)).max()
  _check(full, distinct, atol=test_models.ATOL * max(scale, 1.0))


@pytest.mark.slow
def test_model_sharded_distinct_draft_matches_one_device():
  """Heads over model = 2, rows over data = 4: the distinct draft on the mesh is the
  K-tail draft on one device."""
  model, params = _palm()
  scheme, temperature = _SCHEMES["iid"]
  inputs = _inputs(test_models.VOCAB, seed=2, rows=8)
  full = _run(model, params, inputs, scheme, temperature, None)
  mesh = sharding.make_mesh(4, 2, devices=jax.devices()[:8])
  sharded_params = sharding.shard_params(params, mesh, axes=model.param_axes())
  with jax.set_mesh(mesh):
    distinct = _run(model, sharded_params, inputs, scheme, temperature, model.take_tails)
  _check(full, jax.device_get(distinct), atol=1e-5)
