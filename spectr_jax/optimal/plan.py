"""The optimal verifier's plan at one position: `OptimalPlan`, the cut plan on the slots,
its refinement, `optimal_plan` and `selection_law` (notation: `spectr_jax.optimal`)."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spectr_jax import checks
from spectr_jax.optimal.levels import kinetic_levels, rate_diff
from spectr_jax.optimal.slots import Slots, complete_homogeneous, cumsum, make_slots

DEFAULT_NUM_CUTS = 64


class OptimalPlan(NamedTuple):
  """The verifier's construction at one position (V vocabulary, Vs slots, M cuts).

  order_Vs: slot groups in slot order (int32; groups with p = 0 last).
  slot_V: the slot (1..Vs) of each token.
  block_end_Vs: for slot t (at index t - 1), the block end b >= t of its block.
  cut_M, cut_level_M: the candidate breakpoints (Vs + 1 where unused) and their kinetic
    levels (M entries: the refined plan's number where a plan can be refined).
  levels_Vs1: level of breakpoints 0..Vs (1 at block ends), the same levels in full.
  r_V: law of the selected draft Z (sums to 1 for k >= 1, zero for k = 0).
  accept: sum min(r, q), the probability of the accept branch. The hit probability lies
    between accept and bound, and equals both when shortfall = 0.
  bound: alpha* of the slots (their tokens merged) from the same prefix sums: at least
    alpha*(p, q, k), equal to it when every token is its own slot.
  shortfall: the O(V) optimality check: the mass by which r exceeds q on tokens of blocks
    of hull slope <= 1 plus the mass by which it falls short of q on tokens of blocks of
    slope > 1. bound - accept = shortfall (up to rounding); at 0, accept = alpha*(p, q, k).
  """

  order_Vs: jax.Array
  slot_V: jax.Array
  block_end_Vs: jax.Array
  cut_M: jax.Array
  cut_level_M: jax.Array
  levels_Vs1: jax.Array
  r_V: jax.Array
  accept: jax.Array
  bound: jax.Array
  shortfall: jax.Array


def _cut_plan(slots: Slots, p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """The plan on `slots` with kinetic levels for the `num_cuts` heaviest interior
  breakpoints: the levels, the selection rates, r and the shortfall check."""
  num = slots.a_Vs.shape[0]
  dtype = p_V.dtype
  a_Vs, b_Vs = slots.a_Vs, slots.b_Vs
  cuts = min(max(num_cuts, 1), num + 1)
  top_w, top_j = lax.top_k(slots.weight_Vs1, cuts)
  order_M = jnp.argsort(top_j)
  nodes_M = top_j[order_M].astype(jnp.int32)
  is_node_M = (top_w[order_M] > -jnp.inf) & (num_cuts > 0)
  a_M = jnp.where(is_node_M, a_Vs[jnp.maximum(nodes_M - 1, 0)], 0)
  b_M = jnp.where(is_node_M, b_Vs[jnp.maximum(nodes_M - 1, 0)], 0)
  level_M = kinetic_levels(nodes_M, is_node_M, a_M, b_M, slots.sums, slots.totals_3)
  cut_M = jnp.where(is_node_M, nodes_M, num + 1)
  levels_Vs1 = slots.vertex_Vs1.astype(dtype).at[cut_M].set(level_M, mode="drop")

  # Selection rates: each block's group (a, b] while no candidate inside is active, plus
  # the groups between candidates.
  def h2(i, j):
    return complete_homogeneous(slots.u_Vs1[i], slots.u_Vs1[j], k, max_k)

  diff = rate_diff(nodes_M, is_node_M, a_M, b_M, level_M, h2, num + 1)
  rate_Vs = h2(a_Vs, b_Vs) + cumsum(diff[:num, None])[:, 0]
  # Meant to materialise them once; the CPU compiler drops the barrier and fuses the rates'
  # arithmetic into the per-token pass below (about a sixth of a refined plan's time in a
  # profile; left as is).
  slot_V, rate_Vs, slope_Vs = lax.optimization_barrier((slots.slot_V, rate_Vs, slots.slope_Vs))
  r_V = p_V / slots.totals_3[0] * rate_Vs[slot_V - 1]
  accept = jnp.sum(jnp.minimum(r_V, q_V))
  qn_V = q_V / slots.totals_3[1]
  excess_V = jnp.where(slope_Vs[slot_V - 1] <= 1.0, r_V - qn_V, qn_V - r_V)
  shortfall = jnp.sum(jnp.where(p_V > 0, jnp.maximum(excess_V, 0.0), 0.0))
  return OptimalPlan(
    slots.order_Vs, slot_V, b_Vs, cut_M, level_M, levels_Vs1, r_V, accept, slots.bound, shortfall
  )


def _plan_single(p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """`optimal_plan` for one position (1-D p_V, q_V; scalar k) without refinement, its
  slots and cuts both from num_cuts; vmap batches it."""
  k = jnp.asarray(k, jnp.int32)
  return _cut_plan(make_slots(p_V, q_V, k, num_cuts, max_k), p_V, q_V, k, num_cuts, max_k)


REFINE_FACTOR = 2
REFINE_SHORTFALL = 2e-3


def _pad_cuts(plan: OptimalPlan, num_cuts: int) -> OptimalPlan:
  """`plan` with its cuts padded to `num_cuts` (the refined plan's number): the extra
  cuts are unused breakpoints of level 0, so the rule is unchanged."""
  pad = num_cuts - plan.cut_M.shape[0]
  unused = plan.block_end_Vs.shape[0] + 1
  return plan._replace(
    cut_M=jnp.concatenate([plan.cut_M, jnp.full((pad,), unused, plan.cut_M.dtype)]),
    cut_level_M=jnp.concatenate([plan.cut_level_M, jnp.zeros((pad,), plan.cut_level_M.dtype)]),
  )


def build_plan(p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """The plan with num_cuts, its levels redone with REFINE_FACTOR x num_cuts where its
  shortfall exceeds REFINE_SHORTFALL x its bound. The slots (with REFINE_FACTOR x
  num_cuts heavy tokens), their sums and blocks are built once and serve both. The
  refinement runs in a `lax.while_loop` of at most one step rather than a `lax.cond`:
  under vmap a cond runs both branches for every position, the loop runs only when some
  position needs it."""
  k = jnp.asarray(k, jnp.int32)
  more = min(REFINE_FACTOR * num_cuts, p_V.shape[0] + 1)
  slots = make_slots(p_V, q_V, k, max(more, num_cuts), max_k)
  plan = _cut_plan(slots, p_V, q_V, k, num_cuts, max_k)
  if more <= num_cuts:
    return plan
  plan = _pad_cuts(plan, min(more, slots.a_Vs.shape[0] + 1))
  need = plan.shortfall > REFINE_SHORTFALL * jnp.maximum(plan.bound, 0.0)

  def refine(carry):
    # The inputs read through the loop flag: a body of loop invariants would be hoisted
    # out of the loop by XLA and run every time.
    need, (slots_, p, q) = lax.optimization_barrier((carry[0], (slots, p_V, q_V)))
    del need
    return jnp.bool_(False), _cut_plan(slots_, p, q, k, more, max_k)

  return lax.while_loop(lambda c: c[0], refine, (need, plan))[1]


@functools.partial(jax.jit, static_argnames=("num_cuts", "max_k"))
def _optimal_plan(p_V, q_V, k, *, num_cuts, max_k):
  return build_plan(p_V, q_V, k, num_cuts, max_k)


def _static_max_k(k, max_k: int | None) -> int:
  if max_k is not None:
    return int(max_k)
  if not checks.is_concrete(k):
    raise ValueError("k is traced: pass a static upper bound max_k")
  return max(int(np.max(np.asarray(k))), 0)


def optimal_plan(
  p_V, q_V, k, *, num_cuts: int = DEFAULT_NUM_CUTS, max_k: int | None = None
) -> OptimalPlan:
  """The optimal verifier's construction at one position (see `OptimalPlan`).

  Args:
    p_V, q_V: draft and target distributions (float32, or float64 with x64 enabled).
    k: number of drafts (int in [0, max_k], may be traced; 0 gives r = 0).
    num_cuts: how many interior breakpoints may get kinetic levels (static; doubled
      where the first plan's shortfall exceeds 2e-3 of its bound, and as many heavy
      tokens get slots of their own); V or more gives the full construction of
      docs/OPTIMAL_VERIFIER.md.
    max_k: static upper bound on k (defaults to k itself when k is concrete).

  Returns:
    An `OptimalPlan`.
  """
  checks.distributions(p_V=p_V, q_V=q_V)
  max_k = _static_max_k(k, max_k)
  return _optimal_plan(p_V, q_V, k, num_cuts=num_cuts, max_k=max_k)


def selection_law(p_V, q_V, k, *, num_cuts: int = DEFAULT_NUM_CUTS, max_k: int | None = None):
  """The exact law r of the draft Z that `optimal` selects, and sum min(r, q).

  Args: as `optimal_plan`.

  Returns:
    (r_V, accept_prob): r sums to 1 (k >= 1); accept_prob = sum min(r, q) is the
    probability of the accept branch of `optimal`, equal to its hit probability and to
    alpha*(p, q, k) when the plan meets the bound (`OptimalPlan.shortfall` = 0).
  """
  plan = optimal_plan(p_V, q_V, k, num_cuts=num_cuts, max_k=max_k)
  return plan.r_V, plan.accept
