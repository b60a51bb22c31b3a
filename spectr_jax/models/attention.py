"""Attention of one layer in each calling mode of the layer stack: the causal forward
(`Causal`), K tails of new tokens against a cached prefix and the tails' earlier entries
(`Tails`), and a token tree against a cached prefix (`Tree`, with `ancestor_mask`, the
tree's visibility mask).

A mode is a pytree of the arrays every layer shares (`pos`, the tokens' positions, and
lengths, masks) whose call `mode(view, q, k, v, *, layer, window, softcap) -> (o, kv)` is
the attention of one layer: `view` is that layer's slice of the cache (scanned with the
layer's parameters), `layer` its index, and kv its new keys and values. The modes read
the cache and never write it: the caller writes every layer's new entries once, after
the stack (`write_tail`), so a layer's attention combines its key sets (prefix, earlier tail
entries, the new tokens) in one softmax without concatenating them (`_softmax_parts`).

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, R tail capacity (the node slots of a tree), U the new
tokens a query may see (T of its tail, or N of its tree), X any leading shape; in the
tree functions N is the number of tree nodes (not layers).
"""

import functools

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax.models import layers

_MASKED = float(jnp.finfo(jnp.float32).min)


def _group(q_XxHxDh: jax.Array, num_kv_heads: int) -> jax.Array:
  """Splits the query heads into Hk groups of G: X x H x Dh -> X x Hk x G x Dh."""
  *lead, h, dh = q_XxHxDh.shape
  return q_XxHxDh.reshape(*lead, num_kv_heads, h // num_kv_heads, dh)


def _sliding(
  mask: jax.Array, distance: jax.Array, window: layers.Window | None, layer
) -> jax.Array:
  """`mask` with the keys at `distance` >= window.size hidden, on the layers that slide."""
  if window is None:
    return mask
  inside = distance < window.size
  if window.every > 1:
    inside = inside | (layer % window.every != 0)
  return mask & inside


def _softmax_parts(parts, softcap: float | None, dtype) -> jax.Array:
  """One softmax over several key sets, without concatenating them.

  Args:
    parts: (scores, mask, values_fn) per key set: float32 scores with the key axis last,
      a mask broadcastable to them, and values_fn(weights in `dtype`) -> the weighted sum
      of that set's values (float32, the key axis replaced by the value axis Dh: every
      set's scores have the output's leading axes).
    softcap: the soft-cap of the scores, or None.
    dtype: the dtype of the weights that meet the values.

  Returns:
    The attention output, float32: sum_i values_fn(exp(s_i - m)) / sum_i sum exp(s_i - m)
    with m the largest score of all sets (a row with every key masked averages them all,
    as a softmax of the masked scores would).
  """
  scores = [jnp.where(mask, layers.softcap(s, softcap), _MASKED) for s, mask, _ in parts]
  top = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores])
  weights = [jnp.exp(s - top) for s in scores]
  total = functools.reduce(jnp.add, [jnp.sum(w, axis=-1, keepdims=True) for w in weights])
  out = functools.reduce(
    jnp.add, [fn(w.astype(dtype)) for w, (_, _, fn) in zip(weights, parts, strict=True)]
  )
  return out / total


def _contract(spec: str, values: jax.Array):
  """values_fn of `_softmax_parts`: the weights contracted with `values` by `spec`."""
  return lambda w: jnp.einsum(spec, w, values, preferred_element_type=jnp.float32)


@struct.dataclass
class Causal:
  """Causal self-attention over one sequence per row (training and prefill).

  Query t sees keys s <= t (and with a sliding window only those with t - s < size).

  Attributes:
    pos: B x T, the positions 0..T-1 of every row.
    keep_kv: return each layer's (k, v) (prefill: the cache's prefix); training drops them.
  """

  pos: jax.Array
  keep_kv: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, view, q_BxTxHxDh, k_BxTxHkxDh, v_BxTxHkxDh, *, layer, window, softcap):
    del view
    b, t, h, dh = q_BxTxHxDh.shape
    q_BxTxHkxGxDh = _group(q_BxTxHxDh, k_BxTxHkxDh.shape[2])
    s_BxTxHkxGxT = jnp.einsum(
      "btngd,bsnd->btngs", q_BxTxHkxGxDh, k_BxTxHkxDh, preferred_element_type=jnp.float32
    )
    distance_TxT = jnp.arange(t)[:, None] - jnp.arange(t)
    mask_Tx1x1xT = _sliding(distance_TxT >= 0, distance_TxT, window, layer)[:, None, None, :]
    contract = _contract("btngs,bsnd->btngd", v_BxTxHkxDh)
    o_BxTxHkxGxDh = _softmax_parts(
      [(s_BxTxHkxGxT, mask_Tx1x1xT, contract)], softcap, q_BxTxHxDh.dtype
    )
    o_BxTxHxDh = o_BxTxHkxGxDh.reshape(b, t, h, dh).astype(q_BxTxHxDh.dtype)
    return o_BxTxHxDh, ((k_BxTxHkxDh, v_BxTxHkxDh) if self.keep_kv else None)


@struct.dataclass
class Tails:
  """T new tokens on each of K tails per row, against the row's shared prefix, the tail's
  earlier entries and the new tokens up to and including itself.

  The prefix is scored once per row over all K * T queries (never copied K times). The
  layer's view is (prefix_k, prefix_v, tail_k, tail_v): B x S x Hk x Dh and
  B x K x R x Hk x Dh.

  Attributes:
    prefix_len_B: valid prefix entries of each row.
    tail_len_BxK: valid entries of each tail before these tokens.
    pos: B x K x T, the absolute position of every new token (prefix_len + tail_len + t).
    read_tails: attend to the tails' earlier entries (static); False where every tail is
      known to be empty (the round's target call after a commit): their keys are not
      scored, and XLA does not constant-fold a masked-out B x K x T x H x R block.
  """

  prefix_len_B: jax.Array
  tail_len_BxK: jax.Array
  pos: jax.Array
  read_tails: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, view, q_BxKxTxHxDh, k_BxKxTxHkxDh, v_BxKxTxHkxDh, *, layer, window, softcap):
    prefix_k, prefix_v, tail_k, tail_v = view
    b, k, t, h, dh = q_BxKxTxHxDh.shape
    s, r = prefix_k.shape[1], tail_k.shape[2]
    q_BxKxTxHkxGxDh = _group(q_BxKxTxHxDh, prefix_k.shape[2])
    score = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
    pos_BxKxTx1 = self.pos[..., None]
    # Masks broadcast over heads (axes 3, 4); K and T broadcast (size 1) where they can.
    pre_BxKxTxS = (jnp.arange(s) < self.prefix_len_B[:, None])[:, None, None, :]
    pre_BxKxTxS = _sliding(pre_BxKxTxS, pos_BxKxTx1 - jnp.arange(s), window, layer)
    old_BxKxTxR = (jnp.arange(r) < self.tail_len_BxK[..., None])[:, :, None, :]
    old_pos_BxKx1xR = (self.prefix_len_B[:, None, None] + jnp.arange(r))[:, :, None, :]
    old_BxKxTxR = _sliding(old_BxKxTxR, pos_BxKxTx1 - old_pos_BxKx1xR, window, layer)
    distance_TxU = jnp.arange(t)[:, None] - jnp.arange(t)
    new_TxU = _sliding(distance_TxU >= 0, distance_TxU, window, layer)
    heads = lambda m: m[:, :, :, None, None, :]  # noqa: E731
    prefix = (
      score("bktngd,bsnd->bktngs", q_BxKxTxHkxGxDh, prefix_k),
      heads(pre_BxKxTxS),
      _contract("bktngs,bsnd->bktngd", prefix_v),
    )
    earlier = (
      score("bktngd,bkrnd->bktngr", q_BxKxTxHkxGxDh, tail_k),
      heads(old_BxKxTxR),
      _contract("bktngr,bkrnd->bktngd", tail_v),
    )
    new = (
      score("bktngd,bkund->bktngu", q_BxKxTxHkxGxDh, k_BxKxTxHkxDh.astype(tail_k.dtype)),
      new_TxU[None, None, :, None, None, :],
      _contract("bktngu,bkund->bktngd", v_BxKxTxHkxDh.astype(tail_v.dtype)),
    )
    parts = [prefix, earlier, new] if self.read_tails else [prefix, new]
    o = _softmax_parts(parts, softcap, prefix_v.dtype)
    return o.reshape(b, k, t, h, dh).astype(q_BxKxTxHxDh.dtype), (k_BxKxTxHkxDh, v_BxKxTxHkxDh)


@struct.dataclass
class Tree:
  """The N nodes of a token tree per row against the row's prefix and the nodes each sees
  (its ancestors and itself). The layer's view is (prefix_k, prefix_v): B x S x Hk x Dh.

  Attributes:
    prefix_len_B: valid prefix entries of each row.
    visible_BxNxN: bool, node i sees node j (`ancestor_mask`; the diagonal included).
    pos: B x N, the absolute position of every node (prefix_len + depth).
  """

  prefix_len_B: jax.Array
  visible_BxNxN: jax.Array
  pos: jax.Array

  def __call__(self, view, q_BxNxHxDh, k_BxNxHkxDh, v_BxNxHkxDh, *, layer, window, softcap):
    prefix_k, prefix_v = view
    b, n, h, dh = q_BxNxHxDh.shape
    s = prefix_k.shape[1]
    q_BxNxHkxGxDh = _group(q_BxNxHxDh, prefix_k.shape[2])
    score = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
    pos_BxNx1 = self.pos[:, :, None]
    # N broadcasts (size 1) unless a sliding window makes the prefix mask query-dependent.
    pre_BxNxS = (jnp.arange(s) < self.prefix_len_B[:, None])[:, None, :]
    pre_BxNxS = _sliding(pre_BxNxS, pos_BxNx1 - jnp.arange(s), window, layer)
    node_BxNxN = _sliding(self.visible_BxNxN, pos_BxNx1 - self.pos[:, None, :], window, layer)
    parts = [
      (
        score("bingd,bsnd->bings", q_BxNxHkxGxDh, prefix_k),
        pre_BxNxS[:, :, None, None, :],
        _contract("bings,bsnd->bingd", prefix_v),
      ),
      (
        score("bingd,bjnd->bingj", q_BxNxHkxGxDh, k_BxNxHkxDh.astype(prefix_k.dtype)),
        node_BxNxN[:, :, None, None, :],
        _contract("bingj,bjnd->bingd", v_BxNxHkxDh.astype(prefix_v.dtype)),
      ),
    ]
    o = _softmax_parts(parts, softcap, prefix_v.dtype)
    return o.reshape(b, n, h, dh).astype(q_BxNxHxDh.dtype), (k_BxNxHkxDh, v_BxNxHkxDh)


def write_tail(
  tail_YxBxKxRxHkxDh: jax.Array, new_YxBxKxTxHkxDh: jax.Array, start_BxK: jax.Array
) -> jax.Array:
  """Writes every layer's T new entries of every tail at the tail's own start; entries
  past R are dropped.

  One select per new entry (T are few), not a scatter: XLA's classic CPU emitters (the
  test suite's) expand a batched scatter into a loop over its B K T updates that, inside a
  round's `lax.switch`, copied the whole tail buffer on every update (quadratic in B)."""
  r, t = tail_YxBxKxRxHkxDh.shape[3], new_YxBxKxTxHkxDh.shape[3]
  new_YxBxKxTxHkxDh = new_YxBxKxTxHkxDh.astype(tail_YxBxKxRxHkxDh.dtype)
  offset_BxKxR = jnp.arange(r) - start_BxK[:, :, None]
  out = tail_YxBxKxRxHkxDh
  for j in range(t):
    at_1xBxKxRx1x1 = (offset_BxKxR == j)[None, :, :, :, None, None]
    out = jnp.where(at_1xBxKxRx1x1, new_YxBxKxTxHkxDh[:, :, :, j : j + 1], out)
  return out


def ancestor_mask(parent_BxN: jax.Array) -> jax.Array:
  """Which nodes of a token tree each node sees: itself and every ancestor.

  Built by pointer doubling: after step k the mask holds the ancestors at distances
  below 2^(k + 1) and `jump` the 2^(k + 1)-th ancestor, so ceil(log2 N) steps of
  `take_along_axis` cover the deepest possible chain (N - 1 edges); shapes are static and
  nothing loops over N. Node order is free (a parent may come after its child).

  Args:
    parent_BxN: int, the parent node of each node in [0, N), or -1 for a node with no
      parent node (a child of the cached prefix: a root). Must describe a forest (no
      cycles); padding nodes are roots nobody points at.

  Returns:
    visible_BxNxN, bool: visible[b, i, j] is True iff node j is node i or an ancestor of
    node i.
  """
  b, n = parent_BxN.shape
  visible_BxNxN = jnp.broadcast_to(jnp.eye(n, dtype=bool), (b, n, n))
  jump_BxN = parent_BxN.astype(jnp.int32)  # the 2^k-th ancestor, -1 past a root
  for _ in range(max(n - 1, 0).bit_length()):  # ceil(log2 N) steps
    has_BxN = jump_BxN >= 0
    at_BxN = jnp.maximum(jump_BxN, 0)
    # Row jump[i] of the mask: the ancestors of i at distances 2^k .. 2^(k + 1) - 1.
    rows_BxNxN = jnp.take_along_axis(
      visible_BxNxN, jnp.broadcast_to(at_BxN[:, :, None], (b, n, n)), axis=1
    )
    visible_BxNxN = visible_BxNxN | (rows_BxNxN & has_BxN[:, :, None])
    jump_BxN = jnp.where(has_BxN, jnp.take_along_axis(jump_BxN, at_BxN, axis=1), -1)
  return visible_BxNxN
