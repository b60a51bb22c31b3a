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
from tests import reference


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
