"""Drafting schemes: how a round draws its K draft sequences (the drafting seam).

A scheme is a `Depths`, its draws depth by depth: "iid" (`iid_depths`, K i.i.d. paths of
L tokens, SpecTr), "wor" (`tree_depths`, a tree drawn without replacement at every
node, docs/WITHOUT_REPLACEMENT.md) and "topk" (`topk_depths`, the same trees with the
draft's most likely tokens as children: deterministic). `methods.DRAFTING` names them.
`draft_paths` runs any scheme on the draft model and returns `Drafts`; `Drafter.draft`
calls it for `rounds.draw`. `iid` and `without_replacement` are the first two schemes as
whole functions:

  scheme(extend, params, cache, pending_Bx2, num_pending_B, key_B, probs, *,
         num_drafts, draft_len, take_tails=None, threshold=None) -> Drafts

`extend` is the decoder's extend-on-tails call: (params, tokens_BxKxT, cache,
num_new_B=None, logits_at_B=None, tails_empty=False) -> (logits, cache); a round's
opening call, on empty tails, passes tails_empty=True. `probs` is the decode's sampling
transform. With `take_tails` (the decoder's (cache, tails_BxW) -> cache) a dedup round
computes each prefix its draws share once (docs/CACHE.md); the drafts' law is unchanged.

Key convention: the draw of step t (t = 0..L-1) of tail k uses
fold_in(fold_in(row key, t), k) (`draft_keys_LxBxK`).
"""

import dataclasses
import functools
import importlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import adaptive, loops, sampling

__all__ = [
  "PROPORTIONAL",
  "Depths",
  "Drafter",
  "Drafts",
  "NoDrafts",
  "check_branching",
  "draft_paths",
  "iid_depths",
  "top_children",
  "topk_depths",
  "tree_depths",
  "check_branching",
  "check_distinct",
  "default_branching",
  "distinct_tokens",
  "draft_keys_LxBxK",
  "iid",
  "sample_BxK",
  "without_replacement",
]


# A tree shape drawn from the draft's path probabilities (`Drafting.branches` schemes).
PROPORTIONAL = "proportional"


def check_branching(branching, num_drafts: int, draft_len: int) -> None:
  """Raises a clear error unless `branching` is L integers >= 1 whose product is K, or
  `PROPORTIONAL` (a tree shaped by the draft's path probabilities, drawn by
  `drafting.without_replacement`)."""
  if branching == PROPORTIONAL:
    return
  if not (
    isinstance(branching, tuple)
    and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in branching)
  ):
    raise ValueError(
      f"branching must be a tuple of integers >= 1 or {PROPORTIONAL!r}, got {branching!r}"
    )
  if len(branching) != draft_len or math.prod(branching) != num_drafts:
    raise ValueError(
      f"branching {branching} must have draft_len = {draft_len} entries whose product is "
      f"num_drafts = {num_drafts} (one path per leaf)"
    )


class Drafts(NamedTuple):
  """A round's drafts.

  tokens_BxKxL: K draft sequences of L tokens per row.
  p_BxKxLxV: p[b, k, t] = the draft distribution token t of draft k was proposed from
    (after the row's prefix and the draft's first t tokens).
  cache: the draft model's cache with the drafts in its tails (the last token of each
    draft is never fed: the round's commit appends it when it is accepted).
  nonfinite_B: rows whose draft logits were not finite anywhere.
  positions: the draft positions computed per row (int32 scalar): K (L + 1) on tails
    (two pending tokens, then L - 1 steps of K), fewer with `take_tails` (static).

  Tails are the structure: draft k is the path of tail k (paths may share prefixes).
  """

  tokens_BxKxL: jax.Array
  p_BxKxLxV: jax.Array
  cache: Any
  nonfinite_B: jax.Array
  positions: jax.Array


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

  k = key_K.shape[0]

  def draw(carry, key_i):
    taken_V, x_K, valid_K = carry
    key, i = key_i
    left_V = jnp.where(taken_V, 0.0, p_V)
    some = jnp.any(left_V > 0)
    x = sampling.categorical(key, left_V)
    # Selects rather than updates of one entry (or a scan's stacked outputs): XLA:GPU
    # makes such an update a copy thunk that keeps the round out of its CUDA graph
    # (docs/ACCELERATORS.md).
    taken_V = taken_V | ((jnp.arange(p_V.shape[-1]) == x) & some)
    at_K = jnp.arange(k) == i
    return (taken_V, jnp.where(at_K, x, x_K), jnp.where(at_K, some, valid_K)), None

  init = (jnp.zeros(p_V.shape, bool), jnp.zeros((k,), jnp.int32), jnp.zeros((k,), bool))
  (_, x_K, valid_K), _ = loops.scan(draw, init, (key_K, jnp.arange(k)))
  return jnp.where(valid_K, x_K, x_K[0]).astype(jnp.int32), valid_K


def default_branching(num_drafts: int, draft_len: int) -> tuple[int, ...]:
  """(K, 1, ..., 1): K distinct first tokens, each path continuing alone."""
  return (num_drafts,) + (1,) * (draft_len - 1)


def check_distinct(drafts_KxL) -> None:
  """Raises a clear error unless the paths could come from `without_replacement` with the
  default branching: paths that share their first token must be identical (copies).
  Traced drafts are not checked (nor static trees of another branching: `verify.walk`).
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


def _iid(key_BxK, p_BxKxV, source_BxK, level, node_BxKx2):
  """The i.i.d. scheme's draws at one depth: one per tail, with its own key."""
  del level
  return sample_BxK(key_BxK, p_BxKxV), source_BxK, node_BxKx2


def _children(key_BxK, p_BxKxV, source_BxK, level, node_BxKx2, *, max_children: int,
              pick: Callable = distinct_tokens):  # fmt: skip
  """One depth of a static tree: every node draws its children with `pick` (without
  replacement: `distinct_tokens`; the most likely tokens: `top_children`).

  A node is a block of `size` consecutive tails that share their prefix (level = (size,
  child_size): the tails of a node and of each of its children); child j is the block of
  `child_size` tails from the node's first tail + j child_size, drawn (`distinct_tokens`
  on the p of the node's first tail) with the key of that block's first tail, so a node
  of one child draws with its own key, as `_iid`. A child beyond the node's support
  (invalid) copies child 0: its tails take as source the tail at the same offset in
  child 0's block. Where the level is static (the first depth) each node draws once;
  after, each tail draws its node's first `max_children` children and keeps its own.
  """
  size, child_size = level
  k = key_BxK.shape[1]
  tail_K = jnp.arange(k)
  static = isinstance(size, int)
  first_N = jnp.arange(0, k, size) if static else tail_K // size * size
  draw_NxJ = jnp.minimum(first_N[:, None] + jnp.arange(max_children) * child_size, k - 1)
  x_BxNxJ, valid_BxNxJ = jax.vmap(jax.vmap(pick))(key_BxK[:, draw_NxJ], p_BxKxV[:, first_N])
  node_K = tail_K // size if static else tail_K
  child_K = tail_K % size // child_size
  x_BxK, valid_BxK = x_BxNxJ[:, node_K, child_K], valid_BxNxJ[:, node_K, child_K]
  copied_BxK = jnp.take_along_axis(source_BxK, (tail_K - child_K * child_size)[None], 1)
  return x_BxK, jnp.where(valid_BxK, source_BxK, copied_BxK), node_BxKx2


def shares(size, drawn_p_J, valid_J):
  """The paths each child of a node of `size` paths gets, children in the order drawn:
  about `size` times its draft probability, at least 1, until the node's paths are
  spent (later draws get 0: not children); paths left when the support runs out go to
  child 0. Each count depends only on the draws before it, so whether a child exists
  never depends on its own token (`_proportional`)."""
  want_J = jnp.where(valid_J, jnp.maximum(1, jnp.round(size * drawn_p_J)), 0).astype(jnp.int32)
  before_J = jnp.cumsum(want_J) - want_J
  got_J = jnp.clip(size - before_J, 0, want_J)
  return got_J.at[0].add(size - jnp.sum(got_J))


def _proportional(key_BxK, p_BxKxV, source_BxK, level, node_BxKx2, *,
                  pick: Callable = distinct_tokens):  # fmt: skip
  """One depth of a tree shaped by the draft (branching `PROPORTIONAL`): a node holding a
  block of m consecutive tails (node_BxKx2: each tail's block start and m) draws
  children with `pick` (without replacement: `distinct_tokens` on the p of its first
  tail, draw j with the key of its tail j; or its top tokens, `top_children`) and gives
  child j `shares` of the block, in order. So a node of draft path probability P ends up
  with about K P of the K paths: peaked draft laws grow deep subtrees, flat ones wide
  nodes. A child's count of paths is set by the
  draws before it and its own probability, so the number of children of a node never
  depends on their tokens, and recursive rejection without replacement stays exact.
  """
  del level
  k = key_BxK.shape[1]
  start_BxK, size_BxK = node_BxKx2[..., 0], node_BxKx2[..., 1]
  p_node_BxKxV = jnp.take_along_axis(p_BxKxV, start_BxK[..., None], 1)
  draw_BxKxJ = jnp.minimum(start_BxK[..., None] + jnp.arange(k), k - 1)
  keys_BxKxJ = jax.vmap(lambda keys, idx: keys[idx])(key_BxK, draw_BxKxJ)
  x_BxKxJ, valid_BxKxJ = jax.vmap(jax.vmap(pick))(keys_BxKxJ, p_node_BxKxV)
  drawn_p_BxKxJ = jnp.take_along_axis(p_node_BxKxV, x_BxKxJ, -1)
  got_BxKxJ = jax.vmap(jax.vmap(shares))(size_BxK, drawn_p_BxKxJ, valid_BxKxJ)
  end_BxKxJ = jnp.cumsum(got_BxKxJ, -1)
  offset_BxK = jnp.arange(k) - start_BxK
  child_BxK = jnp.sum(end_BxKxJ <= offset_BxK[..., None], -1)
  pick = lambda a_BxKxJ: jnp.take_along_axis(a_BxKxJ, child_BxK[..., None], -1)[..., 0]  # noqa: E731
  got_BxK = pick(got_BxKxJ)
  node_BxKx2 = jnp.stack([start_BxK + pick(end_BxKxJ) - got_BxK, got_BxK], -1)
  return pick(x_BxKxJ), source_BxK, node_BxKx2


def _extend_shared(extend: Callable, take_tails: Callable | None, params, size: int,
                   tokens_BxKxT, cache, *args, **kwargs):  # fmt: skip
  """`extend` on K tails that form nodes of `size` consecutive tails holding the same
  sequence (before and after these tokens; static): the first tail of each node computes
  and the others take its entries and logits (`take_tails`). Size 1 (or no
  `take_tails`): every tail computes its own. Returns (logits for all K tails, the K-tail
  cache, the positions computed per row: an int)."""
  b, k, t = tokens_BxKxT.shape
  if take_tails is None or size == 1:
    logits, cache = extend(params, tokens_BxKxT, cache, *args, **kwargs)
    return logits, cache, k * t
  first_W = jnp.arange(0, k, size)
  node_BxK = jnp.broadcast_to(jnp.arange(k) // size, (b, k))
  cache = take_tails(cache, jnp.broadcast_to(first_W, (b, first_W.size)))
  logits, cache = extend(params, tokens_BxKxT[:, first_W], cache, *args, **kwargs)
  return logits[:, node_BxK[0]], take_tails(cache, node_BxK), first_W.size * t


def _runs(sizes: list[int]) -> list[tuple[int, int, int]]:
  """Consecutive equal entries of `sizes` as (start, stop, size)."""
  runs = []
  for i, size in enumerate(sizes):
    if runs and runs[-1][2] == size:
      runs[-1] = (runs[-1][0], i + 1, size)
    else:
      runs.append((i, i + 1, size))
  return runs


class Depths(NamedTuple):
  """A drafting scheme's draws, depth by depth (what `draft_paths` runs).

  first (depth 0) and draw (the later depths): (key_BxK, p_BxKxV, source_BxK, level,
    node_BxKx2) -> (x_BxK, source_BxK, node_BxKx2). They draw every tail's token at one
    depth and name the tail each one copies: itself, or a tail of an earlier subtree
    with the same tokens. level = levels[t]; node_BxKx2 is each tail's node as (first
    tail, tails), all K tails at the root, for draws that shape the tree as they go.
  levels: per depth, (tails per node, tails per child) of a static tree; (1, 1) where the
    scheme has none. Python ints at depth 0, traced after. Tails of one node share
    their prefix, so with `take_tails` one of them computes it.
  proposal: p_...xV -> p_...xV, the law the draws are drawn from, given the draft's
    (e.g. its top-k renormalised); None: the draft's own. The verifiers read it, so a
    scheme that draws from a transform of the draft stays exact.
  """

  first: Callable
  draw: Callable
  levels: tuple[tuple[int, int], ...]
  proposal: Callable | None = None


def draft_paths(depths: Depths, extend, params, cache, pending_Bx2, num_pending_B, key_B,
                probs, *, num_drafts: int, draft_len: int, take_tails: Callable | None = None,
                threshold=None) -> Drafts:  # fmt: skip
  """K draft paths of L tokens per row, drawn depth by depth with a scheme's `Depths`:
  the depth loop every scheme shares.

  A copying tail continues with its source's keys, so it draws the same tokens, and its
  tokens are set to the source's at the end (the verifier's view never depends on two
  tails computing bit-identical logits). The commit takes the first agreeing tail,
  never a copy of an earlier one.

  The pending tokens (1 or 2 per row: what the draft has not seen of the emitted text)
  open every tail, and only the last one's logits are computed; L - 1 steps under
  `lax.scan` follow, each writing its p in place into p_BxKxLxV. With `take_tails` the
  opening runs on one tail and step t on one tail per node of levels[t] (a scan per run
  of steps of one node size: `_extend_shared`; docs/CACHE.md).

  With `threshold` (adaptive draft length, tails only) a `lax.while_loop` replaces the
  scan: step t runs while some row verifies position t (`adaptive.confident_length` of
  the drafts so far, whose undrawn positions have p = 0 and so never pass), so the
  drafts end at the batch's longest length; later positions keep token 0 and p = 0.
  """
  b, k, n = pending_Bx2.shape[0], num_drafts, draft_len
  call = functools.partial(_extend_shared, extend, take_tails, params)
  # The distributions the tails draw from, which the verifier reads (`Depths.proposal`).
  law = probs if depths.proposal is None else lambda logits: depths.proposal(probs(logits))
  tokens_BxKx2 = jnp.broadcast_to(pending_Bx2[:, None, :], (b, k, 2))
  # The tails are empty when a round's drafting starts (the commit empties them).
  logits_BxKxV, cache, positions = call(
    k, tokens_BxKx2, cache, num_pending_B, num_pending_B - 1, tails_empty=True
  )
  bad_B = sampling.nonfinite_rows(logits_BxKxV)
  p_BxKxV = law(logits_BxKxV)
  key_LxBxK = draft_keys_LxBxK(key_B, n, k)
  source_BxK = jnp.broadcast_to(jnp.arange(k), (b, k))
  node_BxKx2 = jnp.broadcast_to(jnp.asarray([0, k], jnp.int32), (b, k, 2))
  levels = depths.levels
  x_BxK, source_BxK, node_BxKx2 = depths.first(
    key_LxBxK[0], p_BxKxV, source_BxK, tuple(levels[0]), node_BxKx2
  )
  p_BxKxLxV = jnp.zeros((b, k, n) + p_BxKxV.shape[-1:], p_BxKxV.dtype)
  p_BxKxLxV = p_BxKxLxV.at[:, :, 0].set(p_BxKxV)
  drafts_BxKxL = jnp.zeros((b, k, n), jnp.int32).at[:, :, 0].set(x_BxK)

  def step(size, carry, inputs):
    cache, drafts_BxKxL, p_BxKxLxV, bad_B, source_BxK, node_BxKx2 = carry
    t, level = inputs
    x_BxKx1 = jax.lax.dynamic_slice_in_dim(drafts_BxKxL, t - 1, 1, axis=2)
    logits_BxKx1xV, cache, _ = call(size, x_BxKx1, cache)
    bad_B |= sampling.nonfinite_rows(logits_BxKx1xV)
    p_BxKx1xV = law(logits_BxKx1xV)
    key_BxK = jnp.take_along_axis(key_LxBxK[t], source_BxK, 1)
    nxt_BxK, source_BxK, node_BxKx2 = depths.draw(
      key_BxK, p_BxKx1xV[:, :, 0], source_BxK, tuple(level), node_BxKx2
    )
    drafts_BxKxL = jax.lax.dynamic_update_slice_in_dim(drafts_BxKxL, nxt_BxK[..., None], t, 2)
    p_BxKxLxV = jax.lax.dynamic_update_slice_in_dim(p_BxKxLxV, p_BxKx1xV, t, axis=2)
    return (cache, drafts_BxKxL, p_BxKxLxV, bad_B, source_BxK, node_BxKx2), None

  carry = (cache, drafts_BxKxL, p_BxKxLxV, bad_B, source_BxK, node_BxKx2)
  t_A, level_Ax2 = jnp.arange(1, n), jnp.asarray(levels[1:], jnp.int32).reshape(n - 1, 2)
  sizes = [level[0] if take_tails is not None else 1 for level in levels[1:]]
  if threshold is not None:
    if take_tails is not None:
      raise ValueError("adaptive draft length drafts tails: it shares no prefixes (no dedup)")
    carry, steps = _while_confident(functools.partial(step, 1), carry, level_Ax2, threshold)
    positions = positions + steps * k
  else:
    for start, stop, size in _runs(sizes):
      steps = t_A[start:stop], level_Ax2[start:stop]
      carry, _ = loops.scan(functools.partial(step, size), carry, steps)
      positions += (stop - start) * k // size
  cache, drafts_BxKxL, p_BxKxLxV, bad_B, source_BxK, _ = carry
  drafts_BxKxL = jnp.take_along_axis(drafts_BxKxL, source_BxK[:, :, None], 1)
  return Drafts(drafts_BxKxL, p_BxKxLxV, cache, bad_B, jnp.int32(positions))


def _while_confident(step: Callable, carry, level_Ax2, threshold):
  """The steps t = 1, 2, ... of `draft_paths` (on K tails) while t < L and some row verifies
  position t (`adaptive.confident_length` of the drafts so far > t). Returns (carry,
  steps run)."""
  n = level_Ax2.shape[0] + 1
  if n == 1:
    return carry, jnp.int32(0)
  length = jax.vmap(adaptive.confident_length, (0, 0, None))

  def more(loop):
    t, (_, drafts_BxKxL, p_BxKxLxV, *_) = loop
    return (t < n) & jnp.any(length(drafts_BxKxL, p_BxKxLxV, threshold) > t)

  def body(loop):
    t, carry = loop
    carry, _ = step(carry, (t, level_Ax2[jnp.minimum(t, n - 1) - 1]))
    return t + 1, carry

  t, carry = jax.lax.while_loop(more, body, (jnp.int32(1), carry))
  return carry, t - 1


def iid_depths(num_drafts: int, draft_len: int, branching=None) -> Depths:
  """The i.i.d. scheme: every tail draws its own token from its own p at every depth."""
  del num_drafts, branching
  return Depths(_iid, _iid, ((1, 1),) * draft_len)


def tree_depths(num_drafts: int, draft_len: int, branching=None) -> Depths:
  """The tree drawn without replacement: at depth t every node has branching[t]
  children drawn without replacement from the draft (`distinct_tokens`); branching None
  is (K, 1, ..., 1), `PROPORTIONAL` shapes the tree by the draft's probabilities."""
  return _static_tree(num_drafts, draft_len, branching, distinct_tokens)


def topk_depths(num_drafts: int, draft_len: int, branching=None) -> Depths:
  """The tree of the draft's most likely tokens: the shapes of `tree_depths`, with child
  j of every node the draft's j-th most likely token (`top_children`). Deterministic:
  the tree is a function of the context; the keys are not read."""
  return _static_tree(num_drafts, draft_len, branching, top_children)


def top_children(key_K, p_V):
  """A node's K children in the field's mode: the K most likely tokens of p, in order
  (ties to the lower index; `sampling.top_tokens`). The signature of `distinct_tokens`;
  key_K sets K only. Children beyond the tokens with mass are invalid (as there)."""
  return sampling.top_tokens(p_V, key_K.shape[0])


def _static_tree(num_drafts: int, draft_len: int, branching, pick: Callable) -> Depths:
  """The depths of a tree whose nodes take their children from `pick` (key_K, p_V) ->
  (tokens_K, valid_K): the shape `branching` (None: (K, 1, ..., 1); `PROPORTIONAL`)."""
  branching = default_branching(num_drafts, draft_len) if branching is None else branching
  check_branching(branching, num_drafts, draft_len)
  if branching == PROPORTIONAL:
    shaped = functools.partial(_proportional, pick=pick)
    return Depths(shaped, shaped, ((1, 1),) * draft_len)
  levels, size = [], num_drafts
  for children in branching:
    levels.append((size, size // children))
    size //= children
  first = functools.partial(_children, max_children=branching[0], pick=pick)
  draw = functools.partial(_children, max_children=max(branching[1:], default=1), pick=pick)
  return Depths(first, draw, tuple(levels))


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
  take_tails: Callable | None = None,
  threshold: jax.Array | None = None,
) -> Drafts:
  """K i.i.d. draft sequences of L tokens per row (SpecTr).

  Args:
    extend: the draft decoder's extend call (module docstring).
    params: the draft's parameters.
    cache: the draft's cache (K tails, empty).
    pending_Bx2, num_pending_B: the pending tokens of each row and how many are valid.
    key_B: one key per row.
    probs: logits [..., V] -> sampling distributions (the decode's transform).
    num_drafts, draft_len: K and L (static).
    take_tails: the decoder's `take_tails`, to compute each shared prefix once (module
      docstring), or None for K tails throughout.
    threshold: adaptive draft length's threshold (`spectr_jax.adaptive`; tails only):
      drafting stops after the batch's longest confident length. None: L positions.

  Returns:
    `Drafts`.
  """
  return draft_paths(iid_depths(num_drafts, draft_len), extend, params, cache, pending_Bx2,
                     num_pending_B, key_B, probs, num_drafts=num_drafts, draft_len=draft_len,
                     take_tails=take_tails, threshold=threshold)  # fmt: skip


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
  branching: tuple[int, ...] | None = None,
  take_tails: Callable | None = None,
  threshold: jax.Array | None = None,
) -> Drafts:
  """A static tree of K paths per row: at depth t every node has branching[t] children,
  drawn without replacement from the draft (`distinct_tokens`, the law of Gumbel-top-k).

  The drafts of "rrs" and "traversal". By default (K, 1, ..., 1): K distinct first
  tokens, each path continuing alone. Paths are in depth-first order: child j of a node
  is the j-th block of its paths. A node with fewer tokens with draft mass than children
  copies child 0's subtree into the extras; the verifier skips a repeated token, so the
  law stays the target's and any K >= 1 is taken (docs/WITHOUT_REPLACEMENT.md).

  Args:
    extend: the draft decoder's extend call (module docstring).
    params: the draft's parameters.
    cache: the draft's cache (K tails, empty).
    pending_Bx2, num_pending_B: the pending tokens of each row and how many are valid.
    key_B: one key per row.
    probs: logits [..., V] -> sampling distributions (the decode's transform).
    num_drafts, draft_len: K and L (static).
    branching: children per node at each depth (static; `check_branching`), None for
      (K, 1, ..., 1), or `PROPORTIONAL`: each node's children and their shares of the K
      paths follow the draft's probabilities (`_proportional`).
    take_tails: the decoder's `take_tails`, to compute each shared prefix once (module
      docstring), or None for K tails throughout.
    threshold: as in `iid`.

  Returns:
    `Drafts`.
  """
  return draft_paths(tree_depths(num_drafts, draft_len, branching), extend, params, cache,
                     pending_Bx2, num_pending_B, key_B, probs, num_drafts=num_drafts,
                     draft_len=draft_len, take_tails=take_tails, threshold=threshold)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Drafter:
  """A decode's drafting: its scheme record (`methods.Drafting`) and tree shape, run by
  the round on the draft model (static, hashable)."""

  scheme: Any
  branching: tuple[int, ...] | str | None = None

  def draft(self, model, params, cache, pending_Bx2, num_pending_B, key_B, probs, *,
            num_drafts: int, draft_len: int, share_prefixes: bool,
            stop=None) -> Drafts:  # fmt: skip
    """The round's drafts (`draft_paths` on the scheme's `Depths`): with
    `share_prefixes` (a scored tree) each shared prefix is computed once; with `stop`
    (a length policy's threshold) drafting ends at the batch's longest length."""
    take_tails = model.take_tails if share_prefixes else None
    if self.scheme.depths is None:  # a whole scheme function (the deprecated form)
      fn = self.scheme.draft
      if isinstance(fn, str):
        module, _, name = fn.partition(":")
        fn = getattr(importlib.import_module(module), name)
      return fn(model.extend, params, cache, pending_Bx2, num_pending_B, key_B, probs,
                num_drafts=num_drafts, draft_len=draft_len, take_tails=take_tails,
                **({} if self.branching is None else {"branching": self.branching}),
                **({} if stop is None else {"threshold": stop}))  # fmt: skip
    depths = self.scheme.depths(num_drafts, draft_len, self.branching)
    return draft_paths(depths, model.extend, params, cache, pending_Bx2, num_pending_B, key_B,
                       probs, num_drafts=num_drafts, draft_len=draft_len,
                       take_tails=take_tails, threshold=stop)  # fmt: skip

  def prefill(self, prefill: Callable):
    """The draft's cache after the prompts (`prefill()` builds it)."""
    return prefill()

  def commit(self, model, cache, tail_B, tokens_BxL1, num_B, length_B, last_B, live_B,
             pending_Bx2, num_pending_B, features_BxKxL1xD=None):  # fmt: skip
    """Appends what the draft saw of the emitted tokens from tail tail_B to its prefix and
    sets the tokens it has not seen (1 or 2 pending per row): (cache, pending_Bx2,
    num_pending_B). A row whose walk accepted every draft its path verifies (length_B)
    keeps its last draft and the bonus pending (the draft never fed its last draft).
    With the target's features (a head drafts), the draft receives those before each
    pending token: the emitted token at t follows the target's feature at t."""
    seen_B = jnp.minimum(num_B - 1, length_B - 1)
    cache = model.commit(cache, tail_B, jnp.where(live_B, num_pending_B + seen_B, 0))
    full_B = num_B == length_B + 1
    at_Bx2 = jnp.where(
      full_B[:, None], length_B[:, None] + jnp.arange(-1, 1), (num_B - 1)[:, None] + jnp.arange(2)
    )
    at_Bx2 = jnp.minimum(at_Bx2, tokens_BxL1.shape[1] - 1)
    ends_Bx2 = jnp.take_along_axis(tokens_BxL1, length_B[:, None] + jnp.arange(-1, 1), 1)
    one_Bx2 = jnp.stack([last_B, jnp.zeros_like(last_B)], axis=1)
    new_pending_Bx2 = jnp.where(full_B[:, None], ends_Bx2, one_Bx2)
    if features_BxKxL1xD is not None:  # a row that is not live never drafts again
      path_BxL1xD = jnp.take_along_axis(features_BxKxL1xD, tail_B[:, None, None, None], 1)[:, 0]
      cache = model.receive(cache, jnp.take_along_axis(path_BxL1xD, at_Bx2[..., None], 1))
    pending_Bx2 = jnp.where(live_B[:, None], new_pending_Bx2, pending_Bx2)
    num_pending_B = jnp.where(live_B, jnp.where(full_B, 2, 1), num_pending_B)
    return cache, pending_Bx2, num_pending_B


@dataclasses.dataclass(frozen=True)
class NoDrafts:
  """The drafting of a decode without drafts (autoregressive): L = 0 tokens per path."""

  def draft(self, model, params, cache, pending_Bx2, num_pending_B, key_B, probs, *,
            num_drafts: int, draft_len: int, share_prefixes: bool,
            stop=None) -> Drafts:  # fmt: skip
    del model, params, num_pending_B, key_B, probs, draft_len, share_prefixes, stop
    b = pending_Bx2.shape[0]
    return Drafts(
      jnp.zeros((b, num_drafts, 0), jnp.int32), None, cache, jnp.zeros((b,), bool), jnp.int32(0)
    )

  def prefill(self, prefill: Callable):
    """No draft model, no cache."""
    del prefill

  def commit(self, model, cache, tail_B, tokens_BxL1, num_B, length_B, last_B, live_B,
             pending_Bx2, num_pending_B, features_BxKxL1xD=None):  # fmt: skip
    """Nothing to commit: the state's pending tokens as they are."""
    del model, tail_B, tokens_BxL1, num_B, length_B, last_B, live_B, features_BxKxL1xD
    return cache, pending_Bx2, num_pending_B
