"""Float64 numpy reference of the OT-optimal multi-draft verifier (docs/OPTIMAL_VERIFIER.md).

A test oracle: sequential and straightforward, it states the construction that
`spectr_jax/optimal/` vectorises, and tests/verify/test_optimal.py checks the JAX verifier
against it (nothing in spectr_jax imports it). Its prefix sums are numpy's sequential
float64 sums, monotone for nonnegative masses. Notation (slots, P, u, Q, h, levels,
groups) as in `spectr_jax.optimal`. Fast enough for V = 256k with a few hundred cuts: the hull is
one pass over Python floats and breakpoints of level 0 are merged in bulk.

- `reference_plan(p, q, k)`: slot order, (Q, h) lower hull, kinetic levels (all interior
  breakpoints, or only the `num_cuts` heaviest), the selection law r and sum min(r, q).
- `rates_from_levels(levels, u, k)`: the selection rate of every slot for ANY level
  array (r = p * rate), by merging groups in order of level.
- `selection_given_drafts(slots, levels, u_draw)`: which draft the rule selects.
"""

import heapq
from typing import NamedTuple

import numpy as np


def complete_h2(x, y, degree: int):
  """H_degree(x, y) = sum_{i=0}^{degree} x^i y^(degree-i) (0 for degree < 0)."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return sum(x**i * y ** (degree - i) for i in range(degree + 1)) + 0.0 * (x + y)


def complete_h3(x, y, z, degree: int):
  """H_degree(x, y, z): the sum of all monomials of that degree (0 for degree < 0)."""
  total = 0.0 * (x + y + z)
  for i in range(degree + 1):
    for j in range(degree + 1 - i):
      total = total + x**i * y**j * z ** (degree - i - j)
  return total


class ReferencePlan(NamedTuple):
  """The optimal verifier's construction for one position, in float64.

  order_Vs: tokens with p > 0 sorted by q/p descending (stable); slot t (1-based) is
    order_Vs[t - 1]. P, u, Q, h: arrays over breakpoints 0..n (P_j = p(slots 1..j),
    u_j = 1 - P_j, Q_j = q(slots 1..j), h_j = 1 - u_j^k). vertex: breakpoints that are
    block ends. levels: the level of every breakpoint (1 at block ends). r_V: law of the
    selected draft. accept: sum min(r, q). bound: alpha*.
  """

  order_Vs: np.ndarray
  P: np.ndarray
  u: np.ndarray
  Q: np.ndarray
  h: np.ndarray
  vertex: np.ndarray
  levels: np.ndarray
  r_V: np.ndarray
  accept: float
  bound: float


def slot_arrays(p, q, k, order=None):
  """Slot order and the prefix arrays P, u, Q, h over breakpoints 0..n.

  `order` (optional): a token order to use instead of sorting by q/p (its tokens with
  p > 0 become the slots), e.g. the JAX plan's quantized order.
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  if order is None:
    support = np.flatnonzero(p > 0)
    order_Vs = support[np.argsort(-(q[support] / p[support]), kind="stable")]
  else:
    order_Vs = np.asarray(order)[p[np.asarray(order)] > 0]
  ps, qs = p[order_Vs], q[order_Vs]
  P = np.concatenate([[0.0], np.cumsum(ps)])
  u = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]])
  Q = np.concatenate([[0.0], np.cumsum(qs)])
  h = 1.0 - u**k
  return order_Vs, P, u, Q, h


def lower_hull(Q, h, m: int):
  """Vertex mask of the lower convex hull of (Q_j, h_j), j = 0..m; breakpoints > m are
  vertices too (each slot with q = 0 is its own block). The top b is popped when the
  slope into it is at least the slope out of it (collinear points are popped)."""
  Qs, hs = Q[: m + 1].tolist(), h[: m + 1].tolist()
  stack: list[int] = []
  for j in range(m + 1):
    qj, hj = Qs[j], hs[j]
    while len(stack) >= 2:
      a, b = stack[-2], stack[-1]
      if (hs[b] - hs[a]) * (qj - Qs[b]) >= (hj - hs[b]) * (Qs[b] - Qs[a]):
        stack.pop()
      else:
        break
    stack.append(j)
  vertex = np.zeros(len(Q), bool)
  vertex[stack] = True
  vertex[m:] = True
  return vertex


def _event(i, j, r, P, Q, u, k, slope):
  """The level at which breakpoint j leaves the kinetic hull between i and r."""
  p_ij, p_jl = P[j] - P[i], P[r] - P[j]
  q_ij, q_jl = Q[j] - Q[i], Q[r] - Q[j]
  gap = (p_ij + p_jl) * p_ij * p_jl * complete_h3(u[i], u[j], u[r], k - 2)
  if gap <= 0:
    return 0.0
  return slope * (q_ij * p_jl - q_jl * p_ij) / gap


def kinetic_levels(P, Q, u, h, vertex, k, cut):
  """Levels: 1 at block ends, removal times of the deletion-only kinetic hull for the
  breakpoints in `cut` (interior ones), 0 elsewhere."""
  n1 = len(P)
  levels = np.where(vertex, 1.0, 0.0)
  nodes = np.flatnonzero(vertex | cut)
  prev = dict(zip(nodes[1:], nodes[:-1], strict=True))
  nxt = dict(zip(nodes[:-1], nodes[1:], strict=True))
  vert_idx = np.flatnonzero(vertex)
  block_start = vert_idx[np.searchsorted(vert_idx, np.arange(n1), side="right") - 1]
  block_end = vert_idx[np.minimum(np.searchsorted(vert_idx, np.arange(n1)), len(vert_idx) - 1)]
  slope = {}
  heap: list = []
  version: dict = {}
  for j in nodes:
    if vertex[j]:
      continue
    a, b = block_start[j], block_end[j]
    slope[j] = (h[b] - h[a]) / (Q[b] - Q[a])
    version[j] = 0
    heapq.heappush(heap, (_event(prev[j], j, nxt[j], P, Q, u, k, slope[j]), j, 0))
  level = 0.0
  while heap:
    e, j, ver = heapq.heappop(heap)
    if version.get(j) != ver:
      continue
    level = min(max(level, e), 1.0)
    levels[j] = level
    version[j] = -1
    a, b = prev[j], nxt[j]
    nxt[a], prev[b] = b, a
    for t in (a, b):
      if not vertex[t]:
        version[t] += 1
        heapq.heappush(heap, (_event(prev[t], t, nxt[t], P, Q, u, k, slope[t]), t, version[t]))
  return levels


def rates_from_levels(levels, u, k):
  """Selection rate of each slot 1..n for an arbitrary level array over breakpoints 0..n.

  While group (i, l] exists (an interval of U), each of its slots is selected at rate
  H_{k-1}(u_i, u_l) per unit of p; integrating over U ~ Uniform(0, 1) gives r / p.
  Breakpoints of level <= 0 never cut, so the groups start as the runs between the others;
  those with level in (0, 1) are then removed in order of level, closing two groups each.
  """
  n1 = len(levels)
  levels = np.asarray(levels, np.float64).copy()
  levels[0] = levels[-1] = 1.0
  nodes = np.flatnonzero(levels > 0)
  prev = dict(zip(nodes[1:].tolist(), nodes[:-1].tolist(), strict=True))
  nxt = dict(zip(nodes[:-1].tolist(), nodes[1:].tolist(), strict=True))
  start = np.zeros(n1)  # start[l]: level at which the group ending at l was formed
  left, right, life = [], [], []  # closed groups (left, right] and their lifetimes
  for j in sorted(nodes[levels[nodes] < 1.0].tolist(), key=lambda t: levels[t]):
    lv = levels[j]
    i, r = prev[j], nxt[j]
    left += [i, j]
    right += [j, r]
    life += [lv - start[j], lv - start[r]]
    nxt[i], prev[r] = r, i
    start[r] = lv
  last, j = [0], 0
  while j < n1 - 1:
    j = nxt[j]
    last.append(j)
  left = np.array(left + last[:-1], int)
  right = np.array(right + last[1:], int)
  life = np.concatenate([life, 1.0 - start[last[1:]]])
  w = life * complete_h2(u[left], u[right], k - 1)
  diff = np.zeros(n1 + 1)
  np.add.at(diff, left + 1, w)
  np.add.at(diff, right + 1, -w)
  return np.cumsum(diff)[1:n1]


def reference_plan(p, q, k: int, num_cuts: int | None = None, order=None) -> ReferencePlan:
  """The optimal verifier's construction (levels, r, acceptance) in float64.

  Args:
    p, q: draft and target distributions. k: number of drafts (>= 1).
    num_cuts: if given, only the `num_cuts` interior breakpoints with the largest p + q of
      the slot before them get kinetic levels; the others get level 0.
    order: optional slot order (see `slot_arrays`).
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  order_Vs, P, u, Q, h = slot_arrays(p, q, k, order)
  n = len(order_Vs)
  m = int(np.sum(q[order_Vs] > 0))
  vertex = lower_hull(Q, h, m)
  cut = ~vertex
  if num_cuts is not None:
    weight = np.concatenate([[-np.inf], p[order_Vs] + q[order_Vs]])
    weight[vertex] = -np.inf
    cut = np.zeros(n + 1, bool)
    cut[np.argsort(-weight, kind="stable")[:num_cuts]] = True
    cut &= ~vertex
  levels = kinetic_levels(P, Q, u, h, vertex, k, cut)
  rate = rates_from_levels(levels, u, k)
  r_V = np.zeros_like(p)
  r_V[order_Vs] = p[order_Vs] * rate
  accept = float(np.minimum(r_V, q).sum())
  bound = float(np.min(Q[n] - Q + h))
  return ReferencePlan(order_Vs, P, u, Q, h, vertex, levels, r_V, accept, min(bound, 1.0))


def selection_given_drafts(slots, levels, u_draw):
  """The slot group selected by the rule for drafts at `slots` (1-based) and level U.

  Returns the indices (into `slots`) of the drafts in the earliest group holding any
  draft; the rule picks one of them uniformly.
  """
  slots = np.asarray(slots)
  first = slots.min()
  active = np.asarray(levels) >= u_draw
  active[-1] = True
  active = np.flatnonzero(active)
  end = active[np.searchsorted(active, first)]
  return np.flatnonzero(slots <= end)
