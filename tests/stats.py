"""Goodness-of-fit tests with a suite-wide false-alarm budget.

Every statistical test in the suite calls `assert_law` (or `chisquare_pvalue` and
`check_pvalue`). The family-wise false-alarm probability of the whole suite is at most
`FAMILY_ALPHA` by Bonferroni: each test rejects at `ALPHA = FAMILY_ALPHA / MAX_TESTS`, and
the session fails if more than `MAX_TESTS` tests ran. Seeds are fixed, so a run is
deterministic; the budget says how unlucky a seed would have to be.

Tests that must *reject* a deliberately broken variant use `assert_rejects`; a rejection
is not a false alarm, so it does not count against the budget.
"""

import numpy as np
from scipy import stats as sstats

from spectr_jax.testing.sequences import equal_mass_bins  # noqa: F401 (the tests' binning)

FAMILY_ALPHA = 1e-3
MAX_TESTS = 400
ALPHA = FAMILY_ALPHA / MAX_TESTS
_MIN_EXPECTED = 5.0

_count = 0


def tests_run() -> int:
  return _count


def _pearson(counts, probs):
  """Pearson's statistic of `counts` against `probs` and its degrees of freedom; None for
  counts in a cell of probability 0.

  Cells with expected count below 5 are pooled into one cell (the rule of thumb for the
  chi-square approximation).
  """
  counts = np.asarray(counts, dtype=np.float64).ravel()
  probs = np.asarray(probs, dtype=np.float64).ravel()
  if counts.shape != probs.shape:
    raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ")
  if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-6:
    raise ValueError(f"probs is not a distribution (sum {probs.sum()})")
  n = counts.sum()
  if np.any(counts[probs == 0] > 0):
    return None
  expected = n * probs
  small = expected < _MIN_EXPECTED
  obs = np.concatenate([counts[~small], [counts[small].sum()]])
  exp = np.concatenate([expected[~small], [expected[small].sum()]])
  keep = exp > 0
  obs, exp = obs[keep], exp[keep]
  exp = exp * obs.sum() / exp.sum()
  return float(np.sum((obs - exp) ** 2 / exp)), obs.size - 1


def chisquare_pvalue(counts, probs) -> float:
  """Pearson chi-square p-value of `counts` against the law `probs` (cells of expected
  count below 5 pooled). Observations in a cell of probability 0 give p = 0."""
  pearson = _pearson(counts, probs)
  if pearson is None:
    return 0.0
  statistic, df = pearson
  return 1.0 if df < 1 else float(sstats.chi2.sf(statistic, df))


def assert_law(counts, probs, what: str = "") -> float:
  """Asserts that `counts` are draws from `probs` at the per-test level `ALPHA`."""
  global _count
  _count += 1
  pvalue = chisquare_pvalue(counts, probs)
  assert pvalue >= ALPHA, f"{what}: chi-square p = {pvalue:.3g} < {ALPHA:.3g}"
  return pvalue


def rejection_power(counts, probs) -> float:
  """The estimated probability that another sample of the same size from the broken
  variant is rejected at `ALPHA`: Pearson's statistic less its degrees of freedom
  estimates the noncentrality of its (noncentral chi-square) law under the variant."""
  pearson = _pearson(counts, probs)
  if pearson is None:
    return 1.0
  statistic, df = pearson
  critical = sstats.chi2.isf(ALPHA, df)
  return float(sstats.ncx2.sf(critical, df, max(statistic - df, 1e-9)))


def assert_rejects(counts, probs, what: str = "", min_power: float | None = None) -> float:
  """Asserts that a broken variant's `counts` are rejected as draws from `probs`; with
  `min_power`, also that the rejection is not luck: a new sample of the same size would
  be rejected with at least that estimated probability (`rejection_power`), which is how
  a test's sample size is shown to be large enough."""
  pvalue = chisquare_pvalue(counts, probs)
  assert pvalue < ALPHA, f"{what}: broken variant not rejected (p = {pvalue:.3g})"
  if min_power is not None:
    power = rejection_power(counts, probs)
    assert power >= min_power, f"{what}: rejected, but with estimated power {power:.3f}"
  return pvalue


def assert_mean(samples, mean: float, what: str = "") -> float:
  """Asserts that the sample mean of `samples` is consistent with `mean` (z-test)."""
  global _count
  _count += 1
  samples = np.asarray(samples, dtype=np.float64)
  se = samples.std(ddof=1) / np.sqrt(samples.size)
  if se == 0:
    assert np.isclose(samples.mean(), mean, atol=1e-6), f"{what}: {samples.mean()} != {mean}"
    return 1.0
  pvalue = float(2 * sstats.norm.sf(abs(samples.mean() - mean) / se))
  assert pvalue >= ALPHA, f"{what}: mean {samples.mean():.5f} vs {mean:.5f}, p = {pvalue:.3g}"
  return pvalue


def _welch_pvalue(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
  return float(2 * sstats.norm.sf(abs(a.mean() - b.mean()) / se))


def assert_same_mean(a, b, what: str = "") -> float:
  """Asserts that two large samples have consistent means (two-sample z-test)."""
  global _count
  _count += 1
  pvalue = _welch_pvalue(a, b)
  assert pvalue >= ALPHA, f"{what}: means {np.mean(a):.4f} vs {np.mean(b):.4f}, p = {pvalue:.3g}"
  return pvalue


def assert_different_mean(a, b, what: str = "") -> float:
  """Asserts that a broken variant's sample mean is told apart from the reference's."""
  pvalue = _welch_pvalue(a, b)
  assert pvalue < ALPHA, f"{what}: broken variant not rejected (p = {pvalue:.3g})"
  return pvalue


def assert_paired_difference(a, b, what: str = "") -> float:
  """Asserts that a broken variant's per-row values `a` differ on average from the correct
  run's `b` on the same rows and randomness (a z-test on the paired differences: the rows'
  shared part, e.g. each prompt's own likelihood, cancels)."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  se = d.std(ddof=1) / np.sqrt(d.size)
  pvalue = 0.0 if se == 0 and d.mean() != 0 else float(2 * sstats.norm.sf(abs(d.mean()) / se))
  assert pvalue < ALPHA, f"{what}: broken variant not rejected (p = {pvalue:.3g})"
  return pvalue
