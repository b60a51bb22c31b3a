"""`spectr_jax.testing.harness.check_verifier`: every registered method passes for the
laws it claims (`Method.exact_for`), and broken rules fail with the case that shows it.

A report that must pass runs at the suite's per-test level (alpha = `stats.ALPHA`,
Bonferroni over the report's own tests inside) and counts as one test of the suite's
false-alarm budget (tests/stats.py); the broken variants run at the harness's default
alpha (a rejection is not a false alarm).
"""

import functools

import jax
import jax.numpy as jnp
import pytest

from spectr_jax import acceptance, methods, verify
from spectr_jax.methods import Verdict
from spectr_jax.sampling import categorical
from spectr_jax.testing import harness
from tests import stats

# The fast tier runs law cases only, the first trees of `harness.CASES` (the boundary
# rows have their own test; every check of every method is slow-marked).
_FAST = dict(quick=True, boundary=False, large_vocab=None)


def _function(record: methods.Method):
  fn = record.function()
  if record.takes_rho:
    return functools.partial(fn, rho_mode="star", rho_value=0.0)
  return fn


def _must_pass(fn, **kwargs) -> harness.Report:
  """`check_verifier` at the suite's level, counted as one test of its budget."""
  stats._count += 1
  return harness.check_verifier(fn, alpha=stats.ALPHA, **kwargs)


def sd_q_residual(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Broken speculative sampling: after a rejection the token is drawn from q, not from
  the residual norm(max(q - p, 0))."""
  accept_key, residual_key = jax.random.split(key)
  x, valid = drafts_K[0], valid_K[0]
  ratio = jnp.where(p_V[x] > 0, q_V[x] / jnp.where(p_V[x] > 0, p_V[x], 1.0), 0.0)
  accepted = valid & (jax.random.uniform(accept_key) < ratio)
  y = categorical(residual_key, q_V)
  return Verdict(jnp.where(accepted, x, y).astype(jnp.int32), accepted)


def test_a_residual_drawn_from_q_fails_the_law_and_the_bound():
  report = harness.check_verifier(
    sd_q_residual, level="token", laws=("iid",), max_drafts=1, name="sd, residual from q",
    cases=harness.CASES[:2], **_FAST,
  )  # fmt: skip
  assert not report.passed
  dense = [r for r in report.failures if r.case.startswith("dense")]
  assert dense and all(r.kind == "law" for r in report.failures)
  # Accepting min(1, q/p) then drawing q again puts too much mass on the drafts: more
  # tokens per round than any exact verifier can reach on some tree.
  assert any("above the LP bound" in r.why for r in report.failures), report.markdown()
  assert "FAIL" in report.markdown()


def test_specinfer_is_not_exact_for_drafts_without_replacement():
  report = harness.check_verifier(
    verify.specinfer_verdict, level="token", laws=("wor",), name="specinfer on wor",
    cases=harness.CASES[:1], **_FAST,
  )  # fmt: skip
  assert not report.passed
  failed = {r.case for r in report.failures}
  assert "dense V4 L1 K3" in failed, report.markdown()
  assert all(r.law == "wor" and r.kind == "law" for r in report.failures)


def test_specinfer_passes_for_iid_drafts_and_the_report_reads():
  report = _must_pass(
    verify.specinfer_verdict, level="token", laws=("iid",), name="specinfer",
    cases=harness.CASES[:2], **_FAST,
  )  # fmt: skip
  assert report.passed, report.markdown()
  assert report.failures == []
  assert len(report.rows) == 2 and report.num_tests == 4
  for row in report.rows:
    assert row.tokens <= row.bound + 5 * row.tokens_se + 1e-6
  text = report.markdown()
  assert text.count("\n| ") == 1 + len(report.rows) and "Bonferroni" in text


def test_the_boundary_check_catches_a_token_of_probability_zero():
  """A rule whose accept test is u <= ratio accepts a draft of ratio 0 when the uniform
  is 0.0; the forced-uniform rows show it (and the correct u < ratio passes)."""

  def sd_le(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
    accept_key, residual_key = jax.random.split(key)
    x, valid = drafts_K[0], valid_K[0]
    ratio = jnp.where(p_V[x] > 0, q_V[x] / jnp.where(p_V[x] > 0, p_V[x], 1.0), 0.0)
    accepted = valid & (jax.random.uniform(accept_key) <= ratio)
    y = categorical(residual_key, jnp.where(valid, acceptance.residual(q_V, p_V), q_V))
    return Verdict(jnp.where(accepted, x, y).astype(jnp.int32), accepted)

  only = dict(cases=(), large_vocab=None, max_drafts=1)
  uniform = jax.random.uniform
  broken = harness.check_verifier(sd_le, level="token", laws=("iid",), **only)
  assert jax.random.uniform is uniform  # the forced draws are undone
  assert not broken.passed and {r.kind for r in broken.failures} == {"boundary"}
  assert "u=0" in broken.failures[0].why
  good = _must_pass(verify.sd_verdict, level="token", laws=("iid",), **only)
  assert good.passed, good.markdown()


def test_register_adds_a_method_once(monkeypatch):
  monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))
  record = methods.Method(
    name="sd_copy", level="token", verify=verify.sd_verdict, summary="sd again",
    max_drafts=1,
  )  # fmt: skip
  methods.register(record)
  methods.register(record)  # the same record again: a no-op
  assert methods.get("sd_copy") is record and "sd_copy" in methods.names(level="token")
  with pytest.raises(ValueError, match="a different method is registered as 'sd_copy'"):
    methods.register(methods.Method(**{**record.__dict__, "summary": "another"}))


def _check_registered(name: str, **kwargs) -> harness.Report:
  record = methods.get(name)
  return _must_pass(
    _function(record), level=record.level, laws=record.exact_for, name=name,
    max_drafts=record.max_drafts, **kwargs,
  )  # fmt: skip


# Every method through `check_verifier`'s default mode (its evidence: each informative
# tree's law test detects TV 0.01 with probability 0.99 at the suite's level; one-hot and
# tie trees and the boundary rows; every position at V = 32k) in two tests: the small
# trees compile quickly (the suite's default level), the V = 32k rows run loops over the
# vocabulary and get XLA's optimised build (`numerics`: 4x faster there).
@pytest.mark.slow
@pytest.mark.parametrize("name", methods.names(speculative=True))
def test_every_registered_method_passes_for_its_laws(name):
  report = _check_registered(name, large_vocab=None)
  assert report.passed, report.markdown()
  for kind in harness.INFORMATIVE:
    assert report.power()[("law", kind)] <= harness.DETECT_TV, report.power_markdown()


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("name", methods.names(speculative=True))
def test_every_registered_method_passes_at_an_llm_vocabulary(name):
  report = _check_registered(name, cases=(), boundary=False)
  laws = report.laws[:1] if methods.get(name).max_drafts == 1 else report.laws
  assert [(r.kind, r.law, r.draft_len) for r in report.rows] == [
    ("chi2-32k", law, t) for law in laws for t in range(3)
  ]  # every position of L = 2, the bonus included
  assert report.passed, report.markdown()
