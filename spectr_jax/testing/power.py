"""The power of the exactness checks' tests: what a chi-square test detects, and the Wald
test of a stratified mixture law against the target law.

`detectable_tv`: the smallest total variation from the target law that a test rejects
with probability `POWER` at a level, in the worst direction; `draws_for` inverts it.
`wald`: the law test of `harness.check_verifier`'s law rows.
"""

import dataclasses
import math

import numpy as np
from scipy import optimize
from scipy import stats as sstats

__all__ = [
  "DETECT_TV",
  "INFORMATIVE",
  "LARGE_VOCAB_TV",
  "POWER",
  "Wald",
  "detectable_tv",
  "draws_for",
  "noncentrality",
  "wald",
]

# The default mode's power: any law at total variation DETECT_TV or more from the target
# fails an informative case's law test with probability at least POWER, at the report's
# per-test level (`detectable_tv`); the large-vocabulary rows detect LARGE_VOCAB_TV
# between the binned laws.
DETECT_TV = 0.01
LARGE_VOCAB_TV = 0.05
POWER = 0.99
# The tree kinds where a wrong rule changes the law: the default mode sizes their cases to
# detect DETECT_TV.
INFORMATIVE = ("dense", "sparse", "p0", "q0")
# Outcomes of expected count below this (at the effective sample size) are pooled.
_MIN_EXPECTED = 5.0


def noncentrality(df: int, level: float, power: float = POWER) -> float:
  """The noncentrality a chi-square test of `df` degrees of freedom at `level` needs to
  reject with probability `power` (its statistic noncentral chi-square under an
  alternative)."""
  critical = sstats.chi2.isf(level, df)
  return float(optimize.brentq(lambda lam: sstats.ncx2.sf(critical, df, lam) - power, 0.0, 1e7))


def detectable_tv(
  effective_draws: float, df: int, level: float, power: float = POWER, pooled_mass: float = 0.0
) -> float:
  """The smallest total variation from the target law that the law test rejects with
  probability `power` at `level`, whatever the direction of the deviation.

  The Wald statistic d' Cov^-1 d of the mixture estimate (d its deviation from the
  target) is noncentral chi-square under an alternative, with noncentrality
  delta' Cov^-1 delta for the alternative's deviation delta. Cov = sum_t w_t^2 C_t / M_t,
  C_t a multinomial covariance, and s' C_t s <= 1 for any s of entries +-1 (the variance
  of a +-1 variable), so with s = sign(delta), Cauchy-Schwarz gives delta' Cov^-1 delta
  >= (s' delta)^2 / s' Cov s >= (2 TV)^2 n_eff, n_eff = 1 / sum_t (w_t^2 / M_t) (the
  effective draws). A deviation inside the pooled outcomes (target mass `pooled_mass`)
  is not seen: it is added. Against the Pearson statistic of B equal-mass bins (n draws)
  the same bound holds with n_eff = n, the total variation that of the binned laws.
  """
  if df < 1 or effective_draws <= 0:
    return 1.0
  return math.sqrt(noncentrality(df, level, power) / (4.0 * effective_draws)) + pooled_mass


def draws_for(tv: float, df: int, level: float, power: float = POWER) -> int:
  """The effective draws that make `detectable_tv` (no pooling) equal to `tv`."""
  return math.ceil(noncentrality(df, level, power) / (4.0 * tv * tv))


@dataclasses.dataclass(frozen=True)
class Wald:
  """`wald`'s result: statistic, degrees of freedom, p-value, why the test failed outright
  ("" if not), and what `detectable_tv` takes (effective draws, pooled target mass)."""

  statistic: float
  df: int
  pvalue: float
  why: str
  effective_draws: float
  pooled_mass: float


def wald(counts_TxO, weights_T, target_O, per_tuple_T) -> Wald:
  """The Wald test of the stratified mixture against the target law.

  hat = sum_t w_t n_t / M_t estimates the mixture law (M_t draws of tuple t); its
  covariance is the exact stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M_t, with
  P_t estimated by n_t / M_t and, on the diagonal, by (n_t + 2) / (M_t + 2) (an upper
  estimate: a cell a heavy stratum happened not to hit would otherwise get variance 0
  there; the result is still a covariance, and conservative). Outcomes of expected count
  below 5 at the effective draws n_eff = 1 / sum_t (w_t^2 / M_t) are pooled into one cell
  (with the smallest other cell while that one is still below 5); the cells sum to 1, so
  one is dropped: the Wald statistic d^T Cov^-1 d is chi-square with (cells - 1) degrees
  of freedom.
  """
  m_T = per_tuple_T.astype(np.float64)
  hat_O = (weights_T / m_T) @ counts_TxO
  n_eff = 1.0 / float(np.sum(weights_T**2 / m_T))
  if np.any(hat_O[target_O <= 0] > 0):
    return Wald(math.inf, 0, 0.0, "mass on an outcome of target probability 0", n_eff, 0.0)
  expected_O = target_O * n_eff
  order = [int(i) for i in np.argsort(expected_O) if target_O[i] > 0]
  pool = [i for i in order if expected_O[i] < _MIN_EXPECTED]
  kept = [i for i in order if expected_O[i] >= _MIN_EXPECTED]
  while pool and kept and expected_O[pool].sum() < _MIN_EXPECTED:
    pool.append(kept.pop(0))
  pooled_mass = float(target_O[pool].sum()) if pool else 0.0
  cols = [[i] for i in kept] + ([pool] if pool else [])
  if len(cols) < 2:
    return Wald(0.0, 0, 1.0, "", n_eff, pooled_mass)
  counts = np.stack([counts_TxO[:, c].sum(1) for c in cols], 1).astype(np.float64)
  target = np.array([target_O[c].sum() for c in cols])
  probs_TxC = counts / m_T[:, None]
  upper_TxC = (counts + 2.0) / (m_T[:, None] + 2.0)
  w2 = weights_T**2 / m_T
  cov = np.diag(w2 @ upper_TxC) - np.einsum("t,tc,td->cd", w2, probs_TxC, probs_TxC)
  d = (weights_T @ probs_TxC - target)[:-1]
  statistic = float(d @ np.linalg.solve(cov[:-1, :-1], d))
  df = len(cols) - 1
  return Wald(statistic, df, float(sstats.chi2.sf(statistic, df)), "", n_eff, pooled_mass)
