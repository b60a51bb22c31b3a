"""Thomas & Pal's greedy multi-path block verification ("gbv_tp", `block.verify_tp_paths`).

- The node order (`block.ratio_rank`) is its definition: q/p descending, ties by token
  id (the lower id higher), tokens with p = 0 lowest.
- The selection is the lexicographic maximum of the K paths, and the library's float32
  skewed law (with its x, a recursion) is the exact conditional law of that maximum,
  computed by enumerating every K-tuple (`block_bound.selected_path_law`).
- Exactness by enumeration (`block_bound.block_law`, float64: the library's closed form
  run with 64-bit floats): the output law is the target's to 1e-12 on random, sparse,
  one-hot and tied trees, V = 2-4, K = 1-4, L = 1-3; a broken variant whose CDF breaks
  ties the other way than the choice is not.
- Float32 at V = 32k: the skewed law is >= 0, sums to 1, matches float64.
- Sampled blocks through `methods.verify_drafts` (chi-square), the broken variant rejected.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import block, block_bound, methods
from spectr_jax.testing import sequences
from tests import stats

N = 100_000


def _tree(seed, vocab, draft_len, kind="random"):
  return sequences.random_tree(np.random.default_rng(seed), vocab, draft_len, kind)


def _definition_rank(p, q):
  """The node order by its definition (q/p descending, lower id first; p = 0 last), the
  ratio computed in the dtype of p and q (float32 rounding decides near ties)."""
  ratio = [q[t] / p[t] if p[t] > 0 else -1.0 for t in range(len(p))]
  ascending = sorted(range(len(p)), key=lambda t: (ratio[t], -t))
  return np.argsort(ascending)


def _reversed_ties(monkeypatch):
  """The broken variant: the CDF breaks ties the other way than the choice (as the
  reference code's first-child choice beside a token-id CDF)."""
  ratio_rank = block.ratio_rank

  def broken(p_V, q_V):
    rank_V, _ = ratio_rank(p_V, q_V)
    _, below_V = ratio_rank(p_V[::-1], q_V[::-1])  # ties: the higher id ranks higher
    return rank_V, below_V[::-1]

  monkeypatch.setattr(block, "ratio_rank", broken)


def test_ratio_rank_is_the_definition():
  rng = np.random.default_rng(0)
  for trial in range(20):
    vocab = int(rng.integers(2, 9))
    p = rng.dirichlet(np.ones(vocab)) * (rng.random(vocab) < 0.8)
    p = p / p.sum() if p.sum() > 0 else np.eye(vocab)[0]
    q = rng.dirichlet(np.ones(vocab)) * (rng.random(vocab) < 0.7)
    if trial % 2:  # ties: q = p, q = 2 p, q = 0 on several tokens
      q = np.where(rng.random(vocab) < 0.5, p, np.where(rng.random(vocab) < 0.5, 2 * p, 0.0))
    q = q / q.sum() if q.sum() > 0 else np.eye(vocab)[-1]
    p32, q32 = np.float32(p), np.float32(q)
    rank, below = (np.asarray(a) for a in jax.jit(block.ratio_rank)(p32, q32))
    expected = _definition_rank(p32, q32)
    np.testing.assert_array_equal(rank, expected, err_msg=f"{p32} {q32}")
    np.testing.assert_allclose(below, [p32[rank < rank[t]].sum() for t in range(vocab)], atol=1e-7)


def test_p_equals_q_matches_spec_and_is_not_monotone_in_k():
  """SPEC 5: p = q (uniform, V = 2), L = 1: 2.00, 1.75, 1.625 tokens per round for
  K = 1, 2, 3: the skewed law moves away from q as K grows. The bound stays at 2."""
  p_tab, q_tab = sequences.constant_tree([0.5, 0.5], [0.5, 0.5], 1)
  values = [block_bound.block_value(p_tab, q_tab, k, 1, method="gbv_tp") for k in (1, 2, 3)]
  np.testing.assert_allclose(values, [2.0, 1.75, 1.625], atol=1e-12)
  assert block_bound.block_bound(p_tab, q_tab, 3, 1) == pytest.approx(2.0, abs=1e-9)


def test_one_draft_is_block():
  for seed, (vocab, draft_len) in enumerate([(3, 2), (2, 3), (4, 1)]):
    p_tab, q_tab = _tree(seed, vocab, draft_len)
    tp = block_bound.block_value(p_tab, q_tab, 1, draft_len, method="gbv_tp")
    bv = block_bound.block_value(p_tab, q_tab, 1, draft_len, method="block")
    assert tp == pytest.approx(bv, abs=1e-6)  # "block" from float32 weights


LAW_CASES = [
  # (kind, V, K, L): V = 2-4, K = 1-4, L = 1-3 with V^(L K) <= 4096.
  ("random", 3, 1, 2),
  ("random", 2, 4, 3),
  ("random", 3, 3, 2),
  ("random", 4, 2, 2),
  ("sparse", 3, 3, 2),
  ("sparse", 4, 4, 1),
  ("one-hot", 3, 2, 2),
  ("one-hot", 2, 3, 3),
  ("ties", 2, 4, 2),
  ("ties", 3, 3, 2),
  ("ties", 4, 2, 2),
  ("ties", 2, 2, 3),
]


@pytest.mark.parametrize("kind, vocab, num_drafts, draft_len", LAW_CASES)
def test_exact_output_law_by_enumeration(kind, vocab, num_drafts, draft_len):
  """Over every K-tuple: the selected path's law (the lexicographic maximum) with the
  closed-form skewed law, block-verified: the output is the target's law to 1e-12."""
  p_tab, q_tab = _tree(vocab * 10 + num_drafts, vocab, draft_len, kind)
  law, num_law = block_bound.block_law(p_tab, q_tab, num_drafts, draft_len, method="gbv_tp")
  np.testing.assert_allclose(law, sequences.target_law(q_tab, draft_len), rtol=0, atol=1e-12)
  value = block_bound.block_value(p_tab, q_tab, num_drafts, draft_len, method="gbv_tp")
  assert num_law @ np.arange(draft_len + 2) == pytest.approx(value, abs=1e-12)
  assert 1.0 <= value <= block_bound.block_bound(p_tab, q_tab, num_drafts, draft_len) + 1e-9


@pytest.mark.parametrize("vocab, num_drafts, draft_len", [(2, 2, 2), (3, 3, 1), (2, 3, 2)])
def test_inconsistent_tie_orders_are_rejected_by_enumeration(
  monkeypatch, vocab, num_drafts, draft_len
):
  p_tab, q_tab = _tree(vocab * 10 + num_drafts, vocab, draft_len, "ties")
  law, _ = block_bound.block_law(p_tab, q_tab, num_drafts, draft_len, method="gbv_tp")
  target = sequences.target_law(q_tab, draft_len)
  np.testing.assert_allclose(law, target, rtol=0, atol=1e-12)
  _reversed_ties(monkeypatch)
  broken, _ = block_bound.block_law(p_tab, q_tab, num_drafts, draft_len, method="gbv_tp")
  assert np.abs(broken - target).max() > 1e-3


def _exact_conditionals(path_law, vocab, draft_len):
  """{prefix: P(Z_{t+1} = . | Z^t = prefix)} from the selected path's exact law."""
  through = {}
  for path, prob in path_law.items():
    for t in range(draft_len + 1):
      through[path[:t]] = through.get(path[:t], 0.0) + prob
  return {
    u: np.array([through.get(u + (y,), 0.0) for y in range(vocab)]) / mass
    for u, mass in through.items()
    if len(u) < draft_len
  }


@pytest.mark.parametrize(
  "kind, vocab, num_drafts, draft_len",
  [("random", 3, 3, 2), ("ties", 2, 4, 2), ("sparse", 4, 2, 2), ("ties", 3, 2, 2)],
)
def test_float32_selection_and_skewed_law_are_the_law_of_the_maximum(
  kind, vocab, num_drafts, draft_len
):
  """The library's plan (float32, its own x, a recursion) on every K-tuple of paths: the
  selected path is the lexicographic maximum, the draft rows the exact conditional law."""
  p_tab, q_tab = _tree(vocab * 10 + num_drafts + 1, vocab, draft_len, kind)
  path_law = block_bound.selected_path_law(p_tab, q_tab, num_drafts, draft_len)
  conditionals = _exact_conditionals(path_law, vocab, draft_len)
  paths = list(itertools.product(range(vocab), repeat=draft_len))
  probs = block_bound.path_probs(p_tab, draft_len)
  tuples = [
    idx for idx in itertools.product(range(len(paths)), repeat=num_drafts) if probs[list(idx)].all()
  ]
  drafts = np.array([[paths[i] for i in idx] for idx in tuples], np.int32)  # N x K x L
  codes = drafts @ (vocab ** np.arange(draft_len))[::-1]  # N x K prefix codes at depth L
  p_j, q_j = jnp.float32(p_tab), jnp.float32(q_tab)
  prefix = [codes // vocab ** (draft_len - t) for t in range(draft_len + 1)]
  p_BxKxLxV = jnp.stack([p_j[t, prefix[t]] for t in range(draft_len)], axis=2)
  q_BxKxL1xV = jnp.stack([q_j[t, prefix[t]] for t in range(draft_len + 1)], axis=2)

  @jax.jit
  @jax.vmap
  def plans(d, p, q):
    return block._verify(jax.random.key(0), d, p, q, True)[1]

  plan = plans(jnp.asarray(drafts), p_BxKxLxV, q_BxKxL1xV)
  selected = np.asarray(plan.path_L)
  tree = block_bound._MaxTree(p_tab, q_tab, num_drafts, draft_len)
  for n, idx in enumerate(tuples):
    assert tuple(selected[n]) in path_law  # positive probability
    expected = max((paths[i] for i in idx), key=tree.key)
    np.testing.assert_array_equal(selected[n], expected)
    for t in range(draft_len):
      np.testing.assert_allclose(
        np.asarray(plan.draft_L1xV[n, t]), conditionals[tuple(selected[n, :t])], atol=2e-6
      )


@pytest.mark.numerics
@pytest.mark.parametrize("num_drafts", [2, 4, 8])
def test_float32_skewed_law_at_32k_tokens(num_drafts):
  """At V = 32768 the float32 law is >= 0, sums to 1 and is the float64 law (same order)
  to 1e-6 in total variation, at the root, mid-tree and at a prefix far rarer than
  those ranked below it; the CDF is monotone in the order."""
  vocab = 32768
  rng = np.random.default_rng(num_drafts)
  p = rng.dirichlet(np.full(vocab, 0.1))
  q = rng.dirichlet(np.full(vocab, 0.1))
  q[:4000] = p[:4000]  # ties at ratio 1
  q[4000:] *= (1 - p[:4000].sum()) / q[4000:].sum()
  p, q = np.float32(p), np.float32(q)
  rank, below = (np.asarray(a) for a in jax.jit(block.ratio_rank)(p, q))
  order = np.argsort(rank)
  assert np.all(np.diff(below[order]) >= 0)
  below64 = np.zeros(vocab)
  below64[order] = np.concatenate([[0.0], np.cumsum(np.float64(p)[order])[:-1]])
  law = jax.jit(block.skewed_law, static_argnums=4)
  for x, a in ((1.0, 0.0), (0.3, 0.7), (1e-30, 1.0)):
    s = np.asarray(law(p, below, np.float32(x), np.float32(a), num_drafts), np.float64)
    with jax.enable_x64(True):
      s64 = np.asarray(block.skewed_law(np.float64(p), below64, x, a, num_drafts))
    assert s.min() >= 0 and abs(s.sum() - 1) < 2e-6, (x, s.min(), s.sum())
    assert np.abs(s - s64).sum() < 1e-6, (x, np.abs(s - s64).sum())


def _sampled(p_tab, q_tab, num_drafts, draft_len, verify_fn, n=N):
  return sequences.sample_blocks(
    jax.random.key(11), p_tab, q_tab, num_drafts, draft_len, verify_fn, n
  )


def _through_verify_drafts(key, drafts, p, q):
  return methods.verify_drafts(key, drafts, p, q, method="gbv_tp")


@pytest.mark.parametrize(
  "kind, vocab, num_drafts, draft_len",
  [("random", 3, 3, 2), pytest.param("ties", 2, 4, 3, marks=pytest.mark.slow)],
)
def test_sampled_sequence_law_through_verify_drafts(kind, vocab, num_drafts, draft_len):
  p_tab, q_tab = _tree(3, vocab, draft_len, kind)
  codes, nums = _sampled(p_tab, q_tab, num_drafts, draft_len, _through_verify_drafts)
  law = sequences.target_law(q_tab, draft_len)
  stats.assert_law(np.bincount(codes, minlength=law.size), law, f"gbv_tp {kind}")
  expected = block_bound.block_value(p_tab, q_tab, num_drafts, draft_len, method="gbv_tp")
  stats.assert_mean(nums, expected, f"gbv_tp {kind} tokens per round")


@pytest.mark.slow
def test_sampled_inconsistent_tie_orders_are_rejected(monkeypatch):
  """The broken variant, sampled (the verifier traced afresh with the patched order)."""
  _reversed_ties(monkeypatch)
  p_tab, q_tab = sequences.constant_tree([0.5, 0.5], [0.5, 0.5], 2)

  def fresh(key, drafts, p, q):
    tokens_L1, num, _ = block.verify_tp_paths(key, drafts, p, q)
    return tokens_L1, num

  codes, _ = _sampled(p_tab, q_tab, 2, 2, fresh, n=20_000)
  law = sequences.target_law(q_tab, 2)
  stats.assert_rejects(np.bincount(codes, minlength=law.size), law, "gbv_tp, reversed CDF ties")
