"""The suite's goodness-of-fit helpers (tests/stats.py): Pearson's p-value and the
estimated power that shows a statistical test's sample is large enough."""

import numpy as np
import pytest
from scipy import stats as sstats

from tests import stats


def test_pvalue_is_pearsons_chi_square_with_small_cells_pooled():
  probs = np.array([0.5, 0.3, 0.17, 0.02, 0.01])
  counts = np.array([90, 66, 34, 7, 3])  # expected 100, 60, 34, 4, 2: the last two pooled
  want = sstats.chisquare([90, 66, 34, 10], [100, 60, 34, 6]).pvalue
  assert stats.chisquare_pvalue(counts, probs) == pytest.approx(want, rel=1e-12)
  assert stats.chisquare_pvalue([3, 1, 0], [0.5, 0.0, 0.5]) == 0.0  # mass where none is


def _break(probs, noncentrality, n, rng):
  """A law p' = p + d with n * sum(d^2 / p) = noncentrality."""
  shift = rng.normal(size=probs.size) * probs
  shift -= probs * shift.sum()  # sums to 0
  shift *= np.sqrt(noncentrality / n / np.sum(shift**2 / probs))
  assert np.all(probs + shift > 0)
  return probs + shift


def test_rejection_power_tells_a_clear_break_from_a_lucky_rejection():
  rng = np.random.default_rng(1)
  probs = rng.dirichlet(np.ones(64) * 5)
  n, df = 20_000, 63
  critical = sstats.chi2.isf(stats.ALPHA, df)
  needed = next(lam for lam in range(1, 1000) if sstats.ncx2.sf(critical, df, lam) >= 0.99)
  # Draws from the law itself: little power; a break 4x the noncentrality that a 99%
  # power needs: near 1, as the noncentral chi-square law says.
  assert stats.rejection_power(rng.multinomial(n, probs), probs) < 0.01
  clear = rng.multinomial(n, _break(probs, 4 * needed, n, rng))
  assert stats.rejection_power(clear, probs) > 0.99
  stats.assert_rejects(clear, probs, "a clear break", min_power=0.99)
  # Counts whose statistic is just past the critical value are rejected, but a new
  # sample of that variant would often not be: refused with min_power.
  lucky = np.round(n * _break(probs, critical + 10, n, rng))
  assert stats.chisquare_pvalue(lucky, probs) < stats.ALPHA
  with pytest.raises(AssertionError, match="estimated power"):
    stats.assert_rejects(lucky, probs, "a lucky rejection", min_power=0.99)
