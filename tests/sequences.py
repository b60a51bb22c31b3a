"""Sequence-level sampling of block verifiers on enumerable autoregressive trees.

Shared by the token-level (test_verify) and block-level (test_block) law tests: draw K
draft paths from p, verify them, and complete each emitted block with exact target
draws, so that the completed L + 1 tokens follow the target's sequence law exactly when
the verifier is exact.
"""

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import sampling


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
