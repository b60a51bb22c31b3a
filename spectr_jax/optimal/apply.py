"""The optimal verifier's random part: `select` (the draft Z given a plan),
`select_draft` (the plan built only where k >= 2), the registry's token-level
`position_verdict` and the checked verifier `optimal` (notation: `spectr_jax.optimal`)."""

import jax
import jax.numpy as jnp
from jax import lax

from spectr_jax import acceptance, checks
from spectr_jax.optimal.plan import DEFAULT_NUM_CUTS, OptimalPlan, build_plan
from spectr_jax.sampling import categorical
from spectr_jax.verdict import Verdict


def select(u_level, u_pick, drafts_K, valid_K, plan: OptimalPlan):
  """Index into drafts_K of the draft Z that the rule selects, in O(K + M).

  Breakpoints of level >= 1 - u_level cut the slots into groups; Z is valid draft
  floor(u_pick * count) (in index order) of the earliest group holding a valid draft. The
  earliest group starts at or before the first draft's slot and ends at the first active
  breakpoint from there: its block end, or an earlier candidate whose level is high
  enough. Given the plan, the law of Z is `plan.r_V`.

  Args:
    u_level, u_pick: uniforms in [0, 1).
    drafts_K, valid_K: the drafts and the mask of those to choose from (at least one).
    plan: `optimal_plan(p, q, sum(valid_K))`.

  Returns:
    The int index into drafts_K of Z.
  """
  num = plan.block_end_Vs.shape[0]
  slot_K = jnp.where(valid_K, plan.slot_V[drafts_K], num)
  first = jnp.min(slot_K)
  threshold = 1.0 - jnp.asarray(u_level, plan.cut_level_M.dtype)
  active_M = (plan.cut_M >= first) & (plan.cut_level_M >= threshold)
  end = jnp.minimum(plan.block_end_Vs[first - 1], jnp.min(jnp.where(active_M, plan.cut_M, num)))
  in_group_K = valid_K & (slot_K <= end)
  count = jnp.sum(in_group_K)
  pick = jnp.floor(u_pick * count).astype(jnp.int32)
  rank_K = jnp.cumsum(in_group_K) - 1
  return jnp.argmax(in_group_K & (rank_K == jnp.minimum(pick, count - 1)))


def _select_uniforms(key, dtype):
  """(u_level, u_pick) of `select` from one key."""
  level_key, pick_key = jax.random.split(key)
  return jax.random.uniform(level_key, dtype=dtype), jax.random.uniform(pick_key)


def _plan_where(need, p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """`build_plan` where `need`, a plan of zeros elsewhere. Like the refinement in `build_plan`, a
  `lax.while_loop` of at most one step: under vmap it runs only when some position
  needs it (a `lax.cond` would run for every position)."""
  shape = jax.eval_shape(lambda: build_plan(p_V, q_V, k, num_cuts, max_k))
  empty = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shape)

  def build(carry):
    # p and q read through the loop flag, so XLA cannot hoist the plan out of the loop.
    need, _ = carry
    p, q = (jnp.where(need, x, 0.0) for x in (p_V, q_V))
    return jnp.bool_(False), build_plan(p, q, k, num_cuts, max_k)

  return lax.while_loop(lambda c: c[0], build, (need, empty))[1]


def select_draft(
  u_level, u_pick, drafts_K, valid_K, p_V, q_V, *, num_cuts: int = DEFAULT_NUM_CUTS, max_k: int
):
  """The draft Z that the rule selects among the valid drafts, and its law r.

  With two or more valid drafts, `select` on `optimal_plan(p, q, k)`; with one there is
  nothing to choose: Z is that draft and r = p (single-draft speculative sampling, the
  optimum for one draft); with none, index 0 and r = 0. The plan is built only where
  k >= 2 (under vmap, only when some position has k >= 2: after a walk's first position
  that is rare), so its cost is not paid for the single-survivor positions.

  Args:
    u_level, u_pick: uniforms in [0, 1) (see `select`).
    drafts_K, valid_K: the drafts and the mask of those to choose from.
    p_V, q_V: draft and target distributions (no input checks: for use inside jit).
    num_cuts: static; see `optimal_plan`. max_k: static upper bound on sum(valid_K).

  Returns:
    (index into drafts_K of Z, r_V).
  """
  k = jnp.sum(valid_K).astype(jnp.int32)
  only = jnp.argmax(valid_K)
  r_V = jnp.where(k == 1, p_V, 0.0)
  if drafts_K.shape[0] < 2 or max_k < 2:
    return only, r_V
  planned = k >= 2
  plan = _plan_where(planned, p_V, q_V, k, num_cuts, max_k)
  index = jnp.where(planned, select(u_level, u_pick, drafts_K, valid_K, plan), only)
  return index, jnp.where(planned, plan.r_V, r_V)


def _verify_with(key, drafts_K, valid_K, q_V, choose):
  """(token, accepted): (index, r) = choose(select key), Z = drafts_K[index], accepted
  with probability min(1, q(Z) / r(Z)), otherwise a draw from norm(q - min(r, q))."""
  select_key, accept_key, residual_key = jax.random.split(key, 3)
  index, r_V = choose(select_key)
  z = drafts_K[index]
  r_z = r_V[z]
  accepted = jnp.any(valid_K) & (jax.random.uniform(accept_key, dtype=r_z.dtype) * r_z < q_V[z])
  y = categorical(residual_key, acceptance.residual(q_V, jnp.minimum(r_V, q_V)))
  return jnp.where(accepted, z, y).astype(jnp.int32), accepted


def _apply_plan(key, drafts_K, valid_K, q_V, plan: OptimalPlan):
  """The verifier's random part given its plan: (token, accepted)."""

  def choose(key):
    u_level, u_pick = _select_uniforms(key, plan.cut_level_M.dtype)
    return select(u_level, u_pick, drafts_K, valid_K, plan), plan.r_V

  return _verify_with(key, drafts_K, valid_K, q_V, choose)


def position_verdict(
  key, drafts_K, p_V, q_V, valid_K, *, num_cuts: int = DEFAULT_NUM_CUTS
) -> Verdict:
  """`optimal` without its input checks (valid_K required): the token-level verify
  function of the method registry, for callers inside jit; the plan is built only where
  k >= 2 (`select_draft`)."""

  def choose(key):
    u_level, u_pick = _select_uniforms(key, p_V.dtype)
    return select_draft(
      u_level, u_pick, drafts_K, valid_K, p_V, q_V, num_cuts=num_cuts, max_k=drafts_K.shape[0]
    )

  return Verdict(*_verify_with(key, drafts_K, valid_K, q_V, choose))


_position_verdict_jit = jax.jit(position_verdict, static_argnames="num_cuts")


def optimal(key, drafts_K, p_V, q_V, *, valid_K=None, num_cuts: int = DEFAULT_NUM_CUTS):
  """The OT-optimal verifier of the valid drafts at one position.

  Selects one draft Z by the level rule (module docstring), accepts it with probability
  min(1, q(Z) / r(Z)), otherwise samples norm(q - min(r, q)). The output is distributed
  as q for any levels; P(accepted) is `selection_law(...)[1]` (alpha* when the plan meets
  the bound). k = number of valid drafts; k = 0 samples q.

  Args:
    key: PRNG key.
    drafts_K: int drafts, i.i.d. from p_V (duplicates are separate chances).
    p_V, q_V: draft and target distributions.
    valid_K: optional bool mask of the drafts to use.
    num_cuts: static; see `optimal_plan`.

  Returns:
    (token, accepted): int32 token ~ q and whether it came from the accept branch.
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.shape("drafts_K", drafts_K, (None,))
  checks.shape("q_V", q_V, (p_V.shape[-1],))
  if valid_K is None:
    valid_K = jnp.ones(drafts_K.shape, bool)
  checks.shape("valid_K", valid_K, drafts_K.shape)
  verdict = _position_verdict_jit(
    key, drafts_K, p_V, q_V, jnp.asarray(valid_K, bool), num_cuts=num_cuts
  )
  return verdict.token, verdict.accepted
