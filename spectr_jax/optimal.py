"""The exact, OT-optimal multi-draft verifier (design: docs/OPTIMAL_VERIFIER.md).

With k i.i.d. drafts X_1..X_k ~ p, `optimal` outputs Y ~ q exactly and hits a draft with
probability up to alpha*(p, q, k), the optimal-transport bound
(`acceptance.optimal_acceptance`), of which K-SEQ is only guaranteed 1 - (1 - 1/k)^k.

Notation. Tokens with p > 0 sorted by q/p descending are the slots 1..n (tokens with
p = 0 follow and are never drafted); breakpoint j sits after slot j (j = 0..V).
P_j = p(slots 1..j), u_j = 1 - P_j, Q_j = q(slots 1..j), h_j = 1 - u_j^k (the chance that
a draft falls in slots 1..j). Each breakpoint has a level in [0, 1]. The rule:

  U ~ Uniform(0, 1]; breakpoints with level >= U cut the slots into groups;
  Z = a uniformly chosen draft of the earliest group that holds a draft (duplicates count);
  accept Z with probability min(1, q(Z) / r(Z)), else sample norm(q - min(r, q)),

where r is the law of Z. While group (i, l] exists, each of its slots t is selected at
rate p_t H_{k-1}(u_i, u_l) (H_d: complete homogeneous symmetric polynomial), so r follows
from the levels by integrating over U. r is always computed from the levels actually
used, so the output law is q for ANY levels; only the acceptance depends on them.

Levels: the vertices of the lower convex hull of (Q_j, h_j) (the blocks) get level 1, and
the `num_cuts` heaviest interior breakpoints (by p + q of the slot before them) get the
removal times of a deletion-only kinetic hull (docs/OPTIMAL_VERIFIER.md); all others get
level 0. With num_cuts >= V the levels are those of the note and sum min(r, q) = alpha*.
With the default 64, measured on LLM-like pairs (logit scale 3, V = 4096 to 256k, k <= 8), the
acceptance stays within 1.1e-3 of alpha* (within 2e-5 for k <= 4), with 256 within 3e-6;
on near-flat pairs (logit scale 1, V = 1000, k = 8) 64 cuts lose 1.4e-2 and 256 lose
2.5e-3 (docs/OPTIMAL_VERIFIER.md). `OptimalPlan.shortfall` reports the gap.

Numerics: every prefix sum the construction relies on is monotone by construction and
has accurate local differences (`_Sums`: two exact int32 sums, of 2^-29 units and of
the remainders in finer units), and the hull compares the slopes of adjacent segments, so ties,
zero masses and float noise cost acceptance at float precision only.

CPU note: the slot order (a counting sort for large V) and the hull are sequential
passes written so that XLA updates their buffers in place; under `vmap` these two run
position by position (`lax.map`, a custom batching rule), the rest is batched.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spectr_jax import acceptance, checks
from spectr_jax.sampling import categorical

__all__ = [
  "DEFAULT_NUM_CUTS",
  "OptimalPlan",
  "optimal",
  "optimal_plan",
  "optimal_unchecked",
  "select",
  "selection_law",
]

DEFAULT_NUM_CUTS = 64


class OptimalPlan(NamedTuple):
  """The verifier's construction at one position (shapes for vocabulary size V).

  order_V: tokens in slot order (int32; tokens with p = 0 last).
  slot_V: the slot (1..V) of each token, the inverse of order_V.
  block_end_V: for slot t (at index t - 1), the block end b >= t of its block.
  cut_M, cut_level_M: the candidate breakpoints (M = min(max(num_cuts, 1), V + 1)
    entries, V + 1 where unused) and their kinetic levels.
  levels_V1: level of breakpoints 0..V (1 at block ends), the same levels in full.
  r_V: law of the selected draft Z (sums to 1 for k >= 1, zero for k = 0).
  accept: sum min(r, q), the probability of the accept branch. The hit probability lies
    between accept and bound, and equals both when shortfall = 0.
  bound: alpha*(p, q, k) from the same prefix sums.
  shortfall: the O(n) optimality check: the mass by which r exceeds q on blocks of hull
    slope <= 1 plus the mass by which it falls short of q on blocks of slope > 1. It is 0
    exactly when accept = bound; otherwise bound - accept = shortfall (up to rounding).
  """

  order_V: jax.Array
  slot_V: jax.Array
  block_end_V: jax.Array
  cut_M: jax.Array
  cut_level_M: jax.Array
  levels_V1: jax.Array
  r_V: jax.Array
  accept: jax.Array
  bound: jax.Array
  shortfall: jax.Array


def _h2(x, y, k, max_k: int):
  """H_{k-1}(x, y) = sum_{i<k} x^i y^(k-1-i) for integer k in [0, max_k] (traced)."""
  y_pow = jnp.ones_like(x * y)
  total = jnp.zeros_like(y_pow)
  for d in range(max_k):
    total = jnp.where(d < k, x * total + y_pow, total)
    y_pow = y_pow * y
  return total


def _h3(x, y, z, k, max_k: int):
  """H_{k-2}(x, y, z), the sum of all monomials of degree k - 2, for k in [0, max_k]."""
  y_pow = jnp.ones_like(x * y * z)
  h2 = jnp.zeros_like(y_pow)
  h3 = jnp.zeros_like(y_pow)
  for d in range(max_k - 1):
    h2 = x * h2 + y_pow
    h3 = jnp.where(d < k - 1, h2 + z * h3, h3)
    y_pow = y_pow * y
  return h3


_COUNTING_SORT_MIN_V = 8192
_COUNTING_SORT_BITS = 16


def _slot_order(p_V, q_V):
  """Tokens by q/p descending, then q = 0, then p = 0; ties by index.

  The ratio is reduced to a code of the top bits of its float32 pattern: 31 - ceil(log2 V)
  bits packed with the token index into one int32 sort key for V <= 8192, and 16 bits (8
  of mantissa) for a counting sort above. Tokens whose ratios share a code keep index
  order: acceptance moves by 1e-8 at most (docs/OPTIMAL_VERIFIER.md), exactness never.
  """
  vocab = p_V.shape[0]
  index_bits = max(1, (vocab - 1).bit_length())
  code_bits = _COUNTING_SORT_BITS if vocab > _COUNTING_SORT_MIN_V else 31 - index_bits
  top = (1 << code_bits) - 3
  ratio_V = (q_V / jnp.where(p_V > 0, p_V, 1.0)).astype(jnp.float32)
  bits_V = lax.bitcast_convert_type(ratio_V, jnp.int32) >> (31 - code_bits)
  code_V = jnp.where(
    p_V > 0, jnp.where(q_V > 0, top - jnp.minimum(bits_V, top), top + 1), top + 2
  ).astype(jnp.int32)
  if vocab > _COUNTING_SORT_MIN_V:
    return _counting_order(code_V)
  index_V = jnp.arange(vocab, dtype=jnp.int32)
  key_V = lax.sort((code_V << index_bits) | index_V, is_stable=False)
  return key_V & ((1 << index_bits) - 1)


def _map_batched(fn, axis_size, in_batched, *args):
  """Runs `fn` over a batch one element after another (`lax.map`), broadcasting the
  unbatched arguments: the batching rule of the sequential passes below, whose in-place
  updates a batched loop would turn into scatters."""
  args = [
    x if batched else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))
    for x, batched in zip(args, in_batched, strict=True)
  ]
  out = lax.map(lambda a: fn(*a), tuple(args))
  return out, jax.tree.map(lambda _: True, out)


def _at(x, i):
  return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


@jax.custom_batching.custom_vmap
def _counting_order(code_V):
  """Stable counting sort of int codes in [0, 2^16): the order of the indices.

  The placement pass reads each bucket's offset only through its own update and reads
  the updated cell back, which lets XLA keep both buffers in place.
  """
  vocab = code_V.shape[0]
  counts = jnp.zeros((1 << _COUNTING_SORT_BITS,), jnp.int32).at[code_V].add(1)
  start = jnp.cumsum(counts) - counts

  def place(i, carry):
    offset, order = carry
    code = _at(code_V, i)
    offset = lax.dynamic_update_index_in_dim(offset, _at(offset, code) + 1, code, 0)
    order = lax.dynamic_update_index_in_dim(order, i, _at(offset, code) - 1, 0)
    return offset, order

  _, order_V = lax.fori_loop(0, vocab, place, (start, jnp.zeros((vocab,), jnp.int32)))
  return order_V


@_counting_order.def_vmap
def _counting_order_vmap(axis_size, in_batched, code_V):
  return _map_batched(_counting_order, axis_size, in_batched, code_V)


def _cumsum(x_AxC, block: int = 128):
  """Inclusive cumulative sums down axis 0 of an N x C array, by blocked triangular
  matmuls with the block totals summed the same way (several times faster than
  `jnp.cumsum` on CPU). Not monotone: where independently rounded block offsets meet the
  sums can step down by a unit in the last place (`_Sums` is monotone)."""
  n, c = x_AxC.shape
  rows = -(-n // block)
  blocks = jnp.pad(x_AxC, ((0, rows * block - n), (0, 0))).reshape(rows, block, c)
  within = jnp.einsum(
    "rbc,bd->rdc",
    blocks,
    jnp.triu(jnp.ones((block, block), x_AxC.dtype)),
    precision=lax.Precision.HIGHEST,
  )
  if rows == 1:
    return within[0, :n]
  offsets = jnp.concatenate([jnp.zeros((1, c), x_AxC.dtype), _cumsum(within[:-1, -1], block)])
  return (within + offsets[:, None]).reshape(rows * block, c)[:n]


_GRID = 2.0**29


class _Sums(NamedTuple):
  """Prefix sums over breakpoints 0..V of C columns of masses x >= 0 (summing to < 4),
  held as two exact int32 sums: of x in units of 2^-29 (rounded down), and of the
  remainders (each < 2^-29) in units of 2^-S, S = 59 - ceil(log2(V + 1)), the largest for
  which V remainders cannot overflow (remainder bits below 2^-S are dropped: at most
  V 2^-S in all: 2e-9 at V = 32k, 2.4e-7 at V = 256k).

  `between(i, j)`, the mass of slots (i, j], is thereby accurate relative to itself
  (not to the total, as a difference of float prefix sums is: 6e-8 absolute in float32),
  never negative, and non-decreasing in j and non-increasing in i by construction
  (integer sums in any order are exact; conversion and rounding are monotone).
  """

  grid_V1xC: jax.Array
  rest_V1xC: jax.Array

  @classmethod
  def of(cls, x_VxC):
    vocab, c = x_VxC.shape
    fine = 2.0 ** (59 - vocab.bit_length())
    x_VxC = jnp.maximum(x_VxC, 0.0)
    grid_VxC = jnp.floor(x_VxC * _GRID).astype(jnp.int32)
    rest_VxC = x_VxC - grid_VxC.astype(x_VxC.dtype) / _GRID  # exact, in [0, 2^-29)
    lo_VxC = jnp.floor(rest_VxC * fine).astype(jnp.int32)
    zero = jnp.zeros((1, c), jnp.int32)
    lo_V1xC = jnp.concatenate([zero, jnp.cumsum(lo_VxC, axis=0)])
    return cls(
      jnp.concatenate([zero, jnp.cumsum(grid_VxC, axis=0)]),
      lo_V1xC.astype(x_VxC.dtype) / fine,
    )

  def between(self, i, j):
    """Mass of slots (i, j] per column, for index arrays i <= j (shape i.shape + (C,))."""
    return self._value(self.grid_V1xC[j] - self.grid_V1xC[i], self.rest_V1xC[j] - self.rest_V1xC[i])

  def prefix(self):
    """Mass of slots 1..j for every breakpoint j (N1 x C)."""
    return self._value(self.grid_V1xC, self.rest_V1xC)

  def suffix(self):
    """Mass of the slots after j for every breakpoint j (N1 x C)."""
    return self._value(self.grid_V1xC[-1] - self.grid_V1xC, self.rest_V1xC[-1] - self.rest_V1xC)

  @staticmethod
  def _value(grid, rest):
    return grid.astype(rest.dtype) / _GRID + rest


@jax.custom_batching.custom_vmap
def _hull_stack(grid_V1x2, rest_V1x2, m):
  """Lower convex hull of (Q_j, h_j), j = 0..m, by one monotone-chain pass, given the
  `_Sums` of the columns (q, h increments).

  Returns (stack, size): stack[:size] are the vertex indices in increasing order. The top
  b of the stack is popped when the slope from the one below, a, is at least the slope
  from b to the new point j: (h_b - h_a)(Q_j - Q_b) >= (h_j - h_b)(Q_b - Q_a), with the
  increments of (a, b] and (b, j] from the sums. Each factor is then accurate relative to
  itself, so only slopes equal to float precision are confused (the usual form relative
  to a cancels when j is close to b, and misjudged such points on LLM-like pairs). Q and
  h never decrease (`_Sums`); of points with equal Q the later, higher one is popped by
  the ">=", and so are collinear points. The pass reads the stack only before its one
  write per step and reads the written cell back to learn whether it pushed, which lets
  XLA update the stack in place.
  """
  n1 = grid_V1x2.shape[0]

  def point(j):
    return _at(grid_V1x2, j), _at(rest_V1x2, j)

  def rise(x, y):
    dq, dh = _Sums._value(y[0] - x[0], y[1] - x[1])
    return dq, dh

  def body(carry):
    j, size, stack = carry
    a = point(_at(stack, jnp.maximum(size - 2, 0)))
    b = point(_at(stack, jnp.maximum(size - 1, 0)))
    dq_ab, dh_ab = rise(a, b)
    dq_bj, dh_bj = rise(b, point(j))
    pop = (size >= 2) & (dh_ab * dq_bj >= dh_bj * dq_ab)
    stack = lax.dynamic_update_index_in_dim(stack, j, jnp.where(pop, n1, size), 0)
    pushed = (_at(stack, size) == j).astype(jnp.int32)
    return j + pushed, size + 2 * pushed - 1, stack

  init = (jnp.int32(0), jnp.int32(0), jnp.full((n1 + 1,), -1, jnp.int32))
  _, size, stack = lax.while_loop(lambda c: c[0] <= m, body, init)
  return stack[:n1], size


@_hull_stack.def_vmap
def _hull_stack_vmap(axis_size, in_batched, *args):
  return _map_batched(_hull_stack, axis_size, in_batched, *args)


def _slope(rise, a, b, flat):
  """Hull slope (h_b - h_a) / (Q_b - Q_a) of blocks (a, b] from `rise(a, b)` = (Q_b - Q_a,
  h_b - h_a); `flat` where Q_b = Q_a."""
  dq, dh = rise(a, b)
  return jnp.where(dq > 0, dh / jnp.where(dq > 0, dq, 1.0), flat)


class _Kinetic(NamedTuple):
  """State of the kinetic loop over M candidate breakpoints (index M is a dummy)."""

  events: jax.Array  # current removal event of each live candidate, inf otherwise
  prev_node: jax.Array  # neighbouring live candidate in the same block, or -1
  next_node: jax.Array
  prev_slot: jax.Array  # neighbouring breakpoint (a candidate or a block end)
  next_slot: jax.Array
  left_start: jax.Array  # level at which the group (prev_slot, node] was formed
  right_start: jax.Array  # level at which the group (node, next_slot] was formed
  level: jax.Array


def _kinetic(nodes_M, is_node_M, a_M, b_M, mass, rise, u_V1, k, max_k):
  """Kinetic levels of the candidate breakpoints `nodes_M` (sorted by index).

  `mass(i, j)` and `rise(i, j)` give P_j - P_i, Q_j - Q_i and Q_j - Q_i, h_j - h_i from
  the `_Sums`. Each real candidate j lies strictly inside its block (a_j, b_j). The loop removes the
  candidate with the smallest current event, links its neighbours, and records the two
  groups it closes and, for the last candidate of a block, the start of the block's group.

  Returns (node_M, level_M, left_2M, right_2M, life_2M, final_b_M): per step, the removed
  candidate (M if none) and its level; the closed groups (left, right] and their lifetimes;
  the block end whose final group starts at that level (-1 if none).
  """
  num = nodes_M.shape[0]
  idx = jnp.arange(num)
  same = (a_M[None, :] == a_M[:, None]) & is_node_M[None, :]
  prev_node = jnp.max(jnp.where(same & (idx[None, :] < idx[:, None]), idx[None, :], -1), axis=1)
  next_node = jnp.min(jnp.where(same & (idx[None, :] > idx[:, None]), idx[None, :], num), axis=1)
  next_node = jnp.where(next_node == num, -1, next_node)
  prev_slot = jnp.where(prev_node >= 0, nodes_M[jnp.maximum(prev_node, 0)], a_M)
  next_slot = jnp.where(next_node >= 0, nodes_M[jnp.maximum(next_node, 0)], b_M)
  slope_M = _slope(rise, a_M, b_M, 0.0)

  def pad(x, value):
    return jnp.concatenate([x, jnp.full((1,), value, x.dtype)])

  nodes, slope = pad(nodes_M, 0), pad(slope_M, 0.0)

  def event(i, j, r, c):
    (p_ij, q_ij), (p_jl, q_jl) = mass(i, j), mass(j, r)
    gap = (p_ij + p_jl) * p_ij * p_jl * _h3(u_V1[i], u_V1[j], u_V1[r], k, max_k)
    lift = c * (q_ij * p_jl - q_jl * p_ij)
    return jnp.where(gap > 0, lift / jnp.where(gap > 0, gap, 1.0), 0.0)

  events = jnp.where(is_node_M, event(prev_slot, nodes_M, next_slot, slope_M), jnp.inf)
  zero = jnp.zeros((num + 1,), events.dtype)
  init = _Kinetic(
    pad(events, jnp.inf),
    pad(prev_node, -1),
    pad(next_node, -1),
    pad(prev_slot, 0),
    pad(next_slot, 0),
    zero,
    zero,
    jnp.zeros((), events.dtype),
  )

  def step(s: _Kinetic, _):
    i = jnp.argmin(s.events)
    live = s.events[i] < jnp.inf
    i = jnp.where(live, i, num)
    level = jnp.where(live, jnp.clip(s.events[i], s.level, 1.0), s.level)
    left, right = s.prev_node[i], s.next_node[i]
    li = jnp.where(left >= 0, left, num)
    ri = jnp.where(right >= 0, right, num)
    record = (
      i,
      level,
      jnp.stack([s.prev_slot[i], nodes[i]]),
      jnp.stack([nodes[i], s.next_slot[i]]),
      jnp.where(live, jnp.stack([level - s.left_start[i], level - s.right_start[i]]), 0.0),
      jnp.where(live & (left < 0) & (right < 0), s.next_slot[i], -1),
    )
    prev_slot = s.prev_slot.at[ri].set(s.prev_slot[i])
    next_slot = s.next_slot.at[li].set(s.next_slot[i])
    both = jnp.stack([li, ri])
    fresh = event(prev_slot[both], nodes[both], next_slot[both], slope[both])
    events = s.events.at[i].set(jnp.inf).at[both].set(fresh).at[num].set(jnp.inf)
    new = _Kinetic(
      events,
      s.prev_node.at[ri].set(left),
      s.next_node.at[li].set(right),
      prev_slot,
      next_slot,
      s.left_start.at[ri].set(level),
      s.right_start.at[li].set(level),
      level,
    )
    return new, record

  _, (node, level, left, right, life, final_b) = lax.scan(step, init, None, length=num)
  return node, level, left.reshape(-1), right.reshape(-1), life.reshape(-1), final_b


def _plan_single(p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """`optimal_plan` for one position (1-D p_V, q_V; scalar k); vmap batches it."""
  vocab = p_V.shape[0]
  dtype = p_V.dtype
  k = jnp.asarray(k, jnp.int32)
  order_V = _slot_order(p_V, q_V)
  ps_V, qs_V = p_V[order_V], q_V[order_V]
  # Prefix sums with accurate local differences (`_Sums`), monotone by construction: of p,
  # giving u = 1 - P (the mass after j, for precision near P = 1), then of q and
  # of the increments of h = 1 - u^k, h_t - h_{t-1} = p_t H_{k-1}(u_{t-1}, u_t) (sums of
  # positive terms: no cancellation at small P). Each is divided by its computed total,
  # so that u_0 = Q_V = h_V = 1 hold exactly in floats (a float32 total of 1 + 2e-6
  # would enter r as u_0^k).
  j_V1 = jnp.arange(vocab + 1, dtype=jnp.int32)
  sums_p = _Sums.of(ps_V[:, None])
  total_p = sums_p.suffix()[0, 0]
  u_V1 = sums_p.suffix()[:, 0] / total_p
  ps_V = ps_V / total_p
  dh_V = ps_V * _h2(u_V1[:-1], u_V1[1:], k, max_k)
  sums_qh = _Sums.of(jnp.stack([qs_V, dh_V], axis=1))
  totals_qh = sums_qh.suffix()[0]
  totals_qh = jnp.where(totals_qh > 0, totals_qh, 1.0)  # h = 0 for k = 0
  Q_V1, h_V1 = jnp.moveaxis(sums_qh.prefix() / totals_qh, -1, 0)
  qs_V = qs_V / totals_qh[0]

  def mass(i, j):
    return sums_p.between(i, j)[..., 0] / total_p, sums_qh.between(i, j)[..., 0] / totals_qh[0]

  def rise(i, j):
    return jnp.moveaxis(sums_qh.between(i, j) / totals_qh, -1, 0)

  m = jnp.sum((p_V > 0) & (q_V > 0)).astype(jnp.int32)

  # Blocks: the lower hull's vertices, then every breakpoint from m on.
  stack_V1, size = _hull_stack(sums_qh.grid_V1xC, sums_qh.rest_V1xC, m)
  on_hull = jnp.zeros((vocab + 2,), bool).at[jnp.where(j_V1 < size, stack_V1, vocab + 1)].set(True)
  vertex_V1 = on_hull[: vocab + 1] | (j_V1 >= m)
  count_V1 = jnp.cumsum(vertex_V1.astype(jnp.int32))
  # Slot t = 1..V lies in block (a_t, b_t]: a_t the last vertex before t, b_t the first from t.
  block_V = count_V1[:-1] - 1
  vertices_V2 = (
    jnp.full((vocab + 2,), vocab, jnp.int32)
    .at[jnp.where(vertex_V1, count_V1 - 1, vocab + 1)]
    .set(j_V1)
  )
  a_V, b_V = vertices_V2[block_V], vertices_V2[block_V + 1]

  # Kinetic levels of the num_cuts heaviest interior breakpoints.
  num = min(max(num_cuts, 1), vocab + 1)
  weight_V1 = jnp.concatenate([jnp.full((1,), -jnp.inf, dtype), ps_V + qs_V])
  weight_V1 = jnp.where(vertex_V1, -jnp.inf, weight_V1)
  top_w, top_j = lax.top_k(weight_V1, num)
  order_M = jnp.argsort(top_j)
  nodes_M = top_j[order_M].astype(jnp.int32)
  is_node_M = (top_w[order_M] > -jnp.inf) & (num_cuts > 0)
  a_M = jnp.where(is_node_M, a_V[jnp.maximum(nodes_M - 1, 0)], 0)
  b_M = jnp.where(is_node_M, b_V[jnp.maximum(nodes_M - 1, 0)], 0)
  node, level, left, right, life, final_b = _kinetic(
    nodes_M, is_node_M, a_M, b_M, mass, rise, u_V1, k, max_k
  )
  cut_M = jnp.where(node < num, nodes_M[jnp.minimum(node, num - 1)], vocab + 1)
  levels_V1 = vertex_V1.astype(dtype).at[cut_M].set(level, mode="drop")

  # Selection rates: each block's final group, plus the groups closed in the loop.
  final_start = (
    jnp.zeros((vocab + 2,), dtype).at[jnp.where(final_b >= 0, final_b, vocab + 1)].set(level)
  )
  rate_V = (1.0 - final_start[b_V]) * _h2(u_V1[a_V], u_V1[b_V], k, max_k)
  weight_2M = life * _h2(u_V1[left], u_V1[right], k, max_k)
  diff = jnp.zeros((vocab + 2,), dtype).at[left].add(weight_2M).at[right].add(-weight_2M)
  rate_V = rate_V + _cumsum(diff[:vocab, None])[:, 0]
  r_slot_V = ps_V * rate_V
  r_V = jnp.zeros((vocab,), dtype).at[order_V].set(r_slot_V)
  accept = jnp.sum(jnp.minimum(r_V, q_V))

  q_tot = 1.0 - jnp.sum(jnp.where(p_V > 0, 0.0, q_V)) / totals_qh[0]
  bound = jnp.minimum(jnp.min(q_tot - Q_V1 + h_V1), 1.0)
  slope_V = _slope(rise, a_V, b_V, jnp.inf)
  excess_V = jnp.where(slope_V <= 1.0, r_slot_V - qs_V, qs_V - r_slot_V)
  shortfall = jnp.sum(jnp.where(ps_V > 0, jnp.maximum(excess_V, 0.0), 0.0))
  slot_V = jnp.zeros((vocab,), jnp.int32).at[order_V].set(j_V1[1:])
  return OptimalPlan(order_V, slot_V, b_V, cut_M, level, levels_V1, r_V, accept, bound, shortfall)


@functools.partial(jax.jit, static_argnames=("num_cuts", "max_k"))
def _optimal_plan(p_V, q_V, k, *, num_cuts, max_k):
  return _plan_single(p_V, q_V, k, num_cuts, max_k)


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
    num_cuts: how many interior breakpoints may get kinetic levels (static); V or more
      gives the full construction of docs/OPTIMAL_VERIFIER.md.
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
  vocab = plan.slot_V.shape[0]
  slot_K = jnp.where(valid_K, plan.slot_V[drafts_K], vocab)
  first = jnp.min(slot_K)
  threshold = 1.0 - jnp.asarray(u_level, plan.cut_level_M.dtype)
  active_M = (plan.cut_M >= first) & (plan.cut_level_M >= threshold)
  end = jnp.minimum(plan.block_end_V[first - 1], jnp.min(jnp.where(active_M, plan.cut_M, vocab)))
  in_group_K = valid_K & (slot_K <= end)
  count = jnp.sum(in_group_K)
  pick = jnp.floor(u_pick * count).astype(jnp.int32)
  rank_K = jnp.cumsum(in_group_K) - 1
  return jnp.argmax(in_group_K & (rank_K == jnp.minimum(pick, count - 1)))


def _select(key, drafts_K, valid_K, plan: OptimalPlan):
  level_key, pick_key = jax.random.split(key)
  u_level = jax.random.uniform(level_key, dtype=plan.cut_level_M.dtype)
  return select(u_level, jax.random.uniform(pick_key), drafts_K, valid_K, plan)


def _apply_plan(key, drafts_K, valid_K, q_V, plan: OptimalPlan):
  """The verifier's random part given its plan: (token, accepted)."""
  select_key, accept_key, residual_key = jax.random.split(key, 3)
  z = drafts_K[_select(select_key, drafts_K, valid_K, plan)]
  r_z = plan.r_V[z]
  accepted = jnp.any(valid_K) & (jax.random.uniform(accept_key, dtype=r_z.dtype) * r_z < q_V[z])
  y = categorical(residual_key, acceptance.residual(q_V, jnp.minimum(plan.r_V, q_V)))
  return jnp.where(accepted, z, y).astype(jnp.int32), accepted


@functools.partial(jax.jit, static_argnames="num_cuts")
def optimal_unchecked(key, drafts_K, p_V, q_V, valid_K, *, num_cuts: int = DEFAULT_NUM_CUTS):
  """`optimal` without its input checks (valid_K required), for callers inside jit."""
  k = jnp.sum(valid_K).astype(jnp.int32)
  plan = _plan_single(p_V, q_V, k, num_cuts, drafts_K.shape[0])
  return _apply_plan(key, drafts_K, valid_K, q_V, plan)


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
  return optimal_unchecked(key, drafts_K, p_V, q_V, jnp.asarray(valid_K, bool), num_cuts=num_cuts)
