"""Closed-form acceptance analysis of multi-draft verifiers on one position.

Everything here is exact (no sampling) and works on a single pair of distributions
`p_V` (draft) and `q_V` (target) with `k` i.i.d. drafts X_1..X_k ~ p:

- `rho_star`, `kseq_plan`: the K-SEQ construction (shared with `verify.kseq`);
- `kseq_acceptance`: P(Y in {X_1..X_k}) of K-SEQ for any split factor, its accept-branch
  probability and how far the residual goes negative for an invalid fixed rho;
- `specinfer_acceptance`: the same for SpecInfer's recursive rejection;
- `optimal_acceptance`: the optimal-transport bound alpha*(p, q, k).

Functions are pure JAX (float32 unless x64 is enabled) and jit/vmap-able; `k` may be traced.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import checks, methods

RHO_MODES = ("star", "k", "fixed")
_BISECTION_ITERS = 32


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

  The left side minus the right side is non-increasing in rho, so a fixed number of
  bisection steps on [1, k] finds the root; the upper end of the bracket is returned
  (a rho below rho* may break exactness, one above it only costs acceptance).

  Args:
    p_V: draft distribution.
    q_V: target distribution.
    k: number of drafts (int or traced int); values below 1 are treated as 1.

  Returns:
    rho*, a float32 scalar in [1, max(k, 1)].
  """
  k_f = jnp.maximum(jnp.asarray(k, jnp.float32), 1.0)

  def excess(rho):
    beta = overlap(p_V, q_V, rho)
    return one_minus_pow(beta, k_f) - rho * beta

  def bisect(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    below = excess(mid) <= 0
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  one = jnp.float32(1.0)
  _, hi = jax.lax.fori_loop(0, _BISECTION_ITERS, bisect, (one, k_f))
  return jnp.where(excess(one) <= 0, one, hi)


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
  `methods.check_rho` (the one parser of rho) unless it is traced.
  """
  if isinstance(rho, jax.core.Tracer):
    return "fixed", jnp.asarray(rho, jnp.float32)
  if np.ndim(rho) != 0:
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}")
  value = methods.check_rho(rho if isinstance(rho, str) else np.asarray(rho).item())
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

  last, (rs, betas) = jax.lax.scan(stage, q_V, None, length=num_drafts)
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
