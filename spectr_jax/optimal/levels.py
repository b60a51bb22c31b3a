"""The kinetic levels of the optimal verifier's cut candidates (Newton steps on U) and
the selection rates they give (notation: `spectr_jax.optimal`)."""

import jax.numpy as jnp
from jax import lax

from spectr_jax.optimal.slots import Sums, block_slope, rise_of


def kinetic_levels(nodes_M, is_node_M, a_M, b_M, sums: Sums, totals_3):
  """Kinetic levels of the candidate breakpoints `nodes_M` (sorted by index).

  `sums` holds the `Sums` of the columns (p, q, h increments) and `totals_3` their
  totals, so that P_j - P_i, Q_j - Q_i and h_j - h_i are local differences of them; each
  real candidate j lies strictly inside its block (a_j, b_j), where y = h_a + c (Q - Q_a).
  j stays a vertex of the upper hull of the points (P, y - U h) of its block's candidates
  and ends exactly while U < level_j (OPTIMAL.md), and it is a vertex iff every slope into
  it from the left exceeds every slope out of it to the right (no chord passes above it).
  Each slope (c Q_ij - U h_ij) / P_ij comes from local masses, so the test is accurate.
  The levels are found for all candidates at once (O(M^2) per step) instead of by M
  sequential removals: the gap g(U) = (least slope into j) - (greatest slope out of j) is
  concave and piecewise linear in U, positive while j is a vertex, so Newton steps from
  U = 1 along a supergradient decrease monotonically to its root (each step lands on
  the root of the current pair of lines, never below the true one) and reach it in a few
  steps (5-8 on the embedded pair; at most nmant + 1, as many as a bisection would
  take). Where g(1) > 0 the level is 1; where g <= 0 throughout it is 0. The sums are read at
  the candidates and their blocks' ends only (O(M)), and the M x (M + 1) differences
  formed from those by broadcasting (gathers of M x (M + 1) indices cost more on CPU).
  """
  num = nodes_M.shape[0]
  idx = jnp.arange(num)
  c_M = block_slope(rise_of(sums, totals_3), a_M, b_M, 0.0)
  same = (a_M[None, :] == a_M[:, None]) & is_node_M[None, :]
  ones = jnp.ones((num, 1), bool)
  left_ok = jnp.concatenate([same & (idx[None, :] < idx[:, None]), ones], axis=1)
  right_ok = jnp.concatenate([same & (idx[None, :] > idx[:, None]), ones], axis=1)
  # The sums at each candidate j (rows) and at the other end x of each slope (columns: the
  # other candidates, then the block's start or end).
  at_j = [x[nodes_M][:, None] for x in sums]

  def ends(block_M):
    return [
      jnp.concatenate(
        [jnp.broadcast_to(x[nodes_M][None], (num, *x[nodes_M].shape)), x[block_M][:, None]], 1
      )
      for x in sums
    ]

  def slopes(lo, hi):
    """(c Q / P, h / P) over the slots (lo, hi] (zeros where P = 0 or lo >= hi)."""
    (grid_lo, rest_lo), (grid_hi, rest_hi) = lo, hi
    p_xy, q_xy, h_xy = jnp.moveaxis(
      Sums.value(grid_hi - grid_lo, rest_hi - rest_lo) / totals_3, -1, 0
    )
    scale = jnp.where(p_xy > 0, 1.0 / jnp.where(p_xy > 0, p_xy, 1.0), 0.0)
    return c_M[:, None] * q_xy * scale, h_xy * scale

  a_left, b_left = slopes(ends(a_M), at_j)
  a_right, b_right = slopes(at_j, ends(b_M))

  def gap(u_M):
    """g(u) = into(u) - out(u), concave in u (a minimum of lines minus a maximum of
    lines), and a supergradient of it: the slopes of the lines that attain them."""
    into_MxM1 = jnp.where(left_ok, a_left - u_M[:, None] * b_left, jnp.inf)
    out_MxM1 = jnp.where(right_ok, a_right - u_M[:, None] * b_right, -jnp.inf)
    into, out = jnp.min(into_MxM1, axis=1), jnp.max(out_MxM1, axis=1)
    b_in = jnp.max(jnp.where(into_MxM1 == into[:, None], b_left, -jnp.inf), axis=1)
    b_out = jnp.min(jnp.where(out_MxM1 == out[:, None], b_right, jnp.inf), axis=1)
    return into - out, b_out - b_in

  def newton(carry):
    u, done, step = carry
    g, slope = gap(u)
    below = jnp.clip(u - g / jnp.where(slope < 0, slope, -1.0), 0.0, u)
    below = jnp.where(slope < 0, below, 0.0)
    done = done | (g > 0) | (below >= u)
    return jnp.where(done, u, below), done, step + 1

  max_steps = jnp.finfo(c_M.dtype).nmant + 1
  u, _, _ = lax.while_loop(
    lambda c: ~jnp.all(c[1]) & (c[2] < max_steps),
    newton,
    (jnp.ones((num,), c_M.dtype), ~is_node_M, 0),
  )
  return jnp.where(is_node_M, u, 0.0)


def rate_diff(nodes_M, is_node_M, a_M, b_M, level_M, h2, size: int):
  """Difference array (over breakpoints, `size` entries) of the selection rates of the
  groups between candidates, for ANY levels in [0, 1], O(M^2).

  Order the candidates by (level, index). For j, let (i, l) be the nearest candidates of
  its block above it in that order on each side (else the block ends): every candidate
  strictly between them ranks below j, so (i, l] is a group for U in (level_j, min(level_i,
  level_l)], and (i, j] and (j, l] are groups from U = level_j down to the levels of the
  candidates that split them in turn. Adding -level_j h2(i, l) on (i, l] and +level_j
  h2(i, j), +level_j h2(j, l) on (i, j] and (j, l] therefore sums to each group's
  lifetime times its rate (the block's own group (a, b], lifetime 1 - its highest
  candidate level, is not included).
  """
  num = nodes_M.shape[0]
  idx = jnp.arange(num)
  same = (a_M[None, :] == a_M[:, None]) & is_node_M[None, :]
  lower = idx[None, :] < idx[:, None]  # [j, i]: i before j
  above_left = same & lower & (level_M[None, :] > level_M[:, None])
  above_right = same & lower.T & (level_M[None, :] >= level_M[:, None])
  left_i = jnp.max(jnp.where(above_left, idx[None, :], -1), axis=1)
  right_i = jnp.min(jnp.where(above_right, idx[None, :], num), axis=1)
  left = jnp.where(left_i >= 0, nodes_M[jnp.maximum(left_i, 0)], a_M)
  right = jnp.where(right_i < num, nodes_M[jnp.minimum(right_i, num - 1)], b_M)
  level = jnp.where(is_node_M, level_M, 0.0)
  w_whole, w_left, w_right = (
    level * h2(x, y) for x, y in ((left, right), (left, nodes_M), (nodes_M, right))
  )
  at = jnp.concatenate([left, right, left, nodes_M, nodes_M, right])
  add = jnp.concatenate([-w_whole, w_whole, w_left, -w_left, w_right, -w_right])
  return jnp.zeros((size,), add.dtype).at[at].add(add)
