"""The exact, OT-optimal multi-draft verifier (design: docs/OPTIMAL_VERIFIER.md).

With k i.i.d. drafts X_1..X_k ~ p, `optimal` outputs Y ~ q exactly and hits a draft with
probability up to alpha*(p, q, k), the optimal-transport bound
(`acceptance.optimal_acceptance`), of which K-SEQ is only guaranteed 1 - (1 - 1/k)^k.

Notation. The tokens are merged into N slot groups ("slots"): each token its own slot
when V <= H + 258, otherwise the H tokens of largest p + q one slot each and the others
by log2(q / p) in 1/16-octave buckets (q = 0 and p = 0 in one each); H = REFINE_FACTOR x
num_cuts, the cuts a refined plan may use.
Slots with p > 0 sorted by q/p descending are slots 1..n (slots with p = 0 follow and are
never drafted); breakpoint j sits after slot j (j = 0..N). P_j = p(slots 1..j),
u_j = 1 - P_j, Q_j = q(slots 1..j), h_j = 1 - u_j^k (the chance that a draft falls in
slots 1..j). Each breakpoint has a level in [0, 1]. The rule:

  U ~ Uniform(0, 1]; breakpoints with level >= U cut the slots into groups;
  Z = a uniformly chosen draft of the earliest group that holds a draft (duplicates count);
  accept Z with probability min(1, q(Z) / r(Z)), else sample norm(q - min(r, q)),

where r is the law of Z. While group (i, l] exists, each of its tokens t is selected at
rate p_t H_{k-1}(u_i, u_l) (H_d: complete homogeneous symmetric polynomial), so r follows
from the levels by integrating over U. r is always computed from the slots and levels
actually used, so the output law is q for ANY slots and levels; only the acceptance
depends on them (merging tokens of one bucket costs at most 4e-5 of alpha* on the pairs
measured: a slot is never split, so only a bucket that straddles the optimum costs).

Levels: the vertices of the lower convex hull of (Q_j, h_j) (the blocks) get level 1, and
the `num_cuts` heaviest interior breakpoints (by p + q of the slot before them) get the
removal times of a deletion-only kinetic hull (docs/OPTIMAL_VERIFIER.md), found for all
candidates at once by Newton steps on U; all others get level 0. Where the O(n) check
`OptimalPlan.shortfall` exceeds REFINE_SHORTFALL = 2e-3 of the bound, the levels are
redone with REFINE_FACTOR = 2 times the cuts on the same slots, sums and blocks (only
the cuts, levels and rates are recomputed). With num_cuts >= V the levels
are those of the note and sum min(r, q) = alpha*. Measured acceptance, LLM-like and
near-flat pairs: docs/OPTIMAL_VERIFIER.md. With k <= 1 valid drafts no plan is built:
the one draft is Z with r = p (single-draft speculative sampling), or none, and q is
sampled.

Numerics: every prefix sum the construction relies on is monotone by construction and
has accurate local differences (`_Sums`: two exact int32 sums, of 2^-29 units and of
the remainders in finer units), and the hull and level tests compare slopes of local
differences, so ties, zero masses and float noise cost acceptance at float precision only.

CPU note: the hull is a sequential pass over the N slots written so that XLA updates its
stack in place; under `vmap` it runs position by position (`lax.map`, a custom batching
rule), the rest is batched.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spectr_jax import acceptance, checks
from spectr_jax.methods import Verdict
from spectr_jax.sampling import categorical

__all__ = [
  "DEFAULT_NUM_CUTS",
  "OptimalPlan",
  "optimal",
  "optimal_plan",
  "position_verdict",
  "select",
  "select_draft",
  "selection_law",
]

DEFAULT_NUM_CUTS = 64


class OptimalPlan(NamedTuple):
  """The verifier's construction at one position (V vocabulary, N slots, M cuts).

  order_N: slot groups in slot order (int32; groups with p = 0 last).
  slot_V: the slot (1..N) of each token.
  block_end_N: for slot t (at index t - 1), the block end b >= t of its block.
  cut_M, cut_level_M: the candidate breakpoints (N + 1 where unused) and their kinetic
    levels (M entries: the refined plan's number where a plan can be refined).
  levels_N1: level of breakpoints 0..N (1 at block ends), the same levels in full.
  r_V: law of the selected draft Z (sums to 1 for k >= 1, zero for k = 0).
  accept: sum min(r, q), the probability of the accept branch. The hit probability lies
    between accept and bound, and equals both when shortfall = 0.
  bound: alpha* of the slots (their tokens merged) from the same prefix sums: at least
    alpha*(p, q, k), equal to it when every token is its own slot.
  shortfall: the O(V) optimality check: the mass by which r exceeds q on tokens of blocks
    of hull slope <= 1 plus the mass by which it falls short of q on tokens of blocks of
    slope > 1. bound - accept = shortfall (up to rounding); at 0, accept = alpha*(p, q, k).
  """

  order_N: jax.Array
  slot_V: jax.Array
  block_end_N: jax.Array
  cut_M: jax.Array
  cut_level_M: jax.Array
  levels_N1: jax.Array
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


_BUCKETS_PER_OCTAVE = 16
_OCTAVES = 8  # ratios beyond 2^(+-_OCTAVES) share the outermost buckets


def _num_slots(vocab: int, num_heavy: int) -> int:
  """N: V when every token can be its own slot, else num_heavy heavy tokens plus the
  ratio buckets and one bucket each for q = 0 and for p = 0."""
  return min(vocab, max(num_heavy, 0) + 2 * _OCTAVES * _BUCKETS_PER_OCTAVE + 2)


def _slot_groups(p_V, q_V, num_heavy: int):
  """The slot-group id (0..N-1) of every token: the token itself when N = V; otherwise
  the num_heavy tokens of largest p + q get a group each and the rest are bucketed by
  log2(q / p) at 1/16 octave (q = 0 and p = 0 in buckets of their own). Only the order of the groups
  and the breakpoints between them matter to the verifier, so tokens of one group are
  never split (docs/OPTIMAL_VERIFIER.md)."""
  vocab = p_V.shape[0]
  num = _num_slots(vocab, num_heavy)
  if num == vocab:
    return jnp.arange(vocab, dtype=jnp.int32)
  heavy = max(num_heavy, 0)
  # The exponent and top mantissa bits of the float32 ratio: 1/16-octave buckets.
  ratio_V = (q_V / jnp.where(p_V > 0, p_V, 1.0)).astype(jnp.float32)
  shift = 23 - (_BUCKETS_PER_OCTAVE.bit_length() - 1)
  low = (127 - _OCTAVES) * _BUCKETS_PER_OCTAVE
  top = 2 * _OCTAVES * _BUCKETS_PER_OCTAVE - 1
  code_V = (lax.bitcast_convert_type(ratio_V, jnp.int32) >> shift) - low
  code_V = jnp.where(q_V > 0, jnp.clip(code_V, 0, top), top + 1)
  code_V = jnp.where(p_V > 0, code_V, top + 2).astype(jnp.int32)
  group_V = heavy + code_V
  if heavy:
    _, top_j = lax.top_k(jnp.where(p_V > 0, p_V + q_V, -1.0), heavy)
    group_V = group_V.at[top_j].set(jnp.arange(heavy, dtype=jnp.int32))
  return group_V


def _slot_order(p_N, q_N):
  """Slot groups by q/p descending, then q = 0, then p = 0; ties by index.

  The ratio is reduced to a code of the top 31 - ceil(log2 N) bits of its float32
  pattern, packed with the index into one int32 key for XLA's single-operand sort (a
  key-value sort is 4x slower on CPU). Ratios that share a code keep index order:
  acceptance moves by 1e-8 at most (docs/OPTIMAL_VERIFIER.md), exactness never.
  """
  num = p_N.shape[0]
  index_bits = max(1, (num - 1).bit_length())
  code_bits = 31 - index_bits
  top = (1 << code_bits) - 3
  ratio_N = (q_N / jnp.where(p_N > 0, p_N, 1.0)).astype(jnp.float32)
  bits_N = lax.bitcast_convert_type(ratio_N, jnp.int32) >> (31 - code_bits)
  code_N = jnp.where(
    p_N > 0, jnp.where(q_N > 0, top - jnp.minimum(bits_N, top), top + 1), top + 2
  ).astype(jnp.int32)
  key_N = lax.sort((code_N << index_bits) | jnp.arange(num, dtype=jnp.int32), is_stable=False)
  return key_N & ((1 << index_bits) - 1)


def _map_batched(fn, axis_size, in_batched, *args):
  """Runs `fn` over a batch one element after another (`lax.map`), broadcasting the
  unbatched arguments: the batching rule of the hull pass below, whose in-place
  updates a batched loop would turn into scatters."""
  args = [
    x if batched else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))
    for x, batched in zip(args, in_batched, strict=True)
  ]
  out = lax.map(lambda a: fn(*a), tuple(args))
  return out, jax.tree.map(lambda _: True, out)


def _at(x, i):
  return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


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


def _levels(nodes_M, is_node_M, a_M, b_M, sums: _Sums, totals_3):
  """Kinetic levels of the candidate breakpoints `nodes_M` (sorted by index).

  `sums` holds the `_Sums` of the columns (p, q, h increments) and `totals_3` their
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
  c_M = _slope(_rise(sums, totals_3), a_M, b_M, 0.0)
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
      _Sums._value(grid_hi - grid_lo, rest_hi - rest_lo) / totals_3, -1, 0
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


def _rate_diff(nodes_M, is_node_M, a_M, b_M, level_M, h2, size: int):
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


class _Slots(NamedTuple):
  """The part of a plan that does not depend on its number of cuts: the slots, their
  prefix sums, blocks and the bound (N slots; N1 = N + 1 breakpoints)."""

  order_N: jax.Array
  slot_V: jax.Array
  u_N1: jax.Array
  sums: _Sums  # of the columns (p, q, h increments) in slot order
  totals_3: jax.Array  # their totals
  vertex_N1: jax.Array
  a_N: jax.Array
  b_N: jax.Array
  weight_N1: jax.Array
  slope_N: jax.Array
  bound: jax.Array


def _slots(p_V, q_V, k, num_heavy: int, max_k: int) -> _Slots:
  """The slots of one position (`num_heavy` tokens of their own, see `_slot_groups`),
  their sums, the lower hull's blocks and the bound."""
  vocab = p_V.shape[0]
  num = _num_slots(vocab, num_heavy)
  dtype = p_V.dtype
  group_V = _slot_groups(p_V, q_V, num_heavy)
  if num == vocab:
    p_N, q_N = p_V, q_V
  else:
    p_N = jnp.zeros((num,), dtype).at[group_V].add(p_V)
    q_N = jnp.zeros((num,), dtype).at[group_V].add(q_V)
  order_N = _slot_order(p_N, q_N)
  ps_N, qs_N = p_N[order_N], q_N[order_N]
  # Prefix sums with accurate local differences (`_Sums`), monotone by construction: of p,
  # giving u = 1 - P (the mass after j, for precision near P = 1), then of q and
  # of the increments of h = 1 - u^k, h_t - h_{t-1} = p_t H_{k-1}(u_{t-1}, u_t) (sums of
  # positive terms: no cancellation at small P). Each is divided by its computed total,
  # so that u_0 = Q_N = h_N = 1 hold exactly in floats (a float32 total of 1 + 2e-6
  # would enter r as u_0^k).
  j_N1 = jnp.arange(num + 1, dtype=jnp.int32)
  sums_p = _Sums.of(ps_N[:, None])
  total_p = sums_p.suffix()[0, 0]
  u_N1 = sums_p.suffix()[:, 0] / total_p
  ps_N = ps_N / total_p
  dh_N = ps_N * _h2(u_N1[:-1], u_N1[1:], k, max_k)
  sums_qh = _Sums.of(jnp.stack([qs_N, dh_N], axis=1))
  totals_qh = sums_qh.suffix()[0]
  totals_qh = jnp.where(totals_qh > 0, totals_qh, 1.0)  # h = 0 for k = 0
  Q_N1, h_N1 = jnp.moveaxis(sums_qh.prefix() / totals_qh, -1, 0)
  qs_N = qs_N / totals_qh[0]
  m = jnp.sum((p_N > 0) & (q_N > 0)).astype(jnp.int32)

  # Blocks: the lower hull's vertices, then every breakpoint from m on.
  stack_N1, size = _hull_stack(sums_qh.grid_V1xC, sums_qh.rest_V1xC, m)
  on_hull = jnp.zeros((num + 2,), bool).at[jnp.where(j_N1 < size, stack_N1, num + 1)].set(True)
  vertex_N1 = on_hull[: num + 1] | (j_N1 >= m)
  count_N1 = jnp.cumsum(vertex_N1.astype(jnp.int32))
  # Slot t = 1..N lies in block (a_t, b_t]: a_t the last vertex before t, b_t the first from t.
  block_N = count_N1[:-1] - 1
  vertices_N2 = (
    jnp.full((num + 2,), num, jnp.int32).at[jnp.where(vertex_N1, count_N1 - 1, num + 1)].set(j_N1)
  )
  a_N, b_N = vertices_N2[block_N], vertices_N2[block_N + 1]
  # Interior breakpoints weighted by p + q of the slot before them (cut candidates).
  weight_N1 = jnp.concatenate([jnp.full((1,), -jnp.inf, dtype), ps_N + qs_N])
  weight_N1 = jnp.where(vertex_N1, -jnp.inf, weight_N1)
  sums = _Sums(*(jnp.concatenate(x, axis=1) for x in zip(sums_p, sums_qh, strict=True)))
  totals_3 = jnp.concatenate([total_p[None], totals_qh])
  slope_N = _slope(_rise(sums, totals_3), a_N, b_N, jnp.inf)
  slot_V = jnp.zeros((num,), jnp.int32).at[order_N].set(j_N1[1:])[group_V]
  q_tot = 1.0 - jnp.sum(jnp.where(p_V > 0, 0.0, q_V)) / totals_qh[0]
  bound = jnp.minimum(jnp.min(q_tot - Q_N1 + h_N1), 1.0)
  return _Slots(
    order_N, slot_V, u_N1, sums, totals_3, vertex_N1, a_N, b_N, weight_N1, slope_N, bound
  )


def _rise(sums: _Sums, totals_3):
  """rise(i, j) = (Q_j - Q_i, h_j - h_i) from the sums of (p, q, h increments)."""
  return lambda i, j: jnp.moveaxis(sums.between(i, j)[..., 1:] / totals_3[1:], -1, 0)


def _cut_plan(slots: _Slots, p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """The plan on `slots` with kinetic levels for the `num_cuts` heaviest interior
  breakpoints: the levels, the selection rates, r and the shortfall check."""
  num = slots.a_N.shape[0]
  dtype = p_V.dtype
  a_N, b_N = slots.a_N, slots.b_N
  cuts = min(max(num_cuts, 1), num + 1)
  top_w, top_j = lax.top_k(slots.weight_N1, cuts)
  order_M = jnp.argsort(top_j)
  nodes_M = top_j[order_M].astype(jnp.int32)
  is_node_M = (top_w[order_M] > -jnp.inf) & (num_cuts > 0)
  a_M = jnp.where(is_node_M, a_N[jnp.maximum(nodes_M - 1, 0)], 0)
  b_M = jnp.where(is_node_M, b_N[jnp.maximum(nodes_M - 1, 0)], 0)
  level_M = _levels(nodes_M, is_node_M, a_M, b_M, slots.sums, slots.totals_3)
  cut_M = jnp.where(is_node_M, nodes_M, num + 1)
  levels_N1 = slots.vertex_N1.astype(dtype).at[cut_M].set(level_M, mode="drop")

  # Selection rates: each block's group (a, b] while no candidate inside is active, plus
  # the groups between candidates.
  def h2(i, j):
    return _h2(slots.u_N1[i], slots.u_N1[j], k, max_k)

  diff = _rate_diff(nodes_M, is_node_M, a_M, b_M, level_M, h2, num + 1)
  rate_N = h2(a_N, b_N) + _cumsum(diff[:num, None])[:, 0]
  # Meant to materialise them once; the CPU compiler drops the barrier and fuses the rates'
  # arithmetic into the per-token pass below (about a sixth of a refined plan's time in a
  # profile; left as is).
  slot_V, rate_N, slope_N = lax.optimization_barrier((slots.slot_V, rate_N, slots.slope_N))
  r_V = p_V / slots.totals_3[0] * rate_N[slot_V - 1]
  accept = jnp.sum(jnp.minimum(r_V, q_V))
  qn_V = q_V / slots.totals_3[1]
  excess_V = jnp.where(slope_N[slot_V - 1] <= 1.0, r_V - qn_V, qn_V - r_V)
  shortfall = jnp.sum(jnp.where(p_V > 0, jnp.maximum(excess_V, 0.0), 0.0))
  return OptimalPlan(
    slots.order_N, slot_V, b_N, cut_M, level_M, levels_N1, r_V, accept, slots.bound, shortfall
  )


def _plan_single(p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """`optimal_plan` for one position (1-D p_V, q_V; scalar k) without refinement, its
  slots and cuts both from num_cuts; vmap batches it."""
  k = jnp.asarray(k, jnp.int32)
  return _cut_plan(_slots(p_V, q_V, k, num_cuts, max_k), p_V, q_V, k, num_cuts, max_k)


REFINE_FACTOR = 2
REFINE_SHORTFALL = 2e-3


def _pad_cuts(plan: OptimalPlan, num_cuts: int) -> OptimalPlan:
  """`plan` with its cuts padded to `num_cuts` (the refined plan's number): the extra
  cuts are unused breakpoints of level 0, so the rule is unchanged."""
  pad = num_cuts - plan.cut_M.shape[0]
  unused = plan.block_end_N.shape[0] + 1
  return plan._replace(
    cut_M=jnp.concatenate([plan.cut_M, jnp.full((pad,), unused, plan.cut_M.dtype)]),
    cut_level_M=jnp.concatenate([plan.cut_level_M, jnp.zeros((pad,), plan.cut_level_M.dtype)]),
  )


def _plan(p_V, q_V, k, num_cuts: int, max_k: int) -> OptimalPlan:
  """The plan with num_cuts, its levels redone with REFINE_FACTOR x num_cuts where its
  shortfall exceeds REFINE_SHORTFALL x its bound. The slots (with REFINE_FACTOR x
  num_cuts heavy tokens), their sums and blocks are built once and serve both. The
  refinement runs in a `lax.while_loop` of at most one step rather than a `lax.cond`:
  under vmap a cond runs both branches for every position, the loop runs only when some
  position needs it."""
  k = jnp.asarray(k, jnp.int32)
  more = min(REFINE_FACTOR * num_cuts, p_V.shape[0] + 1)
  slots = _slots(p_V, q_V, k, max(more, num_cuts), max_k)
  plan = _cut_plan(slots, p_V, q_V, k, num_cuts, max_k)
  if more <= num_cuts:
    return plan
  plan = _pad_cuts(plan, min(more, slots.a_N.shape[0] + 1))
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
  return _plan(p_V, q_V, k, num_cuts, max_k)


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
  num = plan.block_end_N.shape[0]
  slot_K = jnp.where(valid_K, plan.slot_V[drafts_K], num)
  first = jnp.min(slot_K)
  threshold = 1.0 - jnp.asarray(u_level, plan.cut_level_M.dtype)
  active_M = (plan.cut_M >= first) & (plan.cut_level_M >= threshold)
  end = jnp.minimum(plan.block_end_N[first - 1], jnp.min(jnp.where(active_M, plan.cut_M, num)))
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
  """`_plan` where `need`, a plan of zeros elsewhere. Like the refinement in `_plan`, a
  `lax.while_loop` of at most one step: under vmap it runs only when some position
  needs it (a `lax.cond` would run for every position)."""
  shape = jax.eval_shape(lambda: _plan(p_V, q_V, k, num_cuts, max_k))
  empty = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shape)

  def build(carry):
    # p and q read through the loop flag, so XLA cannot hoist the plan out of the loop.
    need, _ = carry
    p, q = (jnp.where(need, x, 0.0) for x in (p_V, q_V))
    return jnp.bool_(False), _plan(p, q, k, num_cuts, max_k)

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
