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

FAMILY_ALPHA = 1e-3
MAX_TESTS = 400
ALPHA = FAMILY_ALPHA / MAX_TESTS
_MIN_EXPECTED = 5.0

_count = 0


def tests_run() -> int:
  return _count


def chisquare_pvalue(counts, probs) -> float:
  """Pearson chi-square p-value of `counts` against the law `probs`.

  Cells with expected count below 5 are pooled into one cell (the rule of thumb for the
  chi-square approximation). Observations in a cell of probability 0 give p = 0.
  """
  counts = np.asarray(counts, dtype=np.float64).ravel()
  probs = np.asarray(probs, dtype=np.float64).ravel()
  if counts.shape != probs.shape:
    raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ")
  if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-6:
    raise ValueError(f"probs is not a distribution (sum {probs.sum()})")
  n = counts.sum()
  if np.any(counts[probs == 0] > 0):
    return 0.0
  expected = n * probs
  small = expected < _MIN_EXPECTED
  obs = np.concatenate([counts[~small], [counts[small].sum()]])
  exp = np.concatenate([expected[~small], [expected[small].sum()]])
  keep = exp > 0
  obs, exp = obs[keep], exp[keep]
  if obs.size < 2:
    return 1.0
  return float(sstats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def assert_law(counts, probs, what: str = "") -> float:
  """Asserts that `counts` are draws from `probs` at the per-test level `ALPHA`."""
  global _count
  _count += 1
  pvalue = chisquare_pvalue(counts, probs)
  assert pvalue >= ALPHA, f"{what}: chi-square p = {pvalue:.3g} < {ALPHA:.3g}"
  return pvalue


def assert_rejects(counts, probs, what: str = "") -> float:
  """Asserts that a broken variant's `counts` are rejected as draws from `probs`."""
  pvalue = chisquare_pvalue(counts, probs)
  assert pvalue < ALPHA, f"{what}: broken variant not rejected (p = {pvalue:.3g})"
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


def equal_mass_bins(probs, num_bins: int):
  """Maps each token to one of `num_bins` bins of about equal probability mass.

  Returns (bin_of_token_V, bin_probs). Used to test laws over large vocabularies.
  """
  probs = np.asarray(probs, dtype=np.float64)
  order = np.argsort(-probs, kind="stable")
  cum = np.cumsum(probs[order])
  bin_sorted = np.minimum((cum - probs[order] / 2) * num_bins, num_bins - 1).astype(int)
  bin_of_token = np.empty_like(bin_sorted)
  bin_of_token[order] = bin_sorted
  bin_probs = np.bincount(bin_of_token, weights=probs, minlength=num_bins)
  return bin_of_token, bin_probs / bin_probs.sum()


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
