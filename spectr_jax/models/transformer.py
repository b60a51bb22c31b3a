"""PaLM-style decoder LM: parallel blocks, RoPE, multi-query attention, SwiGLU, tied embedding.

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity, X any leading shape.

The KV cache is an explicit pytree (`KVCache`) passed in and returned, never a mutable
flax collection, so every method is a pure function of (params, inputs, cache).
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import ModelConfig

_MASKED = float(jnp.finfo(jnp.float32).min)

# attend(q_XxHxDh, k_XxHkxDh, v_XxHkxDh) -> (o_XxHxDh, kv): the attention of one layer;
# kv is whatever the calling mode keeps of the layer (its keys and values, or its tails).
Attend = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


def _rope(x_XxHxDh: jax.Array, pos_X: jax.Array, base: float) -> jax.Array:
  """Rotates the two halves of every head by angles pos * base^(-i / (Dh / 2))."""
  half = x_XxHxDh.shape[-1] // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle_XxHalf = pos_X.astype(jnp.float32)[..., None] * freq
  sin = jnp.sin(angle_XxHalf)[..., None, :]
  cos = jnp.cos(angle_XxHalf)[..., None, :]
  x1, x2 = jnp.split(x_XxHxDh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_XxHxDh.dtype)


def _group(q_XxHxDh: jax.Array, num_kv_heads: int) -> jax.Array:
  """Splits the query heads into Hk groups of G: X x H x Dh -> X x Hk x G x Dh."""
  *lead, h, dh = q_XxHxDh.shape
  return q_XxHxDh.reshape(*lead, num_kv_heads, h // num_kv_heads, dh)


def _causal_attention(
  q_BxTxHxDh: jax.Array, k_BxTxHkxDh: jax.Array, v_BxTxHkxDh: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Causal self-attention over one sequence per row; keeps (k, v) for the cache."""
  b, t, h, dh = q_BxTxHxDh.shape
  q_BxTxHkxGxDh = _group(q_BxTxHxDh, k_BxTxHkxDh.shape[2])
  s_BxHkxGxTxT = jnp.einsum(
    "btngd,bsnd->bngts", q_BxTxHkxGxDh, k_BxTxHkxDh, preferred_element_type=jnp.float32
  )
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  p_BxHkxGxTxT = jax.nn.softmax(jnp.where(causal_TxT, s_BxHkxGxTxT, _MASKED), axis=-1)
  o_BxTxHkxGxDh = jnp.einsum(
    "bngts,bsnd->btngd", p_BxHkxGxTxT.astype(v_BxTxHkxDh.dtype), v_BxTxHkxDh
  )
  return o_BxTxHkxGxDh.reshape(b, t, h, dh), (k_BxTxHkxDh, v_BxTxHkxDh)


def _write_tail(
  tail_BxKxRxHkxDh: jax.Array, new_BxKxTxHkxDh: jax.Array, start_BxK: jax.Array
) -> jax.Array:
  """Writes T new entries of every tail at its own start; entries past R are dropped."""

  def write(tail_RxHkxDh, new_TxHkxDh, start):
    pos_T = start + jnp.arange(new_TxHkxDh.shape[0])
    return tail_RxHkxDh.at[pos_T].set(new_TxHkxDh.astype(tail_RxHkxDh.dtype), mode="drop")

  return jax.vmap(jax.vmap(write))(tail_BxKxRxHkxDh, new_BxKxTxHkxDh, start_BxK)


def _tail_attention(
  q_BxKxTxHxDh: jax.Array,
  prefix_k_BxSxHkxDh: jax.Array,
  prefix_v_BxSxHkxDh: jax.Array,
  prefix_len_B: jax.Array,
  tail_k_BxKxRxHkxDh: jax.Array,
  tail_v_BxKxRxHkxDh: jax.Array,
  tail_pos_BxKxT: jax.Array,
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
  pre_mask_BxS = jnp.arange(s)[None, :] < prefix_len_B[:, None]
  r = tail_k_BxKxRxHkxDh.shape[2]
  tail_mask_BxKxTxR = jnp.arange(r) <= tail_pos_BxKxT[..., None]
  scores = jnp.concatenate(
    [
      jnp.where(pre_mask_BxS[:, None, None, None, None, :], s_pre_BxKxTxHkxGxS, _MASKED),
      jnp.where(tail_mask_BxKxTxR[:, :, :, None, None, :], s_tail_BxKxTxHkxGxR, _MASKED),
    ],
    axis=-1,
  )
  p = jax.nn.softmax(scores, axis=-1).astype(prefix_v_BxSxHkxDh.dtype)
  o_BxKxTxHkxGxDh = jnp.einsum("bktngs,bsnd->bktngd", p[..., :s], prefix_v_BxSxHkxDh)
  o_BxKxTxHkxGxDh += jnp.einsum("bktngr,bkrnd->bktngd", p[..., s:], tail_v_BxKxRxHkxDh)
  return o_BxKxTxHkxGxDh.reshape(b, k, t, h, dh)


class _Block(nn.Module):
  """The PaLM parallel block: x + attn(norm(x)) + mlp(norm(x)), no biases."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_XxD: jax.Array, pos_X: jax.Array, attend: Attend) -> tuple[jax.Array, Any]:
    cfg = self.config
    dt = cfg.compute_dtype
    d, h, hk, dh, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    in_init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
    w_q = self.param("w_q", in_init, (d, h, dh), jnp.float32)
    w_k = self.param("w_k", in_init, (d, hk, dh), jnp.float32)
    w_v = self.param("w_v", in_init, (d, hk, dh), jnp.float32)
    w_o = self.param(
      "w_o", nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2), (h, dh, d), jnp.float32
    )
    w_gate = self.param("w_gate", nn.initializers.lecun_normal(), (d, f), jnp.float32)
    w_up = self.param("w_up", nn.initializers.lecun_normal(), (d, f), jnp.float32)
    w_down = self.param("w_down", nn.initializers.lecun_normal(), (f, d), jnp.float32)

    y_XxD = nn.RMSNorm(epsilon=cfg.norm_eps, dtype=dt, param_dtype=jnp.float32, name="norm")(x_XxD)
    q_XxHxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_q.astype(dt)) * dh**-0.5
    k_XxHkxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_k.astype(dt))
    v_XxHkxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_v.astype(dt))
    q_XxHxDh = _rope(q_XxHxDh, pos_X, cfg.rope_base)
    k_XxHkxDh = _rope(k_XxHkxDh, pos_X, cfg.rope_base)
    o_XxHxDh, kv = attend(q_XxHxDh, k_XxHkxDh, v_XxHkxDh)
    attn_XxD = jnp.einsum("...hk,hkd->...d", o_XxHxDh.astype(dt), w_o.astype(dt))

    gate_XxF = jax.nn.silu(y_XxD @ w_gate.astype(dt))
    mlp_XxD = (gate_XxF * (y_XxD @ w_up.astype(dt))) @ w_down.astype(dt)
    return x_XxD + attn_XxD + mlp_XxD, kv


class Transformer(nn.Module):
  """PaLM-style decoder-only LM with a speculative-decoding KV cache.

  The input embedding (initialised N(0, 1)) is tied with the output layer:
  logits = final_norm(x) @ embedding.T / sqrt(D). Logits are float32.

  Attributes:
    config: the model hyper-parameters.
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embed = nn.Embed(
      cfg.vocab_size,
      cfg.d_model,
      embedding_init=nn.initializers.normal(1.0),
      dtype=cfg.compute_dtype,
      param_dtype=jnp.float32,
    )
    self.blocks = [_Block(cfg, name=f"block_{i}") for i in range(cfg.num_layers)]
    self.final_norm = nn.RMSNorm(
      epsilon=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=jnp.float32
    )

  def _logits(self, x_XxD: jax.Array) -> jax.Array:
    y_XxD = self.final_norm(x_XxD)
    if self.config.output_vocab_size is None:
      logits_XxV = self.embed.attend(y_XxD)
    else:
      embedding_VxD = self.embed.embedding[: self.config.output_vocab_size]
      logits_XxV = y_XxD @ embedding_VxD.astype(y_XxD.dtype).T
    logits_XxV = logits_XxV * self.config.d_model**-0.5
    return logits_XxV.astype(jnp.float32)

  def _causal(self, tokens_BxT: jax.Array) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """The causal forward at positions 0..T-1; returns logits and every layer's (k, v)."""
    b, t = tokens_BxT.shape
    pos_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
    x_BxTxD = self.embed(tokens_BxT)
    kvs = []
    for block in self.blocks:
      x_BxTxD, kv = block(x_BxTxD, pos_BxT, _causal_attention)
      kvs.append(kv)
    return self._logits(x_BxTxD), kvs

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    """The causal forward for training.

    Args:
      tokens_BxT: int token ids at positions 0..T-1.

    Returns:
      logits_BxTxV, float32; position t predicts token t + 1.
    """
    logits_BxTxV, _ = self._causal(tokens_BxT)
    return logits_BxTxV

  def prefill(
    self, tokens_BxT: jax.Array, lengths_B: jax.Array, cache: KVCache
  ) -> tuple[jax.Array, KVCache]:
    """Runs right-padded ragged prompts and stores them as the cache prefix.

    Args:
      tokens_BxT: int prompt ids, row b valid in [0, lengths_B[b]); T <= S.
      lengths_B: int prompt lengths.
      cache: a cache of batch size B (its previous contents are replaced).

    Returns:
      logits_BxTxV (arbitrary at padded positions) and the cache with
      prefix_len = lengths_B and empty tails.
    """
    t = tokens_BxT.shape[1]
    if t > cache.S:
      raise ValueError(f"prompt length {t} exceeds the cache capacity S={cache.S}")
    logits_BxTxV, kvs = self._causal(tokens_BxT)
    k_NxBxTxHkxDh = jnp.stack([k for k, _ in kvs]).astype(cache.prefix_k.dtype)
    v_NxBxTxHkxDh = jnp.stack([v for _, v in kvs]).astype(cache.prefix_v.dtype)
    cache = cache.replace(
      prefix_k=cache.prefix_k.at[:, :, :t].set(k_NxBxTxHkxDh),
      prefix_v=cache.prefix_v.at[:, :, :t].set(v_NxBxTxHkxDh),
      prefix_len=lengths_B.astype(jnp.int32),
      tail_len=jnp.zeros_like(cache.tail_len),
    )
    return logits_BxTxV, cache

  def extend(
    self, tokens_BxKxT: jax.Array, cache: KVCache, num_new_B: jax.Array | None = None
  ) -> tuple[jax.Array, KVCache]:
    """Appends T tokens to each of the K tails of every row.

    Token t of tail (b, k) sits at position prefix_len[b] + tail_len[b, k] + t and
    attends to the row's prefix and to its own tail up to and including itself.
    K = 1, T = 1 is plain decoding; K drafts with T = L + 1 is parallel draft scoring.

    Args:
      tokens_BxKxT: int token ids; row b's first num_new_B[b] tokens are valid.
      cache: the cache; tail_len + T must not exceed R (later entries are dropped).
      num_new_B: int, how many of the T tokens of each row are valid (default T).

    Returns:
      logits_BxKxTxV (arbitrary at padded tokens) and the cache with
      tail_len += num_new_B (padding is written past the new length, never attended).
    """
    b, k, t = tokens_BxKxT.shape
    if (b, k) != (cache.B, cache.K):
      raise ValueError(f"tokens are {b} x {k} rows x tails, the cache {cache.B} x {cache.K}")
    tail_pos_BxKxT = cache.tail_len[:, :, None] + jnp.arange(t)
    pos_BxKxT = cache.prefix_len[:, None, None] + tail_pos_BxKxT
    x_BxKxTxD = self.embed(tokens_BxKxT)
    tails_k, tails_v = [], []
    for n, block in enumerate(self.blocks):

      def attend(q, k_new, v_new, n=n):
        tail_k = _write_tail(cache.tail_k[n], k_new, cache.tail_len)
        tail_v = _write_tail(cache.tail_v[n], v_new, cache.tail_len)
        o = _tail_attention(
          q, cache.prefix_k[n], cache.prefix_v[n], cache.prefix_len, tail_k, tail_v, tail_pos_BxKxT
        )
        return o, (tail_k, tail_v)

      x_BxKxTxD, (tail_k, tail_v) = block(x_BxKxTxD, pos_BxKxT, attend)
      tails_k.append(tail_k)
      tails_v.append(tail_v)
    num_new_B = jnp.full((b,), t, jnp.int32) if num_new_B is None else num_new_B
    cache = cache.replace(
      tail_k=jnp.stack(tails_k),
      tail_v=jnp.stack(tails_v),
      tail_len=cache.tail_len + num_new_B.astype(jnp.int32)[:, None],
    )
    return self._logits(x_BxKxTxD), cache
