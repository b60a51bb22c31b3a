"""The speculative-decoding KV cache: one shared prefix per prompt plus K small tails.

Letters beyond the package legend: Hk key/value heads, Dh head width, R tail capacity;
in `commit_nodes` W is the width of the committed window of node slots.
The layout, the position arithmetic and the headroom rule are described in docs/CACHE.md.
"""

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
  """Keys and values of every layer: a per-row prefix and K per-row tails.

  Attributes:
    prefix_k: Y x B x S x Hk x Dh keys of the committed sequence of each row.
    prefix_v: Y x B x S x Hk x Dh values of the committed sequence.
    prefix_len: B int32, the number of valid prefix entries of each row.
    tail_k: Y x B x K x R x Hk x Dh keys of the uncommitted tails (the drafts).
    tail_v: Y x B x K x R x Hk x Dh values of the tails.
    tail_len: B x K int32, the number of valid entries of each tail.
  """

  prefix_k: jax.Array
  prefix_v: jax.Array
  prefix_len: jax.Array
  tail_k: jax.Array
  tail_v: jax.Array
  tail_len: jax.Array

  @property
  def B(self) -> int:
    """The batch size."""
    return self.prefix_k.shape[1]

  @property
  def K(self) -> int:
    """The number of tails per row."""
    return self.tail_k.shape[2]

  @property
  def S(self) -> int:
    """The prefix capacity."""
    return self.prefix_k.shape[2]

  @property
  def R(self) -> int:
    """The tail capacity."""
    return self.tail_k.shape[3]


def init_cache(
  config: ModelConfig,
  batch_size: int,
  num_tails: int,
  tail_capacity: int,
  dtype: jnp.dtype | None = None,
) -> KVCache:
  """Returns an empty cache.

  Args:
    config: the model config; S = config.max_len.
    batch_size: B.
    num_tails: K, the number of drafts scored per row (1 for plain decoding).
    tail_capacity: R, the most tokens a tail holds before a commit (L + 1 for SpecTr).
    dtype: the dtype of keys and values; defaults to the config's compute dtype.

  Returns:
    A `KVCache` of zeros with all lengths 0.
  """
  dtype = config.compute_dtype if dtype is None else dtype
  n, hk, dh = config.num_layers, config.num_kv_heads, config.head_dim
  prefix_shape = (n, batch_size, config.max_len, hk, dh)
  tail_shape = (n, batch_size, num_tails, tail_capacity, hk, dh)
  return KVCache(
    prefix_k=jnp.zeros(prefix_shape, dtype),
    prefix_v=jnp.zeros(prefix_shape, dtype),
    prefix_len=jnp.zeros((batch_size,), jnp.int32),
    tail_k=jnp.zeros(tail_shape, dtype),
    tail_v=jnp.zeros(tail_shape, dtype),
    tail_len=jnp.zeros((batch_size, num_tails), jnp.int32),
  )


def commit(cache: KVCache, tail_idx_B: jax.Array, num_B: jax.Array) -> KVCache:
  """Appends the first `num_B[b]` entries of tail `tail_idx_B[b]` to each row's prefix.

  Each row scatters its whole R-entry tail window to prefix positions
  `prefix_len[b] + [0, R)`. Entries past `num_B[b]` land beyond the new length and are
  never attended; positions at or past S are dropped, so a write never spills into
  another row or wraps around. The cost is O(B * R) per layer; under `jax.jit` with the
  cache donated, XLA updates the prefix buffers in place.

  Args:
    cache: the cache after `extend`.
    tail_idx_B: B int, which tail of each row to keep.
    num_B: B int, how many of its entries to keep (0..R); `prefix_len + num_B` must not
      exceed S (the prefix length is clamped to S, and overflowing tokens are lost).

  Returns:
    The cache with the longer prefix and all tails emptied.
  """
  return _append(cache, lambda tail_KxRxHkxDh, k: tail_KxRxHkxDh[k], tail_idx_B, num_B)


def _append(cache: KVCache, take, index_BxA: jax.Array, num_B: jax.Array) -> KVCache:
  """Appends `take(row's tails, index_BxA[b])` (W entries) to each row's prefix at
  `prefix_len[b] + [0, W)` (positions at or past S dropped), keeps num_B of them and
  empties the tails."""

  def append_row(prefix_SxHkxDh, tail_KxRxHkxDh, index, start):
    new_WxHkxDh = take(tail_KxRxHkxDh, index)
    pos_W = start + jnp.arange(new_WxHkxDh.shape[0])
    return prefix_SxHkxDh.at[pos_W].set(new_WxHkxDh, mode="drop")

  # vmap over rows inside vmap over layers: the scatter keeps the Y x B x S layout.
  append = jax.vmap(jax.vmap(append_row), in_axes=(0, 0, None, None))
  prefix_len = jnp.minimum(cache.prefix_len + num_B.astype(jnp.int32), cache.S)
  return cache.replace(
    prefix_k=append(cache.prefix_k, cache.tail_k, index_BxA, cache.prefix_len),
    prefix_v=append(cache.prefix_v, cache.tail_v, index_BxA, cache.prefix_len),
    prefix_len=prefix_len,
    tail_len=jnp.zeros_like(cache.tail_len),
  )


def commit_nodes(cache: KVCache, slots_BxW: jax.Array, num_B: jax.Array) -> KVCache:
  """Appends node slots `slots_BxW[b, :num_B[b]]` of tail 0 to each row's prefix.

  After `Transformer.extend_tree`, tail 0 holds a token tree's nodes (docs/CACHE.md,
  "Token trees"); the accepted path is a list of node slots from a root (depth 0) down,
  so its j-th node's keys were computed at position prefix_len[b] + j, where it lands.
  Each row gathers its W slots and scatters them to prefix positions
  `prefix_len[b] + [0, W)`: entries past `num_B[b]` land beyond the new length and are
  never attended, positions at or past S are dropped (as in `commit`). The cost is
  O(B * W) per layer, independent of S and R.

  Args:
    cache: the cache after `extend_tree`.
    slots_BxW: int node slots in [0, R), a root-to-node path in depth order; entries
      past num_B[b] are ignored (any value in [-R, R)).
    num_B: int, how many of them to keep (0..W); `prefix_len + num_B` must not exceed S
      (the prefix length is clamped to S, and overflowing tokens are lost).

  Returns:
    The cache with the longer prefix and all tails emptied.
  """
  take = lambda tail_KxRxHkxDh, slots_W: tail_KxRxHkxDh[0, slots_W]
  return _append(cache, take, slots_BxW.astype(jnp.int32), num_B)


def take_tails(cache: KVCache, tails_BxW: jax.Array) -> KVCache:
  """The cache whose tail j of row b is tail `tails_BxW[b, j]` of `cache` (entries and
  length); the prefix is shared, not copied.

  W may be below K (a subset: the distinct tails of a round's draft tree, computed once
  by `extend`) or any width (W = K with repeated indices spreads each computed tail back
  to the tails that hold the same sequence: `spectr_jax.drafting`). The cost is a gather
  of B * W tails of R entries per layer, independent of S.

  Args:
    cache: the cache.
    tails_BxW: int tail indices in [0, K).

  Returns:
    A cache of W tails per row.
  """
  index_BxW = tails_BxW.astype(jnp.int32)
  take = lambda tail_YxBxKxRxHkxDh: jnp.take_along_axis(
    tail_YxBxKxRxHkxDh, index_BxW[None, :, :, None, None, None], axis=2
  )
  return cache.replace(
    tail_k=take(cache.tail_k),
    tail_v=take(cache.tail_v),
    tail_len=jnp.take_along_axis(cache.tail_len, index_BxW, axis=1),
  )


def rollback(cache: KVCache, new_len_B: jax.Array) -> KVCache:
  """Shortens each row's prefix to at most `new_len_B[b]` entries and empties the tails.

  Only the lengths move; stale entries past the length are overwritten later.

  Args:
    cache: the cache.
    new_len_B: B int, the length to roll back to (longer values leave the row as is).

  Returns:
    The cache with `prefix_len = min(prefix_len, new_len_B)` and all tails emptied.
  """
  prefix_len = jnp.minimum(cache.prefix_len, new_len_B.astype(jnp.int32))
  return cache.replace(prefix_len=prefix_len, tail_len=jnp.zeros_like(cache.tail_len))


def reset_tails(cache: KVCache) -> KVCache:
  """Returns the cache with every tail emptied (the drafts discarded)."""
  return cache.replace(tail_len=jnp.zeros_like(cache.tail_len))
