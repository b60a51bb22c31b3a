"""Enumerable autoregressive trees and sequence-level sampling of block verifiers on them.

Shared by the token-level (test_verify) and block-level (test_block, test_gbv_tp) law
tests and scripts/block_table.py: random and constant (p, q) trees in block_bound's
layout, the target's sequence law, and `sample_blocks`, which draws K draft paths from
p, verifies them and completes each emitted block with exact target draws, so that the
completed L + 1 tokens follow the target's sequence law exactly when the verifier is
exact.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import sampling

TREE_KINDS = ("random", "sparse", "one-hot", "ties")


def random_tree(rng, vocab: int, draft_len: int, kind: str = "random", concentration=0.7):
  """(p_tab, q_tab) float64 of shape (L + 1) x V^L x V (block_bound's tree layout).

  Both tables are Dirichlet(concentration) at every node, then by kind: "random" as
  drawn, "sparse" (random zeros in p and q: ratio-0 ties, undrafted tokens), "one-hot"
  (q one-hot everywhere, p one-hot at half the nodes), "ties" (q = p on a random set of
  >= 2 tokens per node, ratio-1 ties; q = p at some nodes).
  """
  if kind not in TREE_KINDS:
    raise ValueError(f"unknown tree kind {kind!r}; known: {TREE_KINDS}")
  shape = (draft_len + 1, vocab**draft_len)
  p = rng.dirichlet(np.full(vocab, concentration), size=shape)
  q = rng.dirichlet(np.full(vocab, concentration), size=shape)
  for node in itertools.product(range(shape[0]), range(shape[1])):
    if kind == "sparse":
      for table in (p, q):
        keep = rng.random(vocab) < 0.6
        keep[rng.integers(vocab)] = True
        table[node] = np.where(keep, table[node], 0.0) / table[node][keep].sum()
    elif kind == "one-hot":
      q[node] = np.eye(vocab)[rng.integers(vocab)]
      if rng.random() < 0.5:
        p[node] = np.eye(vocab)[rng.integers(vocab)]
    elif kind == "ties":
      tied = rng.permutation(vocab)[: rng.integers(2, vocab + 1)]
      rest = np.setdiff1d(np.arange(vocab), tied)
      q[node] = 0.0
      q[node][tied] = p[node][tied]
      if rest.size:
        q[node][rest] = (1.0 - p[node][tied].sum()) * rng.dirichlet(np.ones(rest.size))
  return p, q


def constant_tree(p, q, draft_len: int):
  """A context-independent tree: the same p and q after every prefix."""
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  shape = (draft_len + 1, len(p) ** draft_len, len(p))
  return np.broadcast_to(p, shape).copy(), np.broadcast_to(q, shape).copy()


def target_law(q_tab, draft_len: int) -> np.ndarray:
  """The target's law of the L + 1 tokens of a tree, in lexicographic order."""
  vocab = q_tab.shape[-1]
  law = np.ones(1)
  for t in range(draft_len + 1):
    law = (law[:, None] * q_tab[t, : vocab**t]).ravel()
  return law


def sample_blocks(key, p_tab, q_tab, num_drafts, draft_len, verify_fn, n, bonus_shift=0):
  """Runs `verify_fn(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> (tokens_L1, num)` on n blocks.

  Args:
    p_tab, q_tab: (L + 1) x V^L x V tables: row t, column c = the distribution after the
      prefix with base-V code c.
    bonus_shift: 1 builds the broken variant whose bonus comes from position L - 1.

  Returns:
    numpy (codes_A, num_tokens_A): the base-V code of the completed L + 1 tokens.
  """
  vocab = p_tab.shape[-1]
  p_j, q_j = jnp.asarray(p_tab, jnp.float32), jnp.asarray(q_tab, jnp.float32)

  def one(key):
    draft_key, verify_key, extend_key = jax.random.split(key, 3)
    codes_K = jnp.zeros((num_drafts,), jnp.int32)
    drafts, ps, qs = [], [], []
    for t in range(draft_len):
      ps.append(p_j[t, codes_K])
      qs.append(q_j[t, codes_K])
      keys = jax.random.split(jax.random.fold_in(draft_key, t), num_drafts)
      x_K = jax.vmap(sampling.categorical)(keys, ps[-1])
      drafts.append(x_K)
      codes_K = codes_K * vocab + x_K
    qs.append(q_j[draft_len - bonus_shift, codes_K // vocab**bonus_shift])
    tokens_L1, num = verify_fn(verify_key, jnp.stack(drafts, 1), jnp.stack(ps, 1), jnp.stack(qs, 1))
    code = jnp.int32(0)
    for t in range(draft_len + 1):
      draw = sampling.categorical(jax.random.fold_in(extend_key, t), q_j[t, code])
      code = code * vocab + jnp.where(t < num, tokens_L1[t], draw)
    return code, num

  codes, nums = jax.jit(jax.vmap(one))(jax.random.split(key, n))
  return np.asarray(codes), np.asarray(nums)
