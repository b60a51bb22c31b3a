"""Block-level verification of speculative drafts (design and proofs: docs/BLOCK_VERIFICATION.md).

Token-level verifiers (`spectr_jax.verify`) decide position by position. These decide over
the whole block. Index convention as `verify.verify_block`: p[i, t] = p(. | h, d_i[:t]),
q[i, t] = q(. | h, d_i[:t]); q[i, L] is the bonus distribution after a full draft.

"block" (K = 1): block verification, Sun et al. (ICLR 2025, arXiv 2403.10444), Algorithm 2.
With the draft X_1..X_L and w_0 = 1:

  w_i = min(1, w_{i-1} q(X_i | X^{i-1}) / p(X_i | X^{i-1}))                   (i = 1..L)
  rho_i = sum_x max(w_i q(x | X^i) - p(x | X^i), 0)                            (i < L)
  h_i = rho_i / (rho_i + 1 - w_i)  (i < L),   h_L = w_L
  tau = max {i >= 1 : eta_i <= h_i} (0 if none), eta_1..eta_L i.i.d. U(0, 1)
  emit X^tau, then Y ~ norm(max(w_tau q(. | X^tau) - p(. | X^tau), 0)), or Y ~ q(. | X^L)
  when tau = L.

P(tau >= i | X^i) = w_i, so E[tokens] = 1 + sum_i E[w_i]: never below token-level "sd"
(whose per-prefix acceptance is prod_j min(1, q/p) <= w_i).

"gbv" (K >= 1): greedy multi-path block verification. Thomas & Pal (arXiv 2602.16961)
define GBV; the text of their algorithm was not available to us, so this rule is derived
here (proof in the doc) and may differ from theirs. It selects one draft path greedily,
depth by depth, and block-verifies it against the law of the selection:

  at depth t the k_t paths that agree with the selected prefix Z^t survive; Z_{t+1} is
  chosen among their tokens by the OT-optimal per-position selection of
  `spectr_jax.optimal` (`optimal.select_draft`), whose law given the history is
  r_t = optimal_plan(p(. | Z^t), q(. | Z^t), k_t).r_V (r_t = p(. | Z^t) where k_t = 1, no
  plan built); run "block" on Z with r_t in place of p (r_t depends only on the history,
  known before Z_{t+1} is drawn).

At L = 1 this is the token-level optimal verifier (accept sum min(r, q) = alpha*).
With K = 1, r = p and "gbv" is "block" (with the same randomness).

Every token is drawn with `sampling.categorical`. All functions are pure, jit/vmap-able
with static shapes.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import acceptance, checks, methods, optimal
from spectr_jax.methods import BlockVerdict
from spectr_jax.sampling import categorical

__all__ = [
  "BlockPlan",
  "block_plan",
  "block_verify",
  "verify_paths",
]


class BlockPlan(NamedTuple):
  """Everything block verification decides before its random draws (one block).

  path_L: the verified path Z (tokens). draft_L1xV: the law Z's token was drawn from at
  each depth (p for "block", the selection law r for "gbv"; row L is unused).
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


def block_plan(drafts_KxL, p_KxLxV, q_KxL1xV, select_u_Lx2) -> BlockPlan:
  """Path selection and weights of "gbv" (= "block" for K = 1), given the selection
  uniforms `select_u_Lx2` in [0, 1) (two per depth, see `optimal.select`)."""
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
    # One survivor (always at K = 1): its law is p, and no plan is built.
    index, r_V = optimal.select_draft(
      select_u_Lx2[t, 0], select_u_Lx2[t, 1], x_K, alive_K, p_V, q_V, max_k=num_drafts
    )
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


def _verify(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> tuple[BlockVerdict, BlockPlan]:
  draft_len = drafts_KxL.shape[1]
  select_key, stop_key, residual_key = jax.random.split(key, 3)
  plan = block_plan(drafts_KxL, p_KxLxV, q_KxL1xV, jax.random.uniform(select_key, (draft_len, 2)))
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
  return _verify(key, drafts_KxL, p_KxLxV, q_KxL1xV)[0]


_verify_jit = jax.jit(_verify)


def block_verify(key, drafts_KxL, p_KxLxV, q_KxL1xV, *, method: str = "gbv", return_plan=False):
  """Block verification of K draft paths of length L (see the module docstring).

  Args:
    key: PRNG key.
    drafts_KxL: int draft tokens, each path drawn from p (paths i.i.d.; they may share
      prefixes).
    p_KxLxV: draft distributions. q_KxL1xV: target distributions (index convention of
      `verify.verify_block`).
    method: "block" (K = 1) or "gbv" (any K; K = 1 is "block").
    return_plan: also return the `BlockPlan` (weights, stop probabilities, survivors).

  Returns:
    (tokens_L1, num_tokens[, plan]): `tokens_L1[:num_tokens]` are emitted (the rest 0),
    1 <= num_tokens <= L + 1; the emitted tokens follow the target's sequence law.
  """
  checks.shape("drafts_KxL", drafts_KxL, (None, None))
  if methods.get(method).level != "block":
    raise ValueError(f"{method!r} is not a block-level method; expected 'block' or 'gbv'")
  methods.get(method).check_drafts(drafts_KxL.shape[0])
  checks.block("block_verify", drafts_KxL, p_KxLxV, q_KxL1xV)
  verdict, plan = _verify_jit(key, drafts_KxL, p_KxLxV, q_KxL1xV)
  if return_plan:
    return verdict.tokens_L1, verdict.num_tokens, plan
  return verdict.tokens_L1, verdict.num_tokens
