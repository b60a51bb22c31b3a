"""Closed-form acceptance against exact enumeration and the transport LP."""

import functools

import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from spectr_jax import acceptance
from spectr_jax.testing import reference


def _random_pairs(seed, num, sizes=(2, 3, 4, 5), concentrations=(0.3, 1.0, 3.0)):
  rng = np.random.default_rng(seed)
  pairs = []
  for i in range(num):
    v = sizes[i % len(sizes)]
    c = concentrations[i % len(concentrations)]
    pairs.append((rng.dirichlet(np.full(v, c)), rng.dirichlet(np.full(v, c))))
  return pairs


EDGE_PAIRS = [
  (np.array([0.6, 0.4]), np.array([0.3, 0.7])),  # SPEC: LP optimum 0.94 at k = 2.
  (np.array([1.0, 0.0]), np.array([0.5, 0.5])),  # One-hot p.
  (np.array([0.5, 0.5]), np.array([0.0, 1.0])),  # One-hot q.
  (np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])),  # Disjoint.
  (np.array([0.2, 0.3, 0.5]), np.array([0.2, 0.3, 0.5])),  # p = q.
  (np.array([0.5, 0.0, 0.5]), np.array([1.0, 0.0, 0.0])),  # rho* = 1.5, rho = 1 exact.
  (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.4, 0.3, 0.2, 0.1])),
]


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def test_spec_example_values():
  p, q = EDGE_PAIRS[0]
  assert float(acceptance.optimal_acceptance(_f32(p), _f32(q), 2)) == pytest.approx(0.94, abs=1e-6)
  assert reference.optimal_lp(p, q, 2) == pytest.approx(0.94, abs=1e-9)
  one = acceptance.kseq_acceptance(_f32(p), _f32(q), 1)
  assert float(one.hit) == pytest.approx(0.70, abs=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_optimal_acceptance_equals_lp(k):
  pairs = EDGE_PAIRS + _random_pairs(1, 12, sizes=(2, 3, 4))
  for p, q in pairs:
    if len(p) ** k > 64:
      continue
    lp = reference.optimal_lp(p, q, k)
    ours = float(acceptance.optimal_acceptance(_f32(p), _f32(q), k))
    assert ours == pytest.approx(lp, abs=2e-6), (p, q, k)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_rho_star_matches_float64_reference(k):
  for p, q in EDGE_PAIRS + _random_pairs(2, 20, sizes=(3, 10, 100)):
    rho = float(acceptance.rho_star(_f32(p), _f32(q), k))
    assert 1.0 <= rho <= k
    assert rho == pytest.approx(reference.rho_star(p, q, k), abs=2e-5), (p, q, k)


def test_rho_star_traced_k():
  p, q = _f32([0.6, 0.3, 0.1]), _f32([0.1, 0.3, 0.6])
  ks = jnp.arange(1, 9)
  traced = jax.jit(jax.vmap(functools.partial(acceptance.rho_star, p, q)))(ks)
  for k, rho in zip(range(1, 9), np.asarray(traced), strict=True):
    assert rho == pytest.approx(float(acceptance.rho_star(p, q, k)), abs=1e-6)


def _bisection_rho_star(p_V, q_V, k):
  """rho* by 32 float32 bisection steps on [1, k], keeping the upper end (how
  `acceptance.rho_star` solved it before its fixed bracketing steps)."""
  k_f = jnp.maximum(jnp.asarray(k, jnp.float32), 1.0)

  def excess(rho):
    beta = jnp.sum(jnp.minimum(p_V, q_V / rho), axis=-1)
    return acceptance.one_minus_pow(beta, k_f) - rho * beta

  def bisect(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    below = excess(mid) <= 0
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  one = jnp.float32(1.0)
  _, hi = jax.lax.fori_loop(0, 32, bisect, (one, k_f))
  return jnp.where(excess(one) <= 0, one, hi)


def _llm_like_pairs(seed, num, vocab=32_000):
  """(p, q, k) at an LLM vocabulary: q = softmax of N(0, s^2) logits (s from flat to
  peaked), p the softmax of those logits perturbed (and sometimes at another temperature)."""
  rng = np.random.default_rng(seed)
  p_XxV, q_XxV = [], []
  for i in range(num):
    scale, noise = (0.5, 1.0, 2.0, 4.0, 8.0)[i % 5], (0.1, 0.3, 1.0, 3.0)[i % 4]
    logits = scale * rng.normal(size=vocab)
    draft = (logits + noise * scale * rng.normal(size=vocab)) * (1.0, 1.0, 2.0, 0.5)[i % 4]
    q_XxV.append(np.exp(logits - logits.max()))
    p_XxV.append(np.exp(draft - draft.max()))
  p_XxV = np.asarray(p_XxV) / np.sum(p_XxV, axis=1, keepdims=True)
  q_XxV = np.asarray(q_XxV) / np.sum(q_XxV, axis=1, keepdims=True)
  return _f32(p_XxV), _f32(q_XxV), jnp.asarray(rng.integers(2, 9, num), jnp.int32)


def _g_and_accept_f64(p_V, q_V, k, rho):
  """g(rho) = rho beta - (1 - (1 - beta)^k) and P_A in float64 (on the float32 inputs)."""
  beta = np.minimum(np.float64(p_V), np.float64(q_V) / rho).sum()
  p_accept = 1 - (1 - beta) ** k
  return rho * beta - p_accept, p_accept


@pytest.mark.numerics
def test_rho_star_at_llm_vocabulary_is_valid_and_matches_bisection():
  """Batched as the walk runs it (vmapped, V = 32000 float32): valid up to float32
  rounding, as the bisection; its acceptance no more than 1e-6 below the bisection's;
  where the root is well conditioned, within 1e-4 of it (flat g, p close to q with many
  drafts, leaves rho* itself uncertain in float32 by up to ~1e-3 for both methods)."""
  p_XxV, q_XxV, k_X = _llm_like_pairs(0, 40)
  rho_X = np.asarray(jax.jit(jax.vmap(acceptance.rho_star))(p_XxV, q_XxV, k_X))
  bisect_X = np.asarray(jax.jit(jax.vmap(_bisection_rho_star))(p_XxV, q_XxV, k_X))
  for p_V, q_V, k, rho, bisect in zip(
    np.asarray(p_XxV), np.asarray(q_XxV), np.asarray(k_X), rho_X, bisect_X, strict=True
  ):
    assert 1.0 <= rho <= k
    g, p_accept = _g_and_accept_f64(p_V, q_V, k, rho)
    g_bisect, p_accept_bisect = _g_and_accept_f64(p_V, q_V, k, bisect)
    assert g >= -5e-7, (k, rho, g)
    assert p_accept >= p_accept_bisect - 1e-6, (k, rho, bisect)
    slope = (_g_and_accept_f64(p_V, q_V, k, bisect * 1.001)[0] - g_bisect) / (bisect * 0.001)
    if slope > 1e-2:
      assert rho == pytest.approx(bisect, abs=1e-4), (k, rho, bisect)


def test_rho_star_boundaries():
  """k = 1 gives exactly 1; so does g(1) >= 0 (p = q, disjoint supports, equal one-hots);
  a one-hot q has the closed form 4 (1 - 0.75^k) for a uniform p over 4 tokens."""
  p_XxV, q_XxV, _ = _llm_like_pairs(1, 4)
  for p_V, q_V in [*zip(p_XxV, q_XxV, strict=True), *(map(_f32, pq) for pq in EDGE_PAIRS)]:
    assert float(acceptance.rho_star(p_V, q_V, 1)) == 1.0
  one_hot = _f32([1.0, 0.0, 0.0, 0.0])
  at_one = [
    (_f32([0.125, 0.375, 0.5]),) * 2,
    (_f32([0.5, 0.5, 0.0, 0.0]), _f32([0.0, 0.0, 0.3, 0.7])),
    (one_hot, one_hot),
  ]
  uniform = _f32([0.25] * 4)
  for k in range(2, 9):
    for p_V, q_V in at_one:
      assert float(acceptance.rho_star(p_V, q_V, k)) == 1.0, (p_V, q_V, k)
    rho = float(acceptance.rho_star(uniform, one_hot, k))
    assert rho == pytest.approx(4 * (1 - 0.75**k), abs=1e-6), k
  # p = q at V = 32000 (sums off 1 by float32 rounding): rho* stays where P_A = 1.
  p_V = p_XxV[0]
  for k in (2, 8):
    rho = float(acceptance.rho_star(p_V, p_V, k))
    assert _g_and_accept_f64(np.asarray(p_V), np.asarray(p_V), k, rho)[1] >= 1 - 1e-6, k


def _kseq_reference(p, q, k, rho):
  law_fn = functools.partial(reference.kseq_law, rho=rho)
  return reference.enumerate_position(lambda x, p, q: law_fn(x, p, q), p, q, k)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_kseq_acceptance_equals_enumeration(k):
  for p, q in EDGE_PAIRS + _random_pairs(3, 12):
    for rho in ("star", "k", 1.0, 1.3):
      ours = acceptance.kseq_acceptance(_f32(p), _f32(q), k, rho=rho)
      law, hit = _kseq_reference(p, q, k, float(ours.rho))
      assert float(ours.hit) == pytest.approx(hit, abs=2e-5), (p, q, k, rho)
      # Flagged valid exactly when the (clipped, renormalised) output law is q.
      law_is_q = np.allclose(law, q, atol=1e-5)
      assert bool(ours.valid) == law_is_q, (p, q, k, rho, law)


def test_rho_one_can_be_exact_below_rho_star():
  p, q = EDGE_PAIRS[5]
  star = acceptance.kseq_acceptance(_f32(p), _f32(q), 2)
  assert float(star.rho) == pytest.approx(1.5, abs=1e-5)
  assert bool(acceptance.kseq_acceptance(_f32(p), _f32(q), 2, rho=1.0).valid)


def test_naive_rho_one_is_flagged_invalid():
  p, q = _f32([1.0, 0.0]), _f32([0.5, 0.5])
  naive = acceptance.kseq_acceptance(p, q, 2, rho=1.0)
  assert not bool(naive.valid)
  assert float(naive.deficit) == pytest.approx(0.25, abs=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_specinfer_acceptance_equals_enumeration(k):
  for p, q in EDGE_PAIRS + _random_pairs(4, 12):
    law, hit = reference.enumerate_position(reference.specinfer_law, p, q, k)
    np.testing.assert_allclose(law, q, atol=1e-12)
    assert float(acceptance.specinfer_acceptance(_f32(p), _f32(q), k)) == pytest.approx(
      hit, abs=2e-6
    )


def test_single_draft_reduction():
  for p, q in EDGE_PAIRS + _random_pairs(5, 20, sizes=(3, 50)):
    single = float(np.minimum(p, q).sum())
    assert float(acceptance.kseq_acceptance(_f32(p), _f32(q), 1).hit) == pytest.approx(
      single, abs=1e-6
    )
    assert float(acceptance.specinfer_acceptance(_f32(p), _f32(q), 1)) == pytest.approx(
      single, abs=1e-6
    )
    assert float(acceptance.optimal_acceptance(_f32(p), _f32(q), 1)) == pytest.approx(
      single, abs=1e-6
    )


_dist = functools.partial(
  hnp.arrays, np.float64, elements=st.floats(0.0, 1.0, allow_subnormal=False)
)


@hypothesis.settings(max_examples=100, deadline=None, derandomize=True)
@hypothesis.given(
  raw_p=_dist(12), raw_q=_dist(12), k=st.integers(1, 8), rho=st.sampled_from(["star", "k"])
)
def test_ordering_single_kseq_optimal(raw_p, raw_q, k, rho):
  hypothesis.assume(raw_p.sum() > 1e-3 and raw_q.sum() > 1e-3)
  p, q = _f32(raw_p / raw_p.sum()), _f32(raw_q / raw_q.sum())
  single = float(jnp.minimum(p, q).sum())
  kseq = acceptance.kseq_acceptance(p, q, k, rho=rho)
  best = float(acceptance.optimal_acceptance(p, q, k))
  assert bool(kseq.valid)
  assert float(kseq.hit) <= best + 1e-5
  assert float(acceptance.specinfer_acceptance(p, q, k)) <= best + 1e-5
  if rho == "star":
    assert float(kseq.hit) >= single - 1e-5
    # SpecTr's guarantee: K-SEQ at rho* reaches 1 - (1 - 1/k)^k of the optimum.
    assert float(kseq.hit) >= (1 - (1 - 1 / k) ** k) * best - 1e-5


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: acceptance.optimal_acceptance(_f32([0.5, 0.5]), _f32([0.2, 0.2, 0.6]), 2), "differ"),
    (lambda: acceptance.kseq_acceptance(_f32([-0.5, 1.5]), _f32([0.5, 0.5]), 2), "negative"),
    (lambda: acceptance.kseq_acceptance(_f32([0.5, 0.6]), _f32([0.5, 0.5]), 2), "normalised"),
    (lambda: acceptance.kseq_acceptance(_f32([0.5, 0.5]), _f32([0.5, 0.5]), 0), "k must be"),
    (lambda: acceptance.specinfer_acceptance(_f32([0.5, 0.5]), _f32([0.5, 0.5]), 1.5), "k must"),
    (lambda: acceptance.kseq_acceptance(_f32([0.5, 0.5]), _f32([0.5, 0.5]), 2, rho="x"), "rho"),
    (lambda: acceptance.kseq_acceptance(_f32([0.5, 0.5]), _f32([0.5, 0.5]), 2, rho=0.5), "rho"),
    (lambda: acceptance.kseq_acceptance(_f32([0.5, np.nan]), _f32([0.5, 0.5]), 2), "finite"),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()
