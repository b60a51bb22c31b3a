"""Traversal Verification: a draft tree verified from the leaves to the root.

Weng et al., "Traversal Verification for Speculative Tree Decoding" (arXiv 2505.12398,
NeurIPS 2025); rules, provenance and evidence: docs/WITHOUT_REPLACEMENT.md, "Traversal
Verification". `verify_tree` is the block-level verify function of "traversal", for trees
drawn without replacement at every node (the "wor" scheme, `drafting.without_replacement`).
Index convention as `methods.verify_drafts`: p[k, t] = p(. | h, d_k[:t]), q[k, t] likewise.

The tree: the node at depth t of path k is its prefix d_k[:t]. Paths are in post-order (a
node's children in the order drawn, each child's paths one block). A path equal to an
earlier one (a copy past a node's support) adds no node. Nodes are tested leaf to root; a
rejected node updates its parent's laws and weight. On a chain (K = 1) this is "block"
(`spectr_jax.block`) with the same draws; at L = 1 it is "rrs".

Static shapes: one `lax.while_loop` of at most K L + 1 tests per block, each O(V + L).
Its trip count depends on the draws (on a GPU each test is a host round trip). It stays
data-dependent: a fixed-trip form would run all K L + 1 tests where a block usually ends
after a few.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import acceptance
from spectr_jax.sampling import categorical
from spectr_jax.verdict import BlockVerdict

__all__ = ["verify_tree"]


class _State(NamedTuple):
  path: jax.Array  # the path whose node is tested
  depth: jax.Array  # the tested node's depth (0 = the root)
  done: jax.Array
  weight_L1: jax.Array  # w of the path's nodes at depths 0..L
  changed_L: jax.Array  # the node at depth t has updated laws (t < L)
  target_LxV: jax.Array  # its updated Q (where changed)
  draft_LxV: jax.Array  # its updated P (where changed)


def _weights(state: _State, drafts_KxL, p_KxLxV, q_KxL1xV, start) -> jax.Array:
  """The path's weights with those at depths >= start recomputed from its current laws."""
  draft_len = drafts_KxL.shape[1]
  x_L = drafts_KxL[state.path]
  depth_L = jnp.arange(draft_len)
  q_x_L = jnp.where(
    state.changed_L, state.target_LxV[depth_L, x_L], q_KxL1xV[state.path, depth_L, x_L]
  )
  p_x_L = jnp.where(
    state.changed_L, state.draft_LxV[depth_L, x_L], p_KxLxV[state.path, depth_L, x_L]
  )
  ratio_L = jnp.where(p_x_L > 0, q_x_L / jnp.where(p_x_L > 0, p_x_L, 1.0), 0.0)
  weight_L1 = state.weight_L1
  for t in range(1, draft_len + 1):  # L is static and small: unrolled
    fresh = jnp.minimum(1.0, weight_L1[t - 1] * ratio_L[t - 1])
    weight_L1 = weight_L1.at[t].set(jnp.where(t >= start, fresh, weight_L1[t]))
  return weight_L1


def verify_tree(key, drafts_KxL, p_KxLxV, q_KxL1xV, length_K=None) -> BlockVerdict:
  """Traversal Verification of the draft tree of K paths of length L (module docstring).

  Args:
    key: PRNG key.
    drafts_KxL: int draft tokens: the paths of a "wor" tree, in post-order.
    p_KxLxV: draft distributions. q_KxL1xV: target distributions (`methods.verify_drafts`).
    length_K: path k holds only its first length_K[k] tokens (a tree budget on the
      default tree, `adaptive.budget_nodes`: its leaf is at that depth; 0: no node).
      None: L.

  Returns:
    The `BlockVerdict`: the accepted node's prefix, then the bonus token.
  """
  num_drafts, draft_len = drafts_KxL.shape
  length_K = jnp.full((num_drafts,), draft_len) if length_K is None else length_K
  length_K = jnp.asarray(length_K, jnp.int32)
  _, stop_key, residual_key = jax.random.split(key, 3)  # the keys of "block"
  eta_KxL1 = jax.random.uniform(stop_key, (num_drafts, draft_len + 1))
  held_KxL = jnp.arange(draft_len) < length_K[:, None]
  equal_KxKxL = drafts_KxL[:, None, :] == drafts_KxL[None, :, :]
  equal_KxKxL &= held_KxL[:, None, :] & held_KxL[None, :, :]
  # same_KxKxL1[i, j, t]: paths i and j hold and share their first t tokens (one node at
  # depth t).
  same_KxKxL1 = jnp.concatenate(
    [jnp.ones((num_drafts, num_drafts, 1), bool), jnp.cumprod(equal_KxKxL, axis=-1) > 0], -1
  )
  index_K = jnp.arange(num_drafts)
  # Not a copy: no earlier path holds all of its tokens (and it holds one).
  first_K = jnp.argmax(same_KxKxL1[index_K, :, length_K], axis=1)
  new_K = (first_K == index_K) & (length_K > 0)
  later_KxK = new_K[None, :] & (index_K[None, :] > index_K[:, None])
  next_K = jnp.where(jnp.any(later_KxK, axis=1), jnp.argmax(later_KxK, axis=1), num_drafts)
  # The depth of the node where the next path branches off (its parent's depth).
  branch_K = jnp.sum(same_KxKxL1[index_K, jnp.minimum(next_K, num_drafts - 1), 1:], axis=-1)
  zeros_LxV = jnp.zeros(p_KxLxV.shape[1:], p_KxLxV.dtype)
  init = _State(
    path=jnp.int32(0),
    depth=length_K[0],
    done=jnp.bool_(False),
    weight_L1=jnp.ones((draft_len + 1,), p_KxLxV.dtype),
    changed_L=jnp.zeros((draft_len,), bool),
    target_LxV=zeros_LxV,
    draft_LxV=zeros_LxV,
  )
  init = init._replace(weight_L1=_weights(init, drafts_KxL, p_KxLxV, q_KxL1xV, 1))

  def law(state: _State, depth):
    """The current (Q, P) of the path's node at depth < L."""
    changed = state.changed_L[depth]
    return (
      jnp.where(changed, state.target_LxV[depth], q_KxL1xV[state.path, depth]),
      jnp.where(changed, state.draft_LxV[depth], p_KxLxV[state.path, depth]),
    )

  def step(s: _State) -> _State:
    # Node (k, t), tested while path k is the last path through it, uses eta[k, t]. The
    # test is eta < w, so w = 0 never accepts and w = 1 always does.
    accept = (s.depth == 0) | (eta_KxL1[s.path, s.depth] < s.weight_L1[s.depth])
    parent = jnp.maximum(s.depth - 1, 0)
    a = s.weight_L1[parent]
    target_V, draft_V = law(s, parent)
    rho = jnp.sum(jnp.maximum(a * target_V - draft_V, 0.0))
    denom = rho + 1.0 - a
    stop = jnp.where(denom > 0, rho / jnp.where(denom > 0, denom, 1.0), 0.0)
    kept_V = draft_V.at[drafts_KxL[s.path, parent]].set(0.0)
    mass = jnp.sum(kept_V)
    depth_L = jnp.arange(draft_len)
    rejected = _State(
      path=s.path,
      depth=parent,
      done=jnp.bool_(False),
      weight_L1=s.weight_L1.at[parent].set(stop),
      # Below the parent: deleted nodes, or the next path's fresh ones.
      changed_L=(s.changed_L | (depth_L == parent)) & (depth_L <= parent),
      target_LxV=s.target_LxV.at[parent].set(acceptance.residual(a * target_V, draft_V)),
      draft_LxV=s.draft_LxV.at[parent].set(kept_V / jnp.where(mass > 0, mass, 1.0)),
    )
    switch = (next_K[s.path] < num_drafts) & (branch_K[s.path] == parent)
    moved = rejected._replace(
      path=next_K[s.path], depth=length_K[jnp.minimum(next_K[s.path], num_drafts - 1)]
    )
    moved = moved._replace(weight_L1=_weights(moved, drafts_KxL, p_KxLxV, q_KxL1xV, parent + 1))
    following = jax.tree.map(lambda m, r: jnp.where(switch, m, r), moved, rejected)
    stay = s._replace(done=jnp.bool_(True))
    return jax.tree.map(lambda old, new: jnp.where(accept, old, new), stay, following)

  final = jax.lax.while_loop(lambda s: ~s.done, step, init)
  tau = final.depth
  bonus_V = jnp.where(
    tau == draft_len,
    q_KxL1xV[final.path, draft_len],
    law(final, jnp.minimum(tau, draft_len - 1))[0],
  )
  y = categorical(residual_key, bonus_V)
  index_L1 = jnp.arange(draft_len + 1)
  path_L1 = jnp.concatenate([drafts_KxL[final.path], jnp.zeros((1,), drafts_KxL.dtype)])
  tokens_L1 = jnp.where(index_L1 < tau, path_L1, 0).at[tau].set(y)
  survivors_L1 = jnp.sum(same_KxKxL1[final.path], axis=0).at[draft_len].set(0)
  return BlockVerdict(tokens_L1.astype(jnp.int32), (tau + 1).astype(jnp.int32), survivors_L1)
