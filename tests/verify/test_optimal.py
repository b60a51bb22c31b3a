"""Exactness and optimality of the OT-optimal verifier (spectr_jax/optimal/).

- Exact enumeration of every draft tuple (V = 2..5, k = 1..4, random and edge-case pairs):
  the law of the selected draft equals r, the output law equals q and the hit probability
  equals alpha*, in float64, for the numpy reference and for the JAX implementation (x64);
  the float32 selection law agrees with the float64 reference.
- Any level array gives an exact verifier (random levels, restricted cuts), and broken
  variants are caught.
- Monte Carlo chi-square tests in float32 at V = 1000 and V = 32000 with k = 8, each with
  a deliberately broken variant that must be rejected.
- At LLM vocabularies (V = 4096, 32k, 128k, 256k; k = 2, 4, 8; 4 seeds): the float32
  plan's acceptance equals the float64 reference's with the same slot order and num_cuts,
  its bound equals alpha*, and shortfall = bound - accept; prefix sums that step down by
  one unit in the last place at block boundaries are caught.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, optimal
from spectr_jax.optimal import apply as opt_apply
from spectr_jax.optimal import plan as opt_plan
from spectr_jax.optimal import slots as opt_slots
from tests import optimal_reference as ref
from tests import stats

TOL64 = 1e-9
MAX_K = 4


def _pair(rng, v, conc):
  return rng.dirichlet(np.full(v, conc)), rng.dirichlet(np.full(v, conc))


def _edge_pairs():
  """Edge cases: one-hot p or q, p = q, disjoint supports, zeros, ratio ties, tiny mass."""
  return {
    "spec-example": (np.array([0.6, 0.4]), np.array([0.3, 0.7])),
    "one-hot-p": (np.array([0.0, 1.0, 0.0]), np.array([0.2, 0.5, 0.3])),
    "one-hot-q": (np.array([0.2, 0.5, 0.3, 0.0]), np.array([0.0, 0.0, 1.0, 0.0])),
    "one-hot-both": (np.array([1.0, 0.0]), np.array([0.0, 1.0])),
    "p-equals-q": (np.array([0.1, 0.2, 0.3, 0.4]),) * 2,
    "disjoint": (np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])),
    "zeros": (np.array([0.3, 0.0, 0.7, 0.0, 0.0]), np.array([0.0, 0.4, 0.2, 0.4, 0.0])),
    "ratio-ties": (np.array([0.2, 0.2, 0.3, 0.3]), np.array([0.1, 0.1, 0.4, 0.4])),
    "all-ties-3": (np.array([0.25, 0.25, 0.5]), np.array([0.2, 0.2, 0.6])),
    "tiny-mass": (
      np.array([0.5, 0.5 - 2e-12, 1e-12, 1e-12, 0.0]),
      np.array([1e-12, 0.3, 0.2, 0.5 - 1e-12, 0.0]),
    ),
  }


def _cases():
  """(name, p, q, k) over V = 2..5, k = 1..4: Dirichlet at four concentrations, edges."""
  rng = np.random.default_rng(2024)
  cases = []
  for v, k, conc in itertools.product(range(2, 6), range(1, MAX_K + 1), (0.1, 0.5, 1.0, 3.0)):
    p, q = _pair(rng, v, conc)
    cases.append((f"dir-v{v}-k{k}-c{conc}", p, q, k))
  for (name, (p, q)), k in itertools.product(_edge_pairs().items(), range(1, MAX_K + 1)):
    cases.append((f"{name}-k{k}", p, q, k))
  return cases


CASES = _cases()


def _enumerate(p, q, k, slot_V, levels_V1, r_V):
  """Exact law of Z, output law and hit probability of the rule with the given slots of
  the tokens and levels of the breakpoints.

  Sums over all k-tuples of drafts and over the intervals of U between distinct levels;
  accepts Z with probability min(1, q/r) and otherwise samples norm(q - min(r, q)).
  """
  vocab = len(p)
  slot_V = np.asarray(slot_V)
  edges = np.unique(np.clip(np.concatenate([[0.0, 1.0], levels_V1]), 0.0, 1.0))
  accept_V = np.where(r_V > 0, np.minimum(1.0, q / np.where(r_V > 0, r_V, 1.0)), 0.0)
  left_V = q - np.minimum(r_V, q)
  residual_V = left_V / left_V.sum() if left_V.sum() > 1e-300 else q
  law_z, law_y, hit = np.zeros(vocab), np.zeros(vocab), 0.0
  for drafts in itertools.product(np.flatnonzero(p > 0), repeat=k):
    drafts = np.array(drafts)
    z_V = np.zeros(vocab)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
      chosen = ref.selection_given_drafts(slot_V[drafts], levels_V1, hi)
      np.add.at(z_V, drafts[chosen], (hi - lo) / len(chosen))
    y_V = z_V * accept_V + np.sum(z_V * (1 - accept_V)) * residual_V
    weight = np.prod(p[drafts])
    law_z += weight * z_V
    law_y += weight * y_V
    hit += weight * y_V[np.unique(drafts)].sum()
  return law_z, law_y, hit


def _slots(order_Vs, vocab, num_breakpoints):
  """The slot (1-based) of each token given the tokens in slot order (others last)."""
  slot_V = np.full(vocab, num_breakpoints, int)
  slot_V[order_Vs] = np.arange(1, len(order_Vs) + 1)
  return slot_V


def _bound64(p, q, k):
  with jax.enable_x64(True):
    return float(acceptance.optimal_acceptance(jnp.asarray(p), jnp.asarray(q), k))


@pytest.mark.parametrize("name, p, q, k", CASES, ids=[c[0] for c in CASES])
def test_reference_enumeration(name, p, q, k):
  plan = ref.reference_plan(p, q, k)
  slot_V = _slots(plan.order_Vs, len(p), len(plan.levels))
  law_z, law_y, hit = _enumerate(p, q, k, slot_V, plan.levels, plan.r_V)
  bound = _bound64(p, q, k)
  np.testing.assert_allclose(law_z, plan.r_V, atol=TOL64, err_msg=f"{name}: law of Z")
  np.testing.assert_allclose(law_y, q, atol=TOL64, err_msg=f"{name}: output law")
  assert abs(hit - bound) < TOL64, f"{name}: hit {hit} vs alpha* {bound}"
  assert abs(plan.accept - bound) < TOL64 and abs(plan.bound - bound) < TOL64


def _jax_plan(p, q, k, num_cuts=8, dtype=jnp.float64):
  plan = optimal.optimal_plan(
    jnp.asarray(p, dtype), jnp.asarray(q, dtype), k, num_cuts=num_cuts, max_k=MAX_K
  )
  return jax.tree.map(np.asarray, plan)


@pytest.mark.slow
def test_jax_float64_enumeration():
  """The JAX construction in float64: law of Z = r, output = q, hit = accept = alpha*."""
  with jax.enable_x64(True):
    for name, p, q, k in CASES:
      plan = _jax_plan(p, q, k)
      assert plan.r_V.dtype == np.float64
      law_z, law_y, hit = _enumerate(p, q, k, plan.slot_V, plan.levels_Vs1, plan.r_V)
      bound = _bound64(p, q, k)
      np.testing.assert_allclose(law_z, plan.r_V, atol=TOL64, err_msg=f"{name}: law of Z")
      np.testing.assert_allclose(law_y, q, atol=TOL64, err_msg=f"{name}: output law")
      assert abs(hit - bound) < TOL64, f"{name}: hit {hit} vs alpha* {bound}"
      assert abs(plan.accept - bound) < TOL64 and abs(plan.bound - bound) < TOL64, name
      assert plan.shortfall < TOL64, name


def test_float32_selection_law_matches_reference():
  for name, p, q, k in CASES:
    p32, q32 = np.asarray(p, np.float32), np.asarray(q, np.float32)
    plan = _jax_plan(p32, q32, k, dtype=jnp.float32)
    expected = ref.reference_plan(p32.astype(np.float64), q32.astype(np.float64), k)
    np.testing.assert_allclose(plan.r_V, expected.r_V, atol=1e-5, err_msg=name)
    assert abs(plan.accept - expected.accept) < 1e-5, name


def test_any_levels_give_the_exact_law():
  """The rate sweep is the law of Z for arbitrary (random) levels: the verifier is exact."""
  rng = np.random.default_rng(7)
  for trial in range(40):
    v, k = int(rng.integers(2, 6)), int(rng.integers(1, 5))
    p, q = _pair(rng, v, 1.0)
    order_Vs, _, u, _, _ = ref.slot_arrays(p, q, k)
    levels = rng.uniform(size=v + 1) * (rng.uniform(size=v + 1) < 0.7)
    r_V = np.zeros(v)
    r_V[order_Vs] = p[order_Vs] * ref.rates_from_levels(levels, u, k)
    law_z, law_y, hit = _enumerate(p, q, k, _slots(order_Vs, len(p), len(levels)), levels, r_V)
    np.testing.assert_allclose(law_z, r_V, atol=1e-12, err_msg=f"trial {trial}")
    np.testing.assert_allclose(law_y, q, atol=1e-12, err_msg=f"trial {trial}")
    assert hit <= _bound64(p, q, k) + 1e-12


@pytest.mark.slow
def test_restricted_cuts_stay_exact_and_shortfall_is_the_gap():
  """Few candidate cuts: still exact; accept = alpha* - shortfall; broken r is caught."""
  rng = np.random.default_rng(11)
  worst_gap, broken_checked = 0.0, 0
  with jax.enable_x64(True):
    for _ in range(12):
      p, q = _pair(rng, 5, 1.0)
      k = 4
      plan = _jax_plan(p, q, k, num_cuts=1)
      law_z, law_y, _ = _enumerate(p, q, k, plan.slot_V, plan.levels_Vs1, plan.r_V)
      np.testing.assert_allclose(law_z, plan.r_V, atol=TOL64)
      np.testing.assert_allclose(law_y, q, atol=TOL64)
      gap = plan.bound - plan.accept
      assert abs(gap - plan.shortfall) < TOL64 and gap > -TOL64
      worst_gap = max(worst_gap, gap)
      # Broken: select with the restricted levels but accept against the optimal r*.
      full = _jax_plan(p, q, k)
      _, broken_y, _ = _enumerate(p, q, k, plan.slot_V, plan.levels_Vs1, full.r_V)
      if np.abs(full.r_V - plan.r_V).max() > 1e-3:
        assert np.abs(broken_y - q).max() > 1e-4
        broken_checked += 1
  assert worst_gap > 1e-4, "one cut should fall short of alpha* somewhere"
  assert broken_checked > 0


def test_merged_slots_stay_exact(monkeypatch):
  """With ratio buckets of a whole octave over 2^-1..2^1, V = 8 tokens and one cut
  merge into 5 slots: the law of Z is r and the output law is q (exact enumeration),
  bound >= alpha* and shortfall = bound - accept; taking r as if every token were its
  own slot (the unmerged plan's r) with the merged slots breaks the output law."""
  monkeypatch.setattr(opt_slots, "_OCTAVES", 1)
  monkeypatch.setattr(opt_slots, "_BUCKETS_PER_OCTAVE", 1)
  rng = np.random.default_rng(5)
  plan_fn = jax.jit(lambda p, q, m: opt_plan._plan_single(p, q, 3, m, 3), static_argnums=2)
  broken_checked = 0
  with jax.enable_x64(True):
    for conc in (0.5, 1.0, 3.0):
      p, q = _pair(rng, 8, conc)
      plan = jax.tree.map(np.asarray, plan_fn(p, q, 1))
      assert plan.block_end_Vs.shape == (5,) and len(np.unique(plan.slot_V)) < 8
      law_z, law_y, _ = _enumerate(p, q, 3, plan.slot_V, plan.levels_Vs1, plan.r_V)
      np.testing.assert_allclose(law_z, plan.r_V, atol=TOL64)
      np.testing.assert_allclose(law_y, q, atol=TOL64)
      assert plan.bound > _bound64(p, q, 3) - TOL64
      assert abs(plan.bound - plan.accept - plan.shortfall) < TOL64
      unmerged = jax.tree.map(np.asarray, plan_fn(p, q, 8))
      _, broken_y, _ = _enumerate(p, q, 3, plan.slot_V, plan.levels_Vs1, unmerged.r_V)
      if np.abs(unmerged.r_V - plan.r_V).max() > 1e-3:
        assert np.abs(broken_y - q).max() > 1e-4
        broken_checked += 1
  assert broken_checked > 0


def test_selection_law_api_vmap_and_traced_k():
  rng = np.random.default_rng(5)
  p_BxV = jnp.asarray(rng.dirichlet(np.ones(40), size=3), jnp.float32)
  q_BxV = jnp.asarray(rng.dirichlet(np.ones(40), size=3), jnp.float32)
  k_B = jnp.array([1, 3, 6])
  r_BxV, acc_B = jax.jit(jax.vmap(lambda p, q, k: optimal.selection_law(p, q, k, max_k=6)))(
    p_BxV, q_BxV, k_B
  )
  for b in range(3):
    r_V, acc = optimal.selection_law(p_BxV[b], q_BxV[b], int(k_B[b]), max_k=6)
    np.testing.assert_allclose(r_BxV[b], r_V, atol=1e-6)
    assert abs(float(acc_B[b]) - float(acc)) < 1e-6
    assert abs(float(jnp.sum(r_V)) - 1.0) < 1e-5
  r0, acc0 = optimal.selection_law(p_BxV[0], q_BxV[0], 0, max_k=6)
  assert float(jnp.abs(r0).max()) == 0.0 and float(acc0) == 0.0
  with pytest.raises(ValueError, match="max_k"):
    jax.jit(lambda k: optimal.selection_law(p_BxV[0], q_BxV[0], k))(2)
  with pytest.raises(ValueError, match="not normalised"):
    optimal.selection_law(jnp.ones(4), q_BxV[0, :4], 2)


def _draw(key, p_V, n, k):
  """n x k i.i.d. drafts from p by inverse CDF."""
  cdf_V = jnp.cumsum(p_V)
  u_BxK = jax.random.uniform(key, (n, k)) * cdf_V[-1]
  last = p_V.shape[0] - 1 - jnp.argmax(p_V[::-1] > 0)
  return jnp.minimum(jnp.searchsorted(cdf_V, u_BxK, side="right"), last).astype(jnp.int32)


_apply_B = jax.jit(jax.vmap(opt_apply._apply_plan, in_axes=(0, 0, None, None, None)))
_optimal_B = jax.jit(
  jax.vmap(
    lambda key, drafts_K, p_V, q_V, valid_K: optimal.optimal(
      key, drafts_K, p_V, q_V, valid_K=valid_K
    ),
    in_axes=(0, 0, None, None, None),
  )
)


def _run(plan, q_V, drafts_BxK, key, valid_K=None):
  """(tokens, accepted, hit) of the verifier's random part on n draft tuples."""
  n, k = drafts_BxK.shape
  valid_K = jnp.ones((k,), bool) if valid_K is None else valid_K
  tokens_B, accepted_B = _apply_B(jax.random.split(key, n), drafts_BxK, valid_K, q_V, plan)
  hit_B = jnp.any((drafts_BxK == tokens_B[:, None]) & valid_K, axis=1)
  return np.asarray(tokens_B), np.asarray(accepted_B), np.asarray(hit_B)


def _binned(tokens, q_V, num_bins):
  bin_of_V, bin_probs = stats.equal_mass_bins(np.asarray(q_V, np.float64), num_bins)
  return np.bincount(bin_of_V[tokens], minlength=num_bins), bin_probs


def _check_monte_carlo(p_V, q_V, k, num_cuts, n, num_bins, what, seed):
  draft_key, verify_key, fallback_key = jax.random.split(jax.random.key(seed), 3)
  drafts_BxK = _draw(draft_key, p_V, n, k)
  plan = optimal.optimal_plan(p_V, q_V, k, num_cuts=num_cuts)
  tokens, accepted, hit = _run(plan, q_V, drafts_BxK, verify_key)
  stats.assert_law(*_binned(tokens, q_V, num_bins), what)
  stats.assert_mean(accepted, float(plan.accept), f"{what}: acceptance")
  # Broken: select with no interior cuts, but accept against the full construction's r.
  blunt = optimal.optimal_plan(p_V, q_V, k, num_cuts=0)
  broken = blunt._replace(r_V=plan.r_V)
  tokens_b, _, _ = _run(broken, q_V, drafts_BxK, verify_key)
  stats.assert_rejects(*_binned(tokens_b, q_V, num_bins), f"{what}: r from the wrong levels")
  # Broken: on rejection sample q itself instead of the residual.
  fallback = np.asarray(_draw(fallback_key, q_V, n, 1)[:, 0])
  tokens_q = np.where(accepted, tokens, fallback)
  stats.assert_rejects(*_binned(tokens_q, q_V, num_bins), f"{what}: residual = q")
  return plan, accepted, hit


@pytest.mark.slow
def test_monte_carlo_v1000_k8():
  rng = np.random.default_rng(1000)
  p, q = _pair(rng, 1000, 1.0)
  p_V, q_V = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  plan, _, hit = _check_monte_carlo(p_V, q_V, 8, 1001, 200_000, 100, "V=1000 k=8", seed=10)
  bound = float(acceptance.optimal_acceptance(p_V, q_V, 8))
  assert abs(float(plan.accept) - bound) < 1e-5
  stats.assert_mean(hit, bound, "V=1000 k=8: hit = alpha*")


@pytest.mark.numerics
@pytest.mark.slow
def test_monte_carlo_v32000_k8():
  rng = np.random.default_rng(32000)
  z = rng.standard_normal(32000)
  logits_p, logits_q = 3 * z, 3 * (0.8 * z + 0.6 * rng.standard_normal(32000))
  p_V, q_V = jax.nn.softmax(jnp.asarray(logits_p)), jax.nn.softmax(jnp.asarray(logits_q))
  plan, _, _ = _check_monte_carlo(
    p_V, q_V, 8, optimal.DEFAULT_NUM_CUTS, 200_000, 200, "V=32k k=8", seed=11
  )
  bound = float(acceptance.optimal_acceptance(p_V, q_V, 8))
  assert float(plan.accept) > 0.998 * bound


@pytest.mark.parametrize("vocab", [10, pytest.param(32000, marks=pytest.mark.slow)])
def test_one_valid_draft_is_speculative_sampling(vocab):
  """With k = 1 the verifier builds no plan: Z is the valid draft, r = p, so the output law
  is q and P(accepted) = sum min(p, q), at V = 10 and at an LLM-sized V = 32k. Broken:
  on rejection drawing q itself (not the residual) is rejected by the same test."""
  rng = np.random.default_rng(vocab)
  z = rng.standard_normal(vocab)
  p_V = jax.nn.softmax(jnp.asarray(2 * z, jnp.float32))
  q_V = jax.nn.softmax(jnp.asarray(2 * (0.8 * z + 0.6 * rng.standard_normal(vocab)), jnp.float32))
  n, num_bins = 200_000, min(vocab, 100)
  draft_key, verify_key, fallback_key = jax.random.split(jax.random.key(vocab), 3)
  drafts_BxK = _draw(draft_key, p_V, n, 4)
  valid_K = jnp.array([False, False, True, False])
  keys_B = jax.random.split(verify_key, n)
  tokens, accepted = (np.asarray(x) for x in _optimal_B(keys_B, drafts_BxK, p_V, q_V, valid_K))
  what = f"V={vocab} k=1"
  stats.assert_law(*_binned(tokens, q_V, num_bins), what)
  stats.assert_mean(accepted, float(jnp.minimum(p_V, q_V).sum()), f"{what}: acceptance")
  assert np.all(tokens[accepted] == np.asarray(drafts_BxK[:, 2])[accepted])
  fallback = np.asarray(_draw(fallback_key, q_V, n, 1)[:, 0])
  tokens_q = np.where(accepted, tokens, fallback)
  stats.assert_rejects(*_binned(tokens_q, q_V, num_bins), f"{what}: residual = q")


@pytest.mark.slow
def test_select_draft_builds_the_plan_only_for_two_or_more():
  """`select_draft` = `select` on the plan and its r where k >= 2 (vmapped over rows of
  different k, so the plan's loop runs for some rows only); the only valid draft and
  r = p where k = 1; r = 0 where k = 0."""
  rng = np.random.default_rng(8)
  p, q = _pair(rng, 50, 0.7)
  p_V, q_V = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  drafts_BxK = _draw(jax.random.key(2), p_V, 6, 4)
  masks = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 0, 1]]
  valid_BxK = jnp.asarray(masks, bool)
  u_Bx2 = jax.random.uniform(jax.random.key(3), (6, 2))
  index_B, r_BxV = jax.jit(
    jax.vmap(lambda u, d, v: optimal.select_draft(u[0], u[1], d, v, p_V, q_V, max_k=4))
  )(u_Bx2, drafts_BxK, valid_BxK)
  for n, mask in enumerate(masks):
    k = sum(mask)
    if k >= 2:
      plan = optimal.optimal_plan(p_V, q_V, k, max_k=4)
      expected = optimal.select(u_Bx2[n, 0], u_Bx2[n, 1], drafts_BxK[n], valid_BxK[n], plan)
      assert int(index_B[n]) == int(expected)
      # The vmapped and the unbatched plan compile apart: equal to float rounding.
      np.testing.assert_allclose(r_BxV[n], plan.r_V, rtol=1e-5, atol=1e-9)
    elif k == 1:
      assert int(index_B[n]) == mask.index(1)
      np.testing.assert_array_equal(r_BxV[n], p_V)
    else:
      assert not np.any(np.asarray(r_BxV[n]))


def test_public_verifier_masks_and_matches_its_plan():
  """`optimal` = plan + random part; masked drafts are ignored; k = 0 samples q."""
  rng = np.random.default_rng(3)
  p, q = _pair(rng, 10, 0.7)
  p_V, q_V = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  n = 50_000
  drafts_BxK = _draw(jax.random.key(0), p_V, n, 4)
  keys_B = jax.random.split(jax.random.key(1), n)
  for mask in ([True, False, True, True], [False] * 4):
    valid_K = jnp.array(mask)
    tokens, accepted = _optimal_B(keys_B, drafts_BxK, p_V, q_V, valid_K)
    assert tokens.dtype == jnp.int32 and accepted.dtype == jnp.bool_
    plan = optimal.optimal_plan(p_V, q_V, sum(mask), max_k=4)
    expected = _apply_B(keys_B, drafts_BxK, valid_K, q_V, plan)
    np.testing.assert_array_equal(tokens, expected[0])
    np.testing.assert_array_equal(accepted, expected[1])
    tokens, accepted = np.asarray(tokens), np.asarray(accepted)
    stats.assert_law(np.bincount(tokens, minlength=10), q / q.sum(), f"mask {mask}")
    if any(mask):
      stats.assert_mean(accepted, float(plan.accept), f"mask {mask}: acceptance")
      masked_out = np.asarray(drafts_BxK[:, 1])
      others = np.asarray(drafts_BxK[:, [0, 2, 3]])
      only_masked = accepted & (tokens == masked_out) & ~(others == tokens[:, None]).any(1)
      assert not only_masked.any(), "accepted a masked draft"
    else:
      assert not accepted.any()


@pytest.mark.parametrize("vocab", [1000, 9000])
def test_slot_order_sorts_by_ratio_code_then_index(vocab):
  """The slot order (packed keys) is by q/p descending, ties by index, with q = 0 and
  then p = 0 last, up to the documented ratio resolution."""
  rng = np.random.default_rng(vocab)
  p, q = _pair(rng, vocab, 0.5)
  p[rng.choice(vocab, 20, replace=False)] = 0.0
  q[rng.choice(vocab, 20, replace=False)] = 0.0
  q[:50] = p[:50]  # exact ratio ties
  p, q = p / p.sum(), q / q.sum()
  order = np.asarray(
    opt_slots._slot_order(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
  )
  assert sorted(order) == list(range(vocab))
  p, q = p[order].astype(np.float32), q[order].astype(np.float32)
  group = np.where(p > 0, np.where(q > 0, 0, 1), 2)
  assert np.all(np.diff(group) >= 0)
  ratio = q[group == 0] / p[group == 0]
  assert np.all(ratio[1:] <= ratio[:-1] * (1 + 2**-7))


def _llm_pair(seed, vocab):
  """p, q = softmax of correlated Gaussian logits (correlation 0.8), scale 2, 3, 4 or 3."""
  scale = (2.0, 3.0, 4.0, 3.0)[seed % 4]
  rng = np.random.default_rng(seed)
  z = rng.standard_normal(vocab)
  p_V = jax.nn.softmax(jnp.asarray(scale * z, jnp.float32))
  q_V = jax.nn.softmax(
    jnp.asarray(scale * (0.8 * z + 0.6 * rng.standard_normal(vocab)), jnp.float32)
  )
  return p_V, q_V


LLM_TOL = 1e-5


def _check_plan_against_reference(plan, p_V, q_V, k, what):
  """The plan against the float64 reference run on the plan's slots (each slot's tokens
  merged into one, in the plan's slot order: the hull, the candidates and the levels
  recomputed independently, with as many candidates as the plan used): equal accept
  (the reference's slot rates spread over the tokens by p), equal bound (alpha* of the
  merged pair, at least alpha*), shortfall = bound - accept, each to LLM_TOL; and accept
  within 0.2% of alpha*."""
  p, q = np.asarray(p_V, np.float64), np.asarray(q_V, np.float64)
  slot = np.asarray(plan.slot_V) - 1
  num = plan.block_end_Vs.shape[0]
  num_cuts = int(np.sum(np.asarray(plan.cut_M) <= num))
  p_Vs, q_Vs = np.bincount(slot, p, num), np.bincount(slot, q, num)
  expected = ref.reference_plan(p_Vs, q_Vs, k, num_cuts, order=np.arange(num))
  rate_Vs = np.where(p_Vs > 0, expected.r_V / np.where(p_Vs > 0, p_Vs, 1.0), 0.0)
  expected_accept = float(np.minimum(p * rate_Vs[slot], q).sum())
  alpha = float(acceptance.optimal_acceptance(p_V, q_V, k))
  accept, bound, shortfall = float(plan.accept), float(plan.bound), float(plan.shortfall)
  assert abs(accept - expected_accept) < LLM_TOL, f"{what}: accept {accept} vs {expected_accept}"
  assert abs(bound - expected.bound) < LLM_TOL, f"{what}: bound {bound} vs {expected.bound}"
  assert bound > alpha - LLM_TOL, f"{what}: bound {bound} below alpha* {alpha}"
  assert abs(bound - accept - shortfall) < LLM_TOL, f"{what}: shortfall {shortfall}"
  assert accept > 0.998 * alpha, f"{what}: accept {accept} vs alpha* {alpha}"


@pytest.mark.numerics
@pytest.mark.parametrize(
  "vocab",
  [
    pytest.param(4096, marks=pytest.mark.slow),
    32000,
    pytest.param(131072, marks=pytest.mark.slow),
    pytest.param(262144, marks=pytest.mark.slow),
  ],
)
def test_plan_matches_float64_reference_at_llm_sizes(vocab):
  for seed, k in itertools.product(range(4), (2, 4, 8)):
    p_V, q_V = _llm_pair(seed, vocab)
    plan = optimal.optimal_plan(p_V, q_V, k, num_cuts=optimal.DEFAULT_NUM_CUTS, max_k=8)
    _check_plan_against_reference(plan, p_V, q_V, k, f"V={vocab} seed={seed} k={k}")


def _stepped_sums(cls, x_VxC):
  """Broken `Sums.of`: plain blocked float prefix sums with every other 128-block one
  unit in the last place low, so that they step down at block boundaries."""
  sums = opt_slots.cumsum(x_VxC)
  low = (jnp.arange(x_VxC.shape[0])[:, None] // 128) % 2 == 1
  sums = jnp.where(low, jnp.nextafter(sums, -jnp.inf), sums)
  zero = jnp.zeros((1, x_VxC.shape[1]), x_VxC.dtype)
  return cls(
    jnp.zeros((x_VxC.shape[0] + 1, x_VxC.shape[1]), jnp.int32), jnp.concatenate([zero, sums])
  )


def test_non_monotone_prefix_sums_are_caught(monkeypatch):
  p_V, q_V = _llm_pair(0, 32000)
  monkeypatch.setattr(opt_slots.Sums, "of", classmethod(_stepped_sums))
  plan = jax.jit(lambda p, q: opt_plan._plan_single(p, q, 8, optimal.DEFAULT_NUM_CUTS, 8))(p_V, q_V)
  with pytest.raises(AssertionError, match="accept"):
    _check_plan_against_reference(plan, p_V, q_V, 8, "stepped sums")
