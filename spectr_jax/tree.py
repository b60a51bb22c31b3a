"""Token trees of a round: K draft paths deduplicated into one node per distinct prefix.

K i.i.d. drafts often share their first tokens; scoring each tail separately makes the
target recompute a shared prefix up to K times. `from_paths` folds the round's paths
`[last, d_1 .. d_L]` into a tree with one node per distinct prefix (the root is the
last committed token, depth 0) and keeps, for every path and depth, the node it passes
through: the target scores the tree's nodes once (`Decoder.extend_tree`) and each path
reads its q from its nodes, so every verifier sees exactly the q of the tails and keeps
its output law. Duplicate drafts stay separate chances: a node counts the paths through
it (multiplicities, not deletions).

Shapes are static: a tree of K paths of L tokens has at most N = 1 + K * L nodes; the
node order is depth-major (depth d's new nodes after every node of depth d - 1, in path
order), so the first `num_nodes` slots hold the tree and the rest are padding (parent
-1, depth 0, token 0, count 0), and a prefix of the node table is a whole tree. The
engine scores the smallest of a few compiled sizes (`node_buckets`) that holds every
row's tree (`bucket_index`).

Letters beyond the package legend: N node capacity (1 + K * L).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Tree(NamedTuple):
  """The deduplicated tree of each row's K paths.

  tokens_BxN: the node tokens (node 0: the last committed token).
  depth_BxN: 0 for the root, d for the d-th draft token of a path.
  parent_BxN: the parent node (-1 for the root and for padding).
  count_BxN: how many of the K paths pass through the node.
  path_node_BxKxL1: the node of path k at depth t (t = 0: the root).
  num_nodes_B: the number of distinct nodes (1 + distinct non-empty prefixes).
  """

  tokens_BxN: jax.Array
  depth_BxN: jax.Array
  parent_BxN: jax.Array
  count_BxN: jax.Array
  path_node_BxKxL1: jax.Array
  num_nodes_B: jax.Array


def capacity(num_drafts: int, draft_len: int) -> int:
  """N, the most nodes a tree of K paths of L tokens has (the root plus K * L)."""
  return 1 + num_drafts * draft_len


def from_paths(last_B: jax.Array, drafts_BxKxL: jax.Array, length_BxK=None) -> Tree:
  """Folds each row's K draft paths (after its last token) into their tree.

  Args:
    last_B: the last committed token of each row (the root).
    drafts_BxKxL: K draft paths of L tokens per row.
    length_BxK: path k holds only its first length_BxK[b, k] tokens (a tree budget,
      `adaptive.budget_nodes`); its slots below hold the root (never read). None: L.

  Returns:
    The `Tree` of every row (capacity N = 1 + K * L).
  """
  b, k, length = drafts_BxKxL.shape
  if length_BxK is None:
    length_BxK = jnp.full((b, k), length, jnp.int32)
  return jax.vmap(_row_tree)(last_B, drafts_BxKxL, length_BxK)


def _row_tree(last: jax.Array, drafts_KxL: jax.Array, length_K: jax.Array) -> Tree:
  k, length = drafts_KxL.shape
  n = capacity(k, length)
  drafts_LxK = drafts_KxL.T.astype(jnp.int32)
  held_LxK = jnp.arange(length)[:, None] < length_K[None, :]
  # same_LxKxK[d, i, j]: paths i and j both hold and agree on their first d + 1 tokens.
  equal_LxKxK = drafts_LxK[:, :, None] == drafts_LxK[:, None, :]
  equal_LxKxK &= held_LxK[:, :, None] & held_LxK[:, None, :]
  same_LxKxK = jnp.cumsum(~equal_LxKxK, axis=0) == 0
  first_LxK = jnp.argmax(same_LxKxK, axis=2)  # the first path with the same prefix
  new_LxK = (first_LxK == jnp.arange(k)) & held_LxK
  # New nodes numbered depth-major from 1 (node 0 is the root).
  id_LxK = jnp.cumsum(new_LxK.reshape(-1)).reshape(length, k)
  node_LxK = jnp.where(held_LxK, jnp.take_along_axis(id_LxK, first_LxK, axis=1), 0)
  parent_LxK = jnp.concatenate([jnp.zeros((1, k), node_LxK.dtype), node_LxK[:-1]], axis=0)
  slot_LxK = jnp.where(new_LxK, id_LxK, n)  # n: dropped (not a new node)
  depth_LxK = jnp.broadcast_to(jnp.arange(1, length + 1)[:, None], (length, k))
  tokens_N = jnp.zeros((n,), jnp.int32).at[0].set(last).at[slot_LxK].set(drafts_LxK, mode="drop")
  depth_N = jnp.zeros((n,), jnp.int32).at[slot_LxK].set(depth_LxK, mode="drop")
  parent_N = jnp.full((n,), -1, jnp.int32).at[slot_LxK].set(parent_LxK, mode="drop")
  count_N = jnp.zeros((n,), jnp.int32).at[0].set(k).at[node_LxK].add(held_LxK.astype(jnp.int32))
  path_node_KxL1 = jnp.concatenate([jnp.zeros((k, 1), jnp.int32), node_LxK.T], axis=1)
  return Tree(
    tokens_BxN=tokens_N,
    depth_BxN=depth_N,
    parent_BxN=parent_N,
    count_BxN=count_N,
    path_node_BxKxL1=path_node_KxL1.astype(jnp.int32),
    num_nodes_B=(1 + jnp.sum(new_LxK)).astype(jnp.int32),
  )


def node_buckets(num_drafts: int, draft_len: int, num_sizes: int = 2) -> tuple[int, ...]:
  """The node counts the engine compiles a tree call for: the smallest tree's (1 + L
  nodes: every path equal, as in greedy decoding; rounded up to a multiple of 8), the
  largest, N = 1 + K * L, and `num_sizes` - 2 evenly between them (multiples of 8). A
  round pays for the smallest size that holds all its rows' trees; each size is one
  compiled target call in the program (docs/RESULTS.md, "Dedup against tails": at
  temperature 1 a round nearly always needs N).

  Args:
    num_drafts: K. draft_len: L.
    num_sizes: how many sizes at most (each one compiled program branch).

  Returns:
    Increasing sizes, the last one N.
  """
  if num_sizes < 1:
    raise ValueError(f"num_sizes must be >= 1, got {num_sizes}")
  low, high = 1 + draft_len, capacity(num_drafts, draft_len)
  round_up = lambda size: min(high, -(-size // 8) * 8)  # noqa: E731
  sizes = {high} if num_sizes == 1 else {round_up(low), high}
  for i in range(1, num_sizes - 1):
    sizes.add(round_up(low + -(-(high - low) * i // (num_sizes - 1))))
  return tuple(sorted(sizes))


def bucket_index(num_nodes_B: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
  """The index of the smallest size that holds every row's tree (int32 scalar)."""
  need = jnp.max(num_nodes_B)
  return jnp.sum(jnp.asarray(sizes) < need).astype(jnp.int32)
