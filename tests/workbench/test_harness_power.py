"""The power of `check_verifier`'s default mode: its law tests' detectable total variation
(`harness.detectable_tv`) against simulation, and subtly broken verifiers of every class
a researcher writes (a split factor a few percent off, a residual with the wrong mass
removed, rrs updated with p instead of the without-replacement conditional, a bonus drawn
from the draft, block verification with uncapped weights, a 1% mixture of a wrong law)
each rejected by it; block verification written from its equations passes.

The broken variants run at the harness's default alpha (a rejection is not a false
alarm); a control that must pass is one test of the suite's budget (tests/stats.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, block, verify
from spectr_jax.methods import BlockVerdict, Verdict
from spectr_jax.sampling import categorical
from spectr_jax.testing import harness
from tests import stats

# The law cases only: the boundary rows and the V = 32k check have their own tests.
_LAW = dict(boundary=False, large_vocab=None)


def test_the_detectable_tv_is_what_the_wald_test_detects():
  """Simulated under an alternative at exactly `detectable_tv` in the worst direction
  the bound assumes (half the outcomes' mass moved to the other half, draws as a single
  multinomial), the test rejects at the computed power or more; at the same level a
  deviation a third of it is rejected far less often."""
  rng = np.random.default_rng(0)
  target = rng.dirichlet(np.ones(12))
  level, draws, df = 1e-4, 40_000, target.size - 1
  tv = harness.detectable_tv(draws, df, level)
  order = np.argsort(target)
  up = np.zeros(target.size, bool)
  up[order[::2]] = True  # about half the mass up, half down
  up_mass = target[up].sum()

  def rejections(shift):
    alt = np.where(up, target * (1 + shift / up_mass), target * (1 - shift / (1 - up_mass)))
    counts = rng.multinomial(draws, alt, size=400)
    weights, per_tuple = np.ones(1), np.full(1, draws)
    pvalues = [harness.wald(c[None], weights, target, per_tuple).pvalue for c in counts]
    return np.mean(np.array(pvalues) < level)

  assert 0.0 < tv < 0.05
  assert rejections(tv) >= 0.97  # the bound's 0.99, less the 400 runs' sampling error
  assert rejections(tv / 3) < 0.5


def test_the_default_mode_detects_tv_0_01_on_every_informative_tree():
  """At the registered-method gate's level, every informative tree kind's cases detect
  any law at TV 0.01 with probability 0.99; quick mode says it is no evidence."""
  report = harness.check_verifier(
    verify.sd_verdict, level="token", laws=("iid",), max_drafts=1, alpha=stats.ALPHA, **_LAW
  )
  stats._count += 1
  assert report.passed, report.markdown()
  power = report.power()
  for kind in harness.INFORMATIVE:
    assert power[("law", kind)] <= harness.DETECT_TV, report.power_markdown()
  assert "QUICK MODE" not in report.markdown()
  assert "detect any law at TV" in report.markdown()
  quick = harness.check_verifier(
    verify.sd_verdict, level="token", laws=("iid",), max_drafts=1, quick=True, **_LAW
  )
  assert quick.markdown().startswith("QUICK MODE: a smoke test")
  assert max(quick.power().values()) > harness.DETECT_TV


def kseq_rho_below_star(key, drafts_K, p_V, q_V, valid_K, factor=0.97) -> Verdict:
  """K-SEQ at a fixed rho of `factor` x rho* (at least 1): the accept branch overshoots
  where rho* > 1."""
  rho = jnp.maximum(1.0, factor * acceptance.rho_star(p_V, q_V, jnp.sum(valid_K)))
  return verify.kseq_verdict(key, drafts_K, p_V, q_V, valid_K, rho_mode="fixed", rho_value=rho)


def sd_residual_short(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Speculative sampling whose residual removes 90% of the draft's mass, not all of it."""
  accept_key, residual_key = jax.random.split(key)
  x, valid = drafts_K[0], valid_K[0]
  ratio = jnp.where(p_V[x] > 0, q_V[x] / jnp.where(p_V[x] > 0, p_V[x], 1.0), 0.0)
  accepted = valid & (jax.random.uniform(accept_key) < ratio)
  residual_V = jnp.where(valid, acceptance.residual(q_V, 0.9 * p_V), q_V)
  y = categorical(residual_key, residual_V)
  return Verdict(jnp.where(accepted, x, y).astype(jnp.int32), accepted)


def rrs_updated_with_p(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Recursive rejection without replacement whose residual after a rejection removes p
  (SpecInfer's update) instead of the conditional p_i of the remaining tokens."""
  accept_key, residual_key = jax.random.split(key)
  u_K = jax.random.uniform(accept_key, drafts_K.shape)

  def stage(carry, inputs):
    r_V, left_V, accepted, token = carry
    x, valid, u = inputs
    mass = jnp.sum(left_V)
    p_i_V = left_V / jnp.where(mass > 0, mass, 1.0)
    px = p_i_V[x]
    tried = valid & (px > 0) & ~accepted
    accept = tried & (u < r_V[x] / jnp.where(px > 0, px, 1.0))
    r_V = jnp.where(tried & ~accept, acceptance.residual(r_V, p_V), r_V)  # the break
    left_V = jnp.where(tried, jnp.where(jnp.arange(p_V.size) == x, 0.0, left_V), left_V)
    return (r_V, left_V, accepted | accept, jnp.where(accept, x, token)), None

  init = (q_V, p_V, jnp.bool_(False), jnp.int32(0))
  (r_V, _, accepted, token), _ = jax.lax.scan(stage, init, (drafts_K, valid_K, u_K))
  y = categorical(residual_key, r_V)
  return Verdict(jnp.where(accepted, token, y).astype(jnp.int32), accepted)


def block_k1(key, drafts_KxL, p_KxLxV, q_KxL1xV, cap=True) -> BlockVerdict:
  """Block verification of the first draft (Sun et al., ICLR 2025, Algorithm 2), written
  here from its equations: w_i = min(1, w_{i-1} q/p) (uncapped with cap=False),
  h_i = rho_i / (rho_i + 1 - w_i), h_L = w_L, tau the last i with eta_i <= h_i, then a
  draw from norm(max(w_tau q - p, 0)) or, at tau = L, from q."""
  stop_key, residual_key = jax.random.split(key)
  x_L, p_LxV, q_L1xV = drafts_KxL[0], p_KxLxV[0], q_KxL1xV[0]
  draft_len = x_L.shape[0]
  weights, stops = [jnp.float32(1.0)], [jnp.float32(1.0)]
  for i in range(draft_len):
    px = p_LxV[i, x_L[i]]
    w = weights[-1] * jnp.where(px > 0, q_L1xV[i, x_L[i]] / jnp.where(px > 0, px, 1.0), 0.0)
    w = jnp.minimum(w, 1.0) if cap else w
    weights.append(w)
    if i + 1 < draft_len:
      rho = jnp.sum(jnp.maximum(w * q_L1xV[i + 1] - p_LxV[i + 1], 0.0))
      stops.append(
        jnp.where(rho + 1 - w > 0, rho / jnp.where(rho + 1 - w > 0, rho + 1 - w, 1.0), 1.0)
      )
    else:
      stops.append(w)
  eta_L1 = jax.random.uniform(stop_key, (draft_len + 1,))
  tau = jnp.max(jnp.where(eta_L1 < jnp.stack(stops), jnp.arange(draft_len + 1), 0))
  w_tau = jnp.stack(weights)[tau]
  p_pad = jnp.concatenate([p_LxV, jnp.zeros_like(p_LxV[:1])])
  residual = acceptance.residual(w_tau * q_L1xV[tau], p_pad[tau])
  y = categorical(residual_key, jnp.where(tau == draft_len, q_L1xV[tau], residual))
  x_L1 = jnp.concatenate([x_L, jnp.zeros((1,), x_L.dtype)])
  tokens = jnp.where(jnp.arange(draft_len + 1) < tau, x_L1, 0).at[tau].set(y)
  return BlockVerdict(tokens.astype(jnp.int32), (tau + 1).astype(jnp.int32), None)


def gbv_bonus_from_draft(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> BlockVerdict:
  """ "gbv" whose bonus token (after a fully accepted path) is drawn from the draft's last
  distribution instead of the target's."""
  verdict_key, bonus_key = jax.random.split(key)
  verdict = block.verify_paths(verdict_key, drafts_KxL, p_KxLxV, q_KxL1xV)
  draft_len = drafts_KxL.shape[1]
  wrong = categorical(bonus_key, p_KxLxV[0, draft_len - 1])
  tokens = verdict.tokens_L1.at[draft_len].set(
    jnp.where(verdict.num_tokens == draft_len + 1, wrong, verdict.tokens_L1[draft_len])
  )
  return BlockVerdict(tokens, verdict.num_tokens, verdict.survivors_L1)


def kseq_mixed_with_a_wrong_law(key, drafts_K, p_V, q_V, valid_K, weight=0.01) -> Verdict:
  """K-SEQ whose token is, with probability `weight`, the target's least likely token of
  positive probability (a wrong law at total variation 1 - q_min from q) instead."""
  verify_key, mix_key = jax.random.split(key)
  good = verify.kseq_verdict(verify_key, drafts_K, p_V, q_V, valid_K, rho_mode="star",
                              rho_value=0.0)  # fmt: skip
  least = jnp.argmin(jnp.where(q_V > 0, q_V, jnp.inf))
  wrong = jax.random.uniform(mix_key) < weight
  return Verdict(jnp.where(wrong, least, good.token).astype(jnp.int32), good.accepted & ~wrong)


BROKEN = {
  "kseq rho = 0.97 rho*": (kseq_rho_below_star, "token", ("iid",), None),
  "sd residual without 10% of p": (sd_residual_short, "token", ("iid",), 1),
  "rrs updated with p": (rrs_updated_with_p, "token", ("wor",), None),
  "gbv bonus from the draft": (gbv_bonus_from_draft, "block", ("iid",), None),
  "block, weights uncapped": (functools.partial(block_k1, cap=False), "block", ("iid",), 1),
  "kseq, 2% of a wrong law": (
    functools.partial(kseq_mixed_with_a_wrong_law, weight=0.02),
    "token",
    ("iid",),
    None,
  ),
  "kseq, 1% of a wrong law": (kseq_mixed_with_a_wrong_law, "token", ("iid",), None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BROKEN))
def test_the_default_mode_rejects_every_class_of_broken_verifier(name):
  fn, level, laws, max_drafts = BROKEN[name]
  report = harness.check_verifier(fn, level=level, laws=laws, max_drafts=max_drafts, name=name,
                                  **_LAW)  # fmt: skip
  assert not report.passed, report.markdown()
  print(report.markdown())


@pytest.mark.slow
def test_block_verification_written_from_its_equations_passes():
  """The control of the uncapped variant: the same function with capped weights (the
  registered methods are the other controls: tests/workbench/test_harness.py)."""
  report = harness.check_verifier(
    block_k1, level="block", laws=("iid",), max_drafts=1, alpha=stats.ALPHA, **_LAW
  )
  stats._count += 1
  assert report.passed, report.markdown()
