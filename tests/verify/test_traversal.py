"""Traversal Verification ("traversal", `traversal.verify_tree`; Weng et al., arXiv
2505.12398): the tree of drafts without replacement verified leaf to root.

- Exact by enumeration (float64, `wor_reference.traversal_law`): over every tree each
  "wor" drafting scheme can draw (static branchings, the default (K, 1), chains, the
  proportional tree), the round's L + 1 tokens follow the target's law to 1e-12 on
  random, sparse, one-hot and tied trees (V = 3, L = 2 and V = 2, L = 3). Two broken
  variants (the bonus from the node's original q; the draft law never renormalised)
  move the law by more than 1e-3.
- On a chain it is block verification: P(tau >= i | path) = w_i, so its mean tokens are
  1 + sum_i w_i (and `test_block` checks that with K = 1 it emits "block"'s tokens for
  the same keys).
- The JAX function against the enumerated law of fixed trees (chi-square), with copies
  and uneven shapes; a broken variant (residuals not taken) is rejected.
- Drafted and verified end to end (`drafting.without_replacement` on a fake draft model,
  then `verify.walk`): the target's law by chi-square and the enumerated mean tokens.
- Float32 at V = 32k: no token of target probability 0 is ever emitted; on the scheme's
  own trees (K = 4, L = 2) the first two tokens follow q x q (chi-square over equal-mass
  bins), the broken variant rejected.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, drafting, sampling, traversal
from spectr_jax.testing import sequences
from spectr_jax.testing import wor_reference as ref
from tests import stats

N = 100_000


def _trees(p_tab, scheme):
  if isinstance(scheme, tuple):
    return ref.static_tree_law(p_tab, scheme)
  return ref.proportional_tree_law(p_tab, scheme)


def _mixed(trees, p_tab, q_tab, broken=""):
  """(law, mean tokens) of Traversal Verification over the law of trees."""
  out = [(prob, *ref.traversal_law(paths, p_tab, q_tab, broken)) for paths, prob in trees.items()]
  return sum(w * law for w, law, _ in out), sum(w * mean for w, _, mean in out)


_SHAPES = {
  (3, 2): [(2, 2), (1, 3), (3, 1), (1, 1), 3, 4],
  (2, 3): [(2, 1, 2), (1, 2, 2), (2, 1, 1), (1, 1, 1), 4],
}


@pytest.mark.parametrize("vocab, draft_len", sorted(_SHAPES))
@pytest.mark.parametrize("kind", sequences.TREE_KINDS)
def test_traversal_gives_the_target_law_by_enumeration(vocab, draft_len, kind):
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(11), vocab, draft_len, kind)
  target = sequences.target_law(q_tab, draft_len)
  moved = {"bonus": [], "draft": []}
  for scheme in _SHAPES[vocab, draft_len]:
    trees = _trees(p_tab, scheme)
    assert sum(trees.values()) == pytest.approx(1.0, abs=1e-12)
    law, _ = _mixed(trees, p_tab, q_tab)
    np.testing.assert_allclose(law, target, rtol=0, atol=1e-12, err_msg=str(scheme))
    if kind == "random":
      for broken, out in moved.items():
        out.append(np.abs(_mixed(trees, p_tab, q_tab, broken)[0] - target).max())
  if kind == "random":  # the bonus everywhere; the draft law where a node has 2 children
    assert min(moved["bonus"]) > 1e-3, moved  # and a token is left undrafted
    assert max(moved["draft"]) > 1e-3, moved


@pytest.mark.parametrize("draft_len", [2, 3])
def test_traversal_on_a_chain_is_block_verification(draft_len):
  """One path: P(tau >= i | x_1..x_i) = w_i = min(1, w_{i-1} q(x_i) / p(x_i)), block
  verification's law, so the mean tokens are 1 + sum_i E[w_i]."""
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(4), 3, draft_len)
  mean, expected = 0.0, 0.0
  for (code,), prob in ref.static_tree_law(p_tab, (1,) * draft_len).items():
    tokens = [code // 3 ** (draft_len - 1 - t) % 3 for t in range(draft_len)]
    w, tokens_mean, prefix = 1.0, 1.0, 0
    for t, x in enumerate(tokens):
      w = min(1.0, w * q_tab[t, prefix, x] / p_tab[t, prefix, x])
      tokens_mean += w
      prefix = prefix * 3 + x
    expected += prob * tokens_mean
    mean += prob * ref.traversal_law((code,), p_tab, q_tab)[1]
  assert mean == pytest.approx(expected, abs=1e-12)


def _path_tables(paths, p_tab, q_tab, draft_len):
  """(drafts_KxL, p_KxLxV, q_KxL1xV) float32 of fixed paths (base-V codes) on a table."""
  vocab = p_tab.shape[-1]
  tokens = [[c // vocab ** (draft_len - 1 - t) % vocab for t in range(draft_len)] for c in paths]
  ps, qs = [], []
  for path in tokens:
    prefixes = [
      sum(x * vocab ** (t - 1 - i) for i, x in enumerate(path[:t])) for t in range(draft_len + 1)
    ]
    ps.append([p_tab[t, prefixes[t]] for t in range(draft_len)])
    qs.append([q_tab[t, prefixes[t]] for t in range(draft_len + 1)])
  return (
    jnp.asarray(tokens, jnp.int32),
    jnp.asarray(np.array(ps), jnp.float32),
    jnp.asarray(np.array(qs), jnp.float32),
  )


def _sample_tree(paths, p_tab, q_tab, draft_len, n=N, seed=0):
  """n verdicts of `verify_tree` on one tree, each completed with target draws: codes."""
  vocab = p_tab.shape[-1]
  drafts, p, q = _path_tables(paths, p_tab, q_tab, draft_len)
  q_j = jnp.asarray(q_tab, jnp.float32)

  def one(key):
    verify_key, extend_key = jax.random.split(key)
    verdict = traversal.verify_tree(verify_key, drafts, p, q)
    code = jnp.int32(0)
    for t in range(draft_len + 1):
      draw = jax.random.categorical(jax.random.fold_in(extend_key, t), jnp.log(q_j[t, code]))
      code = code * vocab + jnp.where(t < verdict.num_tokens, verdict.tokens_L1[t], draw)
    return code, verdict.num_tokens

  codes, nums = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(seed), n))
  return np.bincount(np.asarray(codes), minlength=vocab ** (draft_len + 1)), np.asarray(nums)


# Trees of the random V = 3, L = 2 table: the (2, 2) tree with the lowest acceptance of
# its first leaf; three paths and a copy of path 0; the proportional shape (3 + 1 paths).
_FIXED = [(0, 4, 6, 8), (1, 2, 6, 1), (2, 0, 1, 6)]


@pytest.mark.parametrize("paths", _FIXED, ids=str)
def test_verify_tree_follows_the_enumerated_law_of_its_tree(paths):
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(11), 3, 2)
  counts, nums = _sample_tree(paths, p_tab, q_tab, 2)
  law, mean = ref.traversal_law(paths, p_tab, q_tab)
  stats.assert_law(counts, law, f"traversal on the tree {paths}")
  stats.assert_mean(nums, mean, f"traversal tokens on the tree {paths}")


def test_verify_tree_without_its_residuals_is_rejected(monkeypatch):
  """Broken: a rejection leaves the node's target law as it was (no residual)."""
  monkeypatch.setattr(acceptance, "residual", lambda target_V, mass_V: target_V / jnp.sum(target_V))
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(11), 3, 2)
  counts, _ = _sample_tree(_FIXED[0], p_tab, q_tab, 2, seed=1)
  law, _ = ref.traversal_law(_FIXED[0], p_tab, q_tab)
  stats.assert_rejects(counts, law, "traversal without residuals", min_power=0.99)


# The default branching (K distinct first tokens) in the fast tier; CI adds static and
# proportional trees.
@pytest.mark.parametrize(
  "num_drafts, branching",
  [
    (3, None),
    pytest.param(4, (2, 2), marks=pytest.mark.slow),
    pytest.param(4, "proportional", marks=pytest.mark.slow),
  ],
)
def test_drafted_trees_verified_by_traversal_give_the_target_law(num_drafts, branching):
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(12), 3, 2, "sparse")
  codes, nums = sequences.sample_wor_blocks(
    p_tab, q_tab, num_drafts, 2, method="traversal", branching=branching
  )
  target = sequences.target_law(q_tab, 2)
  stats.assert_law(np.bincount(codes, minlength=target.size), target, f"traversal {branching}")
  scheme = branching or (num_drafts, 1)
  trees = _trees(p_tab, num_drafts if branching == "proportional" else scheme)
  stats.assert_mean(nums, _mixed(trees, p_tab, q_tab)[1], f"traversal tokens {branching}")


def test_verify_tree_at_an_llm_vocabulary_never_emits_a_zero_probability_token():
  """V = 32768, a (2, 2) tree (K = 4, L = 2) of the draft's two likeliest tokens at every
  node; peaked draft laws, correlated target laws that are 0 on a random half of the
  vocabulary and on two drafted tokens (the first subtree is always rejected, so its
  residuals are used): every emitted token, accepted or drawn from a residual, has
  target probability > 0, and rounds end at every depth."""
  vocab, n = 32768, 256
  rng = np.random.default_rng(5)

  def softmax(logits):
    return np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)))

  draft_logits = 3.0 * rng.standard_normal((3, vocab))  # root, node a, node b
  target_logits = np.concatenate([draft_logits, 3.0 * rng.standard_normal((4, vocab))])
  target_logits += 0.5 * rng.standard_normal(target_logits.shape)
  target_logits[rng.random(target_logits.shape) < 0.5] = -np.inf
  p_root, p_a, p_b = softmax(draft_logits)
  a, b = np.argsort(-p_root)[:2]
  children = [np.argsort(-p_a)[:2], np.argsort(-p_b)[:2]]
  target_logits[0, a], target_logits[0, b] = -np.inf, draft_logits[0, b] - 0.2
  target_logits[2, children[1][0]] = -np.inf
  target_logits[2, children[1][1]] = draft_logits[2, children[1][1]]
  q_root, q_a, q_b, *q_leaf = softmax(target_logits)
  drafts = np.array(
    [[first, x] for first, kids in zip((a, b), children, strict=True) for x in kids]
  )
  node_p, node_q = [p_a, p_a, p_b, p_b], [q_a, q_a, q_b, q_b]
  p = jnp.asarray(np.stack([np.stack([p_root, node_p[k]]) for k in range(4)]))
  q = jnp.asarray(np.stack([np.stack([q_root, node_q[k], q_leaf[k]]) for k in range(4)]))
  run = jax.jit(jax.vmap(traversal.verify_tree, (0, None, None, None)))
  verdict = run(jax.random.split(jax.random.key(0), n), jnp.asarray(drafts, jnp.int32), p, q)
  tokens, nums = np.asarray(verdict.tokens_L1), np.asarray(verdict.num_tokens)
  q_np = np.asarray(q)
  for row in range(n):
    for t in range(nums[row]):  # the node of position t: the path with that prefix
      path = int(np.argmax(np.all(drafts[:, :t] == tokens[row, :t], axis=1)))
      assert q_np[path, t, tokens[row, t]] > 0, (row, t)
  assert set(nums) == {1, 2, 3}, np.bincount(nums)


def _sample_context_free(p, q, num_drafts, n, seed):
  """Traversal Verification of the "wor" scheme's default tree (K distinct first tokens
  drawn without replacement, each path continuing with one draft token) under one
  context-free pair (the same p and q after every prefix), L = 2: the first two emitted
  tokens, the second completed from q where the round emitted one."""
  p_j, q_j = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  p_KxLxV = jnp.broadcast_to(p_j, (num_drafts, 2, p.size))
  q_KxL1xV = jnp.broadcast_to(q_j, (num_drafts, 3, p.size))

  def one(key):
    first_key, next_key, verify_key, complete_key = jax.random.split(key, 4)
    first_K, _ = drafting.distinct_tokens(jax.random.split(first_key, num_drafts), p_j)
    keys = jax.random.split(next_key, num_drafts)
    next_K = jax.vmap(lambda k: sampling.categorical(k, p_j))(keys)
    verdict = traversal.verify_tree(verify_key, jnp.stack([first_K, next_K], 1), p_KxLxV, q_KxL1xV)
    second = jnp.where(
      verdict.num_tokens > 1, verdict.tokens_L1[1], sampling.categorical(complete_key, q_j)
    )
    return verdict.tokens_L1[0], second

  keys = jax.random.split(jax.random.key(seed), n)
  first, second = jax.jit(lambda k: jax.lax.map(one, k, batch_size=512))(keys)
  return np.asarray(first), np.asarray(second)


@pytest.mark.slow
@pytest.mark.execution_bound  # mostly running the program: the optimised build
@pytest.mark.parametrize("broken", [False, True])
def test_traversal_at_an_llm_vocabulary_gives_the_target_law(broken, monkeypatch):
  """V = 32768, K = 4, L = 2, LLM-like correlated laws, the scheme's own trees (float32 at
  the size users run): the first two tokens of a round follow q x q (8 x 8 bins of equal
  q-mass, 8192 rounds, in batches of 512). Broken: residuals not taken (the bonus from
  the node's law as it was): rejected."""
  if broken:
    monkeypatch.setattr(acceptance, "residual", lambda t, m: t / jnp.sum(t))
  p, q = sequences.llm_like(21, 32768)
  first, second = _sample_context_free(p, q, 4, 8192, seed=2)
  bins, bin_probs = stats.equal_mass_bins(q, 8)
  counts = np.bincount(bins[first] * 8 + bins[second], minlength=64)
  law = np.outer(bin_probs, bin_probs).ravel()
  if broken:
    stats.assert_rejects(counts, law, "traversal V=32k without residuals", min_power=0.99)
  else:
    stats.assert_law(counts, law, "traversal V=32k")
