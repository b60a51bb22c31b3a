"""The batch's tree budget (`DecodeSpec.node_budget`, `adaptive.budget_nodes`): the rows
share the round's drafted nodes greedily; the kept nodes are closed under parents and
earlier first tokens, and whether a node is kept never depends on its own token or its
subtree, so the verifiers of drafts without replacement keep the target's law through
the engine, and a rule that looks at a node's own token to keep it is rejected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import DecodeSpec, adaptive, engine, methods, tree, verify
from tests import engine_pair, stats
from tests.engine_pair import codes, exact_law, generate


def _lengths(drafts, p, budget, live=None):
  drafts, p = jnp.asarray(drafts, jnp.int32), jnp.asarray(p, jnp.float32)
  live = jnp.ones(drafts.shape[0], bool) if live is None else jnp.asarray(live)
  return np.asarray(adaptive.budget_nodes(drafts, p, jnp.float32(budget), live))


def _toy():
  """One row, K = 3, L = 2, V = 5: first tokens 0, 1, 2 (p 0.5, 0.3, 0.1), then tokens of
  p 0.9, 0.8, 0.6. Reach: first tokens 1, 0.5, 0.2; second tokens 0.5, 0.3, 0.1."""
  drafts = [[[0, 1], [1, 3], [2, 0]]]
  p = np.zeros((1, 3, 2, 5), np.float32)
  p[0, :, 0] = [0.5, 0.3, 0.1, 0.05, 0.05]
  p[0, 0, 1] = [0.0, 0.9, 0.1, 0.0, 0.0]
  p[0, 1, 1] = [0.0, 0.0, 0.2, 0.8, 0.0]
  p[0, 2, 1] = [0.6, 0.4, 0.0, 0.0, 0.0]
  return drafts, p


def test_the_budget_goes_to_the_nodes_the_walk_is_likeliest_to_reach():
  drafts, p = _toy()
  # One node per step, in order of reach; ties (0.5) go to the shallower node.
  expected = [[1, 0, 0], [1, 1, 0], [2, 1, 0], [2, 2, 0], [2, 2, 1], [2, 2, 2]]
  for budget, lengths in enumerate(expected, 1):
    np.testing.assert_array_equal(_lengths(drafts, p, budget), [lengths], err_msg=str(budget))
  # A fraction of a node per row is not spent.
  np.testing.assert_array_equal(_lengths(drafts, p, 2.9), [[1, 1, 0]])


def _random_tree(rng, rows, k, length, vocab=6):
  """Rows of the default tree: distinct first tokens, p a random law at every node."""
  p = rng.dirichlet(np.ones(vocab) * 0.5, size=(rows, k, length)).astype(np.float32)
  drafts = np.zeros((rows, k, length), np.int32)
  for b in range(rows):
    drafts[b, :, 0] = rng.choice(vocab, k, replace=False)
    drafts[b, :, 1:] = rng.integers(0, vocab, (k, length - 1))
    p[b, :, 0] = p[b, 0, 0]  # the root's law, shared by its children
  p = np.maximum(p, 1e-3)  # every drawn token has draft mass
  return drafts, p / p.sum(-1, keepdims=True)


def test_kept_nodes_are_closed_and_spend_the_budget():
  rng = np.random.default_rng(0)
  for budget in (1.0, 2.5, 4.0, 7.3, 12.0):
    drafts, p = _random_tree(rng, 8, 4, 3)
    live = np.arange(8) % 4 != 3  # two finished rows
    lengths = _lengths(drafts, p, budget, live)
    # Earlier first tokens before later ones; every live row keeps its first node.
    kept_first = lengths > 0
    np.testing.assert_array_equal(kept_first, np.cumprod(kept_first, axis=1) > 0)
    assert np.all(lengths[live, 0] >= 1)
    assert np.all(lengths[~live] == [1, 0, 0, 0])
    given = np.floor(np.float32(live.sum()) * np.float32(budget))
    assert lengths[live].sum() == min(given, 12 * live.sum())


def test_a_repeated_first_token_is_never_kept():
  drafts, p = _toy()
  drafts[0][2] = [0, 1]  # a copy of path 0 (past the draft's support)
  np.testing.assert_array_equal(_lengths(drafts, p, 6.0), [[2, 2, 0]])


def _own_token_changes(rule, trials=60) -> int:
  """How often changing the draft probability of one node's token and of everything
  below it (its own draw and its subtree) changes whether `rule` keeps that node, over
  random trees, budgets and nodes."""
  rng = np.random.default_rng(1)
  k, length = 4, 3
  changes = 0
  for _ in range(trials):
    drafts, p = _random_tree(rng, 3, k, length)
    budget = jnp.float32(rng.uniform(1, k * length))
    path, depth, row = rng.integers(k), rng.integers(length), rng.integers(3)
    changed = p.copy()
    for t in range(depth, length):
      changed[row, path, t, drafts[row, path, t]] = rng.uniform(0.01, 0.99)
    changed /= changed.sum(-1, keepdims=True)
    live = jnp.ones(3, bool)
    kept = [
      int(rule(jnp.asarray(drafts), jnp.asarray(x), budget, live)[row, path]) > depth
      for x in (p, changed)
    ]
    changes += kept[0] != kept[1]
  return changes


def test_whether_a_node_is_kept_never_depends_on_its_own_token_or_below():
  """The stopping-time property, checked directly; the broken rule fails it."""
  assert _own_token_changes(adaptive.budget_nodes) == 0
  assert _own_token_changes(own_token) >= 5


def own_token(drafts_BxKxL, p_BxKxLxV, node_budget, live_B):
  """Broken: a node is kept iff its own draft probability is at least 0.3 (and its
  parent and the earlier first tokens are)."""
  del node_budget, live_B
  drawn = jnp.take_along_axis(p_BxKxLxV, drafts_BxKxL[..., None], -1)[..., 0]
  keep = (drawn >= 0.3).at[:, 0, 0].set(True)
  along = jnp.cumprod(keep.astype(jnp.int32), axis=2)
  firsts = jnp.cumprod(keep[:, :, 0].astype(jnp.int32), axis=1)
  return jnp.sum(along * firsts[..., None], axis=2).astype(jnp.int32)


def test_the_broken_rule_does_depend_on_its_own_token():
  drafts, p = _toy()
  assert _lengths(drafts, p, 6.0)[0, 2] == 2
  kept = np.asarray(own_token(jnp.asarray(drafts), jnp.asarray(p), 6.0, None))
  np.testing.assert_array_equal(kept, [[2, 2, 0]])  # path 2 dropped for its own p = 0.1


def test_a_tree_holds_only_each_paths_kept_tokens():
  drafts = jnp.asarray([[[0, 1], [1, 3], [2, 0]]])
  t = tree.from_paths(jnp.asarray([7]), drafts, jnp.asarray([[2, 1, 0]]))
  assert int(t.num_nodes_B[0]) == 4  # the root, 0, 0.1 and 1
  np.testing.assert_array_equal(np.asarray(t.tokens_BxN[0, :4]), [7, 0, 1, 1])
  np.testing.assert_array_equal(np.asarray(t.parent_BxN[0, :4]), [-1, 0, 0, 1])
  # Path 1's slot below its kept token and path 2's hold the root (never read).
  np.testing.assert_array_equal(
    np.asarray(t.path_node_BxKxL1[0]), [[0, 1, 3], [0, 2, 0], [0, 0, 0]]
  )
  full = tree.from_paths(jnp.asarray([7]), drafts)
  assert int(full.num_nodes_B[0]) == 7


def test_a_walk_past_every_kept_token_draws_the_bonus_from_q():
  """Path 0 holds one token, path 1 none: after path 0's token the walk has no valid
  draft, so the bonus comes from q there, whatever the drafts below."""
  drafts = jnp.asarray([[1, 2], [0, 3]])
  p = jnp.full((2, 2, 4), 0.25)
  q = jnp.zeros((2, 3, 4)).at[:, 0, 1].set(1.0).at[:, 1, 3].set(1.0).at[:, 2, 0].set(1.0)
  for method in ("rrs", "traversal"):
    tokens, num, _ = verify.walk(
      jax.random.key(0), drafts, p, q, 1.0, methods.get(method), "star", length=jnp.asarray([1, 0])
    )
    assert int(num) == 2, method
    np.testing.assert_array_equal(np.asarray(tokens)[:2], [1, 3], err_msg=method)


@pytest.mark.parametrize(
  "kw, match",
  [
    (dict(method="rrs", num_drafts=3, draft_len=2, dedup=True, node_budget=7), r"\[1, K L = 6\]"),
    (dict(method="rrs", num_drafts=3, dedup=True, node_budget=0.5), r"\[1, K L = 12\]"),
    (dict(method="kseq", num_drafts=3, dedup=True, node_budget=2), "tree drafting scheme"),
    (dict(method="rrs", num_drafts=3, node_budget=2), "needs dedup"),
    (
      dict(method="rrs", num_drafts=4, draft_len=2, branching="2x2", dedup=True, node_budget=2),
      "branching",
    ),
    (dict(method="rrs", num_drafts=3, dedup=True, node_budget=2, adaptive=0.5), "adaptive"),
  ],
)
def test_a_spec_that_cannot_share_nodes_is_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    DecodeSpec(**kw)


def test_a_block_verifier_without_lengths_refuses_one():
  drafts = jnp.zeros((2, 2), jnp.int32)
  p, q = jnp.full((2, 2, 4), 0.25), jnp.full((2, 3, 4), 0.25)
  with pytest.raises(ValueError, match="takes no length"):
    gbv = methods.get("gbv")
    verify.walk(jax.random.key(0), drafts, p, q, 1.0, gbv, "star", length=jnp.asarray([1, 1]))


@pytest.fixture(scope="module")
def pair():
  return engine_pair.models()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rrs", "traversal"])
def test_a_shared_budget_keeps_the_output_law(pair, method):
  """K = 3, L = 2, dedup rounds, three of the six nodes per row on average: the target's
  law; the target scores the nodes given, shared unevenly across rows and depths."""
  draft, target = pair
  out = generate(draft, target, method, 3, 2, 4, key=4, dedup=True, node_budget=3.0)
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_law(counts, law, f"{method} node_budget 3")
  s = out.stats
  rounds_ = np.asarray(s.rounds_B).sum()
  assert np.asarray(s.nodes_B).sum() / rounds_ == pytest.approx(1 + 3, abs=0.05)
  per_row = np.asarray(s.nodes_B) / np.asarray(s.rounds_B)
  assert per_row.min() < 3.9 and per_row.max() > 4.1  # shared unevenly, as reach says
  lengths = np.asarray(s.lengths_BxL1).sum(0)
  assert lengths[1] > 0 and lengths[2] > 0  # some rounds verify one token deep, some two


@pytest.mark.slow
def test_a_budget_that_reads_the_nodes_own_token_is_rejected(pair, monkeypatch):
  draft, target = pair
  engine.compiled_program.cache_clear()
  monkeypatch.setattr(adaptive, "budget_nodes", own_token)
  try:
    out = generate(draft, target, "rrs", 3, 2, 4, dedup=True, node_budget=3.0)
  finally:
    engine.compiled_program.cache_clear()
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_rejects(counts, law, "rrs own-token budget", min_power=0.99)
