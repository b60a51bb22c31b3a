"""Exactness of `sampling.categorical` at LLM vocabularies, and the top-p transform.

The sampler's law is derived, not sampled: `level_masses` gives the integer masses of
both levels, and the multiply-high map gives index i of masses m (prefix sums C, total N)
exactly ceil(C_i 2^32 / N) - ceil(C_{i-1} 2^32 / N) of the 2^32 words of its level. The
tests check that this derivation describes the real code (a numpy reimplementation of
the map on random words, and every boundary word of small cases: the map is
non-decreasing in each word, so its boundaries determine it), then bound the derived
law's total variation from the normalised float64 weights and its support. The old
sampler (one float32 uniform, inverse CDF over `jnp.cumsum`) is enumerated over its 2^23
uniforms and rejected by the same check; chi-square tests of direct draws complete it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import sampling
from tests import stats

pytestmark = pytest.mark.numerics  # the whole module: the optimised pass of scripts/test.sh

TV_BOUND = 1e-6


def _vectors(vocab: int) -> dict:
  """The test weight vectors (float32) at `vocab`: LLM-like, flat, tiny masses, truncated."""
  rng = np.random.default_rng(vocab)
  logits_V = jnp.asarray(4.0 * rng.normal(size=vocab), jnp.float32)
  peaked = np.asarray(sampling.transform_probs(logits_V, 1.0))
  tiny = peaked.copy()
  tiny[rng.random(vocab) < 0.1] = 1e-30
  tiny[rng.random(vocab) < 0.1] = 0.0
  return {
    "peaked": peaked,
    "flat": np.asarray(sampling.transform_probs(0.01 * logits_V, 1.0)),
    "tiny-1e-30": tiny / tiny.sum(dtype=np.float32),
    "top-k-40": np.asarray(sampling.transform_probs(logits_V, 1.0, top_k=40)),
    "top-p-0.9": np.asarray(sampling.transform_probs(logits_V, 1.0, top_p=0.9)),
  }


def _words(masses_A):
  """Per index, the number of 32-bit words the map sends to it, along the last axis."""
  cum_A = np.cumsum(masses_A, axis=-1, dtype=np.int64)
  total = cum_A[..., -1:]
  first_A = -(-(cum_A << 32) // np.maximum(total, 1))  # ceil(C_i 2^32 / N)
  words_A = np.diff(first_A, prepend=0, axis=-1)
  return np.where(total > 0, words_A, 0)


def _law(block_Vb, token_VbxVt, vocab):
  """The exact law over [0, vocab) implied by the masses of both levels."""
  block_Vb = _words(block_Vb) / 2.0**32  # exact: counts below 2^33 in float64
  law_VbxVt = block_Vb[:, None] * (_words(token_VbxVt) / 2.0**32)  # one rounding, 0 exact
  assert law_VbxVt.ravel()[vocab:].sum() == 0, "padding has mass"
  return law_VbxVt.ravel()[:vocab]


def _exact_law(weights_V):
  block_Vb, token_VbxVt = sampling.level_masses(jnp.asarray(weights_V))
  return _law(np.asarray(block_Vb), np.asarray(token_VbxVt), len(weights_V))


def _tv(law_V, weights_V):
  w_V = np.maximum(np.asarray(weights_V, np.float64), 0)
  return 0.5 * np.abs(law_V - w_V / w_V.sum()).sum()


def _support_ok(law_V, weights_V):
  return bool(np.array_equal(law_V > 0, np.asarray(weights_V) > 0))


def _old_law(weights_V):
  """The old sampler's law, enumerated over its 2^23 float32 uniforms k 2^-23."""
  w_V = jnp.maximum(jnp.asarray(weights_V, jnp.float32), 0.0)
  cdf_V = np.asarray(jnp.cumsum(w_V))  # XLA's cumsum, as the old sampler computed it
  u = np.arange(2**23, dtype=np.float32) * np.float32(2.0**-23)
  index = np.searchsorted(cdf_V, u * cdf_V[-1], side="right")
  positive = np.flatnonzero(np.asarray(w_V) > 0)
  index = np.minimum(index, positive[-1])
  return np.bincount(index, minlength=len(cdf_V)) / 2.0**23


def _no_floor_law(weights_V):
  """A broken variant: masses round(w / total 2^30) without the floor of 1."""
  num_blocks, block_size = sampling.block_shape(len(weights_V))
  w = np.zeros(num_blocks * block_size)
  w[: len(weights_V)] = weights_V
  w_VbxVt = w.reshape(num_blocks, block_size)
  sums_Vb = w_VbxVt.sum(axis=1)
  block_Vb = np.round(sums_Vb / sums_Vb.sum() * 2.0**30).astype(np.int64)
  token_VbxVt = np.round(w_VbxVt / np.maximum(sums_Vb, 1e-300)[:, None] * 2.0**30)
  return _law(block_Vb, token_VbxVt.astype(np.int64), len(weights_V))


def _numpy_index(bits_Bx2, weights_V):
  """A numpy reimplementation of `categorical_from_bits` from the level masses."""
  block_Vb, token_VbxVt = (np.asarray(m, np.uint64) for m in sampling.level_masses(weights_V))
  bits_Bx2 = np.asarray(bits_Bx2, np.uint64)
  cum_Vb = np.cumsum(block_Vb)
  block_B = np.searchsorted(cum_Vb, (bits_Bx2[:, 0] * cum_Vb[-1]) >> 32, side="right")
  cum_BxVt = np.cumsum(token_VbxVt, axis=1)[block_B]
  u_B = (bits_Bx2[:, 1] * cum_BxVt[:, -1]) >> 32
  token_B = np.sum(cum_BxVt <= u_B[:, None], axis=1)
  return block_B * token_VbxVt.shape[1] + token_B


_from_bits = jax.jit(jax.vmap(sampling.categorical_from_bits, (0, None)))


def _draws(weights_V, n, seed=0):
  keys = jax.random.split(jax.random.key(seed), n)
  return np.asarray(jax.jit(jax.vmap(sampling.categorical, (0, None)))(keys, weights_V))


# --- the exact law by derivation ---------------------------------------------------------


@pytest.mark.parametrize("vocab", [32_000, pytest.param(256_000, marks=pytest.mark.slow)])
def test_exact_law_within_tv_bound(vocab):
  for name, weights_V in _vectors(vocab).items():
    law_V = _exact_law(weights_V)
    assert _tv(law_V, weights_V) <= TV_BOUND, name
    assert _support_ok(law_V, weights_V), name


@pytest.mark.parametrize("vocab", [32_000, pytest.param(256_000, marks=pytest.mark.slow)])
def test_zero_weight_tokens_have_no_mass_under_truncation(vocab):
  vectors = _vectors(vocab)
  for name in ("top-k-40", "top-p-0.9", "tiny-1e-30"):
    weights_V = vectors[name]
    law_V = _exact_law(weights_V)
    assert np.sum(weights_V == 0) > 0, name
    assert law_V[weights_V == 0].max() == 0.0, name
    drawn = _draws(jnp.asarray(weights_V), 100_000)
    assert np.all(weights_V[drawn] > 0), name


@pytest.mark.parametrize("vocab", [32_000, pytest.param(256_000, marks=pytest.mark.slow)])
def test_old_float32_inverse_cdf_is_rejected(vocab):
  """The deliberately broken variants: the old sampler and masses without the floor."""
  vectors = _vectors(vocab)
  peaked = vectors["peaked"]
  old_V = _old_law(peaked)
  assert _tv(old_V, peaked) > TV_BOUND
  small = (peaked > 0) & (peaked < 2.0**-23)
  assert np.sum(small & (old_V == 0)) > 0, "every token below 2^-23 was reachable"
  tiny = vectors["tiny-1e-30"]
  assert not _support_ok(_no_floor_law(tiny), tiny)


@pytest.mark.parametrize("vocab", [1000, 32_000])
def test_map_agrees_with_numpy_reimplementation(vocab):
  bits_Bx2 = np.random.default_rng(1).integers(0, 2**32, size=(20_000, 2), dtype=np.uint32)
  for name, weights_V in _vectors(vocab).items():
    weights_V = jnp.asarray(weights_V)
    got = np.asarray(_from_bits(jnp.asarray(bits_Bx2), weights_V))
    np.testing.assert_array_equal(got, _numpy_index(bits_Bx2, weights_V), err_msg=name)


def _boundary_words(masses_A):
  """(first, last) word of each index of positive mass, and those indices."""
  cum_A = np.cumsum(masses_A, dtype=np.int64)
  first_A1 = -(-(np.concatenate([[0], cum_A]) << 32) // cum_A[-1])
  positive = np.flatnonzero(masses_A > 0)
  return first_A1[positive], first_A1[positive + 1] - 1, positive


def _small_cases():
  yield "v8", np.array([0.1, 0.0, 0.3, 1e-30, 0.0, 0.0, 0.6, 1e-7], np.float32)
  yield "v5-one-hot", np.array([0.0, 0.0, 0.0, 1.0, 0.0], np.float32)
  yield from ((f"v1000-{k}", w) for k, w in _vectors(1000).items())


@pytest.mark.parametrize("name,weights_V", list(_small_cases()))
def test_every_boundary_word_maps_as_derived(name, weights_V):
  """The first and last word of every block and token land on it: the whole map."""
  block_Vb, token_VbxVt = (np.asarray(m) for m in sampling.level_masses(jnp.asarray(weights_V)))
  block_size = token_VbxVt.shape[1]
  pairs, expected = [], []
  for lo1, hi1, block in zip(*_boundary_words(block_Vb), strict=True):
    for lo2, hi2, token in zip(*_boundary_words(token_VbxVt[block]), strict=True):
      pairs += [(lo1, lo2), (lo1, hi2), (hi1, lo2), (hi1, hi2)]
      expected += [block * block_size + token] * 4
  got = _from_bits(jnp.asarray(np.array(pairs, np.uint32)), jnp.asarray(weights_V))
  np.testing.assert_array_equal(np.asarray(got), expected)
  law_V = _exact_law(weights_V)
  assert _support_ok(law_V, weights_V)
  assert _tv(law_V, weights_V) <= TV_BOUND


# --- direct draws -------------------------------------------------------------------------


def test_chi_square_small_vocab_and_reused_word_rejected():
  weights_V = jnp.array([0.1, 0.0, 0.3, 1e-3, 0.0, 0.25, 0.349, 0.0])
  probs = np.asarray(weights_V, np.float64) / float(np.sum(np.asarray(weights_V, np.float64)))
  n = 200_000
  stats.assert_law(np.bincount(_draws(weights_V, n), minlength=8), probs, "V=8")
  words = jax.random.bits(jax.random.key(1), (n,), jnp.uint32)
  reused = _from_bits(jnp.stack([words, words], axis=1), weights_V)
  stats.assert_rejects(np.bincount(np.asarray(reused), minlength=8), probs, "one word, 2 levels")


def test_chi_square_v32000_binned():
  weights_V = _vectors(32_000)["peaked"]
  bin_of_token, bin_probs = stats.equal_mass_bins(weights_V, 64)
  drawn = _draws(jnp.asarray(weights_V), 200_000, seed=2)
  stats.assert_law(np.bincount(bin_of_token[drawn], minlength=64), bin_probs, "V=32000")


# --- edge cases and transforms ------------------------------------------------------------


def test_jit_and_vmap_agree_with_eager():
  weights_BxV = jnp.asarray(np.stack(list(_vectors(1000).values())))
  keys = jax.random.split(jax.random.key(3), weights_BxV.shape[0])
  batched = jax.jit(jax.vmap(sampling.categorical))(keys, weights_BxV)
  eager = [sampling.categorical(k, w) for k, w in zip(keys, weights_BxV, strict=True)]
  np.testing.assert_array_equal(np.asarray(batched), np.asarray(eager))
  assert batched.dtype == jnp.int32


def test_float64_weights():
  weights_V = np.array([0.5, 1e-300, 0.0, 0.25, 0.25 - 1e-12])
  with jax.enable_x64(True):
    w64 = jnp.asarray(weights_V, jnp.float64)
    law_V = _exact_law(w64)
    drawn = np.asarray(
      jax.vmap(sampling.categorical, (0, None))(jax.random.split(jax.random.key(4), 1000), w64)
    )
  assert _support_ok(law_V, weights_V) and _tv(law_V, weights_V) <= TV_BOUND
  assert np.all(weights_V[drawn] > 0)


@pytest.mark.parametrize(
  "weights,support",
  [
    ([0.0, 0.0, 3.0, 0.0], [2]),
    ([1.0] + [0.0] * 999, [0]),
    ([0.0] * 999 + [2.0], [999]),
    ([1e-30, 0.0, 1e-30], [0, 2]),
    ([np.nan, -1.0, 0.5, 0.0], [2]),
  ],
)
def test_degenerate_weights_stay_in_support(weights, support):
  weights_V = jnp.asarray(weights, jnp.float32)
  corners = np.array([[0, 0], [0, 2**32 - 1], [2**32 - 1, 0], [2**32 - 1, 2**32 - 1]])
  bits_Bx2 = np.concatenate([corners, np.random.default_rng(5).integers(0, 2**32, (1000, 2))])
  got = np.asarray(_from_bits(jnp.asarray(bits_Bx2, jnp.uint32), weights_V))
  assert set(got.tolist()) <= set(support)
  if len(support) == 2:  # two equal tiny weights: half the words each
    np.testing.assert_allclose(_exact_law(np.asarray(weights_V)), [0.5, 0, 0.5], atol=1e-9)


def test_all_zero_weights_return_last_index():
  assert int(sampling.categorical(jax.random.key(0), jnp.zeros(10))) == 9


def _nucleus_ok(probs_V, kept_V, top_p, tol=1e-5):
  """Kept is every token at least as likely as its least likely one, and minimal."""
  floor = probs_V[kept_V].min()
  above = probs_V > floor
  return bool(
    np.array_equal(kept_V, probs_V >= floor)
    and probs_V[above].sum() < top_p + tol
    and probs_V[kept_V].sum() >= top_p - tol
  )


def test_top_p_keeps_a_minimal_set_of_most_likely_tokens():
  rng = np.random.default_rng(6)
  for scale in (0.5, 2.0, 4.0):
    logits_V = jnp.asarray(scale * rng.normal(size=32_000), jnp.float32)
    probs_V = np.asarray(sampling.transform_probs(logits_V, 1.0), np.float64)
    for top_p in (0.3, 0.9, 0.99):
      kept_V = np.asarray(sampling.transform_probs(logits_V, 1.0, top_p=top_p)) > 0
      assert _nucleus_ok(probs_V, kept_V, top_p), (scale, top_p)


def test_top_p_ties_and_a_broken_rule_rejected():
  probs = np.array([0.3, 0.2, 0.2, 0.2, 0.1])
  out = np.asarray(
    sampling.transform_probs(jnp.log(jnp.asarray(probs, jnp.float32)), 1.0, top_p=0.4)
  )
  np.testing.assert_array_equal(out > 0, [True, True, True, True, False])
  flat = np.asarray(sampling.transform_probs(jnp.zeros(4), 1.0, top_p=0.1))
  np.testing.assert_allclose(flat, 0.25, rtol=1e-6)
  # The old rule (keep every rank whose prefix mass is below top_p) on a prefix sum that
  # dips back below top_p after crossing it keeps a token too many.
  probs = np.array([0.5, 0.3, 0.15, 0.05])
  mass_before = np.array([0.0, 0.5, 0.8, 0.7])  # should be 0.95 at the last rank
  old_kept = probs >= probs[mass_before < 0.75].min()
  assert _nucleus_ok(probs, probs >= 0.3, 0.75)
  assert not _nucleus_ok(probs, old_kept, 0.75)
