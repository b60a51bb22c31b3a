"""Drafts without replacement and recursive rejection without replacement ("wor", "rrs").

- The draws: `drafting.distinct_tokens` and the scheme `drafting.without_replacement`
  (through a fake draft model that walks an enumerable tree) follow the law of successive
  sampling (Gumbel-top-k), also where fewer than K tokens have mass (copies of path 0).
- Exactness: the float64 reference law of RRS given the drafts, averaged over every
  ordered draw, is q (V = 2-5, K = 1-5, sparse and one-hot cases); the JAX verifier's
  output is q by chi-square per position and, through `methods.verify_drafts`, on
  sequences (L = 1-3); the broken variant (SpecInfer's rule on drafts without
  replacement, the draft law not renormalised) is rejected. The engine test is in
  tests/decoding/test_engine.py.
- The bound: the min-cut over all 2^V token sets equals the coupling LP; the prefix
  search of `acceptance.wor_bound` equals it on every case tried; RRS stays below it.
- The acceptance estimate `acceptance.rrs_acceptance` agrees with exact enumeration.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, drafting, methods, verify
from spectr_jax.testing import reference, sequences
from spectr_jax.testing import wor_reference as ref
from tests import stats

N = 100_000


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _random_cases(seed, num, sizes=(2, 3, 4, 5), ks=(1, 2, 3, 4)):
  """(p, q, k) with Dirichlet laws of several concentrations; every 4th p sparse."""
  rng = np.random.default_rng(seed)
  cases = []
  for i in range(num):
    v, k, conc = sizes[i % len(sizes)], ks[i % len(ks)], (0.3, 1.0, 3.0)[i % 3]
    p, q = rng.dirichlet(np.full(v, conc)), rng.dirichlet(np.full(v, conc))
    if i % 4 == 0:
      p[rng.integers(v)] = 0.0
      p /= p.sum()
    cases.append((p, q, k))
  return cases


EDGE_CASES = [
  (np.array([0.6, 0.4]), np.array([0.3, 0.7]), 2),  # K = V: both tokens drafted
  (np.array([1.0, 0.0, 0.0]), np.array([0.2, 0.5, 0.3]), 3),  # one-hot p: support < K
  (np.array([0.2, 0.5, 0.3]), np.array([0.0, 1.0, 0.0]), 2),  # one-hot q
  (np.array([0.5, 0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.3, 0.7]), 3),  # disjoint
  (np.array([0.1, 0.2, 0.3, 0.4]),) * 2 + (4,),  # p = q, K = V
  (np.array([0.7, 0.0, 0.3, 0.0]), np.array([0.1, 0.4, 0.1, 0.4]), 4),  # support 2 < K
  (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.4, 0.3, 0.2, 0.1]), 3),  # ties in p
  (np.array([1 - 2e-7, 1e-7, 1e-7]), np.array([0.3, 0.3, 0.4]), 2),  # 1 - p(top) tiny
]


# The reference: exact laws in float64.


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_reference_rrs_law_is_q_and_the_broken_variant_is_not(k):
  broken = 0.0
  for p, q, _ in EDGE_CASES + _random_cases(k, 40):
    law, hit = ref.enumerate_wor(ref.rrs_law, p, q, k)
    np.testing.assert_allclose(law, q, atol=1e-12, err_msg=f"{p} {q} {k}")
    assert np.minimum(p, q).sum() - 1e-12 <= hit <= ref.bound_by_cuts(p, q, k)[0] + 1e-12
    wrong, _ = ref.enumerate_wor(reference.specinfer_law, p, q, k)
    broken = max(broken, 0.5 * np.abs(wrong - q).sum())
  assert broken > (0.0 if k == 1 else 0.05), broken  # K = 1: both rules are one draft


def _group(cases, k):
  """The cases of k, padded to V = 5 with tokens of p = q = 0 (they change nothing), so
  that one compile serves them all: (cases, p_XxV, q_XxV)."""
  group = [(p, q) for p, q, kk in cases if kk == k]
  p_XxV, q_XxV = (_f32([np.pad(c[i], (0, 5 - len(c[i]))) for c in group]) for i in (0, 1))
  return group, p_XxV, q_XxV


_KS = [pytest.param(k, marks=() if k in (2, 3) else pytest.mark.slow) for k in (1, 2, 3, 4, 5)]


@pytest.mark.parametrize("k", _KS)
def test_bound_cuts_equal_the_coupling_lp_and_the_prefix_search(k):
  """SPEC 5: min over all G of q(G) + 1 - P(S subset G) is the coupling LP; the q/p-ascending
  prefixes reached the minimum on every case (a conjecture, not a theorem)."""
  cases = [c for c in EDGE_CASES if c[2] == k] + _random_cases(7, 200, ks=(k,))
  group, p_XxV, q_XxV = _group([(p, q, k) for p, q, _ in cases], k)
  cuts = []
  for p, q in group:
    cuts.append(ref.bound_by_cuts(p, q, k)[0])
    if len(p) <= 4:
      assert ref.bound_lp(p, q, k) == pytest.approx(cuts[-1], abs=1e-9), (p, q, k)
    assert ref.bound_by_prefixes(p, q, k) == pytest.approx(cuts[-1], abs=1e-12), (p, q, k)
  ours = np.asarray(acceptance.wor_bound_X(p_XxV, q_XxV, k))
  np.testing.assert_allclose(ours, cuts, atol=2e-6, err_msg=f"k={k}")


@pytest.mark.numerics
def test_bound_numerics_at_an_llm_vocabulary():
  """float32 against the same prefix search in float64 (the exponential-race integral)."""
  rng = np.random.default_rng(3)
  base = rng.normal(size=4096)
  p = np.exp(2.0 * (base + 0.5 * rng.normal(size=(4, 4096))))
  q = np.exp(2.0 * (base + 0.5 * rng.normal(size=(4, 4096))))
  p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
  with jax.enable_x64(True):
    exact = np.asarray(acceptance.wor_bound_X(jnp.asarray(p), jnp.asarray(q), 4))
  ours = np.asarray(acceptance.wor_bound_X(_f32(p), _f32(q), 4))
  np.testing.assert_allclose(ours, exact, atol=5e-6)
  iid = np.asarray(acceptance.optimal_acceptance_X(_f32(p), _f32(q), 4))
  assert np.all(ours >= iid - 1e-5)  # here drafts without replacement do no worse


@pytest.mark.parametrize("k", _KS)
def test_rrs_acceptance_agrees_with_enumeration(k):
  cases = [(p, q, k) for p, q, _ in EDGE_CASES] + _random_cases(11, 40, ks=(k,))
  group, p_XxV, q_XxV = _group(cases, k)
  hits = np.array([ref.enumerate_wor(ref.rrs_law, p, q, k)[1] for p, q in group])
  est = acceptance.rrs_acceptance_X(p_XxV, q_XxV, k, num_histories=1024)
  hit, stderr = np.asarray(est.hit), np.asarray(est.stderr)
  assert np.all(np.abs(hit - hits) <= 5 * stderr + 2e-6), (k, hit, hits, stderr)
  exact = np.array([k <= 2 or np.count_nonzero(p) <= k for p, _ in group])
  assert np.all(stderr[exact] == 0.0)
  p, q = np.array([0.0, 0.45, 0.05, 0.3, 0.2]), np.array([0.3, 0.1, 0.2, 0.1, 0.3])
  batch = acceptance.rrs_acceptance_X(_f32([p, p]), _f32([q, q]), 3)
  assert batch.hit.shape == (2,) and float(batch.stderr[0]) > 0  # m_i depends on the draws


# The draws.


def test_distinct_tokens_follow_successive_sampling():
  for p, k in ((np.array([0.5, 0.05, 0.0, 0.25, 0.2]), 3), (np.array([0.7, 0.0, 0.3, 0.0]), 4)):
    keys = jax.random.split(jax.random.key(1), N)
    draw = jax.jit(
      jax.vmap(lambda key, k=k, p=p: drafting.distinct_tokens(jax.random.split(key, k), _f32(p)))
    )
    tokens, valid = (np.asarray(x) for x in draw(keys))
    s = np.count_nonzero(p)
    assert np.all(valid[:, : min(s, k)]) and not np.any(valid[:, s:])
    np.testing.assert_array_equal(
      tokens[:, s:], np.broadcast_to(tokens[:, :1], tokens[:, s:].shape)
    )
    law = ref.ordered_draws(p, k)
    index = {x: i for i, (x, _) in enumerate(law)}
    cells = [index.get(tuple(row[: min(s, k)]), len(law)) for row in tokens]
    counts = np.bincount(cells, minlength=len(law) + 1)
    assert counts[-1] == 0  # never a repeated or zero-probability valid token
    stats.assert_law(counts[:-1], [w for _, w in law], f"distinct tokens k={k}")


def _tree(seed, vocab, draft_len, conc=0.7, sparse=False):
  """p_tab, q_tab ((L + 1) x V^L x V, as in block_bound); sparse: zeros in p's rows
  (the root keeps 2 tokens: fewer than K = 3)."""
  rng = np.random.default_rng(seed)
  size = vocab**draft_len
  p = rng.dirichlet(np.full(vocab, conc), size=(draft_len + 1, size))
  q = rng.dirichlet(np.full(vocab, conc), size=(draft_len + 1, size))
  if sparse:
    p[0, 0, 2:] = 0.0
    p[1:, :, 0] = 0.0
    p /= p.sum(-1, keepdims=True)
  return p, q


def _codes(paths_XxL, vocab):
  return np.asarray(paths_XxL) @ (vocab ** np.arange(paths_XxL.shape[-1])[::-1])


@pytest.mark.parametrize("sparse", [pytest.param(False, marks=pytest.mark.slow), True])
def test_scheme_draws_the_multiset_law(sparse):
  """The scheme's K paths (first tokens without replacement, then i.i.d.; copies of path 0
  where the root has fewer than K tokens) follow `wor_reference.multiset_law`."""
  vocab, k, draft_len = 3, 3, 2
  p_tab, _ = _tree(5, vocab, draft_len, sparse=sparse)
  out = sequences.wor_drafts(p_tab, k, draft_len, N)
  codes_BxK = _codes(out.tokens_BxKxL, vocab)
  law = ref.multiset_law(p_tab, k, draft_len)
  assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
  index = {m: i for i, m in enumerate(law)}
  cells = [index.get(tuple(sorted(row)), len(law)) for row in codes_BxK]
  counts = np.bincount(cells, minlength=len(law) + 1)
  assert counts[-1] == 0
  stats.assert_law(counts[:-1], list(law.values()), f"wor multiset sparse={sparse}")
  first = np.asarray(out.tokens_BxKxL)[:, :, 0]
  for path in np.asarray(out.tokens_BxKxL)[:50]:  # paths sharing a first token are copies
    drafting.check_distinct(path)
  if sparse:
    assert np.all(first[:, 0] != first[:, 1])
  # p of every tail is the law its token was drawn from.
  p_BxKxLxV = np.asarray(out.p_BxKxLxV)
  np.testing.assert_allclose(p_BxKxLxV[:, :, 0], np.broadcast_to(p_tab[0, 0], (N, k, vocab)), 1e-6)
  np.testing.assert_allclose(
    p_BxKxLxV[:, :, 1], p_tab[1][np.asarray(out.tokens_BxKxL)[:, :, 0]], atol=1e-6
  )


# The verifier at one position.


def _sample_position(fn, p, q, k, *, seed=0, n=N):
  """n outcomes of fn(key, drafts_K, p_V, q_V, valid_K) on drafts of `distinct_tokens`:
  numpy (tokens, accepted, hit)."""
  p_V, q_V = _f32(p), _f32(q)

  @jax.jit
  def run(key):
    def one(key):
      draft_key, verify_key = jax.random.split(key)
      drafts_K, valid_K = drafting.distinct_tokens(jax.random.split(draft_key, k), p_V)
      verdict = fn(verify_key, drafts_K, p_V, q_V, jnp.ones((k,), bool))
      return verdict.token, verdict.accepted, jnp.any(valid_K & (drafts_K == verdict.token))

    # Batched: each draw holds its own V-vector of drafted tokens.
    return jax.lax.map(one, jax.random.split(key, n), batch_size=max(1, 2**25 // len(p)))

  return tuple(np.asarray(x) for x in run(jax.random.key(seed)))


POSITION_CASES = {
  "k-equals-v": EDGE_CASES[0],
  "one-hot-p": EDGE_CASES[1],
  "one-hot-q": EDGE_CASES[2],
  "support-below-k": EDGE_CASES[5],
  "dirichlet-v6": (*_random_cases(3, 3, sizes=(6,))[1][:2], 4),
  "sparse-v5": (np.array([0.0, 0.45, 0.05, 0.3, 0.2]), np.array([0.3, 0.1, 0.2, 0.1, 0.3]), 3),
}


# The edge cases in the fast tier, the random pairs with --runslow.
@pytest.mark.parametrize(
  "case",
  [
    pytest.param(c, marks=pytest.mark.slow if c in ("dirichlet-v6", "sparse-v5") else ())
    for c in sorted(POSITION_CASES)
  ],
)
def test_rrs_output_law_is_q(case):
  p, q, k = POSITION_CASES[case]
  tokens, accepted, hit = _sample_position(verify.rrs_verdict, p, q, k)
  stats.assert_law(np.bincount(tokens, minlength=len(q)), q, f"rrs {case}")
  np.testing.assert_array_equal(hit, accepted)  # a rejected draft is never the final draw
  if case == "dirichlet-v6":
    _, exact = ref.enumerate_wor(ref.rrs_law, p, q, k)
    stats.assert_mean(hit, exact, f"rrs {case} hit rate")


@pytest.mark.numerics
@pytest.mark.slow
def test_rrs_large_vocabulary():
  """V = 32k, K = 8, LLM-like pairs, 64 bins of equal q-mass; the hit rate against the
  estimate of `acceptance.rrs_acceptance`."""
  p, q = sequences.llm_like(11, 32_000)
  tokens, _, hit = _sample_position(verify.rrs_verdict, p, q, 8, n=N // 10)
  bins, bin_probs = stats.equal_mass_bins(q, 64)
  stats.assert_law(np.bincount(bins[tokens], minlength=64), bin_probs, "rrs V=32k")
  est = acceptance.rrs_acceptance(_f32(p), _f32(q), 8, num_histories=512)
  assert abs(hit.mean() - float(est.hit)) < 5 * np.sqrt(hit.var() / hit.size + est.stderr**2)


def test_rejects_specinfer_rule_on_drafts_without_replacement():
  """The draft law not renormalised after each rejection (SpecInfer's rule) is not exact."""
  p, q, k = EDGE_CASES[6]
  tokens, _, _ = _sample_position(verify.specinfer_verdict, p, q, k)
  stats.assert_rejects(np.bincount(tokens, minlength=len(q)), q, "specinfer on wor drafts")


def test_repeated_and_masked_drafts_are_skipped():
  """A repeated token and a masked draft change nothing: with the same keys, the same
  outputs as without them."""
  p, q = _f32([0.3, 0.3, 0.2, 0.2]), _f32([0.25, 0.25, 0.25, 0.25])
  keys = jax.random.split(jax.random.key(2), 4000)

  @jax.jit
  def outputs(drafts_K, valid_K):
    verdict = jax.vmap(lambda key: verify.rrs_verdict(key, drafts_K, p, q, valid_K))(keys)
    return verdict.token, verdict.accepted

  def run(drafts, valid):
    return [np.asarray(x) for x in outputs(jnp.asarray(drafts, jnp.int32), jnp.asarray(valid))]

  same = run([0, 1, 0], [True, True, True])
  np.testing.assert_array_equal(same, run([0, 1, 2], [True, True, False]))
  np.testing.assert_array_equal(same, run([0, 1, 1], [True, True, True]))
  assert not np.array_equal(same[0], run([0, 1, 2], [True, True, True])[0])


def test_public_rrs_and_verify_drafts_checks():
  p, q = _f32([0.5, 0.3, 0.2]), _f32([0.2, 0.2, 0.6])
  token, _ = verify.rrs(jax.random.key(0), jnp.asarray([2, 0], jnp.int32), p, q)
  assert 0 <= int(token) < 3
  p_KxLxV = jnp.broadcast_to(p, (3, 2, 3))
  q_KxL1xV = jnp.broadcast_to(q, (3, 3, 3))
  ok = jnp.asarray([[1, 0], [2, 2], [1, 0]], jnp.int32)  # path 2 copies path 0
  methods.verify_drafts(jax.random.key(0), ok, p_KxLxV, q_KxL1xV, method="rrs")
  iid_like = jnp.asarray([[1, 0], [2, 2], [1, 2]], jnp.int32)
  with pytest.raises(ValueError, match="paths 0 and 2 share the first token 1"):
    methods.verify_drafts(jax.random.key(0), iid_like, p_KxLxV, q_KxL1xV, method="rrs")
  methods.verify_drafts(jax.random.key(0), iid_like, p_KxLxV, q_KxL1xV, method="specinfer")


# Sequences: the scheme's drafts through methods.verify_drafts, completed by exact target draws.


def _sequence_law(q_tab, draft_len):
  vocab, law = q_tab.shape[-1], np.ones(1)
  for t in range(draft_len + 1):
    law = (law[:, None] * q_tab[t, : vocab**t]).ravel()
  return law


def _expected_num_tokens(p_tab, q_tab, num_drafts, draft_len):
  """Exact E[num_tokens]: RRS on the distinct first tokens, then one surviving path."""
  vocab = p_tab.shape[-1]

  @functools.cache
  def single(t, code):  # expected tokens from position t on, one draft path at node code
    if t == draft_len:
      return 1.0
    p, q = p_tab[t, code], q_tab[t, code]
    total = 0.0
    for x in np.flatnonzero(p > 0):
      law = reference.sd_law((x,), p, q)
      total += p[x] * (1.0 + law[x] * single(t + 1, code * vocab + x))
    return total

  p, q = p_tab[0, 0], q_tab[0, 0]
  expected = 0.0
  for x, weight in ref.ordered_draws(p, num_drafts):
    law = ref.rrs_law(x, p, q)
    expected += weight * (1.0 + sum(law[y] * single(1, y) for y in x))
  return expected


# L = 2 with the mean length against its closed form, and a sparse tree; RRS's law at
# L = 1-3 on enumerated drafts is in its `testing.check_verifier` (tests/workbench/test_harness.py).
_SEQ = [
  pytest.param(2, False, id="L2", marks=pytest.mark.slow),
  pytest.param(2, True, id="L2-sparse"),
]


@pytest.mark.parametrize("draft_len, sparse", _SEQ)
def test_block_sequence_law_and_length(draft_len, sparse):
  p_tab, q_tab = _tree(draft_len + 10 * sparse, 3, draft_len, sparse=sparse)
  codes, nums = sequences.sample_wor_blocks(p_tab, q_tab, 3, draft_len)
  law = _sequence_law(q_tab, draft_len)
  what = f"rrs block L={draft_len} sparse={sparse}"
  stats.assert_law(np.bincount(codes, minlength=law.size), law, what)
  assert nums.min() >= 1 and nums.max() <= draft_len + 1
  if draft_len == 2 and not sparse:
    expected = _expected_num_tokens(p_tab, q_tab, 3, draft_len)
    stats.assert_mean(nums, expected, f"{what} num_tokens")


@pytest.mark.slow
def test_block_rejects_specinfer_rule_on_drafts_without_replacement():
  """The same walk with SpecInfer's rule (the draft law not renormalised) is caught; at
  this root it puts total variation 0.053 on the first token."""
  p_tab, q_tab = _tree(4, 3, 2)
  p_tab[0, 0], q_tab[0, 0] = [0.64, 0.12, 0.24], [0.2, 0.32, 0.48]
  codes, _ = sequences.sample_wor_blocks(p_tab, q_tab, 2, 2, method="specinfer")
  law = _sequence_law(q_tab, 2)
  stats.assert_rejects(np.bincount(codes, minlength=law.size), law, "specinfer on wor blocks")


# Static trees: branching per depth, children without replacement at every node.


def _assert_paths_law(tokens_BxKxL, law, vocab, what):
  """The rows' K paths, in order, are draws from `law` ({tuple of K path codes: prob})."""
  assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
  index = {paths: i for i, paths in enumerate(law)}
  cells = [index.get(tuple(row), len(law)) for row in _codes(tokens_BxKxL, vocab)]
  counts = np.bincount(cells, minlength=len(law) + 1)
  assert counts[-1] == 0  # no row outside the law's support
  stats.assert_law(counts[:-1], list(law.values()), what)


@pytest.mark.parametrize(
  "branching, sparse",
  [((2, 2), False), pytest.param((2, 2), True, marks=pytest.mark.slow), ((1, 3), True)],
)
def test_static_tree_draws_its_law(branching, sparse):
  """The scheme with a static branching gives its K paths, in order, the law of
  `wor_reference.static_tree_law`: children without replacement at every node, and where
  a node has fewer tokens with mass than children ((1, 3) on the sparse tree: 2 at
  depth 1), the extra children copy child 0's subtree; each tail's p is the law after its
  own prefix."""
  vocab, draft_len = 3, len(branching)
  k = int(np.prod(branching))
  p_tab, _ = _tree(7, vocab, draft_len, sparse=sparse)
  out = sequences.wor_drafts(p_tab, k, draft_len, N, seed=2, branching=branching)
  tokens_BxKxL = np.asarray(out.tokens_BxKxL)
  law = ref.static_tree_law(p_tab, branching)
  _assert_paths_law(tokens_BxKxL, law, vocab, f"static tree {branching} sparse={sparse}")
  prefix_BxK = tokens_BxKxL[:, :, 0]
  np.testing.assert_allclose(np.asarray(out.p_BxKxLxV)[:, :, 1], p_tab[1][prefix_BxK], atol=1e-6)


def test_static_tree_default_is_the_scheme_of_distinct_first_tokens():
  """branching (K, 1, ..., 1) is the default: the same tokens for the same keys."""
  p_tab, _ = _tree(3, 4, 3)
  default = sequences.wor_drafts(p_tab, 3, 3, 64, seed=1)
  explicit = sequences.wor_drafts(p_tab, 3, 3, 64, seed=1, branching=(3, 1, 1))
  np.testing.assert_array_equal(np.asarray(default.tokens_BxKxL), np.asarray(explicit.tokens_BxKxL))
  for bad in [(3, 1), (2, 1, 1), (3, 1, 0), [3, 1, 1], "proportionl"]:
    with pytest.raises(ValueError, match="branching"):
      sequences.wor_drafts(p_tab, 3, 3, 4, branching=bad)


@pytest.mark.parametrize("broken", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_rrs_verifies_a_static_tree_node_by_node(broken, monkeypatch):
  """RRS walks a static tree (2, 2) node by node (it skips repeated tokens and keeps the
  surviving subtree): the sequence law is the target's. Broken: every node at depth 1
  draws its children from the first node's law while the verifier sees each node's own
  p; at this tree (depth-1 laws one-hot-like on different tokens) that is caught."""
  p_tab, q_tab = _tree(8, 3, 2)
  p_tab[1, :3] = [[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.05, 0.05, 0.9]]
  if broken:
    real = drafting._children

    def first_nodes_law(key_BxK, p_BxKxV, *args, **kwargs):
      p_BxKxV = jnp.broadcast_to(p_BxKxV[:, :1], p_BxKxV.shape)
      return real(key_BxK, p_BxKxV, *args, **kwargs)

    monkeypatch.setattr(drafting, "_children", first_nodes_law)
  codes, nums = sequences.sample_wor_blocks(p_tab, q_tab, 4, 2, branching=(2, 2))
  law = _sequence_law(q_tab, 2)
  counts = np.bincount(codes, minlength=law.size)
  if broken:
    stats.assert_rejects(counts, law, "rrs on a static tree drawn from the wrong node's law")
  else:
    stats.assert_law(counts, law, "rrs on a static tree (2, 2)")
    assert nums.min() >= 1 and nums.max() <= 3


@pytest.mark.parametrize(
  "sparse, k",
  [
    (True, 4),
    pytest.param(False, 4, marks=pytest.mark.slow),
    pytest.param(False, 3, marks=pytest.mark.slow),
  ],
)
def test_proportional_tree_draws_its_law(sparse, k):
  """Branching "proportional": the K paths in order follow
  `wor_reference.proportional_tree_law` (a node of m paths gives child j about m p(x_j)
  of them, at least 1, children without replacement until the paths are spent; on the
  sparse tree the root's 2 tokens cannot take 4 paths: the rest go to child 0)."""
  vocab, draft_len = 3, 2
  p_tab, _ = _tree(11, vocab, draft_len, sparse=sparse)
  out = sequences.wor_drafts(p_tab, k, draft_len, N, seed=4, branching="proportional")
  tokens_BxKxL = np.asarray(out.tokens_BxKxL)
  law = ref.proportional_tree_law(p_tab, k)
  _assert_paths_law(tokens_BxKxL, law, vocab, f"proportional tree K={k} sparse={sparse}")
  shapes = {
    tuple(len({tuple(path[: t + 1]) for path in row}) for t in range(draft_len))
    for row in tokens_BxKxL[:2000]
  }
  assert len(shapes) > 1  # the branching per depth changes with the draws


def test_proportional_tree_shares_follow_the_draws_before():
  """`drafting.shares`: about m p per child, at least 1, until m is spent; what the
  support leaves goes to child 0."""
  p = jnp.asarray([0.6, 0.3, 0.1, 0.0])
  valid = jnp.asarray([True, True, True, False])
  np.testing.assert_array_equal(drafting.shares(8, p, valid), [5, 2, 1, 0])  # 4.8, 2.4, 0.8
  np.testing.assert_array_equal(drafting.shares(2, p, valid), [1, 1, 0, 0])
  np.testing.assert_array_equal(drafting.shares(8, p[:2], valid[:2]), [6, 2])  # 5 + 1 left
  np.testing.assert_array_equal(
    drafting.shares(4, jnp.asarray([0.05, 0.9]), jnp.asarray([True, True])), [1, 3]
  )


# The fast tier checks these trees' exactness by enumeration (below) and the JAX walk on
# static trees; CI also runs the JAX walk on proportional trees.
@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_rrs_verifies_a_proportional_tree(broken, monkeypatch):
  """RRS on "proportional" trees (K = 4, L = 2): the sequence law is the target's.
  Broken: a child whose share rounds to 0 paths is dropped, so whether a drawn token
  becomes a child depends on the token itself (at a root law (0.9, 0.05, 0.05) the rare
  tokens hardly ever do): caught."""
  p_tab, q_tab = _tree(12, 3, 2)
  p_tab[0, 0] = [0.9, 0.05, 0.05]
  q_tab[0, 0] = [0.4, 0.3, 0.3]
  if broken:

    def dropping(size, drawn_p_J, valid_J):
      want_J = jnp.where(valid_J, jnp.round(size * drawn_p_J), 0).astype(jnp.int32)
      got_J = jnp.clip(size - (jnp.cumsum(want_J) - want_J), 0, want_J)
      return got_J.at[0].add(size - jnp.sum(got_J))

    monkeypatch.setattr(drafting, "shares", dropping)
  codes, nums = sequences.sample_wor_blocks(p_tab, q_tab, 4, 2, branching="proportional")
  law = _sequence_law(q_tab, 2)
  counts = np.bincount(codes, minlength=law.size)
  if broken:
    stats.assert_rejects(counts, law, "rrs on trees dropping children", min_power=0.99)
  else:
    stats.assert_law(counts, law, "rrs on a proportional tree")
    assert nums.min() >= 1 and nums.max() <= 3


@pytest.mark.parametrize(
  "scheme, sparse",
  [((2, 2), False), ((2, 2), True), ((1, 3), True), (3, False), (4, True), (4, False)],
)
def test_tree_schemes_give_the_target_law_by_enumeration(scheme, sparse):
  """Issue 27, item 4: over every tree a scheme can draw (static branchings, and the
  proportional tree of K paths), RRS walking it node by node gives one round's L + 1
  tokens exactly the target's law (to 1e-12; random context-dependent trees, V = 3,
  L = 2). The proportional tree with the dropping rule does not (the law moves by more
  than 1e-3) wherever the rule drops a child, nor does SpecInfer's verification rule on
  the static trees."""
  p_tab, q_tab = _tree(13, 3, 2, sparse=sparse)
  if isinstance(scheme, tuple):
    laws = {"static": ref.static_tree_law(p_tab, scheme)}
  else:
    laws = {
      "proportional": ref.proportional_tree_law(p_tab, scheme),
      "dropping": ref.proportional_tree_law(p_tab, scheme, drop=True),
    }
  target = _sequence_law(q_tab, 2)
  for name, trees in laws.items():
    assert sum(trees.values()) == pytest.approx(1.0, abs=1e-12)
    out = sum(prob * ref.tree_walk_law(paths, p_tab, q_tab) for paths, prob in trees.items())
    if name == "dropping" and trees == laws["proportional"]:
      assert sparse  # no share rounds to 0 on the sparse tree: the rule changes nothing
    elif name == "dropping":
      assert np.abs(out - target).max() > 1e-3, "the dropping rule kept the target's law"
    else:
      np.testing.assert_allclose(out, target, rtol=0, atol=1e-12, err_msg=f"{name} {scheme}")
  if scheme == (2, 2) and not sparse:  # SpecInfer's rule (p never renormalised): not exact
    paths, probs = zip(*laws["static"].items(), strict=True)
    walks = [ref.tree_walk_law(t, p_tab, q_tab, reference.specinfer_law) for t in paths]
    assert np.abs(np.tensordot(probs, walks, 1) - target).max() > 1e-3


def test_multiset_law_reduces_to_iid_paths_at_one_draft():
  from spectr_jax import block_bound

  p_tab, _ = _tree(1, 3, 2)
  law = ref.multiset_law(p_tab, 1, 2)
  probs = block_bound.path_probs(p_tab, 2)
  for (code,), prob in law.items():
    assert prob == pytest.approx(probs[code], abs=1e-15)
  law = ref.multiset_law(p_tab, 2, 2)
  assert all(len({c // 3 for c in m}) == 2 for m in law)  # distinct first tokens
  assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("sparse, k, draft_len", [(False, 2, 2), (True, 3, 2), (False, 4, 1)])
def test_block_bound_wor_law_is_the_reference_multiset_law(sparse, k, draft_len):
  """`block_bound.MULTISETS["wor"]` (the block-level bound's input) against the reference
  enumeration, with K beyond the root's support in the sparse case."""
  from spectr_jax import block_bound

  p_tab, _ = _tree(7, 3, draft_len, sparse=sparse)
  law = block_bound.MULTISETS["wor"](p_tab, k, draft_len)
  expected = ref.multiset_law(p_tab, k, draft_len)
  assert law.keys() == expected.keys()
  np.testing.assert_allclose([law[m] for m in expected], list(expected.values()), atol=1e-14)


@pytest.mark.parametrize("vocab, k", [(2, 2), (3, 4)])
def test_every_ordered_draw_is_enumerated(vocab, k):
  p = np.linspace(1.0, 2.0, vocab)
  p /= p.sum()
  draws = ref.ordered_draws(p, k)
  assert len(draws) == len(list(itertools.permutations(range(vocab), min(k, vocab))))
  assert sum(w for _, w in draws) == pytest.approx(1.0, abs=1e-12)
