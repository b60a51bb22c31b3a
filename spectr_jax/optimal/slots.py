"""The slots of the optimal verifier and their exact prefix sums and hull (notation:
`spectr_jax.optimal`): slot groups and their order, the int32 prefix sums `Sums`, the
lower convex hull's blocks, and `make_slots`, the part of a plan that does not depend on
its number of cuts."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


def complete_homogeneous(x, y, k, max_k: int):
  """H_{k-1}(x, y) = sum_{i<k} x^i y^(k-1-i) for integer k in [0, max_k] (traced)."""
  y_pow = jnp.ones_like(x * y)
  total = jnp.zeros_like(y_pow)
  for d in range(max_k):
    total = jnp.where(d < k, x * total + y_pow, total)
    y_pow = y_pow * y
  return total


_BUCKETS_PER_OCTAVE = 16
_OCTAVES = 8  # ratios beyond 2^(+-_OCTAVES) share the outermost buckets


def _num_slots(vocab: int, num_heavy: int) -> int:
  """Vs: V when every token can be its own slot, else num_heavy heavy tokens plus the
  ratio buckets and one bucket each for q = 0 and for p = 0."""
  return min(vocab, max(num_heavy, 0) + 2 * _OCTAVES * _BUCKETS_PER_OCTAVE + 2)


def _slot_groups(p_V, q_V, num_heavy: int):
  """The slot-group id (0..Vs-1) of every token: the token itself when Vs = V; otherwise
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


def _slot_order(p_Vs, q_Vs):
  """Slot groups by q/p descending, then q = 0, then p = 0; ties by index.

  The ratio is reduced to a code of the top 31 - ceil(log2 Vs) bits of its float32
  pattern, packed with the index into one int32 key for XLA's single-operand sort (a
  key-value sort is 4x slower on CPU). Ratios that share a code keep index order:
  acceptance moves by 1e-8 at most (docs/OPTIMAL_VERIFIER.md), exactness never.
  """
  num = p_Vs.shape[0]
  index_bits = max(1, (num - 1).bit_length())
  code_bits = 31 - index_bits
  top = (1 << code_bits) - 3
  ratio_Vs = (q_Vs / jnp.where(p_Vs > 0, p_Vs, 1.0)).astype(jnp.float32)
  bits_Vs = lax.bitcast_convert_type(ratio_Vs, jnp.int32) >> (31 - code_bits)
  code_Vs = jnp.where(
    p_Vs > 0, jnp.where(q_Vs > 0, top - jnp.minimum(bits_Vs, top), top + 1), top + 2
  ).astype(jnp.int32)
  key_Vs = lax.sort((code_Vs << index_bits) | jnp.arange(num, dtype=jnp.int32), is_stable=False)
  return key_Vs & ((1 << index_bits) - 1)


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


def cumsum(x_AxC, block: int = 128):
  """Inclusive cumulative sums down axis 0 of an Vs x C array, by blocked triangular
  matmuls with the block totals summed the same way (several times faster than
  `jnp.cumsum` on CPU). Not monotone: where independently rounded block offsets meet the
  sums can step down by a unit in the last place (`Sums` is monotone)."""
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
  offsets = jnp.concatenate([jnp.zeros((1, c), x_AxC.dtype), cumsum(within[:-1, -1], block)])
  return (within + offsets[:, None]).reshape(rows * block, c)[:n]


_GRID = 2.0**29


class Sums(NamedTuple):
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
    return self.value(self.grid_V1xC[j] - self.grid_V1xC[i], self.rest_V1xC[j] - self.rest_V1xC[i])

  def prefix(self):
    """Mass of slots 1..j for every breakpoint j (Vs1 x C)."""
    return self.value(self.grid_V1xC, self.rest_V1xC)

  def suffix(self):
    """Mass of the slots after j for every breakpoint j (Vs1 x C)."""
    return self.value(self.grid_V1xC[-1] - self.grid_V1xC, self.rest_V1xC[-1] - self.rest_V1xC)

  @staticmethod
  def value(grid, rest):
    return grid.astype(rest.dtype) / _GRID + rest


@jax.custom_batching.custom_vmap
def _hull_stack(grid_V1x2, rest_V1x2, m):
  """Lower convex hull of (Q_j, h_j), j = 0..m, by one monotone-chain pass, given the
  `Sums` of the columns (q, h increments).

  Returns (stack, size): stack[:size] are the vertex indices in increasing order. The top
  b of the stack is popped when the slope from the one below, a, is at least the slope
  from b to the new point j: (h_b - h_a)(Q_j - Q_b) >= (h_j - h_b)(Q_b - Q_a), with the
  increments of (a, b] and (b, j] from the sums. Each factor is then accurate relative to
  itself, so only slopes equal to float precision are confused (the usual form relative
  to a cancels when j is close to b, and misjudged such points on LLM-like pairs). Q and
  h never decrease (`Sums`); of points with equal Q the later, higher one is popped by
  the ">=", and so are collinear points. The pass reads the stack only before its one
  write per step and reads the written cell back to learn whether it pushed, which lets
  XLA update the stack in place.
  """
  n1 = grid_V1x2.shape[0]

  def point(j):
    return _at(grid_V1x2, j), _at(rest_V1x2, j)

  def rise(x, y):
    dq, dh = Sums.value(y[0] - x[0], y[1] - x[1])
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


def block_slope(rise, a, b, flat):
  """Hull slope (h_b - h_a) / (Q_b - Q_a) of blocks (a, b] from `rise(a, b)` = (Q_b - Q_a,
  h_b - h_a); `flat` where Q_b = Q_a."""
  dq, dh = rise(a, b)
  return jnp.where(dq > 0, dh / jnp.where(dq > 0, dq, 1.0), flat)


def rise_of(sums: Sums, totals_3):
  """rise(i, j) = (Q_j - Q_i, h_j - h_i) from the sums of (p, q, h increments)."""
  return lambda i, j: jnp.moveaxis(sums.between(i, j)[..., 1:] / totals_3[1:], -1, 0)


class Slots(NamedTuple):
  """The part of a plan that does not depend on its number of cuts: the slots, their
  prefix sums, blocks and the bound (Vs slots; Vs1 = Vs + 1 breakpoints)."""

  order_Vs: jax.Array
  slot_V: jax.Array
  u_Vs1: jax.Array
  sums: Sums  # of the columns (p, q, h increments) in slot order
  totals_3: jax.Array  # their totals
  vertex_Vs1: jax.Array
  a_Vs: jax.Array
  b_Vs: jax.Array
  weight_Vs1: jax.Array
  slope_Vs: jax.Array
  bound: jax.Array


def make_slots(p_V, q_V, k, num_heavy: int, max_k: int) -> Slots:
  """The slots of one position (`num_heavy` tokens of their own, see `_slot_groups`),
  their sums, the lower hull's blocks and the bound."""
  vocab = p_V.shape[0]
  num = _num_slots(vocab, num_heavy)
  dtype = p_V.dtype
  group_V = _slot_groups(p_V, q_V, num_heavy)
  if num == vocab:
    p_Vs, q_Vs = p_V, q_V
  else:
    p_Vs = jnp.zeros((num,), dtype).at[group_V].add(p_V)
    q_Vs = jnp.zeros((num,), dtype).at[group_V].add(q_V)
  order_Vs = _slot_order(p_Vs, q_Vs)
  ps_Vs, qs_Vs = p_Vs[order_Vs], q_Vs[order_Vs]
  # Prefix sums with accurate local differences (`Sums`), monotone by construction: of p,
  # giving u = 1 - P (the mass after j, for precision near P = 1), then of q and
  # of the increments of h = 1 - u^k, h_t - h_{t-1} = p_t H_{k-1}(u_{t-1}, u_t) (sums of
  # positive terms: no cancellation at small P). Each is divided by its computed total,
  # so that u_0 = Q_Vs = h_Vs = 1 hold exactly in floats (a float32 total of 1 + 2e-6
  # would enter r as u_0^k).
  j_Vs1 = jnp.arange(num + 1, dtype=jnp.int32)
  sums_p = Sums.of(ps_Vs[:, None])
  total_p = sums_p.suffix()[0, 0]
  u_Vs1 = sums_p.suffix()[:, 0] / total_p
  ps_Vs = ps_Vs / total_p
  dh_Vs = ps_Vs * complete_homogeneous(u_Vs1[:-1], u_Vs1[1:], k, max_k)
  sums_qh = Sums.of(jnp.stack([qs_Vs, dh_Vs], axis=1))
  totals_qh = sums_qh.suffix()[0]
  totals_qh = jnp.where(totals_qh > 0, totals_qh, 1.0)  # h = 0 for k = 0
  Q_Vs1, h_Vs1 = jnp.moveaxis(sums_qh.prefix() / totals_qh, -1, 0)
  qs_Vs = qs_Vs / totals_qh[0]
  m = jnp.sum((p_Vs > 0) & (q_Vs > 0)).astype(jnp.int32)

  # Blocks: the lower hull's vertices, then every breakpoint from m on.
  stack_Vs1, size = _hull_stack(sums_qh.grid_V1xC, sums_qh.rest_V1xC, m)
  on_hull = jnp.zeros((num + 2,), bool).at[jnp.where(j_Vs1 < size, stack_Vs1, num + 1)].set(True)
  vertex_Vs1 = on_hull[: num + 1] | (j_Vs1 >= m)
  count_Vs1 = jnp.cumsum(vertex_Vs1.astype(jnp.int32))
  # Slot t = 1..Vs lies in block (a_t, b_t]: a_t the last vertex before t, b_t the first from t.
  block_Vs = count_Vs1[:-1] - 1
  vertices_Vs2 = (
    jnp.full((num + 2,), num, jnp.int32)
    .at[jnp.where(vertex_Vs1, count_Vs1 - 1, num + 1)]
    .set(j_Vs1)
  )
  a_Vs, b_Vs = vertices_Vs2[block_Vs], vertices_Vs2[block_Vs + 1]
  # Interior breakpoints weighted by p + q of the slot before them (cut candidates).
  weight_Vs1 = jnp.concatenate([jnp.full((1,), -jnp.inf, dtype), ps_Vs + qs_Vs])
  weight_Vs1 = jnp.where(vertex_Vs1, -jnp.inf, weight_Vs1)
  sums = Sums(*(jnp.concatenate(x, axis=1) for x in zip(sums_p, sums_qh, strict=True)))
  totals_3 = jnp.concatenate([total_p[None], totals_qh])
  slope_Vs = block_slope(rise_of(sums, totals_3), a_Vs, b_Vs, jnp.inf)
  slot_V = jnp.zeros((num,), jnp.int32).at[order_Vs].set(j_Vs1[1:])[group_V]
  q_tot = 1.0 - jnp.sum(jnp.where(p_V > 0, 0.0, q_V)) / totals_qh[0]
  bound = jnp.minimum(jnp.min(q_tot - Q_Vs1 + h_Vs1), 1.0)
  return Slots(
    order_Vs, slot_V, u_Vs1, sums, totals_3, vertex_Vs1, a_Vs, b_Vs, weight_Vs1, slope_Vs, bound
  )
