"""Token trees: K draft paths folded into one node per distinct prefix (spectr_jax.tree)."""

import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import tree


def _prefixes(drafts_KxL):
  """The distinct non-empty prefixes of the paths, with how many paths share each."""
  counts = {}
  for path in drafts_KxL.tolist():
    for d in range(1, len(path) + 1):
      counts[tuple(path[:d])] = counts.get(tuple(path[:d]), 0) + 1
  return counts


def _node_prefix(t, b, node):
  """The tokens from the root's child down to `node`, by following parents."""
  out = []
  while node > 0:
    out.append(int(t.tokens_BxN[b, node]))
    node = int(t.parent_BxN[b, node])
  assert node == 0, "every node's parent chain ends at the root"
  return tuple(reversed(out))


@pytest.mark.parametrize(
  "k, length, v",
  [(1, 3, 2), (3, 1, 2), (4, 3, 2)]
  + [pytest.param(*c, marks=pytest.mark.slow) for c in ((5, 4, 3), (8, 2, 4))],
)
def test_the_tree_has_one_node_per_distinct_prefix_and_keeps_multiplicities(k, length, v):
  rng = np.random.default_rng(k * 100 + length)
  drafts = rng.integers(0, v, (6, k, length)).astype(np.int32)
  drafts[0] = drafts[0, :1]  # all paths equal: the smallest tree
  last = rng.integers(0, v, 6).astype(np.int32)
  t = tree.from_paths(jnp.asarray(last), jnp.asarray(drafts))
  t = type(t)(*(np.asarray(x) for x in t))
  n = tree.capacity(k, length)
  assert t.tokens_BxN.shape == (6, n)
  assert t.num_nodes_B[0] == 1 + length
  for b in range(6):
    want = _prefixes(drafts[b])
    m = int(t.num_nodes_B[b])
    assert m == 1 + len(want)
    assert (t.tokens_BxN[b, 0], t.depth_BxN[b, 0], t.parent_BxN[b, 0]) == (last[b], 0, -1)
    assert t.count_BxN[b, 0] == k
    got = {}
    for node in range(1, m):
      prefix = _node_prefix(t, b, node)
      assert t.depth_BxN[b, node] == len(prefix)
      got[prefix] = int(t.count_BxN[b, node])
    assert got == want
    assert np.all(np.diff(t.depth_BxN[b, :m]) >= 0), "nodes are depth-major"
    assert np.all(t.parent_BxN[b, 1:m] < np.arange(1, m)), "parents come first"
    # Padding: never a parent, no paths through it.
    assert np.all(t.parent_BxN[b, m:] == -1) and np.all(t.count_BxN[b, m:] == 0)
    for path in range(k):
      nodes = t.path_node_BxKxL1[b, path]
      assert nodes[0] == 0
      assert _node_prefix(t, b, int(nodes[-1])) == tuple(drafts[b, path])
      assert np.all(t.parent_BxN[b, nodes[1:]] == nodes[:-1])


def test_node_buckets_span_the_smallest_to_the_largest_tree():
  assert tree.node_buckets(8, 8) == (16, 65)
  assert tree.node_buckets(8, 8, num_sizes=4) == (16, 32, 48, 65)
  assert tree.node_buckets(1, 4) == (5,)
  assert tree.node_buckets(4, 3, num_sizes=1) == (13,)
  for k, length in [(2, 1), (3, 5), (8, 4), (16, 8)]:
    sizes = tree.node_buckets(k, length)
    assert sizes[-1] == tree.capacity(k, length) and sizes == tuple(sorted(set(sizes)))
    assert sizes[0] >= 1 + length
  with pytest.raises(ValueError, match="num_sizes"):
    tree.node_buckets(2, 2, num_sizes=0)


def test_bucket_index_is_the_smallest_size_that_holds_every_row():
  sizes = (24, 40, 56, 65)
  for counts, want in [([9, 24], 0), ([25, 3], 1), ([40], 1), ([41], 2), ([65, 1], 3)]:
    assert int(tree.bucket_index(jnp.asarray(counts), sizes)) == want
