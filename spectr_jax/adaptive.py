"""Adaptive speculation: each round's verified length chosen from the draft's own law, exactly.

Derivation and measurements: docs/ADAPTIVE.md. Two rules, both read before the target runs:
- `confident_length`: a round drafts L positions and verifies the first l. Position j >= 1
  is verified while the likeliest draft prefix before it has probability >= threshold
  (`DecodeSpec(adaptive=threshold)`; SpecDec++ / DISCO, arXiv 2405.19715, 2405.04304).
- `budget_nodes`: the live rows share floor(node_budget x live rows) nodes of the default
  "wor" tree, kept where the walk is likeliest to reach (`DecodeSpec(node_budget=n)`).
`length_buckets` gives the lengths the target's call is compiled for.

Exact because each decision reads only draws made before the position or node it decides,
or independent of it: a stopping time of the drafting. A rule that reads a node's own token is not
exact; tests/decoding/test_adaptive.py shows the harness rejecting such rules.

Shapes stay static: positions never drafted hold p = 0, which never passes the rule and
is never read by the walk (`verify.walk_positions(length=l)`).
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
  floor(node_budget x live rows) of the round's drafted nodes (docs/ADAPTIVE.md).

  Node (k, t) of a row (path k's token at depth t + 1) is worth the chance the walk
  reaches it were the target the draft:

    reach(k, 0) = 1 - sum_{i < k} p(x_i,0)              (no earlier first token taken)
    reach(k, t) = p(x_k,0) prod_{1 <= s < t} p(x_k,s)   (t >= 1: its ancestors taken).

  The nodes are ranked by (reach descending, depth, path, row) and the first ones kept;
  every live row keeps its first first token. A node's rank never reads its own token
  or its subtree, so the budget keeps the tree's law exact.

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
  # Its ancestors' product: the running product shifted by one, never the node's own token.
  ancestors_BxKxL = jnp.cumprod(drawn_BxKxL, axis=2)
  reach_BxKxL = jnp.concatenate([(1.0 - before_BxK)[..., None], ancestors_BxKxL[..., :-1]], 2)
  # Reach never increases from a node to its child, whatever the rounding.
  reach_BxKxL = jax.lax.cummin(reach_BxKxL, axis=2)
  index = jnp.meshgrid(jnp.arange(b), jnp.arange(k), jnp.arange(length), indexing="ij")
  row_BxKxL, path_BxKxL, depth_BxKxL = index
  first_node_BxKxL = (path_BxKxL == 0) & (depth_BxKxL == 0)
  open_BxKxL = live_B[:, None, None] & ~repeated_BxK[..., None] & ~first_node_BxKxL
  value_BxKxL = jnp.where(open_BxKxL, reach_BxKxL, -jnp.inf)
  # A node's rank counts only nodes worth more, or as much and ranked earlier: none at or
  # below it, nor a later first token. So keeping it never reads its own token.
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
