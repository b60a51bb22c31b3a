"""Attention of one layer: the causal forward, the tails against a cached prefix, and a
token tree against a cached prefix (with `ancestor_mask`, the tree's visibility mask).

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, R tail capacity (the node slots of a tree), X any leading
shape; in the tree functions N is the number of tree nodes (not layers).
"""

import jax
import jax.numpy as jnp

from spectr_jax.models import layers

_MASKED = float(jnp.finfo(jnp.float32).min)


def _group(q_XxHxDh: jax.Array, num_kv_heads: int) -> jax.Array:
  """Splits the query heads into Hk groups of G: X x H x Dh -> X x Hk x G x Dh."""
  *lead, h, dh = q_XxHxDh.shape
  return q_XxHxDh.reshape(*lead, num_kv_heads, h // num_kv_heads, dh)


def causal(
  q_BxTxHxDh: jax.Array,
  k_BxTxHkxDh: jax.Array,
  v_BxTxHkxDh: jax.Array,
  *,
  window: int | None,
  softcap: float | None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Causal self-attention over one sequence per row; keeps (k, v) for the cache.

  Query t sees keys s <= t, and with a sliding window only those with t - s < window.
  """
  b, t, h, dh = q_BxTxHxDh.shape
  q_BxTxHkxGxDh = _group(q_BxTxHxDh, k_BxTxHkxDh.shape[2])
  s_BxHkxGxTxT = jnp.einsum(
    "btngd,bsnd->bngts", q_BxTxHkxGxDh, k_BxTxHkxDh, preferred_element_type=jnp.float32
  )
  s_BxHkxGxTxT = layers.softcap(s_BxHkxGxTxT, softcap)
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  if window is not None:
    causal_TxT &= jnp.triu(jnp.ones((t, t), bool), 1 - window)
  p_BxHkxGxTxT = jax.nn.softmax(jnp.where(causal_TxT, s_BxHkxGxTxT, _MASKED), axis=-1)
  o_BxTxHkxGxDh = jnp.einsum(
    "bngts,bsnd->btngd", p_BxHkxGxTxT.astype(v_BxTxHkxDh.dtype), v_BxTxHkxDh
  )
  return o_BxTxHkxGxDh.reshape(b, t, h, dh), (k_BxTxHkxDh, v_BxTxHkxDh)


def _joint_softmax(
  s_pre_XxS: jax.Array,
  pre_mask_XxS: jax.Array,
  s_own_XxR: jax.Array,
  own_mask_XxR: jax.Array,
  softcap: float | None,
  dtype: jnp.dtype,
) -> tuple[jax.Array, jax.Array]:
  """One softmax over a query's prefix scores and its own (tail or node) scores, each
  soft-capped and masked (masks broadcast to the scores, key axis last): the weights
  of both parts, in `dtype`."""
  s = s_pre_XxS.shape[-1]
  scores = jnp.concatenate(
    [
      jnp.where(pre_mask_XxS, layers.softcap(s_pre_XxS, softcap), _MASKED),
      jnp.where(own_mask_XxR, layers.softcap(s_own_XxR, softcap), _MASKED),
    ],
    axis=-1,
  )
  p = jax.nn.softmax(scores, axis=-1).astype(dtype)
  return p[..., :s], p[..., s:]


def write_tail(
  tail_BxKxRxHkxDh: jax.Array, new_BxKxTxHkxDh: jax.Array, start_BxK: jax.Array
) -> jax.Array:
  """Writes T new entries of every tail at its own start; entries past R are dropped."""

  def write(tail_RxHkxDh, new_TxHkxDh, start):
    pos_T = start + jnp.arange(new_TxHkxDh.shape[0])
    return tail_RxHkxDh.at[pos_T].set(new_TxHkxDh.astype(tail_RxHkxDh.dtype), mode="drop")

  return jax.vmap(jax.vmap(write))(tail_BxKxRxHkxDh, new_BxKxTxHkxDh, start_BxK)


def tails(
  q_BxKxTxHxDh: jax.Array,
  prefix_k_BxSxHkxDh: jax.Array,
  prefix_v_BxSxHkxDh: jax.Array,
  prefix_len_B: jax.Array,
  tail_k_BxKxRxHkxDh: jax.Array,
  tail_v_BxKxRxHkxDh: jax.Array,
  tail_pos_BxKxT: jax.Array,
  *,
  window: int | None,
  softcap: float | None,
) -> jax.Array:
  """Attention of K tails of queries to their row's shared prefix and their own tail.

  Scores against the prefix are one einsum per row over all K*T queries (the prefix is
  never copied K times); scores against each tail are separate; one softmax covers both.

  Args:
    q_BxKxTxHxDh: queries (already rotated).
    prefix_k_BxSxHkxDh: prefix keys; prefix_v_BxSxHkxDh: prefix values.
    prefix_len_B: valid prefix entries of each row.
    tail_k_BxKxRxHkxDh: tail keys including the new ones; tail_v_BxKxRxHkxDh: values.
    tail_pos_BxKxT: the tail slot of every query; it sees tail slots up to this one.
    window: with a sliding window, a query at position q sees keys at k > q - window only.
    softcap: the soft-cap of the scores, or None.

  Returns:
    o_BxKxTxHxDh, the attention output.
  """
  b, k, t, h, dh = q_BxKxTxHxDh.shape
  s = prefix_k_BxSxHkxDh.shape[1]
  q_BxKxTxHkxGxDh = _group(q_BxKxTxHxDh, prefix_k_BxSxHkxDh.shape[2])
  f32 = jnp.float32
  s_pre_BxKxTxHkxGxS = jnp.einsum(
    "bktngd,bsnd->bktngs", q_BxKxTxHkxGxDh, prefix_k_BxSxHkxDh, preferred_element_type=f32
  )
  s_tail_BxKxTxHkxGxR = jnp.einsum(
    "bktngd,bkrnd->bktngr", q_BxKxTxHkxGxDh, tail_k_BxKxRxHkxDh, preferred_element_type=f32
  )
  # K and T broadcast (size 1) unless a sliding window makes the mask query-dependent.
  pre_mask_BxKxTxS = (jnp.arange(s) < prefix_len_B[:, None])[:, None, None, :]
  r = tail_k_BxKxRxHkxDh.shape[2]
  tail_mask_BxKxTxR = jnp.arange(r) <= tail_pos_BxKxT[..., None]
  if window is not None:
    pos_BxKxTx1 = (prefix_len_B[:, None, None] + tail_pos_BxKxT)[..., None]
    pre_mask_BxKxTxS = pre_mask_BxKxTxS & (pos_BxKxTx1 - jnp.arange(s) < window)
    tail_mask_BxKxTxR &= tail_pos_BxKxT[..., None] - jnp.arange(r) < window
  p_pre, p_tail = _joint_softmax(
    s_pre_BxKxTxHkxGxS,
    pre_mask_BxKxTxS[:, :, :, None, None, :],
    s_tail_BxKxTxHkxGxR,
    tail_mask_BxKxTxR[:, :, :, None, None, :],
    softcap,
    prefix_v_BxSxHkxDh.dtype,
  )
  o_BxKxTxHkxGxDh = jnp.einsum("bktngs,bsnd->bktngd", p_pre, prefix_v_BxSxHkxDh)
  o_BxKxTxHkxGxDh += jnp.einsum("bktngr,bkrnd->bktngd", p_tail, tail_v_BxKxRxHkxDh)
  return o_BxKxTxHkxGxDh.reshape(b, k, t, h, dh)


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


def tree(
  q_BxNxHxDh: jax.Array,
  prefix_k_BxSxHkxDh: jax.Array,
  prefix_v_BxSxHkxDh: jax.Array,
  prefix_len_B: jax.Array,
  node_k_BxRxHkxDh: jax.Array,
  node_v_BxRxHkxDh: jax.Array,
  visible_BxNxR: jax.Array,
  pos_BxN: jax.Array,
  node_pos_BxR: jax.Array,
  *,
  window: int | None,
  softcap: float | None,
) -> jax.Array:
  """Attention of the N nodes of a token tree to their row's prefix and their ancestors.

  Scores against the prefix are one einsum per row over all N queries (the prefix is
  never copied); scores against the node slots are another; one softmax covers both.

  Args:
    q_BxNxHxDh: queries of the nodes (already rotated).
    prefix_k_BxSxHkxDh: prefix keys; prefix_v_BxSxHkxDh: prefix values.
    prefix_len_B: valid prefix entries of each row.
    node_k_BxRxHkxDh: keys of the node slots, including the new ones; node_v_BxRxHkxDh:
      their values.
    visible_BxNxR: bool, node i sees slot j (j is i or an ancestor of i); must hold the
      diagonal (a node sees its own key), False for slots no node fills.
    pos_BxN: the absolute position of each query node.
    node_pos_BxR: the absolute position of each node slot (read only with a window).
    window: with a sliding window, a query at position q sees keys at k > q - window only
      (a prefix key's position is its index).
    softcap: the soft-cap of the scores, or None.

  Returns:
    o_BxNxHxDh, the attention output.
  """
  b, n, h, dh = q_BxNxHxDh.shape
  s = prefix_k_BxSxHkxDh.shape[1]
  q_BxNxHkxGxDh = _group(q_BxNxHxDh, prefix_k_BxSxHkxDh.shape[2])
  f32 = jnp.float32
  s_pre_BxNxHkxGxS = jnp.einsum(
    "bingd,bsnd->bings", q_BxNxHkxGxDh, prefix_k_BxSxHkxDh, preferred_element_type=f32
  )
  s_node_BxNxHkxGxR = jnp.einsum(
    "bingd,brnd->bingr", q_BxNxHkxGxDh, node_k_BxRxHkxDh, preferred_element_type=f32
  )
  # N broadcasts (size 1) unless a sliding window makes the prefix mask query-dependent.
  pre_mask_BxNxS = (jnp.arange(s) < prefix_len_B[:, None])[:, None, :]
  node_mask_BxNxR = visible_BxNxR
  if window is not None:
    pos_BxNx1 = pos_BxN[:, :, None]
    pre_mask_BxNxS = pre_mask_BxNxS & (pos_BxNx1 - jnp.arange(s) < window)
    node_mask_BxNxR = node_mask_BxNxR & (pos_BxNx1 - node_pos_BxR[:, None, :] < window)
  p_pre, p_node = _joint_softmax(
    s_pre_BxNxHkxGxS,
    pre_mask_BxNxS[:, :, None, None, :],
    s_node_BxNxHkxGxR,
    node_mask_BxNxR[:, :, None, None, :],
    softcap,
    prefix_v_BxSxHkxDh.dtype,
  )
  o_BxNxHkxGxDh = jnp.einsum("bings,bsnd->bingd", p_pre, prefix_v_BxSxHkxDh)
  o_BxNxHkxGxDh += jnp.einsum("bingr,brnd->bingd", p_node, node_v_BxRxHkxDh)
  return o_BxNxHkxGxDh.reshape(b, n, h, dh)
