"""Statistical exactness of the per-position verifiers and of the block walk.

Every test draws >= 1e5 seeded samples and compares the empirical law with the exact one
by chi-square at the suite's Bonferroni level (tests/stats.py); each family of tests also
runs a deliberately broken variant and must reject it.
"""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, methods, sampling, verify
from spectr_jax.testing import reference, sequences
from tests import stats

N = 100_000


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _dirichlet(seed, v, conc):
  rng = np.random.default_rng(seed)
  return rng.dirichlet(np.full(v, conc)), rng.dirichlet(np.full(v, conc))


def _tiny_mass_pair():
  p = np.array([0.5, 0.5 - 2e-30, 1e-30, 1e-30, 0.0])
  q = np.array([1e-30, 0.3, 0.2, 0.5 - 1e-30, 0.0])
  return p, q


CASES = {
  "spec-example": ((np.array([0.6, 0.4]), np.array([0.3, 0.7])), 2),
  "one-hot-p": ((np.array([1.0, 0.0]), np.array([0.5, 0.5])), 2),
  "one-hot-q": ((np.array([0.2, 0.5, 0.3]), np.array([0.0, 1.0, 0.0])), 3),
  "disjoint": ((np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7])), 2),
  "p-equals-q": ((np.array([0.1, 0.2, 0.3, 0.4]),) * 2, 4),
  "tiny-mass": (_tiny_mass_pair(), 3),
  "dirichlet-v10": (_dirichlet(0, 10, 1.0), 4),
  "dirichlet-v50": (_dirichlet(1, 50, 0.3), 8),
  "dirichlet-v6-k1": (_dirichlet(2, 6, 1.0), 1),
}


def _sample(verifier, p_V, q_V, k, *, seed=0, n=N):
  """Draws n outcomes of `verifier(key, drafts_K, p_V, q_V)` with k drafts ~ p_V.

  Returns numpy (tokens_N, accepted_N, hit_N).
  """

  @jax.jit
  def run(key):
    draft_key, verify_key = jax.random.split(key)
    draft_keys = jax.random.split(draft_key, n * k)
    drafts_BxK = jax.vmap(sampling.categorical, (0, None))(draft_keys, p_V).reshape(n, k)
    keys = jax.random.split(verify_key, n)
    tokens, accepted = jax.vmap(verifier, (0, 0, None, None))(keys, drafts_BxK, p_V, q_V)
    hit = jnp.any(drafts_BxK == tokens[:, None], axis=1)
    return tokens, accepted, hit

  return tuple(np.asarray(x) for x in run(jax.random.key(seed)))


def _internal(method, rho_mode="star", rho_value=0.0):
  """An internal verifier traced afresh (so monkeypatched helpers take effect)."""

  def verifier(key, drafts_K, p_V, q_V):
    valid_K = jnp.ones(drafts_K.shape, bool)
    record = methods.get(method)
    rho = dict(rho_mode=rho_mode, rho_value=jnp.float32(rho_value)) if record.takes_rho else {}
    verdict = record.verify(key, drafts_K, p_V, q_V, valid_K, **rho)
    return verdict.token, verdict.accepted

  return verifier


PUBLIC = {
  "kseq-star": lambda key, d, p, q: verify.kseq(key, d, p, q),
  "kseq-k": lambda key, d, p, q: verify.kseq(key, d, p, q, rho="k"),
  "specinfer": lambda key, d, p, q: verify.specinfer(key, d, p, q),
}


# The edge cases of rho* (and SpecInfer on the spec's example) in the fast tier; SpecInfer's
# other cases, rho = K and the random Dirichlet pairs with --runslow.
def _output_law_in_fast_tier(method, case):
  return method == "kseq-star" and not case.startswith("dirichlet") or case == "spec-example"


@pytest.mark.parametrize(
  "method, case",
  [
    pytest.param(m, c, marks=() if _output_law_in_fast_tier(m, c) else pytest.mark.slow)
    for c in sorted(CASES)
    for m in sorted(PUBLIC)
  ],
)
def test_output_law_is_q(method, case):
  (p, q), k = CASES[case]
  p_V, q_V = _f32(p), _f32(q)
  tokens, accepted, hit = _sample(PUBLIC[method], p_V, q_V, k)
  stats.assert_law(np.bincount(tokens, minlength=len(q)), q, f"{method} {case}")
  if method == "specinfer":
    expected_hit = float(acceptance.specinfer_acceptance(p_V, q_V, k))
    expected_accept = expected_hit
  else:
    result = acceptance.kseq_acceptance(p_V, q_V, k, rho=method.removeprefix("kseq-"))
    expected_hit, expected_accept = float(result.hit), float(result.p_accept)
  stats.assert_mean(hit, expected_hit, f"{method} {case} hit rate")
  stats.assert_mean(accepted, expected_accept, f"{method} {case} accept rate")


@pytest.mark.parametrize(
  "case",
  [
    pytest.param("dirichlet-v6-k1", marks=pytest.mark.slow),
    "spec-example",
    "one-hot-p",
    pytest.param("tiny-mass", marks=pytest.mark.slow),
  ],
)
def test_single_draft_and_kseq_with_one_draft(case):
  (p, q), _ = CASES[case]
  p_V, q_V = _f32(p), _f32(q)
  sd = _sample(lambda key, d, p, q: verify.speculative_sampling(key, d[0], p, q), p_V, q_V, 1)
  one = _sample(PUBLIC["kseq-star"], p_V, q_V, 1, seed=1)
  single = float(np.minimum(p, q).sum())
  for name, (tokens, accepted, _) in (("sd", sd), ("kseq k=1", one)):
    stats.assert_law(np.bincount(tokens, minlength=len(q)), q, f"{name} {case}")
    stats.assert_mean(accepted, single, f"{name} {case} acceptance")


@pytest.mark.parametrize("drafts", [(0, 0), (0, 1), (1, 2, 2), (2, 1, 0, 3)])
def test_kseq_conditional_law_given_drafts(drafts):
  """P(Y | X = x) for fixed drafts, against the exact conditional law."""
  p, q = _dirichlet(3, 4, 1.0)
  p_V, q_V = _f32(p), _f32(q)
  drafts_K = jnp.asarray(drafts, jnp.int32)
  keys = jax.random.split(jax.random.key(7), N)
  tokens, _ = jax.jit(jax.vmap(lambda key: verify.kseq(key, drafts_K, p_V, q_V)))(keys)
  rho = reference.rho_star(p, q, len(drafts))
  law = reference.kseq_law(drafts, p, q, rho)
  stats.assert_law(np.bincount(np.asarray(tokens), minlength=4), law, f"kseq | {drafts}")


@pytest.mark.parametrize("method", ["kseq", pytest.param("specinfer", marks=pytest.mark.slow)])
def test_valid_mask_selects_drafts(method):
  """Masked drafts are ignored: k = number valid, and k = 0 samples q."""
  p, q = _dirichlet(4, 5, 1.0)
  p_V, q_V = _f32(p), _f32(q)
  for valid in ((True, False, True, False), (False,) * 4):
    valid_K = jnp.asarray(valid)
    fn = getattr(verify, method)
    tokens, accepted, _ = _sample(
      lambda key, d, p, q, fn=fn, valid_K=valid_K: fn(key, d, p, q, valid_K=valid_K),
      p_V,
      q_V,
      4,
    )
    k = sum(valid)
    stats.assert_law(np.bincount(tokens, minlength=5), q, f"{method} valid={valid}")
    if k == 0:
      assert not accepted.any()
    elif method == "kseq":
      expected = float(acceptance.kseq_acceptance(p_V, q_V, k).p_accept)
      stats.assert_mean(accepted, expected, f"{method} valid={valid} accept rate")


def test_kseq_fixed_rho_sweep_does_not_recompile():
  p_V, q_V = _f32([0.6, 0.4]), _f32([0.3, 0.7])
  drafts_K = jnp.asarray([0, 1], jnp.int32)
  verify.kseq(jax.random.key(0), drafts_K, p_V, q_V, rho=1.5)
  before = verify._verify_position._cache_size()
  for rho in (1.1, 1.7, 2.0):
    verify.kseq(jax.random.key(0), drafts_K, p_V, q_V, rho=rho)
  assert verify._verify_position._cache_size() == before


@pytest.mark.numerics
@pytest.mark.parametrize("method", ["kseq-star", pytest.param("specinfer", marks=pytest.mark.slow)])
def test_large_vocabulary(method):
  """V = 32k, k = 8, LLM-like correlated pairs, binned into 64 bins of equal q-mass."""
  rng = np.random.default_rng(11)
  base = rng.normal(size=32_000)
  p = np.exp(2.0 * (base + 0.5 * rng.normal(size=32_000)))
  q = np.exp(2.0 * (base + 0.5 * rng.normal(size=32_000)))
  p, q = p / p.sum(), q / q.sum()
  p_V, q_V = _f32(p), _f32(q)
  tokens, _, hit = _sample(PUBLIC[method], p_V, q_V, 8)
  bins, bin_probs = stats.equal_mass_bins(np.asarray(q_V, np.float64), 64)
  stats.assert_law(np.bincount(bins[tokens], minlength=64), bin_probs, f"{method} V=32k")
  if method == "kseq-star":
    stats.assert_mean(hit, float(acceptance.kseq_acceptance(p_V, q_V, 8).hit), "V=32k hit")


# Broken variants: each must be rejected by the same test.


def test_rejects_naive_rho_one():
  (p, q), k = CASES["one-hot-p"]
  tokens, _, _ = _sample(
    lambda key, d, p, q: verify.kseq(key, d, p, q, rho=1.0), _f32(p), _f32(q), k
  )
  stats.assert_rejects(np.bincount(tokens, minlength=2), q, "kseq rho=1")


@pytest.mark.parametrize("method", ["sd", "kseq", "specinfer"])
def test_rejects_residual_equal_to_target(method, monkeypatch):
  monkeypatch.setattr(acceptance, "residual", lambda target_V, mass_V: target_V)
  (p, q), k = CASES["spec-example"]
  k = 1 if method == "sd" else k
  tokens, _, _ = _sample(_internal(method), _f32(p), _f32(q), k)
  stats.assert_rejects(np.bincount(tokens, minlength=2), q, f"{method} residual=q")


# The block walk at the sequence level.

V_SEQ = 3


def _prefix_tables(seed, draft_len, conc=0.7):
  """Prefix-dependent p(. | prefix) and q(. | prefix) for every prefix of length <= L.

  Returns numpy arrays of shape (L + 1) x V^L x V indexed by [length, base-V code].
  """
  rng = np.random.default_rng(seed)
  size = V_SEQ**draft_len
  p = rng.dirichlet(np.full(V_SEQ, conc), size=(draft_len + 1, size))
  q = rng.dirichlet(np.full(V_SEQ, conc), size=(draft_len + 1, size))
  return p, q


def _sample_blocks(key, p_tab, q_tab, num_drafts, draft_len, method, rho, n=N, bonus_shift=0):
  """`sequences.sample_blocks` through `methods.verify_drafts` with the given method and rho."""

  def verify_fn(key, drafts_KxL, p_KxLxV, q_KxL1xV):
    return methods.verify_drafts(key, drafts_KxL, p_KxLxV, q_KxL1xV, method=method, rho=rho)

  return sequences.sample_blocks(
    key, p_tab, q_tab, num_drafts, draft_len, verify_fn, n, bonus_shift=bonus_shift
  )


def _sequence_law(q_tab, draft_len):
  law = np.ones(1)
  for t in range(draft_len + 1):
    law = (law[:, None] * q_tab[t, : V_SEQ**t]).ravel()
  return law


def _expected_num_tokens(p_tab, q_tab, num_drafts, draft_len, law_fn):
  """Exact E[num_tokens] by enumerating all draft blocks and walking the exact laws."""

  def walk(drafts, alive, t, code):
    if t == draft_len:
      return 1.0
    x = tuple(drafts[i][t] for i in alive)
    law = law_fn(x, p_tab[t, code], q_tab[t, code])
    total = 0.0
    for y in range(V_SEQ):
      survivors = [i for i in alive if drafts[i][t] == y]
      rest = walk(drafts, survivors, t + 1, code * V_SEQ + y) if survivors else 0.0
      total += law[y] * (1.0 + rest)
    return total

  def draft_prob(seq):
    prob, code = 1.0, 0
    for t, x in enumerate(seq):
      prob *= p_tab[t, code, x]
      code = code * V_SEQ + x
    return prob

  seqs = list(itertools.product(range(V_SEQ), repeat=draft_len))
  expected = 0.0
  for drafts in itertools.product(seqs, repeat=num_drafts):
    weight = np.prod([draft_prob(s) for s in drafts])
    expected += weight * walk(drafts, list(range(num_drafts)), 0, 0)
  return expected


def _kseq_star_law(x, p, q):
  return reference.kseq_law(x, p, q, reference.rho_star(p, q, len(x)))


BLOCK_METHODS = {
  "kseq-star": ("kseq", "star", 3, _kseq_star_law),
  "kseq-k": ("kseq", "k", 3, lambda x, p, q: reference.kseq_law(x, p, q, max(len(x), 1))),
  "specinfer": ("specinfer", "star", 3, reference.specinfer_law),
  "sd": ("sd", "star", 1, reference.sd_law),
  "optimal": ("optimal", "star", 3, None),
}


# rho* at L = 2 in the fast tier; every other method and L = 1 with --runslow.
@pytest.mark.parametrize(
  "name, draft_len",
  [
    pytest.param(n, length, marks=() if (n, length) == ("kseq-star", 2) else pytest.mark.slow)
    for n in sorted(BLOCK_METHODS)
    for length in (1, 2)
  ],
)
def test_block_sequence_law_and_length(name, draft_len):
  method, rho, num_drafts, law_fn = BLOCK_METHODS[name]
  p_tab, q_tab = _prefix_tables(draft_len, draft_len)
  codes, nums = _sample_blocks(jax.random.key(3), p_tab, q_tab, num_drafts, draft_len, method, rho)
  law = _sequence_law(q_tab, draft_len)
  stats.assert_law(np.bincount(codes, minlength=law.size), law, f"block {name} L={draft_len}")
  assert nums.min() >= 1 and nums.max() <= draft_len + 1
  if law_fn is not None:
    expected = _expected_num_tokens(p_tab, q_tab, num_drafts, draft_len, law_fn)
    stats.assert_mean(nums, expected, f"block {name} L={draft_len} num_tokens")


def test_block_rejects_bonus_from_wrong_position():
  p_tab, q_tab = _prefix_tables(2, 2)
  codes, _ = _sample_blocks(jax.random.key(3), p_tab, q_tab, 3, 2, "kseq", "star", bonus_shift=1)
  law = _sequence_law(q_tab, 2)
  stats.assert_rejects(np.bincount(codes, minlength=law.size), law, "bonus from position L-1")


def test_block_stats_and_identical_models():
  """With p = q every draft is accepted: L hits, then the bonus; stats say so."""
  p_KxLxV = jnp.full((2, 3, 4), 0.25)
  drafts_KxL = jnp.asarray([[0, 1, 2], [0, 1, 3]], jnp.int32)
  q_KxL1xV = jnp.full((2, 4, 4), 0.25)
  tokens, num, st = methods.verify_drafts(
    jax.random.key(0), drafts_KxL, p_KxLxV, q_KxL1xV, return_stats=True
  )
  assert int(num) == 4
  assert bool(st.hit_L1[:3].all()) and not bool(st.hit_L1[3])
  assert bool(st.accepted_L1[:3].all())
  assert int(st.survivors_L1[0]) == 2 and int(st.survivors_L1[3]) == 0
  np.testing.assert_array_equal(np.asarray(tokens[:2]), [0, 1])
  assert int(tokens[2]) in (2, 3)


def test_block_vmaps_under_jit():
  p_tab, q_tab = _prefix_tables(5, 2)
  fn = jax.jit(
    jax.vmap(
      functools.partial(methods.verify_drafts, method="kseq", rho=1.5),
      in_axes=(0, None, None, None),
    )
  )
  drafts = jnp.zeros((2, 2), jnp.int32)
  p = _f32(np.broadcast_to(p_tab[0, 0], (2, 2, 3)))
  q = _f32(np.broadcast_to(q_tab[0, 0], (2, 3, 3)))
  tokens, nums = fn(jax.random.split(jax.random.key(0), 16), drafts, p, q)
  assert tokens.shape == (16, 3) and nums.shape == (16,)


def _data_dependent_loops(fn, *args):
  """The while loops of fn's compiled program whose trip count XLA does not know (on a GPU
  every iteration of such a loop copies its predicate to the host)."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return [
    line for line in text.splitlines() if " while(" in line and "known_trip_count" not in line
  ]


@pytest.mark.parametrize(
  "method, rho_mode, num_drafts",
  [
    ("kseq", "star", 4),
    ("kseq", "k", 4),
    ("kseq", "fixed", 4),
    ("specinfer", "k", 4),
    ("rrs", "k", 4),
    ("sd", "k", 1),
    ("block", "k", 1),
  ],
)
def test_walk_has_no_data_dependent_loop(method, rho_mode, num_drafts):
  draft_len, v = 3, 50
  drafts_KxL = jnp.zeros((num_drafts, draft_len), jnp.int32)
  p_KxLxV = jnp.full((num_drafts, draft_len, v), 1.0 / v)
  q_KxL1xV = jnp.full((num_drafts, draft_len + 1, v), 1.0 / v)

  def walk(key, drafts_KxL, p_KxLxV, q_KxL1xV):
    record = methods.get(method)
    return verify.walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, jnp.float32(1.5), record, rho_mode)

  assert not _data_dependent_loops(walk, _KEY, drafts_KxL, p_KxLxV, q_KxL1xV)


def test_loop_check_finds_a_data_dependent_loop():
  def first_power_above(x):
    return jax.lax.while_loop(lambda y: y < x, lambda y: 2 * y, jnp.float32(1.0))

  assert len(_data_dependent_loops(first_power_above, jnp.float32(10.0))) == 1


def test_rho_star_table_holds_the_walks_positions():
  """`verify.rho_star_KxL` holds rho*(p[i, t], q[i, t], k) where draft i is the first of
  the k >= 2 drafts sharing its t-prefix, and 1 elsewhere."""
  num_drafts, draft_len, v = 6, 4, 5
  rng = np.random.default_rng(1)
  drafts_KxL = rng.integers(0, 2, (num_drafts, draft_len))
  p_KxLxV = _f32(rng.dirichlet(np.ones(v), (num_drafts, draft_len)))
  q_KxL1xV = _f32(rng.dirichlet(np.ones(v), (num_drafts, draft_len + 1)))
  got = np.asarray(verify.rho_star_KxL(jnp.asarray(drafts_KxL, jnp.int32), p_KxLxV, q_KxL1xV))
  for i, t in itertools.product(range(num_drafts), range(draft_len)):
    sharing = [j for j in range(num_drafts) if (drafts_KxL[j, :t] == drafts_KxL[i, :t]).all()]
    want = 1.0
    if len(sharing) >= 2 and sharing[0] == i:
      want = float(acceptance.rho_star(p_KxLxV[i, t], q_KxL1xV[i, t], len(sharing)))
      assert want > 1.0
    assert got[i, t] == pytest.approx(want, abs=1e-5), (i, t)


_KEY = jax.random.key(0)
_HALF = _f32([0.5, 0.5])
_D2 = jnp.zeros(2, jnp.int32)


def _block(method="kseq", draft_len=2, q_len=3):
  drafts = jnp.zeros((2, draft_len), jnp.int32)
  return methods.verify_drafts(
    _KEY, drafts, jnp.full((2, draft_len, 2), 0.5), jnp.full((2, q_len, 2), 0.5), method=method
  )


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: verify.kseq(_KEY, _D2, _HALF, _f32([1.0])), "differ"),
    (lambda: verify.kseq(_KEY, _D2, _f32([1.5, -0.5]), _HALF), "negative"),
    (lambda: verify.specinfer(_KEY, _D2, _f32([0.5, 0.6]), _HALF), "normalised"),
    (lambda: verify.kseq(_KEY, _D2, _HALF, _HALF, valid_K=jnp.ones(3, bool)), "valid_K"),
    (lambda: verify.kseq(_KEY, _D2, _HALF, _HALF, rho=0.0), "rho"),
    (lambda: _block(method="beam"), "unknown method"),
    (lambda: _block(method="sd"), "single draft"),
    (lambda: _block(q_len=2), "q_KxL1xV has shape"),
    (lambda: _block(draft_len=0, q_len=1), "L >= 1"),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()


class WalkTest(chex.TestCase):
  """`verify.walk`, the engine's seam, is `methods.verify_drafts` without the checks, with and
  without jit."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_walk_matches_verify_drafts(self):
    k, draft_len, v = 3, 4, 6
    rng = np.random.default_rng(0)
    p_KxLxV = jnp.asarray(rng.dirichlet(np.ones(v), (k, draft_len)), jnp.float32)
    q_KxL1xV = jnp.asarray(rng.dirichlet(np.ones(v), (k, draft_len + 1)), jnp.float32)
    drafts_KxL = jnp.asarray(rng.integers(0, v, (k, draft_len)), jnp.int32)
    kseq = methods.get("kseq")
    walk = self.variant(functools.partial(verify.walk, verifier=kseq, rho_mode="star"))
    for seed in range(4):
      key = jax.random.key(seed)
      got = walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, jnp.float32(0.0))
      want = methods.verify_drafts(key, drafts_KxL, p_KxLxV, q_KxL1xV, return_stats=True)
      chex.assert_shape(got[0], (draft_len + 1,))
      chex.assert_trees_all_equal(got, want)
