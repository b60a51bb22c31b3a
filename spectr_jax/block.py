"""Block-level verification of speculative drafts (derivation: docs/BLOCK_VERIFICATION.md).

Token-level verifiers (`spectr_jax.verify`) decide position by position; these decide over
the whole block. Index convention as `methods.verify_drafts`: p[i, t] = p(. | h, d_i[:t]),
q[i, t] = q(. | h, d_i[:t]); q[i, L] is the bonus distribution after a full draft.

Methods of `block_verify` (`block_plan` is the part decided before any random draw):
  "block" (K = 1): Sun et al.'s block verification (arXiv 2403.10444, Algorithm 2).
  "gbv" (K >= 1, `verify_paths`): one path chosen depth by depth by the optimal
    verifier's selection (`optimal.select_draft`), then "block" along it with the
    selection's law r_t in place of p. At L = 1 it is the token-level optimal verifier.
  "gbv_tp" (K >= 1, `verify_tp_paths`): Thomas & Pal's rule (arXiv 2602.16961). The path
    is the largest in the `ratio_rank` order, then "block" runs with `skewed_law` for p.
With K = 1 both multi-path rules are "block", with the same draws.

Every token is drawn with `sampling.categorical`. All functions are pure and jit/vmap-able
with static shapes; the depths are unrolled in Python. Only "gbv" at K >= 2 has
data-dependent loops: those of the `optimal` plans it builds.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import acceptance, checks, optimal
from spectr_jax.sampling import categorical
from spectr_jax.verdict import BlockVerdict

__all__ = [
  "BlockPlan",
  "block_plan",
  "block_verify",
  "ratio_rank",
  "skewed_law",
  "verify_paths",
  "verify_tp_paths",
]


class BlockPlan(NamedTuple):
  """Everything block verification decides before its random draws (one block).

  path_L: the verified path Z (tokens). draft_L1xV: the law Z's token was drawn from at
  each depth (p for "block", the selection law r for "gbv", the skewed law s for
  "gbv_tp"; row L is unused).
  target_L1xV: q(. | Z^t) for t = 0..L. weight_L1: w_0..w_L. stop_L1: h_0..h_L
  (h_0 = 1: tau = 0 when no later index succeeds). survivors_L1: paths agreeing with Z^t
  at depth t (0 at t = L). rep: a path index equal to Z.
  """

  path_L: jax.Array
  draft_L1xV: jax.Array
  target_L1xV: jax.Array
  weight_L1: jax.Array
  stop_L1: jax.Array
  survivors_L1: jax.Array
  rep: jax.Array


def block_plan(drafts_KxL, p_KxLxV, q_KxL1xV, select, state) -> BlockPlan:
  """The selected path and the weights and stop probabilities of block verification along
  it, against the law each of its tokens was drawn from.

  Args:
    drafts_KxL, p_KxLxV, q_KxL1xV: as in `block_verify`.
    select: the path selection, `select(t, x_K, alive_K, p_V, q_V, state) -> (index,
      law_V, state)`: at depth t, of the tokens x_K of the paths alive_K that agree with
      the selected prefix (they share p_V, q_V), x_K[index] is chosen; law_V is the law
      of that choice given the selected prefix alone.
    state: the selection's carry at the root.

  Returns:
    The `BlockPlan`.
  """
  num_drafts, draft_len = drafts_KxL.shape
  alive_K = jnp.ones((num_drafts,), bool)
  weight = jnp.float32(1.0)
  path, draft_rows, target_rows, weights, survivors = [], [], [], [weight], []
  for t in range(draft_len):
    # Surviving paths agree on Z^t, so they share p and q at depth t.
    rep = jnp.argmax(alive_K)
    p_V, q_V = p_KxLxV[rep, t], q_KxL1xV[rep, t]
    k = jnp.sum(alive_K)
    x_K = drafts_KxL[:, t]
    index, r_V, state = select(t, x_K, alive_K, p_V, q_V, state)
    z = x_K[index]
    r_z = r_V[z]
    weight = jnp.minimum(1.0, weight * jnp.where(r_z > 0, q_V[z] / jnp.where(r_z > 0, r_z, 1.0), 0))
    path.append(z)
    draft_rows.append(r_V)
    target_rows.append(q_V)
    weights.append(weight)
    survivors.append(k)
    alive_K = alive_K & (x_K == z)
  rep = jnp.argmax(alive_K)
  target_rows.append(q_KxL1xV[rep, draft_len])
  draft_rows.append(jnp.zeros_like(q_KxL1xV[rep, draft_len]))
  survivors.append(jnp.int32(0))
  draft_L1xV = jnp.stack(draft_rows)
  target_L1xV = jnp.stack(target_rows)
  weight_L1 = jnp.stack(weights)
  # rho_i = sum_x max(w_i q(x | Z^i) - r(x | Z^i), 0); h_i = rho_i / (rho_i + 1 - w_i).
  rho_L1 = jnp.sum(jnp.maximum(weight_L1[:, None] * target_L1xV - draft_L1xV, 0.0), axis=-1)
  denom_L1 = rho_L1 + 1.0 - weight_L1
  stop_L1 = jnp.where(denom_L1 > 0, rho_L1 / jnp.where(denom_L1 > 0, denom_L1, 1.0), 0.0)
  stop_L1 = stop_L1.at[draft_len].set(weight_L1[draft_len]).at[0].set(1.0)
  return BlockPlan(
    jnp.stack(path).astype(jnp.int32),
    draft_L1xV,
    target_L1xV,
    weight_L1,
    stop_L1,
    jnp.stack(survivors).astype(jnp.int32),
    rep,
  )


def _optimal_selection(select_u_Lx2, num_drafts: int):
  """ "gbv"'s selection (`optimal.select_draft`, two uniforms in [0, 1) per depth); one
  survivor (always at K = 1) is taken with law p, no plan built."""

  def select(t, x_K, alive_K, p_V, q_V, state):
    index, r_V = optimal.select_draft(
      select_u_Lx2[t, 0], select_u_Lx2[t, 1], x_K, alive_K, p_V, q_V, max_k=num_drafts
    )
    return index, r_V, state

  return select


def ratio_rank(p_V, q_V):
  """The node's total order of "gbv_tp" and the draft mass below each token in it.

  Order: by the ratio q / p, ties broken by token id (the lower id ranks higher); tokens
  with p = 0 (never drafted, no draft mass: their place changes neither the choice nor a
  CDF) rank lowest, below ratio 0 (q = 0 < p).

  Returns:
    (rank_V, below_V): rank_V[t] in 0..V-1 (V - 1 = highest); below_V[t] = the sum of p
    over the tokens ranked below t (an exclusive cumulative sum: F(t) = below_V[t] + p[t]).
  """
  ids_V = jnp.arange(p_V.shape[-1])
  drafted_V = p_V > 0
  ratio_V = jnp.where(drafted_V, q_V / jnp.where(drafted_V, p_V, 1), -1)
  # Ascending: the lowest ratio first; among equal ratios the higher token id first (a
  # stable sort of the tokens in descending id order: one key, about 1.3x faster on CPU
  # than sorting by (ratio, -id)).
  _, order_V = jax.lax.sort((ratio_V[::-1], ids_V[::-1]), num_keys=1, is_stable=True)
  rank_V = jnp.zeros_like(ids_V).at[order_V].set(ids_V)
  # XLA may round each prefix sum in its own order (1 ulp out of order at V = 32k): the
  # running maximum makes the CDF monotone in the order by construction.
  cumulative_V = jax.lax.cummax(jnp.cumsum(p_V[order_V]))
  below_sorted_V = jnp.concatenate([jnp.zeros((1,), p_V.dtype), cumulative_V[:-1]])
  return rank_V, jnp.zeros_like(p_V).at[order_V].set(below_sorted_V)


def _h(a, b, num_drafts: int):
  """H(a, b) = sum_{i<K} a^i b^(K-1-i) by Horner's rule (non-negative terms only)."""
  h, b_power = jnp.ones_like(a), jnp.ones_like(b)
  for _ in range(num_drafts - 1):
    b_power = b_power * b
    h = a * h + b_power
  return h


def skewed_law(p_V, below_V, x, a, num_drafts: int):
  """The law of the next token of "gbv_tp"'s selected path given its prefix u.

  Args:
    p_V: p_u. below_V: the draft mass below each token (`ratio_rank`).
    x: x_u / C_u. a: (C_u - x_u) / C_u (docs/BLOCK_VERIFICATION.md, "gbv_tp";
      x = 1, a = 0 at the root).
    num_drafts: K.

  Returns:
    s_V = p_V H(a + x F, a + x (F - p)) / H(a + x, a), >= 0, summing to 1 (to rounding);
    p_V itself at K = 1. Where x underflows to 0 (a prefix rare beside those ranked
    below it), s_V = p_V, its limit.
  """
  low_V = a + x * below_V
  high_V = low_V + x * p_V
  den = _h(a + x, a, num_drafts)
  return p_V * _h(high_V, low_V, num_drafts) / jnp.where(den > 0, den, 1)


def _max_selection(num_drafts: int):
  """ "gbv_tp"'s selection: the present child of highest rank; the carry is (x, a) of the
  selected prefix (`skewed_law`), updated to the child v = u.z: with low = a + x F(z) - x
  p(z) and high = a + x F(z), x_v = x p(z) / high and a_v = low / high."""

  def select(t, x_K, alive_K, p_V, q_V, state):
    del t
    x, a = state
    rank_V, below_V = ratio_rank(p_V, q_V)
    index = jnp.argmax(jnp.where(alive_K, rank_V[x_K], -1))
    z = x_K[index]
    low = a + x * below_V[z]
    high = low + x * p_V[z]
    high = jnp.where(high > 0, high, 1)
    return index, skewed_law(p_V, below_V, x, a, num_drafts), (x * p_V[z] / high, low / high)

  return select


def _verify(key, drafts_KxL, p_KxLxV, q_KxL1xV, lexicographic: bool):
  num_drafts, draft_len = drafts_KxL.shape
  select_key, stop_key, residual_key = jax.random.split(key, 3)
  if lexicographic:
    select, state = _max_selection(num_drafts), (jnp.float32(1.0), jnp.float32(0.0))
  else:
    select_u_Lx2 = jax.random.uniform(select_key, (draft_len, 2))
    select, state = _optimal_selection(select_u_Lx2, num_drafts), ()
  plan = block_plan(drafts_KxL, p_KxLxV, q_KxL1xV, select, state)
  # tau = the last index whose stop test succeeds, eta_i < h_i with eta_i in [0, 1): a stop
  # probability of 0 never succeeds (even at eta = 0.0) and one of 1 always does; index 0
  # always succeeds (h_0 = 1).
  eta_L1 = jax.random.uniform(stop_key, (draft_len + 1,))
  index_L1 = jnp.arange(draft_len + 1)
  tau = jnp.max(jnp.where(eta_L1 < plan.stop_L1, index_L1, 0))
  w_tau = plan.weight_L1[tau]
  target_V = plan.target_L1xV[tau]
  residual_V = acceptance.residual(w_tau * target_V, plan.draft_L1xV[tau])
  # At tau = L the draft row is 0, so the residual is q(. | Z^L): the bonus token.
  y = categorical(residual_key, jnp.where(tau == draft_len, target_V, residual_V))
  path_L1 = jnp.concatenate([plan.path_L, jnp.zeros((1,), jnp.int32)])
  tokens_L1 = jnp.where(index_L1 < tau, path_L1, 0).at[tau].set(y)
  verdict = BlockVerdict(
    tokens_L1.astype(jnp.int32), (tau + 1).astype(jnp.int32), plan.survivors_L1
  )
  return verdict, plan


def verify_paths(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> BlockVerdict:
  """`block_verify` without its input checks (the block-level verify function of "gbv",
  and of "block" at K = 1, for use inside jit)."""
  return _verify(key, drafts_KxL, p_KxLxV, q_KxL1xV, False)[0]


def verify_tp_paths(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> BlockVerdict:
  """The block-level verify function of "gbv_tp" (`block_verify` without its checks)."""
  return _verify(key, drafts_KxL, p_KxLxV, q_KxL1xV, True)[0]


_verify_jit = jax.jit(_verify, static_argnames="lexicographic")
# The block-level methods of this module: their selection (lexicographic: "gbv_tp") and
# the most paths they take.
_METHODS = {"block": (False, 1), "gbv": (False, None), "gbv_tp": (True, None)}


def block_verify(key, drafts_KxL, p_KxLxV, q_KxL1xV, *, method: str = "gbv", return_plan=False):
  """Block verification of K draft paths of length L (see the module docstring).

  Args:
    key: PRNG key.
    drafts_KxL: int draft tokens, each path drawn from p (paths i.i.d.; they may share
      prefixes).
    p_KxLxV: draft distributions. q_KxL1xV: target distributions (index convention of
      `methods.verify_drafts`).
    method: "block" (K = 1), "gbv" or "gbv_tp" (any K; K = 1 is "block").
    return_plan: also return the `BlockPlan` (weights, stop probabilities, survivors).

  Returns:
    (tokens_L1, num_tokens[, plan]): `tokens_L1[:num_tokens]` are emitted (the rest 0),
    1 <= num_tokens <= L + 1; the emitted tokens follow the target's sequence law.
  """
  checks.shape("drafts_KxL", drafts_KxL, (None, None))
  if method not in _METHODS:
    raise ValueError(
      f"{method!r} is not a block-level method of spectr_jax.block: {tuple(_METHODS)}"
    )
  lexicographic, max_drafts = _METHODS[method]
  if max_drafts is not None and drafts_KxL.shape[0] > max_drafts:
    raise ValueError(f"method {method!r} verifies a single draft, got K = {drafts_KxL.shape[0]}")
  checks.block("block_verify", drafts_KxL, p_KxLxV, q_KxL1xV)
  verdict, plan = _verify_jit(key, drafts_KxL, p_KxLxV, q_KxL1xV, lexicographic=lexicographic)
  if return_plan:
    return verdict.tokens_L1, verdict.num_tokens, plan
  return verdict.tokens_L1, verdict.num_tokens
