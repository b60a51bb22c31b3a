"""Drafting schemes: how a round draws its K draft sequences (the drafting seam).

A scheme is a function

  scheme(extend, params, cache, pending_Bx2, num_pending_B, key_B, probs, *,
         num_drafts, draft_len) -> Drafts

that runs the draft model through `extend` (the decoder's extend-on-tails call:
(params, tokens_BxKxT, cache, num_new_B=None, logits_at_B=None) -> (logits, cache)),
turns logits into distributions with `probs` (the decode's sampling transform) and
returns the draft tokens, the distributions they were proposed from and the structure
the verifier needs. The method registry (`spectr_jax.methods.DRAFTING`) names the scheme
of each method; `rounds.draft` calls it.

Schemes here:
  iid: K i.i.d. sequences of L tokens (SpecTr), one cache tail per draft.

Key convention: the draw of step t (t = 0..L-1) of tail k uses
fold_in(fold_in(row key, t), k) (`draft_keys_LxBxK`).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import sampling

__all__ = ["Drafts", "draft_keys_LxBxK", "iid", "sample_BxK"]


class Drafts(NamedTuple):
  """A round's drafts.

  tokens_BxKxL: K draft sequences of L tokens per row.
  p_BxKxLxV: p[b, k, t] = the draft distribution token t of draft k was proposed from
    (after the row's prefix and the draft's first t tokens).
  cache: the draft model's cache with the drafts in its tails (the last token of each
    draft is never fed: the round's commit appends it when it is accepted).
  nonfinite_B: rows whose draft logits were not finite anywhere.

  Tails are the structure: draft k is the path of tail k (paths may share prefixes).
  """

  tokens_BxKxL: jax.Array
  p_BxKxLxV: jax.Array
  cache: Any
  nonfinite_B: jax.Array


def draft_keys_LxBxK(key_B, num_steps: int, num_tails: int):
  """The key of every draw: fold_in(fold_in(row key, step), tail), L x B x K, drawn in
  two batched calls before the draft loop."""
  step_LxB = jax.vmap(lambda t: jax.vmap(jax.random.fold_in, (0, None))(key_B, t))(
    jnp.arange(num_steps)
  )
  by_tail = jax.vmap(jax.random.fold_in, (None, 0))
  return jax.vmap(jax.vmap(lambda key: by_tail(key, jnp.arange(num_tails))))(step_LxB)


def sample_BxK(key_BxK, probs_BxKxV):
  """One draw per (row, tail) with its own key."""
  return jax.vmap(jax.vmap(sampling.categorical))(key_BxK, probs_BxKxV)


def iid(
  extend: Callable,
  params: Any,
  cache: Any,
  pending_Bx2: jax.Array,
  num_pending_B: jax.Array,
  key_B: jax.Array,
  probs: Callable,
  *,
  num_drafts: int,
  draft_len: int,
) -> Drafts:
  """K i.i.d. draft sequences of L tokens per row.

  The pending tokens (1 or 2 per row: what the draft has not seen of the emitted text)
  open every tail, and only the last one's logits are computed; L - 1 steps under
  `lax.scan` follow, each writing its p in place into p_BxKxLxV.

  Args:
    extend: the draft decoder's extend call (module docstring).
    params: the draft's parameters.
    cache: the draft's cache (K tails).
    pending_Bx2, num_pending_B: the pending tokens of each row and how many are valid.
    key_B: one key per row.
    probs: logits [..., V] -> sampling distributions (the decode's transform).
    num_drafts, draft_len: K and L (static).

  Returns:
    `Drafts`.
  """
  b, k, n = pending_Bx2.shape[0], num_drafts, draft_len
  tokens_BxKx2 = jnp.broadcast_to(pending_Bx2[:, None, :], (b, k, 2))
  logits_BxKxV, cache = extend(params, tokens_BxKx2, cache, num_pending_B, num_pending_B - 1)
  bad_B = sampling.nonfinite_rows(logits_BxKxV)
  p_BxKxV = probs(logits_BxKxV)
  key_LxBxK = draft_keys_LxBxK(key_B, n, k)
  x_BxK = sample_BxK(key_LxBxK[0], p_BxKxV)
  p_BxKxLxV = jnp.zeros((b, k, n) + p_BxKxV.shape[-1:], p_BxKxV.dtype)
  p_BxKxLxV = p_BxKxLxV.at[:, :, 0].set(p_BxKxV)
  drafts_BxKxL = jnp.zeros((b, k, n), jnp.int32).at[:, :, 0].set(x_BxK)

  def step(carry, t):
    cache, drafts_BxKxL, p_BxKxLxV, bad_B = carry
    x_BxKx1 = jax.lax.dynamic_slice_in_dim(drafts_BxKxL, t - 1, 1, axis=2)
    logits_BxKx1xV, cache = extend(params, x_BxKx1, cache)
    bad_B |= sampling.nonfinite_rows(logits_BxKx1xV)
    p_BxKx1xV = probs(logits_BxKx1xV)
    nxt_BxKx1 = sample_BxK(key_LxBxK[t], p_BxKx1xV[:, :, 0])[:, :, None]
    drafts_BxKxL = jax.lax.dynamic_update_slice_in_dim(drafts_BxKxL, nxt_BxKx1, t, axis=2)
    p_BxKxLxV = jax.lax.dynamic_update_slice_in_dim(p_BxKxLxV, p_BxKx1xV, t, axis=2)
    return (cache, drafts_BxKxL, p_BxKxLxV, bad_B), None

  (cache, drafts_BxKxL, p_BxKxLxV, bad_B), _ = jax.lax.scan(
    step, (cache, drafts_BxKxL, p_BxKxLxV, bad_B), jnp.arange(1, n)
  )
  return Drafts(drafts_BxKxL, p_BxKxLxV, cache, bad_B)
