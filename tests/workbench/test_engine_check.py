"""`spectr_jax.testing.check_engine`: a registered method through the engine at V = 32000
passes, a broken one registered the same way fails, bad arguments are refused.

A report that must pass counts as one test of the suite's false-alarm budget (its own
tests inside at alpha = `stats.ALPHA`, Bonferroni); the broken one runs at the default
alpha (a rejection is not a false alarm).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import methods
from spectr_jax.testing import engine_check
from tests import stats

pytestmark = [pytest.mark.slow, pytest.mark.numerics]  # V = 32000: the optimised build


@pytest.fixture(scope="module")
def pair():
  return engine_check.random_pair(32_000)


BROKEN = dataclasses.replace(
  methods.get("sd"),
  name="sd_q_residual_test",
  verify="tests.workbench.test_harness:sd_q_residual",  # the harness tests' broken rule
  summary="speculative sampling with its residual drawn from q (broken, tests only)",
  label="sd, residual from q (broken)",
  compare_with=(),
)


# 1024 rows of 2 tokens: the broken rule's chi-square p-value is about 1e-11 there.
SMALL = dict(rows=1024, new_tokens=2)


def test_k_seq_decodes_the_target_law_through_the_engine(pair):
  stats._count += 1
  report = engine_check.check_engine("kseq", pair=pair, alpha=stats.ALPHA, **SMALL)
  assert report.passed, report.markdown()
  assert [r.case for r in report.rows] == [
    "engine V32000 every token", "engine V32000 token 1", "engine V32000 token 2"
  ]  # fmt: skip
  assert 1.2 < report.rows[0].tokens < 3  # drafts accepted and rejected


def test_a_residual_drawn_from_q_fails_through_the_engine(pair, monkeypatch):
  monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))  # registered for this test
  methods.register(BROKEN)
  report = engine_check.check_engine(BROKEN.name, pair=pair, **SMALL)
  assert not report.passed, report.markdown()
  assert report.failures[0].case == "engine V32000 every token", report.markdown()


def test_bad_arguments_are_refused(pair):
  with pytest.raises(ValueError, match="verifies no drafts"):
    engine_check.check_engine("autoregressive", pair=pair)
  with pytest.raises(ValueError, match="at least 5 per bin"):
    engine_check.check_engine("kseq", rows=100, pair=pair)
  with pytest.raises(ValueError, match="unknown method"):
    engine_check.check_engine("no_such_method", pair=pair)


def test_the_transform_is_uniform_for_target_draws():
  """Tokens drawn from the target's own conditionals (no engine; V = 512) give u whose
  chi-square passes; tokens drawn from the draft's do not: the statistic sees a wrong law."""
  draft, target = engine_check.random_pair(512)
  order_V = engine_check.token_order(draft, target)
  rows = 4096

  def sample(model, key):
    seq = jnp.tile(jnp.asarray([engine_check.PROMPT], jnp.int32), (rows, 1))
    for t in range(2):
      logits = model.model.apply({"params": model.params}, seq)[:, -1]
      token = jax.random.categorical(jax.random.fold_in(key, t), logits.astype(jnp.float32))
      seq = jnp.concatenate([seq, token[:, None].astype(jnp.int32)], 1)
    return np.asarray(seq[:, len(engine_check.PROMPT) :])

  for model, exact in ((target, True), (draft, False)):
    tokens = sample(model, jax.random.key(1))
    u, zero = engine_check.uniforms(target, tokens, jax.random.key(2), order_V, chunk=1024)
    assert u.shape == (rows, 2) and np.all((0 <= u) & (u <= 1))
    _, pvalue = engine_check.chi_square(u.ravel(), 32)
    if exact:
      assert not zero
      stats._count += 1
      assert pvalue >= stats.ALPHA, pvalue
    else:
      assert pvalue < stats.ALPHA, pvalue
