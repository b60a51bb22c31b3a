"""Adaptive speculation: each round's draft length chosen from the draft's own law, exactly.

A round drafts L positions (static shapes) and verifies a prefix of them, l of L per
block, chosen position by position from what was drafted before: position j
(1 <= j < L) is verified iff the likeliest draft prefix before it,

  max_k prod_{t < j} p_k,t(x_k,t),

is at least `threshold` (position 0 always is); the walk then draws its bonus token
after position l - 1 from the target (`verify.walk_positions(length=l)`). A confident
draft is verified further, a doubtful one is cut where its prefix became unlikely, the
SpecDec++ / DISCO idea (arXiv 2405.19715, 2405.04304) with the draft's own
probabilities as the predictor.

Why it stays exact for every token-level walk: the decision to verify position j is a
function of the tokens drafted before j (a stopping time of the drafting). Given those,
each surviving draft's token at j is still a fresh draw from p given its own prefix, so
the verifier at j sees the law it is exact for, whether j was reached or the walk
stopped before it (and then the bonus comes from q). A rule that looks at position j's
own token to decide whether j is verified (its draft probability, its target
probability) changes the law of the tokens the verifier sees: such rules are not exact,
and the tests show the harness rejecting them (tests/decoding/test_adaptive.py).

The engine runs it with `DecodeSpec(adaptive=threshold)`: the draft loop stops when no
row of the batch verifies the next position (`drafting`, a `lax.while_loop`), the target
scores the drafts up to the smallest of `length_buckets` that holds the batch's longest
length (one compiled call per bucket), and each row's walk verifies its own length
(`rounds.run_round`). Static shapes throughout: positions never drafted hold p = 0,
which never passes the rule and is never read by the walk.

The length is the run of leading positions that pass (position 0 always does), so it is
well defined by construction, whatever the rounding of the running sums.

The batch's tree budget (`budget_nodes`, `DecodeSpec(node_budget=n)`) is the same idea on
a drafted tree, across rows: the default "wor" tree (K distinct first tokens, each path a
chain) is drafted whole, then the live rows share floor(n x live rows) of its nodes, given
greedily to the nodes the walk is likeliest to reach were the target the draft, and each
path is verified up to the depth its kept nodes reach (`verify.walk_positions` and
`traversal.verify_tree` with per-path lengths; the target scores only the kept nodes,
`tree.from_paths`). Whether a node is kept depends on its ancestors, on the earlier first
tokens and on nodes drafted independently of it, never on its own token or below it, so
the number of children of every node is a stopping time of its draws, which recursive
rejection without replacement and Traversal Verification allow (docs/ADAPTIVE.md).
"""

import jax
import jax.numpy as jnp

__all__ = ["budget_nodes", "confident_length", "length_buckets"]


def length_buckets(draft_len: int) -> tuple[int, ...]:
  """The lengths the target's call is compiled for: the powers of two below L, and L."""
  return tuple(sorted({2**i for i in range(draft_len.bit_length()) if 2**i < draft_len}
                      | {draft_len}))  # fmt: skip


def confident_length(drafts_KxL, p_KxLxV, threshold) -> jnp.ndarray:
  """The number of positions to verify, 1 <= l <= L (module docstring): 1 plus the
  positions j >= 1 whose likeliest draft prefix before j has probability >= threshold.
  threshold <= 0 verifies every position (l = L).

  Args:
    drafts_KxL: the K drafts' tokens.
    p_KxLxV: the draft distributions they were drawn from (p[k, t] given drafts[k, :t]).
    threshold: float scalar (may be traced).
  """
  p_KxL = jnp.take_along_axis(p_KxLxV, drafts_KxL[..., None], -1)[..., 0].astype(jnp.float32)
  log_p_KxL = jnp.log(p_KxL)  # a token drawn from p has p > 0; -inf would only stop earlier
  # The log-probability of each draft's prefix before position j: the sum over t < j.
  through_KxL = jnp.cumsum(log_p_KxL, axis=1)
  before_KxL = jnp.concatenate([jnp.zeros_like(through_KxL[:, :1]), through_KxL[:, :-1]], 1)
  passes_L = jnp.max(before_KxL, axis=0) >= jnp.log(jnp.float32(threshold))
  passes_L = passes_L.at[0].set(True)
  return jnp.sum(jnp.cumprod(passes_L.astype(jnp.int32))).astype(jnp.int32)


def budget_nodes(drafts_BxKxL, p_BxKxLxV, node_budget, live_B) -> jnp.ndarray:
  """The depth each path of the default "wor" tree verifies when the live rows share
  floor(node_budget x live rows) of the round's drafted nodes (module docstring).

  Node (k, t) of a row (path k's token at depth t + 1) is worth the chance the walk
  reaches it were the target the draft:

    reach(k, 0) = 1 - sum_{i < k} p(x_i,0)          (no earlier first token was taken)
    reach(k, t) = p(x_k,0) prod_{1 <= s < t} p(x_k,s)   (t >= 1: its ancestors taken),

  a running sum shifted by one and a running product shifted by one, so never the node's
  own token; a running minimum along the path makes reach non-increasing from a node to
  its child by construction. The nodes are ranked by (reach descending, depth, path,
  row) and the first n kept: every live row keeps its first first token; a node's rank
  counts only nodes worth more than it or tied and earlier, none of them at or below it
  nor a later first token (worth at most its own, and ranked after on ties), so
  whether it is kept never depends on its own token or its subtree. Kept nodes are closed
  under parents and earlier first tokens (a cumulative product along each path and along
  the first tokens; the ranking already gives it). The greedy that adds the frontier
  node worth most, one at a time, keeps the same set, since reach never increases
  towards the leaves.

  Args:
    drafts_BxKxL: the default tree's paths (K distinct first tokens; a path past the
      draft's support repeats an earlier first token and is never kept).
    p_BxKxLxV: the draft distributions the tokens were drawn from.
    node_budget: drafted nodes per live row on average (float, may be traced; >= 1).
    live_B: the rows that share the budget (finished rows keep their first node).

  Returns:
    length_BxK (int32): path k verifies its first length_BxK[b, k] tokens (0: not kept).
  """
  b, k, length = drafts_BxKxL.shape
  drawn_BxKxL = jnp.take_along_axis(p_BxKxLxV, drafts_BxKxL[..., None], -1)[..., 0]
  first_BxK = drafts_BxKxL[:, :, 0]
  repeated_BxK = jnp.any(
    (first_BxK[:, :, None] == first_BxK[:, None, :]) & jnp.tri(k, k, -1, bool), axis=-1
  )
  first_p_BxK = jnp.where(repeated_BxK, 0.0, drawn_BxKxL[:, :, 0])
  # The mass before k: the running sum shifted by one (a running maximum keeps it
  # non-decreasing whatever order the sum is computed in).
  through_BxK = jax.lax.cummax(jnp.cumsum(first_p_BxK, axis=1), axis=1)
  before_BxK = jnp.concatenate([jnp.zeros_like(through_BxK[:, :1]), through_BxK[:, :-1]], 1)
  ancestors_BxKxL = jnp.cumprod(drawn_BxKxL, axis=2)
  reach_BxKxL = jnp.concatenate([(1.0 - before_BxK)[..., None], ancestors_BxKxL[..., :-1]], 2)
  reach_BxKxL = jax.lax.cummin(reach_BxKxL, axis=2)
  index = jnp.meshgrid(jnp.arange(b), jnp.arange(k), jnp.arange(length), indexing="ij")
  row_BxKxL, path_BxKxL, depth_BxKxL = index
  first_node_BxKxL = (path_BxKxL == 0) & (depth_BxKxL == 0)
  open_BxKxL = live_B[:, None, None] & ~repeated_BxK[..., None] & ~first_node_BxKxL
  value_BxKxL = jnp.where(open_BxKxL, reach_BxKxL, -jnp.inf)
  order_X = jnp.lexsort(
    (row_BxKxL.ravel(), path_BxKxL.ravel(), depth_BxKxL.ravel(), -value_BxKxL.ravel())
  )
  rank_BxKxL = jnp.zeros(order_X.size, jnp.int32).at[order_X].set(jnp.arange(order_X.size))
  live = jnp.sum(live_B).astype(jnp.int32)
  extra = jnp.floor(live.astype(jnp.float32) * node_budget).astype(jnp.int32) - live
  chosen_BxKxL = first_node_BxKxL | (open_BxKxL & (rank_BxKxL.reshape(b, k, length) < extra))
  # Closed under parents and earlier first tokens by construction.
  along_BxKxL = jnp.cumprod(chosen_BxKxL.astype(jnp.int32), axis=2)
  firsts_BxK = jnp.cumprod(chosen_BxKxL[:, :, 0].astype(jnp.int32), axis=1)
  return jnp.sum(along_BxKxL * firsts_BxK[..., None], axis=2).astype(jnp.int32)
