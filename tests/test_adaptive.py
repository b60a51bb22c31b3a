"""`spectr_jax.adaptive`: a draft length decided from the tokens before each position keeps
K-SEQ and single-draft sampling exact (the harness's enumerated laws); rules that look at
the position's own token (its draft or its target probability) are not exact, and the
harness shows the case."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import adaptive, verify
from spectr_jax.methods import BlockVerdict
from spectr_jax.testing import harness
from tests import stats

THRESHOLD = 0.5
# Trees of L >= 2, one of each kind the adaptive rule meets (the bound of every law case
# holds for any shorter walk; `harness.CASES`).
CASES = (
  harness.Case("dense", 3, 2, 2),
  harness.Case("sparse", 4, 2, 2),
  harness.Case("p0", 3, 2, 2),
  harness.Case("dense", 2, 3, 2),
)


def _position(method):
  if method == "kseq":
    return functools.partial(verify.kseq_position, rho_mode="star", rho_value=0.0)
  return verify.sd_position


def adaptive_walk(method, length_fn):
  """A block-level verifier: the token-level walk of `method` up to length_fn(drafts, p,
  q) positions."""

  def run(key, drafts_KxL, p_KxLxV, q_KxL1xV):
    length = length_fn(drafts_KxL, p_KxLxV, q_KxL1xV)
    tokens, num, _ = verify.walk_positions(
      lambda rep, t: _position(method), key, drafts_KxL, p_KxLxV, q_KxL1xV, length=length
    )
    return BlockVerdict(tokens, num, jnp.zeros_like(tokens))

  return run


def confident(drafts_KxL, p_KxLxV, q_KxL1xV):
  del q_KxL1xV
  return adaptive.confident_length(drafts_KxL, p_KxLxV, THRESHOLD)


def own_token(drafts_KxL, p_KxLxV, q_KxL1xV):
  """Broken: position j is verified iff the likeliest prefix THROUGH j (its own token
  included) has probability at least 0.3. (At THRESHOLD, 0.5, this rule stops after
  the first position on nearly every draw of these trees: nearly a fixed length, and
  exact. A rule must vary with the token to be wrong.)"""
  del q_KxL1xV
  p_KxL = jnp.take_along_axis(p_KxLxV, drafts_KxL[..., None], -1)[..., 0]
  passes_L = jnp.max(jnp.cumprod(p_KxL, axis=1), axis=0) >= 0.3
  passes_L = passes_L.at[0].set(True)
  return jnp.sum(jnp.cumprod(passes_L.astype(jnp.int32)))


def target_peek(drafts_KxL, p_KxLxV, q_KxL1xV):
  """Broken: position j is verified iff the first draft's token there is at least as
  likely under the target as under the draft (a rule that peeks at q of the token)."""
  q_KxL = jnp.take_along_axis(q_KxL1xV[:, :-1], drafts_KxL[..., None], -1)[..., 0]
  p_KxL = jnp.take_along_axis(p_KxLxV, drafts_KxL[..., None], -1)[..., 0]
  passes_L = (q_KxL[0] >= p_KxL[0]).at[0].set(True)
  return jnp.sum(jnp.cumprod(passes_L.astype(jnp.int32)))


def _check(fn, laws=("iid",), **kw):
  return harness.check_verifier(
    fn, level="block", laws=laws, quick=True, cases=CASES, boundary=False, large_vocab=None,
    **kw,
  )  # fmt: skip


def test_the_length_counts_leading_positions_whose_prefix_before_them_is_likely():
  p = np.full((2, 4, 3), 1 / 3, np.float32)
  p[0, :, 0] = 0.8
  p[0, :, 1:] = 0.1
  drafts = np.zeros((2, 4), np.int32)  # draft 0: 0.8 per token; draft 1: 1/3
  length = functools.partial(adaptive.confident_length, jnp.asarray(drafts), jnp.asarray(p))
  # Prefix probabilities before j = 0..3: 1, 0.8, 0.64, 0.512 (the likeliest draft).
  assert [int(length(t)) for t in (0.0, 0.5, 0.6, 0.7, 0.9, 1.0)] == [4, 4, 3, 2, 1, 1]
  # The boundary: a prefix of probability exactly the threshold passes.
  assert int(length(np.float32(0.8))) == 2
  # A token of probability 0 (never drawn from p) stops the walk after it, never before.
  p[:, 1, 0] = 0.0
  assert int(adaptive.confident_length(jnp.asarray(drafts), jnp.asarray(p), 0.5)) == 2


def _drafts(method):
  return dict(max_drafts=1) if method == "sd" else {}


# K-SEQ in the fast tier; single-draft sampling with --runslow.
@pytest.mark.parametrize("method", ["kseq", pytest.param("sd", marks=pytest.mark.slow)])
def test_a_length_decided_before_each_position_keeps_the_law(method):
  stats._count += 1
  report = _check(adaptive_walk(method, confident), alpha=stats.ALPHA, **_drafts(method))
  assert report.passed, report.markdown()
  assert all(r.tokens > 1.05 for r in report.rows), report.markdown()


@pytest.mark.slow
def test_the_rule_shortens_the_walks_on_these_trees():
  """Not every walk runs to L: fewer tokens per round than the full walk on some tree
  (the law test above is not the static walk's)."""
  cut = _check(adaptive_walk("kseq", confident))
  full = _check(adaptive_walk("kseq", lambda d, p, q: d.shape[1]))
  gaps = [b.tokens - a.tokens for a, b in zip(cut.rows, full.rows, strict=True)]
  assert max(gaps) > 0.05, (cut.markdown(), full.markdown())


@pytest.mark.parametrize(
  "rule",
  [own_token, pytest.param(target_peek, marks=pytest.mark.slow)],
  ids=["own-token", "target-peek"],
)
def test_a_length_decided_from_the_position_itself_is_not_exact(rule):
  report = _check(adaptive_walk("kseq", rule))
  assert not report.passed, report.markdown()
  assert any(r.why.startswith("law") for r in report.failures), report.markdown()
