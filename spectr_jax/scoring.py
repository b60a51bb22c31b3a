"""How the target scores a round's drafts: K tails, or the distinct prefixes of their tree.

`Tails` runs one target call on `[last, d_1..d_L]` of every path. `Tree` runs it on each
distinct prefix of the paths once (`spectr_jax.tree`; `DecodeSpec.dedup`) and gives
every path the q of its nodes, so verifiers see the same q either way. Each also
commits the accepted tokens to the target's cache the way it scored them, and says how
many cache tails the target holds.
"""

import dataclasses
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import adaptive, sampling, tree
from spectr_jax.models import Decoder, KVCache, ancestor_mask

__all__ = ["Scored", "Tails", "Tree"]


class Scored(NamedTuple):
  """The target's call of a round.

  q_BxKxL1xV: the target's distributions after every path prefix (transformed).
  cache: the target cache holding the scored entries.
  nonfinite_B: rows with non-finite logits.
  path_node_BxKxL1: with a tree, the node slot of path k at depth t (None for tails).
  nodes_B: the distinct prefixes scored per row (K (L + 1) for tails).
  positions: the positions the call computed per row (the compiled tree size for trees).
  features_BxKxL1xD: the target's last-layer output after every path prefix, where the
    draft reads it (a head; else None).
  """

  q_BxKxL1xV: jax.Array
  cache: KVCache
  nonfinite_B: jax.Array
  path_node_BxKxL1: jax.Array | None
  nodes_B: jax.Array
  positions: jax.Array
  features_BxKxL1xD: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Tails:
  """The target scores every path's L + 1 positions on its own cache tail."""

  shares_prefixes: ClassVar[bool] = False

  def cache_tails(self, num_drafts: int, draft_len: int) -> tuple[int, ...]:
    """(tails,) or (tails, tail capacity) of the target's cache."""
    del draft_len
    return (num_drafts,)

  def score(self, target: Decoder, params, cache: KVCache, last_B, drafts_BxKxL,
            probs: Callable, length_BxK=None, features: bool = False) -> Scored:  # fmt: skip
    """One target call on `[last, d_1..d_L]` of every path; with length_BxK (ragged
    lengths) on `[last, d_1..d_m]`, m the smallest of `adaptive.length_buckets` that
    holds every path's length (one compiled call per bucket, under a data-dependent
    conditional; q after m is never read). With `features` (static) the target's
    features come back too (`Scored`)."""
    b, k, length = drafts_BxKxL.shape
    last_BxKx1 = jnp.broadcast_to(last_B[:, None, None], (b, k, 1))
    tokens_BxKxL1 = jnp.concatenate([last_BxKx1, drafts_BxKxL], axis=2)

    def prefix(m):
      def run(cache):
        # A round's target call follows a commit (or the prefill): its tails are empty.
        *out, cache = target.extend(
          params, tokens_BxKxL1[:, :, : m + 1], cache, tails_empty=True, return_features=features
        )
        pad = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, length - m), (0, 0)))  # noqa: E731
        return tuple(map(pad, out)), cache

      return run

    if length_BxK is None:
      out, cache = prefix(length)(cache)
      positions = jnp.int32(k * (length + 1))
    else:
      sizes = adaptive.length_buckets(length)
      bucket = jnp.searchsorted(jnp.asarray(sizes), jnp.max(length_BxK))
      out, cache = jax.lax.switch(bucket, [prefix(m) for m in sizes], cache)
      positions = k * (jnp.asarray(sizes, jnp.int32)[bucket] + 1)
    logits_BxKxL1xV, *feature = out
    bad_B = sampling.nonfinite_rows(logits_BxKxL1xV)
    nodes_B = jnp.full((b,), positions)
    q_BxKxL1xV = probs(logits_BxKxL1xV)
    return Scored(q_BxKxL1xV, cache, bad_B, None, nodes_B, positions, *feature)

  def commit(self, target: Decoder, cache: KVCache, tail_B, path_node_BxKxL1, num_B):
    """Appends the first num_B entries of tail tail_B to the prefix."""
    del path_node_BxKxL1
    return target.commit(cache, tail_B, num_B)


@dataclasses.dataclass(frozen=True)
class Tree:
  """The target scores each distinct prefix of the paths once (their token tree)."""

  shares_prefixes: ClassVar[bool] = True

  def cache_tails(self, num_drafts: int, draft_len: int) -> tuple[int, ...]:
    # A tree's nodes live in one tail of N slots (docs/CACHE.md, "Token trees").
    return (1, tree.capacity(num_drafts, draft_len))

  def score(self, target: Decoder, params, cache: KVCache, last_B, drafts_BxKxL,
            probs: Callable, length_BxK=None, features: bool = False) -> Scored:  # fmt: skip
    """The tree's first n nodes, n the smallest of `tree.node_buckets` that holds every
    row's tree (one compiled target call per size, under the round's one data-dependent
    conditional); each path reads q from its nodes. The mask and the probabilities are
    computed once, outside the branches (a prefix of the depth-major node table is a
    whole tree)."""
    _, num_drafts, draft_len = drafts_BxKxL.shape
    t = tree.from_paths(last_B, drafts_BxKxL, length_BxK)
    capacity = t.tokens_BxN.shape[1]
    sizes = tree.node_buckets(num_drafts, draft_len)
    visible_BxNxN = ancestor_mask(t.parent_BxN)

    def branch(n):
      def run(cache):
        *out, cache = target.extend_tree(
          params, t.tokens_BxN[:, :n], t.depth_BxN[:, :n], visible_BxNxN[:, :n, :n], cache,
          return_features=features,
        )  # fmt: skip
        return tuple(jnp.pad(a, ((0, 0), (0, capacity - n), (0, 0))) for a in out), cache

      return run

    bucket = tree.bucket_index(t.num_nodes_B, sizes)
    (logits_BxNxV, *feature), cache = jax.lax.switch(bucket, [branch(n) for n in sizes], cache)
    real_BxN = jnp.arange(capacity) < t.num_nodes_B[:, None]
    bad_B = sampling.nonfinite_rows(jnp.where(real_BxN[..., None], logits_BxNxV, 0.0))
    # Each path reads its nodes' rows: q, and the features where the draft reads them.
    on_paths = jax.vmap(lambda a_NxX, node_KxL1: a_NxX[node_KxL1])
    q_BxKxL1xV = on_paths(probs(logits_BxNxV), t.path_node_BxKxL1)
    feature = [on_paths(f_BxNxD, t.path_node_BxKxL1) for f_BxNxD in feature]
    positions = jnp.asarray(sizes, jnp.int32)[bucket]
    return Scored(q_BxKxL1xV, cache, bad_B, t.path_node_BxKxL1, t.num_nodes_B, positions, *feature)

  def commit(self, target: Decoder, cache: KVCache, tail_B, path_node_BxKxL1, num_B):
    """Appends the nodes of path tail_B's first num_B positions to the prefix."""
    slots_BxL1 = jnp.take_along_axis(path_node_BxKxL1, tail_B[:, None, None], axis=1)[:, 0]
    return target.commit_nodes(cache, slots_BxL1, num_B)
