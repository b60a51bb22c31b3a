"""SpecTr-GBV (Lin, Sheng, Cai, Zhou, arXiv 2604.25925): what could be checked without
its text (docs/BLOCK_VERIFICATION.md, "SpecTr-GBV").

Only the abstract, third-party summaries and the public reviews of the paper could be
read; its algorithm (Eqs. 2-4, Algorithms 1-2) could not, so no verifier is shipped under
its name. Checked here:

1. What its abstract claims about the optimum, on our LP (`block_bound.block_bound`, the
   best any exact verifier of K i.i.d. paths can do): the optimum grows with K, and at
   L = 1 our "gbv" already reaches it for every K (so a rule claiming the i.i.d. optimum
   must at least match "gbv" there).
2. The one public reading of the method we found: an evaluation script of unknown
   provenance (not the authors' code, as far as we can tell) that labels its runs
   "spectr-gbv". Written in our own notation: at L = 1 it tests the K drafts in order,
   accepting draft x with probability q(x) (1 - (1 - min(1, p(x) / q(x)))^K) /
   (1 - (1 - p(x))^K), else draws norm(q (1 - min(1, p / q)^K)); at K = 1 its walk
   over sub-blocks is the uncapped joint-ratio rule (`hsd.chain_law(capping="none",
   override="none")`). Both are exact only where they reduce to a known rule (K = 1 at
   L = 1: speculative sampling) and are off the target's law otherwise.
"""

import itertools

import numpy as np
import pytest

from spectr_jax import block_bound
from spectr_jax.testing import hsd, sequences

TOY_P, TOY_Q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])


def _reading_law_one_token(p, q, num_drafts):
  """Output law and acceptance at L = 1 of the public reading (module docstring)."""
  kept = np.minimum(1.0, p / q)
  accept = q * (1 - (1 - kept) ** num_drafts) / (1 - (1 - p) ** num_drafts)
  residual = q * (1 - kept**num_drafts)
  residual = residual / residual.sum()
  out, accepted = np.zeros_like(p), 0.0
  for drafts in itertools.product(range(p.size), repeat=num_drafts):
    left = float(np.prod(p[list(drafts)]))
    for x in drafts:
      out[x] += left * accept[x]
      accepted += left * accept[x]
      left *= 1 - accept[x]
    out += left * residual
  return out, accepted


@pytest.mark.slow
def test_iid_optimum_grows_with_k_and_gbv_reaches_it_at_one_token():
  rng = np.random.default_rng(0)
  for vocab in (2, 3, 4):
    p_tab, q_tab = sequences.random_tree(rng, vocab, 1)
    bounds = [block_bound.block_bound(p_tab, q_tab, k, 1) for k in (1, 2, 3)]
    assert np.all(np.diff(bounds) >= -1e-9), bounds
    for k, bound in zip((1, 2, 3), bounds, strict=True):
      assert block_bound.block_value(p_tab, q_tab, k, 1, method="gbv") == pytest.approx(
        bound, abs=1e-5
      )


def test_public_reading_one_token():
  """Exact at K = 1 (speculative sampling); off the target's law at K = 2, 3 on Sun et
  al.'s toy (L1 distance 0.058 and 0.135), so its acceptance (0.798 at K = 2) is not
  comparable with the optimum (alpha* = 8/9 there)."""
  out, accepted = _reading_law_one_token(TOY_P, TOY_Q, 1)
  np.testing.assert_allclose(out, TOY_Q, atol=1e-12)
  assert accepted == pytest.approx(2 / 3)
  for k, distance in ((2, 0.0583), (3, 0.1345)):
    out, _ = _reading_law_one_token(TOY_P, TOY_Q, k)
    assert np.abs(out - TOY_Q).sum() == pytest.approx(distance, abs=1e-4)
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 1)
  assert block_bound.block_bound(p_tab, q_tab, 2, 1) == pytest.approx(1 + 8 / 9, abs=1e-9)


def test_public_reading_one_draft_is_the_uncapped_walk_back():
  """K = 1, L = 2, Sun et al.'s toy: the uncapped joint-ratio rule emits 00 with
  probability 1/3, not 4/9 (as the HSD rule transcribed from its authors' code;
  tests/verify/test_hsd.py)."""
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  law, tokens = hsd.chain_law(p_tab, q_tab, 2, capping="none", override="none")
  assert np.abs(law - sequences.target_law(q_tab, 2)).sum() == pytest.approx(2 / 9)
  assert tokens == pytest.approx(7 / 3)
