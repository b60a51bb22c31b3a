"""`spectr_jax.adaptive`: a draft length decided from the tokens before each position keeps
K-SEQ and single-draft sampling exact (the harness's enumerated laws, and through the
engine, `DecodeSpec(adaptive=...)`); rules that look at the position's own token (its
draft or its target probability) are not exact, and the harness and the engine's law
test show the case."""

import functools
import types

import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import DecodeSpec, adaptive, engine, lengths, verify
from spectr_jax.methods import BlockVerdict
from spectr_jax.testing import harness
from tests import engine_pair, stats
from tests.engine_pair import codes, exact_law, generate

THRESHOLD = 0.5
# Trees of L >= 2, one of each kind the adaptive rule meets (the bound of every law case
# holds for any shorter walk; `harness.CASES`).
CASES = (
  harness.Case("dense", 3, 2, 2),
  harness.Case("sparse", 4, 2, 2),
  harness.Case("p0", 3, 2, 2),
  harness.Case("dense", 2, 3, 2),
)


def adaptive_walk(length_fn):
  """A block-level verifier: K-SEQ's token-level walk up to length_fn(drafts, p, q)
  positions."""
  kseq = functools.partial(verify.kseq_verdict, rho_mode="star", rho_value=0.0)

  def run(key, drafts_KxL, p_KxLxV, q_KxL1xV):
    length = length_fn(drafts_KxL, p_KxLxV, q_KxL1xV)
    tokens, num, _ = verify.walk_positions(
      lambda rep, t: kseq, key, drafts_KxL, p_KxLxV, q_KxL1xV, length=length
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


# K-SEQ (the walk and the rule are the same for one draft; single-draft sampling's
# adaptive rounds are the engine's broken-variant test below).
def test_a_length_decided_before_each_position_keeps_the_law():
  stats._count += 1
  report = _check(adaptive_walk(confident), alpha=stats.ALPHA)
  assert report.passed, report.markdown()
  assert all(r.tokens > 1.05 for r in report.rows), report.markdown()


@pytest.mark.parametrize(
  "rule",
  [own_token, pytest.param(target_peek, marks=pytest.mark.slow)],
  ids=["own-token", "target-peek"],
)
def test_a_length_decided_from_the_position_itself_is_not_exact(rule):
  report = _check(adaptive_walk(rule))
  assert not report.passed, report.markdown()
  assert any(r.why.startswith("law") for r in report.failures), report.markdown()


def test_the_target_is_compiled_for_a_few_lengths():
  assert adaptive.length_buckets(1) == (1,)
  assert adaptive.length_buckets(4) == (1, 2, 4)
  assert adaptive.length_buckets(6) == (1, 2, 4, 6)
  assert adaptive.length_buckets(8) == (1, 2, 4, 8)


@pytest.mark.parametrize(
  "kw, match",
  [
    (dict(method="gbv", num_drafts=2), "token-level verifier"),
    (dict(method="kseq", num_drafts=2, dedup=True), "dedup"),
    (dict(method="kseq", adaptive=1.5), r"\(0, 1\]"),
    (dict(method="kseq", adaptive=-0.1), r"\(0, 1\]"),
    (dict(method="kseq", adaptive="0.5"), r"\(0, 1\]"),
  ],
)
def test_a_spec_that_cannot_adapt_is_refused(kw, match):
  kw.setdefault("adaptive", 0.5)
  with pytest.raises(ValueError, match=match):
    DecodeSpec(**kw)


def test_a_spec_without_drafts_is_never_adaptive():
  assert DecodeSpec(method="autoregressive", adaptive=0.5).adaptive == 0.0
  assert DecodeSpec(method="kseq", adaptive=1).adaptive == 1.0


@pytest.fixture(scope="module")
def pair():
  return engine_pair.models()


def test_the_engine_drafts_and_scores_only_the_verified_positions(pair):
  """At threshold 1 no prefix is likely enough to go past position 0 (the draft's
  probabilities are below 1): every round drafts and scores one position per draft."""
  draft, target = pair
  k = 3
  out = generate(draft, target, "kseq", k, 3, 4, batch=8, adaptive=1.0)
  s = jax_numpy(out.stats)
  assert np.all(s.lengths_BxL1[:, 1] == s.rounds_B) and np.all(s.lengths_BxL1.sum(1) == s.rounds_B)
  assert np.all(s.draft_calls_B == s.rounds_B)
  assert np.all(s.draft_positions_B == 2 * k * s.rounds_B)
  assert np.all(s.positions_B == 2 * k * s.rounds_B)
  assert np.all(s.tokens_per_round_BxL2[:, 3:] == 0)  # one draft token and the bonus at most
  assert np.all(np.asarray(out.lengths_B) == 4)


def jax_numpy(tree):
  return types.SimpleNamespace(
    **{f: np.asarray(getattr(tree, f)) for f in tree.__dataclass_fields__}
  )


@pytest.mark.slow
def test_the_engines_adaptive_rounds_keep_the_output_law(pair):
  """K-SEQ, K = 3, L = 2 at threshold 0.6 through the engine: the target's law over 4
  tokens; rounds verify 1 and 2 positions and the target call takes each bucket."""
  draft, target = pair
  out = generate(draft, target, "kseq", 3, 2, 4, key=3, adaptive=0.6)
  law = exact_law(target, 4)
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "kseq adaptive")
  lengths = np.asarray(out.stats.lengths_BxL1).sum(0)
  assert lengths[0] == 0 and np.all(lengths[1:] > 0.05 * lengths.sum()), lengths
  assert engine_pair.residual_share(out, 2) >= 0.2


@pytest.mark.slow
def test_a_threshold_every_prefix_passes_decodes_the_static_tokens(pair):
  """A threshold below every prefix's probability verifies L positions each round: the
  same tokens as the static decode, key for key (the adaptive program changes no draw)."""
  draft, target = pair
  static = generate(draft, target, "kseq", 3, 2, 6, batch=256)
  adapted = generate(draft, target, "kseq", 3, 2, 6, batch=256, adaptive=1e-30)
  np.testing.assert_array_equal(np.asarray(adapted.tokens_BxT), np.asarray(static.tokens_BxT))
  lengths = np.asarray(adapted.stats.lengths_BxL1)
  assert np.all(lengths[:, 2] == np.asarray(adapted.stats.rounds_B))


def own_token_length(drafts_KxL, p_KxLxV, threshold):
  """Broken: position j is verified iff its own draft token has probability at least
  `threshold` (any draft)."""
  p_KxL = jnp.take_along_axis(p_KxLxV, drafts_KxL[..., None], -1)[..., 0]
  passes_L = (jnp.max(p_KxL, axis=0) >= threshold).at[0].set(True)
  return jnp.sum(jnp.cumprod(passes_L.astype(jnp.int32)))


@pytest.mark.slow
def test_the_engines_law_test_rejects_a_rule_that_reads_the_position_itself(pair, monkeypatch):
  """The engine with the round's lengths from `own_token_length` (the drafting keeps the
  real rule, which drafts at least as far): single-draft sampling at L = 2."""
  draft, target = pair
  broken = types.SimpleNamespace(
    confident_length=own_token_length, length_buckets=adaptive.length_buckets
  )
  engine.compiled_program.cache_clear()
  monkeypatch.setattr(lengths, "adaptive", broken)
  try:
    out = generate(draft, target, "sd", 1, 2, 4, adaptive=0.5)
  finally:
    engine.compiled_program.cache_clear()
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_rejects(counts, law, "sd own-token length", min_power=0.99)
