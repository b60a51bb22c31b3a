"""Enumerable autoregressive trees and sequence-level sampling of block verifiers on them.

Shared by the token-level (test_verify) and block-level (test_block, test_gbv_tp) law
tests and scripts/block_table.py: random and constant (p, q) trees in block_bound's
layout, the target's sequence law, and `sample_blocks`, which draws K draft paths from
p, verifies them and completes each emitted block with exact target draws, so that the
completed L + 1 tokens follow the target's sequence law exactly when the verifier is
exact. `sample_wor_blocks` does the same on the trees of the "wor" scheme, drawn by
`drafting.without_replacement` through a fake draft model walking the table
(`wor_extend`, `wor_drafts`; test_wor, test_traversal).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import drafting, methods, sampling, verify

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


def llm_like(seed, vocab: int):
  """(p, q) float64 over `vocab` tokens: correlated draft and target laws with LLM-like
  tails (log-normal weights around a shared base)."""
  rng = np.random.default_rng(seed)
  base = rng.normal(size=vocab)
  p = np.exp(2.0 * (base + 0.5 * rng.normal(size=vocab)))
  q = np.exp(2.0 * (base + 0.5 * rng.normal(size=vocab)))
  return p / p.sum(), q / q.sum()


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


def wor_extend(p_tab):
  """A fake draft model walking the tree: its cache is (depth, prefix code per tail)."""
  vocab = p_tab.shape[-1]
  logp = jnp.log(jnp.asarray(p_tab, jnp.float32))

  def extend(params, tokens_BxKxT, cache, num_new_B=None, logits_at_B=None, tails_empty=False):
    del params, num_new_B
    depth, code_BxK = cache
    if logits_at_B is not None:  # the opening call (pending tokens): the root
      b, k = tokens_BxKxT.shape[:2]
      return jnp.broadcast_to(logp[0, 0], (b, k, vocab)), (
        jnp.int32(1),
        jnp.zeros((b, k), jnp.int32),
      )
    code_BxK = code_BxK * vocab + tokens_BxKxT[:, :, 0]
    return logp[depth, code_BxK][:, :, None], (depth + 1, code_BxK)

  return extend


def wor_drafts(p_tab, num_drafts, draft_len, n, seed=0, branching=None):
  """n rows of drafts from the "wor" scheme on the tree: drafting.Drafts."""
  cache = (jnp.int32(0), jnp.zeros((n, num_drafts), jnp.int32))
  run = jax.jit(
    functools.partial(
      drafting.without_replacement,
      wor_extend(p_tab),
      None,
      probs=functools.partial(jax.nn.softmax, axis=-1),
      num_drafts=num_drafts,
      draft_len=draft_len,
      branching=branching,
    )
  )
  key_B = jax.random.split(jax.random.key(seed), n)
  return run(cache, jnp.zeros((n, 2), jnp.int32), jnp.ones((n,), jnp.int32), key_B)


def sample_wor_blocks(
  p_tab, q_tab, num_drafts, draft_len, n=100_000, seed=3, method="rrs", branching=None
):
  """`methods.verify_drafts` on drafts of the "wor" scheme (with a static branching: the walk it
  runs, `verify.walk`, whose input check takes the default branching only), each block
  completed with exact target draws: numpy (codes of the L + 1 tokens, num_tokens)."""
  vocab = p_tab.shape[-1]
  out = wor_drafts(p_tab, num_drafts, draft_len, n, seed, branching)
  if branching is None:
    block = functools.partial(methods.verify_drafts, method=method)
  else:
    walk = functools.partial(verify.walk, rho_value=0.0, method=method, rho_mode="star")
    block = lambda *args: walk(*args)[:2]  # noqa: E731
  q_j = jnp.asarray(q_tab, jnp.float32)

  def one(key, drafts_KxL, p_KxLxV):
    verify_key, extend_key = jax.random.split(key)
    code_K = jnp.zeros((num_drafts,), jnp.int32)
    qs = []
    for t in range(draft_len + 1):
      qs.append(q_j[t, code_K])
      if t < draft_len:
        code_K = code_K * vocab + drafts_KxL[:, t]
    tokens_L1, num = block(verify_key, drafts_KxL, p_KxLxV, jnp.stack(qs, 1))
    code = jnp.int32(0)
    for t in range(draft_len + 1):
      draw = sampling.categorical(jax.random.fold_in(extend_key, t), q_j[t, code])
      code = code * vocab + jnp.where(t < num, tokens_L1[t], draw)
    return code, num

  keys = jax.random.split(jax.random.key(seed + 1), n)
  codes, nums = jax.jit(jax.vmap(one))(keys, out.tokens_BxKxL, out.p_BxKxLxV)
  return np.asarray(codes), np.asarray(nums)


def equal_mass_bins(probs, num_bins: int):
  """Maps each token to one of `num_bins` bins of about equal probability mass.

  Returns (bin_of_token_V, bin_probs). Used to test laws over large vocabularies.
  """
  probs = np.asarray(probs, dtype=np.float64)
  order = np.argsort(-probs, kind="stable")
  cum = np.cumsum(probs[order])
  bin_sorted = np.minimum((cum - probs[order] / 2) * num_bins, num_bins - 1).astype(int)
  bin_of_token = np.empty_like(bin_sorted)
  bin_of_token[order] = bin_sorted
  bin_probs = np.bincount(bin_of_token, weights=probs, minlength=num_bins)
  return bin_of_token, bin_probs / bin_probs.sum()
