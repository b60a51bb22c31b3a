"""Closed-form acceptance analysis of multi-draft verifiers on one position.

Everything here is exact (no sampling) and works on a single pair of distributions
`p_V` (draft) and `q_V` (target) with `k` i.i.d. drafts X_1..X_k ~ p:

- `rho_star`, `kseq_plan`: the K-SEQ construction (shared with `verify.kseq`);
- `kseq_acceptance`: P(Y in {X_1..X_k}) of K-SEQ for any split factor, its accept-branch
  probability and how far the residual goes negative for an invalid fixed rho;
- `specinfer_acceptance`: the same for SpecInfer's recursive rejection;
- `optimal_acceptance`: the optimal-transport bound alpha*(p, q, k).

For k drafts drawn WITHOUT replacement (the "wor" scheme, `drafting.distinct_tokens`):

- `rrs_acceptance`: the hit probability of recursive rejection without replacement (exact
  for k <= 2; for k >= 3 an unbiased estimate: no closed form at LLM vocabularies);
- `wor_bound`: the optimum max P(Y in S) of that drafting law (prefix search, see there).

For the k most likely tokens of p as drafts (the "topk" scheme, deterministic):

- `topk_acceptance_X`: q's mass on them, the hit probability of "certain" and the bound.

Functions are pure JAX (float32 unless x64 is enabled) and jit/vmap-able; `k` may be traced
(except where a function says it sets a loop's length).
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import checks, loops
from spectr_jax.sampling import categorical, top_tokens

RHO_MODES = ("star", "k", "fixed")
RHO_NAMES = ("star", "k")  # the strategies a config names (a number is the third)
# Evaluations of beta per rho* (`rho_star`): measured against the 32-step bisection on
# random and edge cases at V = 2..32000, 14 reach its acceptance at V >= 1000 and 18 also
# on small vocabularies (a few large kinks in beta, where the steps fall back to halving).
RHO_EVALS = 18
_EPS = float(np.finfo(np.float32).eps)
_HUGE, _TINY = 1e30, 1e-30


def check_rho(rho: Any) -> str | float:
  """A split factor as configs and cells store it: "star", "k" or a float >= 1.

  Raises:
    ValueError: anything else (a string other than those two, a non-finite number, a
      number below 1, a bool, a sequence).
  """
  if isinstance(rho, str):
    if rho not in RHO_NAMES:
      raise ValueError(f"unknown rho {rho!r}: expected 'star', 'k' or a number >= 1")
    return rho
  try:
    value = float(rho)
  except (TypeError, ValueError):
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}") from None
  if isinstance(rho, bool) or not (1.0 <= value < float("inf")):
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}")
  return value


def one_minus_pow(beta, k):
  """1 - (1 - beta)^k, accurate for small beta; beta is clipped to [0, 1]."""
  beta = jnp.clip(beta, 0.0, 1.0)
  return -jnp.expm1(k * jnp.log1p(-beta))


def residual(target_V, mass_V):
  """norm(max(target - mass, 0)): the law left after removing `mass_V` from `target_V`.

  Falls back to `target_V` itself where nothing is left (then it is never sampled).
  """
  left_V = jnp.maximum(target_V - mass_V, 0.0)
  total = jnp.sum(left_V, axis=-1, keepdims=True)
  return jnp.where(total > 0, left_V / jnp.where(total > 0, total, 1.0), target_V)


def overlap(p_V, q_V, rho=1.0):
  """beta(rho) = sum_x min(p(x), q(x) / rho)."""
  return jnp.sum(jnp.minimum(p_V, q_V / rho), axis=-1)


@jax.jit
def rho_star(p_V, q_V, k):
  """The smallest split factor in [1, k] with 1 - (1 - beta(rho))^k <= rho * beta(rho).

  g(rho) = rho beta(rho) - (1 - (1 - beta(rho))^k) is non-decreasing in rho, g(k) >= 0,
  and rho* is where it turns non-negative. `RHO_EVALS` evaluations of beta (one pass over
  V each: at 1, at k, then Chandrupatla's bracketing steps, inverse quadratic
  interpolation or bisection) on phi = log(1 - rho beta) - k log(1 - beta), the log of
  the two sides' ratio, which stays nearly linear where both sides are small (p close to
  q); the smallest evaluated rho where g >= 0 is returned, as the bisection's upper end
  was (a rho below rho* may break exactness, one above it only costs acceptance). No
  loop depends on the data: the evaluations are a fixed-trip `fori_loop`.

  Args:
    p_V: draft distribution.
    q_V: target distribution.
    k: number of drafts (int or traced int); values below 1 are treated as 1.

  Returns:
    rho*, a float32 scalar in [1, max(k, 1)]; exactly 1 where k <= 1 or g(1) >= 0.
  """
  k_f = jnp.maximum(jnp.asarray(k, jnp.float32), 1.0)

  def evaluate(rho):
    """-phi with the sign of g (>= 0 exactly where rho passes the validity test; one
    value decides both, as XLA may round two copies of g differently); where phi is not
    finite (rho beta >= 1: valid), a large value of that sign."""
    beta = jnp.clip(overlap(p_V, q_V, rho), 0.0, 1.0)
    valid = rho * beta - one_minus_pow(beta, k_f) >= 0
    phi = jnp.log1p(-jnp.minimum(rho * beta, 1.0)) - k_f * jnp.log1p(-beta)
    f = jnp.where(jnp.isfinite(phi), -phi, jnp.where(valid, _HUGE, -_HUGE))
    return jnp.where(valid, jnp.maximum(f, 0.0), jnp.minimum(f, -_TINY))

  def step(_, s):
    # Chandrupatla (1997): a is the newest point, b the bracket's other end (f of the
    # other sign), c the point a replaced; t places the next point between a and b.
    a, fa, b, fb, c, fc, t, hi = s
    x = a + t * (b - a)
    fx = evaluate(x)
    hi = jnp.where(fx >= 0, jnp.minimum(hi, x), hi)
    same = (fx >= 0) == (fa >= 0)
    a, fa, b, fb, c, fc = (
      x,
      fx,
      jnp.where(same, b, a),
      jnp.where(same, fb, fa),
      jnp.where(same, a, b),
      jnp.where(same, fa, fb),
    )
    best = jnp.where(jnp.abs(fa) < jnp.abs(fb), a, b)
    # Steps shorter than 2 ulps of the estimate are lengthened, so the bracket closes.
    t_min = jnp.minimum(2 * _EPS * best / jnp.abs(b - c), 0.5)
    xi, ph = (a - b) / (c - b), (fa - fb) / (fc - fb)
    iqi = (ph * ph < xi) & ((1 - ph) ** 2 < 1 - xi)
    t_iqi = fa / (fb - fa) * fc / (fb - fc) + (c - a) / (b - a) * fa / (fc - fa) * fb / (fc - fb)
    t = jnp.clip(jnp.where(iqi, t_iqi, 0.5), t_min, 1 - t_min)
    return a, fa, b, fb, c, fc, jnp.where(jnp.isfinite(t), t, 0.5), hi

  one = jnp.float32(1.0)
  f_one = evaluate(one)
  f_k = jnp.maximum(evaluate(k_f), 0.0)
  init = (k_f, f_k, one, f_one, k_f, f_k, jnp.float32(0.5), k_f)
  hi = loops.fori_loop(0, RHO_EVALS - 2, step, init)[-1]
  return jnp.where((f_one >= 0) | (k_f <= 1), one, hi)


class KSeqPlan(NamedTuple):
  """The K-SEQ construction for one position.

  rho: split factor used. m_V: min(p, q / rho). beta: sum of m_V.
  p_accept: P_A = 1 - (1 - beta)^k. accept_mass_V: A(x) = P_A / beta * m(x), the law of the
  accept branch's output (unnormalised). residual_V: q - A (negative entries mean that
  rho is invalid for (p, q, k)).
  """

  rho: jax.Array
  m_V: jax.Array
  beta: jax.Array
  p_accept: jax.Array
  accept_mass_V: jax.Array
  residual_V: jax.Array


def kseq_plan(p_V, q_V, k, rho_mode: str = "star", rho_value=None) -> KSeqPlan:
  """Computes the K-SEQ quantities for k drafts (k = 0 gives P_A = 0, residual q).

  Args:
    p_V, q_V: draft and target distributions.
    k: number of drafts (traced int allowed).
    rho_mode: "star" (rho*), "k" (rho = k) or "fixed" (`rho_value`, clipped to [1, k]).
    rho_value: the fixed split factor (scalar, may be traced) for rho_mode "fixed".
  """
  k_f = jnp.asarray(k, jnp.float32)
  k_safe = jnp.maximum(k_f, 1.0)
  if rho_mode == "star":
    rho = rho_star(p_V, q_V, k_safe)
  elif rho_mode == "k":
    rho = k_safe
  elif rho_mode == "fixed":
    rho = jnp.clip(jnp.asarray(rho_value, jnp.float32), 1.0, k_safe)
  else:
    raise ValueError(f"unknown rho mode {rho_mode!r}; expected one of {RHO_MODES}")
  m_V = jnp.minimum(p_V, q_V / rho)
  beta = jnp.clip(jnp.sum(m_V, axis=-1), 0.0, 1.0)
  p_accept = jnp.where(k_f > 0, one_minus_pow(beta, k_safe), 0.0)
  scale = jnp.where(beta > 0, p_accept / jnp.where(beta > 0, beta, 1.0), 0.0)
  accept_mass_V = scale * m_V
  return KSeqPlan(rho, m_V, beta, p_accept, accept_mass_V, q_V - accept_mass_V)


def split_rho(rho) -> tuple[str, jax.Array]:
  """Splits the public `rho` argument into a static mode and a (traceable) value.

  `rho` is "star", "k", or a number / scalar array (a fixed split factor), checked by
  `check_rho` (the one parser of rho) unless it is traced.
  """
  if isinstance(rho, jax.core.Tracer):
    return "fixed", jnp.asarray(rho, jnp.float32)
  if np.ndim(rho) != 0:
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}")
  value = check_rho(rho if isinstance(rho, str) else np.asarray(rho).item())
  if isinstance(value, str):
    return value, jnp.float32(0.0)
  return "fixed", jnp.float32(value)


class KSeqAcceptance(NamedTuple):
  """Exact acceptance of K-SEQ at one position.

  hit: P(Y in {X_1..X_k}) (accept branch plus residual draws that equal a draft).
  p_accept: P(accept branch). rho: split factor used.
  deficit: sum_x max(A(x) - q(x), 0), the mass by which the accept branch overshoots q;
    0 exactly when rho is valid (the output law is q), > 0 when it is not.
  """

  hit: jax.Array
  p_accept: jax.Array
  rho: jax.Array
  deficit: jax.Array

  @property
  def valid(self):
    return self.deficit <= 1e-6


def kseq_acceptance(p_V, q_V, k, rho="star") -> KSeqAcceptance:
  """Exact hit probability of K-SEQ with k i.i.d. drafts (see `KSeqAcceptance`).

  For an invalid fixed rho this describes what `verify.kseq` does: the residual is
  clipped at 0 and renormalised (so the output law is then not q).
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.num_drafts(k)
  mode, value = split_rho(rho)
  return _kseq_acceptance(p_V, q_V, k, value, rho_mode=mode)


@functools.partial(jax.jit, static_argnames="rho_mode")
def _kseq_acceptance(p_V, q_V, k, rho_value, *, rho_mode):
  plan = kseq_plan(p_V, q_V, k, rho_mode, rho_value)
  k_f = jnp.asarray(k, jnp.float32)
  residual_V = residual(q_V, plan.accept_mass_V)
  # Given that all k drafts were rejected, they are i.i.d. from (p - m) / (1 - beta).
  reject_mass = 1.0 - plan.beta
  rejected_V = jnp.where(
    reject_mass > 0, (p_V - plan.m_V) / jnp.where(reject_mass > 0, reject_mass, 1.0), 0.0
  )
  residual_hit = jnp.sum(residual_V * one_minus_pow(rejected_V, k_f), axis=-1)
  hit = plan.p_accept + (1.0 - plan.p_accept) * residual_hit
  deficit = jnp.sum(jnp.maximum(-plan.residual_V, 0.0), axis=-1)
  return KSeqAcceptance(hit, plan.p_accept, plan.rho, deficit)


def specinfer_residuals(p_V, q_V, num_drafts: int):
  """The deterministic chain of SpecInfer targets r_1 = q, r_{i+1} = norm(max(r_i - p, 0)).

  Returns r_{1..num_drafts+1} stacked (shape (num_drafts + 1) x V) and the per-stage
  acceptance probabilities beta_i = sum min(r_i, p) (shape num_drafts).
  """

  def stage(r_V, _):
    beta = jnp.sum(jnp.minimum(r_V, p_V))
    return residual(r_V, p_V), (r_V, beta)

  last, (rs, betas) = loops.scan(stage, q_V, None, length=num_drafts)
  return jnp.concatenate([rs, last[None]], axis=0), betas


def specinfer_acceptance(p_V, q_V, k):
  """Exact hit probability of SpecInfer's recursive rejection with k i.i.d. drafts.

  Stage i accepts its draft with probability beta_i = sum min(r_i, p), independently of the
  earlier rejected draft values, so P(accept) = 1 - prod_i (1 - beta_i). The final residual
  r_{k+1} is supported where r_k > p, where no rejected draft can lie, so the residual
  draw never hits a draft and the hit probability equals P(accept).

  Args:
    p_V, q_V: distributions. k: a Python int >= 1 (it sets the chain's length).
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.num_drafts(k)
  return _specinfer_acceptance(p_V, q_V, int(k))


@functools.partial(jax.jit, static_argnums=2)
def _specinfer_acceptance(p_V, q_V, k):
  _, betas = specinfer_residuals(p_V, q_V, k)
  return 1.0 - jnp.prod(1.0 - betas)


def optimal_acceptance(p_V, q_V, k):
  """The optimal-transport bound alpha*(p, q, k) = min_G q(G) + 1 - p(G)^k.

  The minimising G is a prefix of the tokens sorted by p/q descending (tokens with q = 0
  and p > 0 first), so alpha* costs one sort.
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.num_drafts(k)
  return _optimal_acceptance(p_V, q_V, k)


@jax.jit
def _optimal_acceptance(p_V, q_V, k):
  k_f = jnp.asarray(k, p_V.dtype)
  ratio_V = jnp.where(
    q_V > 0, p_V / jnp.where(q_V > 0, q_V, 1.0), jnp.where(p_V > 0, jnp.inf, -1.0)
  )
  order_V = jnp.argsort(-ratio_V, stable=True)
  p_cum = jnp.cumsum(p_V[order_V])
  q_cum = jnp.cumsum(q_V[order_V])
  cuts = q_cum + 1.0 - jnp.clip(p_cum, 0.0, 1.0) ** k_f
  return jnp.minimum(jnp.min(cuts), 1.0)


def _check_X(p_XxV, q_XxV, k) -> None:
  """Shapes and k only: the batched forms take model outputs, too many to check on host."""
  checks.shape("p_XxV", p_XxV, (None, None))
  checks.shape("q_XxV", q_XxV, np.shape(p_XxV))
  checks.num_drafts(k)


@functools.partial(jax.jit, static_argnames="rho_mode")
def _kseq_X(p_XxV, q_XxV, k, rho_value, *, rho_mode):
  return jax.vmap(lambda p_V, q_V: _kseq_acceptance(p_V, q_V, k, rho_value, rho_mode=rho_mode))(
    p_XxV, q_XxV
  )


def kseq_acceptance_X(p_XxV, q_XxV, k, rho="star") -> KSeqAcceptance:
  """`kseq_acceptance` at X positions at once: each field of the result is [X].

  Args:
    p_XxV, q_XxV: draft and target distributions at X positions.
    k: number of drafts (traced).
    rho: "star", "k" or a number (see `split_rho`).
  """
  _check_X(p_XxV, q_XxV, k)
  mode, value = split_rho(rho)
  return _kseq_X(p_XxV, q_XxV, k, value, rho_mode=mode)


def overlap_X(p_XxV, q_XxV, k: int = 1) -> jax.Array:
  """Single-draft acceptance sum_x min(p(x), q(x)) at X positions: [X] (k must be 1)."""
  _check_X(p_XxV, q_XxV, k)
  if int(k) != 1:
    raise ValueError(f"single-draft acceptance takes k = 1, got {k}")
  return overlap(jnp.asarray(p_XxV), jnp.asarray(q_XxV))


@functools.partial(jax.jit, static_argnums=2)
def _specinfer_X(p_XxV, q_XxV, k):
  return jax.vmap(lambda p_V, q_V: _specinfer_acceptance(p_V, q_V, k))(p_XxV, q_XxV)


def specinfer_acceptance_X(p_XxV, q_XxV, k: int) -> jax.Array:
  """`specinfer_acceptance` at X positions at once: [X]."""
  _check_X(p_XxV, q_XxV, k)
  return _specinfer_X(p_XxV, q_XxV, int(k))


@functools.partial(jax.jit, static_argnums=2)
def _optimal_X(p_XxV, q_XxV, k):
  return jax.vmap(_optimal_acceptance, (0, 0, None))(p_XxV, q_XxV, k)


def optimal_acceptance_X(p_XxV, q_XxV, k: int) -> jax.Array:
  """`optimal_acceptance` (the bound alpha*) at X positions at once: [X]."""
  _check_X(p_XxV, q_XxV, k)
  return _optimal_X(p_XxV, q_XxV, int(k))


class RRSAcceptance(NamedTuple):
  """Hit probability of recursive rejection without replacement at one position.

  hit: P(Y in S) (= P(accept): a rejected draft is never the final draw); exact for
    k <= 2 and where at most k tokens have draft mass, an unbiased estimate otherwise.
  stderr: its standard error over the sampled histories (0 where it is exact).
  """

  hit: jax.Array
  stderr: jax.Array


def _excess_fn(p_V, q_V):
  """Z(lam) = sum (q - lam p)^+ for any array of lam, by one sort of q/p and prefix sums."""
  ratio_V = jnp.where(p_V > 0, q_V / jnp.where(p_V > 0, p_V, 1.0), jnp.where(q_V > 0, jnp.inf, 0.0))
  order_V = jnp.argsort(ratio_V)
  zero = jnp.zeros((1,), p_V.dtype)
  # Masses of the tokens above each sorted position (summed from the top: no cancellation).
  p_above_V1 = jnp.concatenate([jnp.cumsum(p_V[order_V][::-1])[::-1], zero])
  q_above_V1 = jnp.concatenate([jnp.cumsum(q_V[order_V][::-1])[::-1], zero])
  ratio_s = ratio_V[order_V]

  def excess(lam):
    above = jnp.searchsorted(ratio_s, lam, side="right")
    return jnp.maximum(q_above_V1[above] - lam * p_above_V1[above], 0.0)

  return excess


def _rrs_rejected(key, p_V, q_V, k: int, excess):
  """P(all k drafts rejected), given drafts 1..k-2 of one history drawn from their law
  given rejection, averaged exactly over draft k - 1.

  With Z = `excess`, the targets of `verify.rrs_verdict` are r_i = (q - lam_i p)^+ /
  Z(lam_i), with lam_1 = 0 and lam_{i+1} = lam_i + Z(lam_i) / m_i, m_i the draft mass not
  yet drawn; stage i rejects with probability Z(lam_{i+1}) / Z(lam_i), so all k are
  rejected with probability Z(lam_{k+1}), which depends on the drafts only through
  m_2..m_k. A rejected draft i is distributed as (p_i - r_i)^+.
  """
  removed_V = jnp.zeros(p_V.shape, bool)

  def left(removed_V):
    left_V = jnp.where(removed_V, 0.0, p_V)
    mass = jnp.sum(left_V)  # summed: no cancellation
    return left_V, jnp.where(mass > 0, mass, 1.0)

  def rejected(lam, removed_V):
    left_V, m = left(removed_V)
    z = excess(lam)
    r_V = jnp.maximum(q_V - lam * p_V, 0.0) / jnp.where(z > 0, z, 1.0)
    return jnp.maximum(left_V / m - r_V, 0.0), left_V, m, lam + z / m

  if k == 1:
    return excess(excess(jnp.zeros(())) / left(removed_V)[1])

  def stage(carry, key):
    lam, removed_V = carry
    weight_V, _, _, lam_next = rejected(lam, removed_V)
    # With no rejection possible, Z is 0 from here on and x does not matter.
    x = categorical(key, weight_V)
    return (lam_next, removed_V.at[x].set(True)), None

  init = (jnp.zeros((), p_V.dtype), removed_V)
  (lam, removed_V), _ = loops.scan(stage, init, jax.random.split(key, k - 2))
  weight_V, left_V, m, lam_next = rejected(lam, removed_V)
  # The mass left after drawing x, m - p(x), summed without x for the largest token (the
  # only one where the difference can cancel).
  rest_V = m - left_V
  top = jnp.argmax(left_V)
  rest_V = rest_V.at[top].set(jnp.sum(left_V.at[top].set(0.0)))
  last_V = excess(lam_next + excess(lam_next) / jnp.where(rest_V > 0, rest_V, 1.0))
  total = jnp.sum(weight_V)
  return jnp.sum(weight_V * last_V) / jnp.where(total > 0, total, 1.0)


def _rrs_acceptance(key, p_V, q_V, k: int, num_histories: int) -> RRSAcceptance:
  excess = _excess_fn(p_V, q_V)
  histories = num_histories if k >= 3 else 1  # only drafts 1..k-2 are sampled
  rejected_M = jax.vmap(_rrs_rejected, (0, None, None, None, None))(
    jax.random.split(key, histories), p_V, q_V, k, excess
  )
  # At most k tokens with mass: every one is drafted and Y hits a draft iff it is one.
  whole = jnp.sum(p_V > 0) <= k
  hit = jnp.where(whole, jnp.sum(jnp.where(p_V > 0, q_V, 0.0)), 1.0 - jnp.mean(rejected_M))
  stderr = jnp.std(rejected_M, ddof=1) / math.sqrt(histories) if histories > 1 else 0.0
  return RRSAcceptance(jnp.clip(hit, 0.0, 1.0), jnp.where(whole, 0.0, stderr))


def rrs_acceptance(p_V, q_V, k: int, *, key=None, num_histories: int = 8) -> RRSAcceptance:
  """Hit probability of recursive rejection without replacement (`verify.rrs_verdict`)
  with k drafts drawn without replacement.

  Exact for k <= 2 and where at most k tokens have draft mass (one sort and V binary
  searches). For k >= 3 an unbiased estimate: each of `num_histories` sampled histories
  of rejected drafts 1..k-2 contributes its exact probability that all k are rejected,
  averaged over draft k - 1 (see `_rrs_rejected`); on LLM-like pairs at V = 4096 a
  history's spread is about 0.001-0.01. Histories miss rare draws, so a position where a
  rare draft changes the outcome much is estimated noisily (the stderr then understates
  it); means over many positions are unaffected. An exact form sums over the ordered
  (k - 2)-tuples of drafts; tests/wor_reference.py enumerates them.

  Args:
    p_V, q_V: distributions. k: a Python int >= 1 (it sets the scan's length).
    key: PRNG key of the histories (default: key 0, so the result is deterministic).
    num_histories: M, histories averaged (k >= 3).
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.num_drafts(k)
  key = jax.random.key(0) if key is None else key
  return _rrs_jit(key, p_V, q_V, int(k), int(num_histories))


_rrs_jit = jax.jit(_rrs_acceptance, static_argnums=(3, 4))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _rrs_X(p_XxV, q_XxV, k, num_histories):
  keys_X = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(0), jnp.arange(p_XxV.shape[0]))
  return jax.lax.map(
    lambda a: _rrs_acceptance(*a, k, num_histories), (keys_X, p_XxV, q_XxV), batch_size=64
  )


def rrs_acceptance_X(p_XxV, q_XxV, k: int, num_histories: int = 8) -> RRSAcceptance:
  """`rrs_acceptance` at X positions at once (position x uses fold_in(key 0, x)):
  fields [X]."""
  _check_X(p_XxV, q_XxV, k)
  return _rrs_X(p_XxV, q_XxV, int(k), int(num_histories))


# The trapezoid rule in log time for `_wor_bound`: nodes t = exp(s), s from log 1e-6 in
# 211 steps of 0.5 (to t = 4.6e39): every complement mass r >= 1e-38 (float32's smallest
# normal) has r t >= 40 at the last node, so the integrand vanishes at both ends and the
# rule converges geometrically: within 7e-8 of the exact enumeration in float64 (3e-11
# at step 0.35), below float32's 1e-6 at V = 4096 (tests/verify/test_wor.py).
_RACE_LOG_T0 = math.log(1e-6)
_RACE_STEP = 0.5
_RACE_NODES = 212


def _inside_closed_form(p_s, k: int):
  """P(S subset G) for every prefix G of p_s, k <= 2 drafts (the prefix sums of p(G) for
  k = 1 or a one-token support; for two, sum over x in G of p(x) (p(G) - p(x)) / (1 - p(x)),
  with the one token that may have p(x) > 1/2 summed apart so that 1 - p(x) never
  cancels)."""
  p_cum = jnp.cumsum(p_s)
  if k == 1:
    return p_cum
  top = jnp.argmax(p_s)
  is_top_V = jnp.arange(p_s.shape[-1]) == top
  rest_s = jnp.where(is_top_V, 0.0, p_s)
  share_V = rest_s / (1.0 - rest_s)
  others = jnp.sum(rest_s)  # 1 - p(top), summed
  rest_cum = jnp.cumsum(rest_s)
  # Drafts 1 and 2 both in G: x = a token other than top, then any other token of G ...
  pairs = p_cum * jnp.cumsum(share_V) - jnp.cumsum(rest_s * share_V)
  # ... or x = top (once in G), then any other token of G.
  pairs += jnp.where(
    jnp.cumsum(is_top_V) > 0, p_s[top] * rest_cum / jnp.where(others > 0, others, 1.0), 0.0
  )
  return jnp.where(jnp.sum(p_s > 0) >= 2, pairs, p_cum)


def _cut_minimum(q_s, inside_V):
  """min(1, min over prefixes of q(G) + 1 - P(S subset G))."""
  return jnp.clip(jnp.min(jnp.cumsum(q_s) + 1.0 - jnp.clip(inside_V, 0.0, 1.0)), 0.0, 1.0)


def _wor_bound(p_V, q_V, k: int):
  """min over prefixes G of the q/p-ascending order of q(G) + 1 - P(S subset of G).

  P(S subset G), S = the k drafts without replacement (k cut to the support size s): in
  closed form for k <= 2 (`_inside_closed_form`); otherwise by the exponential race:
  Gumbel-top-k is the arrival order of independent clocks T_x ~ Exp(p(x)), so S is
  inside G iff k clocks of G ring before the first clock of the rest, which rings at
  rate r = p(not G):

    P(S subset G) = int_0^inf r e^(-r t) P(N_G(t) >= k) dt,

  N_G(t) ~ Poisson-binomial with success probabilities 1 - e^(-p(x) t), x in G. One scan
  over the sorted tokens grows G and keeps P(N_G(t) = j), j < k, at every node t (the
  integral by `_RACE_NODES` nodes; draft probabilities below 1e-38 fall outside them).
  """
  ratio_V = jnp.where(p_V > 0, q_V / jnp.where(p_V > 0, p_V, 1.0), jnp.inf)
  order_V = jnp.argsort(ratio_V, stable=True)
  p_s, q_s = p_V[order_V], q_V[order_V]
  if k <= 2:
    return _cut_minimum(q_s, _inside_closed_form(p_s, k))
  after_V = jnp.concatenate([jnp.cumsum(p_s[::-1])[::-1][1:], jnp.zeros((1,), p_s.dtype)])
  # log t at the nodes: t itself passes float32's range, so rates times t are formed as
  # exp(log rate + log t) (0 for a rate of 0, inf where they are large: never NaN).
  s_Q = _RACE_LOG_T0 + _RACE_STEP * jnp.arange(_RACE_NODES, dtype=p_s.dtype)
  counted_K = jnp.arange(k) < jnp.minimum(k, jnp.sum(p_V > 0))

  def grow(c_QxK, inputs):
    p_x, r = inputs
    f_Q = -jnp.expm1(-jnp.exp(jnp.log(p_x) + s_Q))
    shifted_QxK = jnp.pad(c_QxK[:, :-1], ((0, 0), (1, 0)))
    c_QxK = c_QxK * (1.0 - f_Q)[:, None] + shifted_QxK * f_Q[:, None]
    ring_Q = 1.0 - jnp.sum(jnp.where(counted_K, c_QxK, 0.0), axis=1)
    log_rt_Q = jnp.log(r) + s_Q
    weight_Q = jnp.exp(log_rt_Q - jnp.exp(log_rt_Q))  # r t e^(-r t)
    tail = ring_Q[-1] * jnp.exp(-jnp.exp(log_rt_Q[-1]))
    inside = _RACE_STEP * jnp.sum(weight_Q * ring_Q) + tail
    return c_QxK, jnp.where(r > 0, inside, 1.0)

  c_QxK = jnp.zeros(s_Q.shape + (k,), p_s.dtype).at[:, 0].set(1.0)
  _, inside_V = loops.scan(grow, c_QxK, (p_s, after_V))
  return _cut_minimum(q_s, inside_V)


def wor_bound(p_V, q_V, k: int):
  """The optimal hit probability for k drafts drawn without replacement from p (SPEC 5):
  max P(Y in S) = min over token sets G of q(G) + 1 - P(S subset of G), searched over the
  prefixes G of the tokens sorted by q/p ascending only.

  That the minimiser is such a prefix is NOT proven: it held on every small case checked
  against the minimum over all 2^V sets (tests/verify/test_wor.py: k = 1..5, V <= 5, 200 random
  cases each and the edge cases, sparse ones included). Where it failed, this would be
  the minimum over the prefix cuts, an upper bound of the optimum. P(S subset G) is in
  closed form for k <= 2, a numerical integral otherwise (`_wor_bound`), within 1e-6 in
  float32. Cost: a sort and prefix sums for k <= 2; else V steps of 212 x k products.

  Args:
    p_V, q_V: distributions. k: a Python int >= 1 (the state size of the scan).
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.num_drafts(k)
  return _wor_jit(p_V, q_V, int(k))


_wor_jit = jax.jit(_wor_bound, static_argnums=2)


@functools.partial(jax.jit, static_argnums=2)
def _wor_X(p_XxV, q_XxV, k):
  return jax.vmap(_wor_bound, (0, 0, None))(p_XxV, q_XxV, k)


def wor_bound_X(p_XxV, q_XxV, k: int) -> jax.Array:
  """`wor_bound` (the bound of drafts without replacement) at X positions at once: [X]."""
  _check_X(p_XxV, q_XxV, k)
  return _wor_X(p_XxV, q_XxV, int(k))


@functools.partial(jax.jit, static_argnums=2)
def _topk_X(p_XxV, q_XxV, k):
  def one(p_V, q_V):
    tokens_K, valid_K = top_tokens(p_V, k)
    return jnp.sum(jnp.where(valid_K, q_V[tokens_K], 0.0))

  return jax.vmap(one)(p_XxV, q_XxV)


def topk_acceptance_X(p_XxV, q_XxV, k: int) -> jax.Array:
  """q's mass on the k most likely tokens of p (`top_tokens`), at X positions: [X].

  The hit probability of "certain" on the "topk" scheme's k children of a node. It is
  also that law's bound: an exact verifier emits Y ~ q, a hit only where Y is a draft.
  """
  _check_X(p_XxV, q_XxV, k)
  return _topk_X(p_XxV, q_XxV, int(k))


def compare_methods(p_V, q_V, k: int) -> dict[str, float]:
  """Exact hit probability of every verifier at one position, with k drafts.

  Returns a dict with "single" (one draft), "kseq-star", "kseq-k", "specinfer" and
  "optimal" (the bound alpha*).
  """
  return {
    "single": float(overlap(p_V, q_V)),
    "kseq-star": float(kseq_acceptance(p_V, q_V, k, rho="star").hit),
    "kseq-k": float(kseq_acceptance(p_V, q_V, k, rho="k").hit),
    "specinfer": float(specinfer_acceptance(p_V, q_V, k)),
    "optimal": float(optimal_acceptance(p_V, q_V, k)),
  }
