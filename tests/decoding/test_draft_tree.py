"""The draft of a dedup round: each shared prefix computed once (issue 27).

Every drafting scheme run with the decoder's `take_tails` (dedup rounds) against
the same scheme on K tails: the same tokens, the same p and the same cache tails within
float32 rounding, and the positions the round pays for (the pending tokens once, then per
depth one tail per node of a static tree, K elsewhere). On the PaLM test models (i.i.d.
paths, static trees, the proportional tree, greedy drafts), every Hugging Face family
(sliding windows that bite, soft-caps) and a (data, model) mesh. Two broken variants,
every tail given tail 0's computation and a static tree's nodes taken twice as wide,
miss the K-tail draft by far more than the tolerance.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import drafting, sampling, sharding
from spectr_jax.models import decoder, load_pretrained, take_tails
from spectr_jax.testing import hf_checkpoints
from tests.models import test_models

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


def _positions(branching) -> int:
  """What the shared draft pays per row: the pending tokens once, then per depth t < L
  one tail per node of a static tree (the product of its first t branchings), else K."""
  total = 2
  for t in range(1, L):
    total += K if not isinstance(branching, tuple) else math.prod(branching[:t])
  return total


def _check(full, shared, branching=None, atol=ATOL):
  """The shared draft equals the K-tail draft: tokens, p, cache tails and lengths."""
  np.testing.assert_array_equal(shared.tokens_BxKxL, full.tokens_BxKxL)
  np.testing.assert_allclose(shared.p_BxKxLxV, full.p_BxKxLxV, rtol=0, atol=atol)
  np.testing.assert_array_equal(shared.cache.tail_len, full.cache.tail_len)
  np.testing.assert_array_equal(shared.cache.prefix_len, full.cache.prefix_len)
  # Slots past a tail's length are stale (never attended): compared where valid.
  valid_BxKxR = np.arange(full.cache.R) < np.asarray(full.cache.tail_len)[..., None]
  assert valid_BxKxR.any(-1).all()
  for name in ("tail_k", "tail_v"):
    got, want = (np.asarray(getattr(c.cache, name)) for c in (shared, full))
    np.testing.assert_allclose(got[:, valid_BxKxR], want[:, valid_BxKxR], rtol=0, atol=atol)
  assert int(full.positions) == K * (L + 1)
  assert int(shared.positions) == _positions(branching) < K * (L + 1)


_SCHEMES = {  # name: (scheme, temperature, branching)
  "iid": (drafting.iid, 0.5, None),
  "iid_greedy": (drafting.iid, 0.0, None),
  "wor": (drafting.without_replacement, 1.0, None),
  "wor_2_2_1_1": (
    functools.partial(drafting.without_replacement, branching=(2, 2, 1, 1)),
    1.0,
    (2, 2, 1, 1),
  ),
  "wor_1_2_1_2": (
    functools.partial(drafting.without_replacement, branching=(1, 2, 1, 2)),
    0.5,
    (1, 2, 1, 2),
  ),
  "proportional": (
    functools.partial(drafting.without_replacement, branching=drafting.PROPORTIONAL),
    0.5,
    None,
  ),
}


@functools.cache
def _palm():
  config = test_models._config(2, max_len=32)
  return decoder(config), test_models._numpy_params(config)


@pytest.mark.parametrize("name", sorted(_SCHEMES))
def test_shared_draft_equals_the_draft_on_k_tails(name):
  """i.i.d. paths (sampled and greedy), the default tree without replacement, the
  proportional tree (the opening shared), and static trees whose nodes hold 2 or 4
  tails at some depths (one computed per node): each is the K-tail draft."""
  model, params = _palm()
  scheme, temperature, branching = _SCHEMES[name]
  inputs = _inputs(test_models.VOCAB)
  full = _run(model, params, inputs, scheme, temperature, None)
  shared = _run(model, params, inputs, scheme, temperature, model.take_tails)
  _check(full, shared, branching)


_runs = drafting._runs


@pytest.mark.parametrize("variant", ["tail_0_for_all", "nodes_twice_as_wide"])
def test_a_broken_shared_draft_misses_the_draft_on_k_tails(variant, monkeypatch):
  """The check the shared draft passes fails on each broken variant."""
  model, params = _palm()
  scheme, temperature, _ = _SCHEMES["wor_2_2_1_1"]
  inputs = _inputs(test_models.VOCAB)
  full = _run(model, params, inputs, scheme, temperature, None)
  take = model.take_tails
  if variant == "tail_0_for_all":
    take = lambda cache, tails_BxW: take_tails(cache, jnp.zeros_like(tails_BxW))  # noqa: E731
  else:
    monkeypatch.setattr(drafting, "_runs", lambda sizes: _runs([min(2 * s, K) for s in sizes]))
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


# Gemma 2 (soft-caps, alternating windows) and Mistral (a window that bites) in the fast
# tier; the other families with --runslow.
@pytest.mark.parametrize("family", hf_checkpoints.family_params())
def test_every_family_drafts_each_shared_prefix_once(family, tmp_path):
  """Llama (llama3 rope scaling), Qwen2 (biases), Gemma, Gemma 2 (soft-caps, a window of
  4 on the even layers), GPT-2 (learned positions) and Mistral (a window of 2 on every
  layer, shorter than the draft): the shared draft of a (2, 2, 1, 1) tree is the K-tail
  draft."""
  hf_checkpoints.write_tiny(tmp_path, family)
  bundle = load_pretrained(tmp_path)
  model = decoder(bundle.config)
  inputs = _inputs(bundle.config.vocab_size, seed=1)
  scheme, temperature, branching = _SCHEMES["wor_2_2_1_1"]
  full = _run(model, bundle.params, inputs, scheme, temperature, None)
  shared = _run(model, bundle.params, inputs, scheme, temperature, model.take_tails)
  _check(full, shared, branching)


@pytest.mark.slow
def test_model_sharded_shared_draft_matches_one_device():
  """Heads over model = 2, rows over data = 4: the shared draft of a (2, 2, 1, 1) tree on
  the mesh is the K-tail draft on one device."""
  model, params = _palm()
  scheme, temperature, branching = _SCHEMES["wor_2_2_1_1"]
  inputs = _inputs(test_models.VOCAB, seed=2, rows=8)
  full = _run(model, params, inputs, scheme, temperature, None)
  mesh = sharding.make_mesh(4, 2, devices=jax.devices()[:8])
  sharded_params = sharding.shard_params(params, mesh, axes=model.param_axes())
  with jax.set_mesh(mesh):
    shared = _run(model, sharded_params, inputs, scheme, temperature, model.take_tails)
  _check(full, jax.device_get(shared), branching, atol=1e-5)
