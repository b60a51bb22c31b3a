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
  without_replacement: K distinct first tokens drawn without replacement (the law of
    Gumbel-top-k in the order of the perturbed values), each path then continuing i.i.d.
    (Jeon et al., RSD, arXiv 2402.14160; Hu et al., arXiv 2502.18779). Where fewer than
    K tokens have draft mass, the extra paths copy the first (see `distinct_tokens`).

Key convention: the draw of step t (t = 0..L-1) of tail k uses
fold_in(fold_in(row key, t), k) (`draft_keys_LxBxK`).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import sampling

__all__ = [
  "Drafts",
  "check_distinct",
  "distinct_tokens",
  "draft_keys_LxBxK",
  "iid",
  "sample_BxK",
  "without_replacement",
]


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


def distinct_tokens(key_K, p_V):
  """K distinct tokens drawn without replacement from p, in the order of the draws.

  Token i is drawn from p with tokens 1..i-1 removed and renormalised (successive
  sampling): the law of Gumbel-top-k, the K largest of log p + Gumbel noise in the order
  of the perturbed values. Each draw is one exact `sampling.categorical` on p with the
  earlier draws zeroed, rather than float32 Gumbel noise: a float32 uniform has 2^23
  values, which truncates the Gumbel tail near 16 and coarsens it below, so tokens of
  small probability at LLM vocabularies would get the wrong chance; the categorical draw
  is exact to its integer resolution and never returns a token of zero probability.

  Where only s < K tokens have positive mass, draws s + 1..K have nothing left: they are
  marked invalid and repeat token 1 (the verifier ignores a repeated token: its
  renormalised draft probability is 0), so no decode stops; the drafts are then the whole
  support.

  Args:
    key_K: one key per draw.
    p_V: the draft distribution (non-negative; NaN counts as 0).

  Returns:
    (tokens_K int32, valid_K bool): valid_K[i] = i < number of tokens with p > 0.
  """

  def draw(taken_V, key):
    left_V = jnp.where(taken_V, 0.0, p_V)
    some = jnp.any(left_V > 0)
    x = sampling.categorical(key, left_V)
    return taken_V.at[x].set(taken_V[x] | some), (x, some)

  _, (x_K, valid_K) = jax.lax.scan(draw, jnp.zeros(p_V.shape, bool), key_K)
  return jnp.where(valid_K, x_K, x_K[0]).astype(jnp.int32), valid_K


def check_distinct(drafts_KxL) -> None:
  """Raises a clear error unless the paths could come from `without_replacement`: paths
  that share their first token must be identical (copies). Traced drafts are not checked.
  """
  if isinstance(drafts_KxL, jax.core.Tracer):
    return
  paths_KxL = np.asarray(drafts_KxL)
  for i, path in enumerate(paths_KxL):
    first = int(np.argmax(paths_KxL[:, 0] == path[0]))
    if not np.array_equal(paths_KxL[first], path):
      raise ValueError(
        f"drafts_KxL: paths {first} and {i} share the first token {path[0]} but differ: "
        "this method's drafts have distinct first tokens (drawn without replacement, "
        "`drafting.without_replacement`); i.i.d. drafts would not give the target's law"
      )


def _iid_first(key_BxK, p_BxKxV):
  """The i.i.d. scheme's first tokens: one draw per tail; every tail is its own source."""
  b, k = key_BxK.shape
  return sample_BxK(key_BxK, p_BxKxV), jnp.broadcast_to(jnp.arange(k), (b, k))


def _distinct_first(key_BxK, p_BxKxV):
  """First tokens without replacement (`distinct_tokens` on each row's shared first-position
  law); an invalid tail's source is tail 0, which it copies."""
  x_BxK, valid_BxK = jax.vmap(distinct_tokens)(key_BxK, p_BxKxV[:, 0])
  return x_BxK, jnp.where(valid_BxK, jnp.arange(key_BxK.shape[1]), 0)


def _paths(first: Callable, extend, params, cache, pending_Bx2, num_pending_B, key_B, probs, *,
           num_drafts: int, draft_len: int) -> Drafts:  # fmt: skip
  """K draft paths of L tokens per row: first tokens by `first`, then i.i.d. continuations.

  `first(key_BxK, p_BxKxV) -> (x_BxK, source_BxK)` draws the first token of every tail and
  names the tail each one copies (itself, or an earlier tail with the same first token);
  a copying tail continues with its source's keys, so it draws the same tokens, and its
  tokens are set to the source's at the end (the verifier's view never depends on two
  tails computing bit-identical logits). The commit takes the first agreeing tail, never
  a copy of an earlier one.

  The pending tokens (1 or 2 per row: what the draft has not seen of the emitted text)
  open every tail, and only the last one's logits are computed; L - 1 steps under
  `lax.scan` follow, each writing its p in place into p_BxKxLxV.
  """
  b, k, n = pending_Bx2.shape[0], num_drafts, draft_len
  tokens_BxKx2 = jnp.broadcast_to(pending_Bx2[:, None, :], (b, k, 2))
  logits_BxKxV, cache = extend(params, tokens_BxKx2, cache, num_pending_B, num_pending_B - 1)
  bad_B = sampling.nonfinite_rows(logits_BxKxV)
  p_BxKxV = probs(logits_BxKxV)
  key_LxBxK = draft_keys_LxBxK(key_B, n, k)
  x_BxK, source_BxK = first(key_LxBxK[0], p_BxKxV)
  key_LxBxK = jax.vmap(lambda key_BxK: jnp.take_along_axis(key_BxK, source_BxK, 1))(key_LxBxK)
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
  drafts_BxKxL = jnp.take_along_axis(drafts_BxKxL, source_BxK[:, :, None], 1)
  return Drafts(drafts_BxKxL, p_BxKxLxV, cache, bad_B)


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
  """K i.i.d. draft sequences of L tokens per row (SpecTr).

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
  return _paths(_iid_first, extend, params, cache, pending_Bx2, num_pending_B, key_B, probs,
                num_drafts=num_drafts, draft_len=draft_len)  # fmt: skip


def without_replacement(
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
  """K draft paths per row whose first tokens are distinct, drawn without replacement
  (`distinct_tokens`, the law of Gumbel-top-k), each continuing i.i.d. from the draft.

  The drafts of recursive rejection without replacement ("rrs"). Where fewer than K
  tokens have draft mass (top-k or top-p truncation, temperature 0), the first drafts
  are the whole support and every extra path is an exact copy of path 0: the verifier
  ignores a repeated token, so it sees fewer valid drafts, and the output law stays the
  target's (no error in the middle of a decode; any K >= 1 is taken).

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
  return _paths(_distinct_first, extend, params, cache, pending_Bx2, num_pending_B, key_B,
                probs, num_drafts=num_drafts, draft_len=draft_len)  # fmt: skip
