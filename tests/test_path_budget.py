"""The batch's tree budget (`DecodeSpec.path_budget`, `drafting.budget_paths`): the rows
share the round's draft paths greedily; each row keeps a prefix of its candidates, decided
from the candidates before each one, so the verifiers of drafts without replacement keep
the target's law through the engine, and a rule that looks at a candidate's own token to
keep it is rejected."""

import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import DecodeSpec, drafting, engine, rounds
from tests import engine_pair, stats
from tests.engine_pair import codes, exact_law, generate


def _keep(drawn_p, budget, live=None, valid=None):
  drawn_p = jnp.asarray(drawn_p, jnp.float32)
  valid = jnp.ones(drawn_p.shape, bool) if valid is None else jnp.asarray(valid)
  live = jnp.ones(drawn_p.shape[0], bool) if live is None else jnp.asarray(live)
  return np.asarray(drafting.budget_paths(drawn_p, valid, jnp.float32(budget), live))


def test_the_budget_goes_to_the_rows_with_the_most_mass_left_uncovered():
  # Row 0's first candidate covers 0.9 of its draft mass, row 1's 0.2, row 2's 0.5.
  drawn_p = [[0.9, 0.05, 0.03], [0.2, 0.2, 0.2], [0.5, 0.3, 0.1]]
  # Two paths per row on average: 3 extra; gains 0.1, 0.05 | 0.8, 0.6 | 0.5, 0.2.
  np.testing.assert_array_equal(_keep(drawn_p, 2.0), [[1, 0, 0], [1, 1, 1], [1, 1, 0]])
  # The boundaries: one path per row keeps only the first; K keeps every candidate.
  np.testing.assert_array_equal(_keep(drawn_p, 1.0), [[1, 0, 0]] * 3)
  np.testing.assert_array_equal(_keep(drawn_p, 3.0), np.ones((3, 3)))


def test_each_row_keeps_a_prefix_and_finished_rows_keep_one_path():
  rng = np.random.default_rng(0)
  for budget in (1.0, 1.5, 2.0, 2.7, 4.0):
    p = rng.dirichlet(np.ones(6), size=8)[:, :4]  # four candidates' probabilities per row
    live = rng.random(8) < 0.75
    keep = _keep(p, budget, live=live)
    counts = keep.sum(1)
    # A prefix of each row's candidates; a finished row keeps its first path only.
    np.testing.assert_array_equal(keep, np.arange(4) < counts[:, None])
    assert np.all(counts[~live] == 1) and np.all(counts >= 1)
    given = np.floor(np.float32(live.sum()) * np.float32(budget))  # at most the budget
    assert counts[live].sum() == min(given, 4 * live.sum())


def test_ties_go_to_the_earlier_candidate_and_invalid_ones_are_never_kept():
  # Equal gains everywhere: the extra path goes to the first candidate after the first,
  # of the first row.
  np.testing.assert_array_equal(_keep(np.zeros((2, 3)), 1.5), [[1, 1, 0], [1, 0, 0]])
  valid = [[True, False, False], [True, True, True]]
  np.testing.assert_array_equal(_keep(np.zeros((2, 3)), 3.0, valid=valid), [[1, 0, 0], [1, 1, 1]])


@pytest.mark.parametrize(
  "kw, match",
  [
    (dict(method="rrs", num_drafts=3, path_budget=4), r"\[1, K = 3\]"),
    (dict(method="rrs", num_drafts=3, path_budget=0.5), r"\[1, K = 3\]"),
    (dict(method="kseq", num_drafts=3, path_budget=2), "tree drafting scheme"),
    (dict(method="rrs", num_drafts=4, draft_len=2, branching="2x2", path_budget=2), "branching"),
    (dict(method="rrs", num_drafts=3, path_budget=2, adaptive=0.5), "not combined"),
  ],
)
def test_a_spec_that_cannot_share_paths_is_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    DecodeSpec(**kw)


def test_distinct_paths_are_counted_once():
  drafts = jnp.asarray([[[1, 2], [1, 2], [1, 3]], [[0, 0], [0, 0], [0, 0]]])
  np.testing.assert_array_equal(np.asarray(rounds._distinct_paths(drafts)), [2, 1])


@pytest.fixture(scope="module")
def pair():
  return engine_pair.models()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rrs", "traversal"])
def test_a_shared_budget_keeps_the_output_law(pair, method):
  """K = 3, L = 2, dedup rounds, two paths per row on average: the target's law, and
  the target scores the paths given (fewer nodes than the three paths' trees)."""
  draft, target = pair
  out = generate(draft, target, method, 3, 2, 4, key=4, dedup=True, path_budget=2.0)
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_law(counts, law, f"{method} path_budget 2")
  s = out.stats
  rounds_ = np.asarray(s.rounds_B).sum()
  assert np.asarray(s.paths_B).sum() / rounds_ == pytest.approx(2.0, abs=0.05)
  assert np.asarray(s.nodes_B).sum() / rounds_ <= 2 * 2 + 1 + 0.05
  per_row = np.asarray(s.paths_B) / np.asarray(s.rounds_B)
  assert per_row.min() < 1.9 and per_row.max() > 2.1  # shared unevenly, as gains say


def own_token(drawn_p_BxJ, valid_BxJ, path_budget, live_B):
  """Broken: a candidate is kept iff its own draft probability is at least 0.3."""
  del path_budget, live_B
  return (valid_BxJ & (drawn_p_BxJ >= 0.3)).at[:, 0].set(valid_BxJ[:, 0])


@pytest.mark.slow
def test_a_budget_that_reads_the_candidates_own_token_is_rejected(pair, monkeypatch):
  draft, target = pair
  engine.compiled_program.cache_clear()
  monkeypatch.setattr(drafting, "budget_paths", own_token)
  try:
    out = generate(draft, target, "rrs", 3, 2, 4, dedup=True, path_budget=2.0)
  finally:
    engine.compiled_program.cache_clear()
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_rejects(counts, law, "rrs own-token budget", min_power=0.99)
