"""The decoder LM: PaLM-style by default, or a Llama / Qwen2 / Gemma / Gemma 2 / GPT-2 block.

The config chooses the block (parallel or sequential pre-norm), the norms, positions, MLP,
biases, soft-caps and sliding windows (models/layers.py holds those pieces).

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity, X any leading shape.

The KV cache is an explicit pytree (`KVCache`) passed in and returned, never a mutable
flax collection, so every method is a pure function of (params, inputs, cache).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import attention, layers
from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import ModelConfig


class _Block(nn.Module):
  """One decoder block: PaLM's parallel block or a sequential pre-norm block.

  Parallel: x + attn(norm(x)) + mlp(norm(x)). Sequential: x += attn(norm(x)), then
  x += mlp(mlp_norm(x)), with Gemma 2's post_attn_norm / post_mlp_norm applied to the
  attention and MLP outputs when `post_norms`.
  """

  config: ModelConfig

  @nn.compact
  def __call__(
    self, x_XxD: jax.Array, pos_X: jax.Array, attend: attention.Attend
  ) -> tuple[jax.Array, Any]:
    cfg = self.config
    y_XxD = layers.make_norm(cfg, "norm")(x_XxD)
    attn_XxD, kv = self._self_attention(y_XxD, pos_X, attend)
    if cfg.post_norms:
      attn_XxD = layers.make_norm(cfg, "post_attn_norm")(attn_XxD)
    if cfg.block == "parallel":
      return x_XxD + attn_XxD + self._mlp(y_XxD), kv
    x_XxD = x_XxD + attn_XxD
    mlp_XxD = self._mlp(layers.make_norm(cfg, "mlp_norm")(x_XxD))
    if cfg.post_norms:
      mlp_XxD = layers.make_norm(cfg, "post_mlp_norm")(mlp_XxD)
    return x_XxD + mlp_XxD, kv

  def _weight(self, name: str, shape: tuple[int, ...], in_axis=0, out_axis=-1) -> jax.Array:
    init = nn.initializers.lecun_normal(in_axis=in_axis, out_axis=out_axis)
    return self.param(name, init, shape, jnp.float32).astype(self.config.compute_dtype)

  def _bias(self, name: str, shape: tuple[int, ...]) -> jax.Array:
    bias = self.param(name, nn.initializers.zeros, shape, jnp.float32)
    return bias.astype(self.config.compute_dtype)

  def _self_attention(
    self, y_XxD: jax.Array, pos_X: jax.Array, attend: attention.Attend
  ) -> tuple[jax.Array, Any]:
    cfg = self.config
    d, h, hk, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    w_q = self._weight("w_q", (d, h, dh), 0, (1, 2))
    w_k = self._weight("w_k", (d, hk, dh), 0, (1, 2))
    w_v = self._weight("w_v", (d, hk, dh), 0, (1, 2))
    w_o = self._weight("w_o", (h, dh, d), (0, 1), 2)
    q_XxHxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_q)
    k_XxHkxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_k)
    v_XxHkxDh = jnp.einsum("...d,dhk->...hk", y_XxD, w_v)
    if cfg.qkv_bias:
      q_XxHxDh = q_XxHxDh + self._bias("b_q", (h, dh))
      k_XxHkxDh = k_XxHkxDh + self._bias("b_k", (hk, dh))
      v_XxHkxDh = v_XxHkxDh + self._bias("b_v", (hk, dh))
    q_XxHxDh = q_XxHxDh * (dh**-0.5 if cfg.query_scale is None else cfg.query_scale)
    if cfg.positions == "rope":
      freq_Half = layers.rope_frequencies(cfg)
      q_XxHxDh = layers.rope(q_XxHxDh, pos_X, freq_Half)
      k_XxHkxDh = layers.rope(k_XxHkxDh, pos_X, freq_Half)
    o_XxHxDh, kv = attend(q_XxHxDh, k_XxHkxDh, v_XxHkxDh)
    attn_XxD = jnp.einsum("...hk,hkd->...d", o_XxHxDh.astype(w_o.dtype), w_o)
    if cfg.out_bias:
      attn_XxD = attn_XxD + self._bias("b_o", (d,))
    return attn_XxD, kv

  def _mlp(self, y_XxD: jax.Array) -> jax.Array:
    cfg = self.config
    d, f = cfg.d_model, cfg.mlp_dim
    w_gate = self._weight("w_gate", (d, f)) if cfg.gated_mlp else None
    w_up = self._weight("w_up", (d, f))
    w_down = self._weight("w_down", (f, d))
    up_XxF = y_XxD @ w_up
    if cfg.mlp_bias:
      up_XxF = up_XxF + self._bias("b_up", (f,))
    if cfg.gated_mlp:
      gate_XxF = y_XxD @ w_gate
      if cfg.mlp_bias:
        gate_XxF = gate_XxF + self._bias("b_gate", (f,))
      hidden_XxF = layers.mlp_activation(cfg, gate_XxF) * up_XxF
    else:
      hidden_XxF = layers.mlp_activation(cfg, up_XxF)
    out_XxD = hidden_XxF @ w_down
    if cfg.mlp_bias:
      out_XxD = out_XxD + self._bias("b_down", (d,))
    return out_XxD


class Transformer(nn.Module):
  """Decoder-only LM with a speculative-decoding KV cache.

  The input embedding (initialised N(0, 1); times sqrt(D) if `embed_scale`, plus a
  learned position row if `positions == "learned"`) feeds N blocks; the logits are
  final_norm(x) @ E.T with E the input embedding (tied) or `out_embedding`, divided by
  sqrt(D) if `scale_logits`, soft-capped if `final_softcap`. Logits are float32.

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
    if cfg.positions == "learned":
      self.pos_embed = nn.Embed(
        cfg.num_positions,
        cfg.d_model,
        embedding_init=nn.initializers.normal(0.02),
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
      )
    if not cfg.tied_embedding:
      self.out_embedding = self.param(
        "out_embedding", nn.initializers.normal(1.0), (cfg.vocab_size, cfg.d_model), jnp.float32
      )
    self.blocks = [_Block(cfg, name=f"block_{i}") for i in range(cfg.num_layers)]
    self.final_norm = layers.make_norm(cfg)

  def _embed(self, tokens_XxT: jax.Array, pos_XxT: jax.Array) -> jax.Array:
    cfg = self.config
    x_XxTxD = self.embed(tokens_XxT)
    if cfg.embed_scale:
      x_XxTxD = x_XxTxD * jnp.asarray(cfg.d_model**0.5, cfg.compute_dtype)
    if cfg.positions == "learned":
      # Clamped: jnp.take would fill NaN past the table (padding positions reach it).
      x_XxTxD = x_XxTxD + self.pos_embed(jnp.minimum(pos_XxT, cfg.num_positions - 1))
    return x_XxTxD

  def _logits(self, x_XxD: jax.Array) -> jax.Array:
    cfg = self.config
    y_XxD = self.final_norm(x_XxD)
    if cfg.tied_embedding and cfg.output_vocab_size is None:
      logits_XxV = self.embed.attend(y_XxD)
    else:
      table_VxD = self.embed.embedding if cfg.tied_embedding else self.out_embedding
      logits_XxV = y_XxD @ table_VxD[: cfg.num_logits].astype(y_XxD.dtype).T
    if cfg.scale_logits:
      logits_XxV = logits_XxV * cfg.d_model**-0.5
    return layers.softcap(logits_XxV.astype(jnp.float32), cfg.final_softcap)

  def _causal(self, tokens_BxT: jax.Array) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """The causal forward at positions 0..T-1; returns logits and every layer's (k, v)."""
    b, t = tokens_BxT.shape
    pos_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
    x_BxTxD = self._embed(tokens_BxT, pos_BxT)
    cfg = self.config
    kvs = []
    for n, block in enumerate(self.blocks):
      attend = functools.partial(
        attention.causal, window=cfg.layer_window(n), softcap=cfg.attn_softcap
      )
      x_BxTxD, kv = block(x_BxTxD, pos_BxT, attend)
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
    self,
    tokens_BxKxT: jax.Array,
    cache: KVCache,
    num_new_B: jax.Array | None = None,
    logits_at_B: jax.Array | None = None,
  ) -> tuple[jax.Array, KVCache]:
    """Appends T tokens to each of the K tails of every row.

    Token t of tail (b, k) sits at position prefix_len[b] + tail_len[b, k] + t and
    attends to the row's prefix and to its own tail up to and including itself.
    K = 1, T = 1 is plain decoding; K drafts with T = L + 1 is parallel draft scoring.

    Args:
      tokens_BxKxT: int token ids; row b's first num_new_B[b] tokens are valid.
      cache: the cache; tail_len + T must not exceed R (later entries are dropped).
      num_new_B: int, how many of the T tokens of each row are valid (default T).
      logits_at_B: int in [0, T), or None: only the logits of token logits_at_B[b] of
        each tail are computed (the output layer runs on one position per tail).

    Returns:
      logits_BxKxTxV (arbitrary at padded tokens), or logits_BxKxV with logits_at_B, and
      the cache with tail_len += num_new_B (padding is written past the new length,
      never attended).
    """
    b, k, t = tokens_BxKxT.shape
    if (b, k) != (cache.B, cache.K):
      raise ValueError(f"tokens are {b} x {k} rows x tails, the cache {cache.B} x {cache.K}")
    tail_pos_BxKxT = cache.tail_len[:, :, None] + jnp.arange(t)
    pos_BxKxT = cache.prefix_len[:, None, None] + tail_pos_BxKxT
    x_BxKxTxD = self._embed(tokens_BxKxT, pos_BxKxT)
    cfg = self.config
    # Each layer's new entries go straight into the stacked tails (updated in place
    # under jit; each layer reads its slice from the running array, never a stale one).
    tail_k_all, tail_v_all = cache.tail_k, cache.tail_v
    for n, block in enumerate(self.blocks):

      def attend(q, k_new, v_new, n=n, old_k=tail_k_all[n], old_v=tail_v_all[n]):
        tail_k = attention.write_tail(old_k, k_new, cache.tail_len)
        tail_v = attention.write_tail(old_v, v_new, cache.tail_len)
        o = attention.tails(
          q,
          cache.prefix_k[n],
          cache.prefix_v[n],
          cache.prefix_len,
          tail_k,
          tail_v,
          tail_pos_BxKxT,
          window=cfg.layer_window(n),
          softcap=cfg.attn_softcap,
        )
        return o, (tail_k, tail_v)

      x_BxKxTxD, (tail_k, tail_v) = block(x_BxKxTxD, pos_BxKxT, attend)
      tail_k_all = tail_k_all.at[n].set(tail_k)
      tail_v_all = tail_v_all.at[n].set(tail_v)
    num_new_B = jnp.full((b,), t, jnp.int32) if num_new_B is None else num_new_B
    cache = cache.replace(
      tail_k=tail_k_all,
      tail_v=tail_v_all,
      tail_len=cache.tail_len + num_new_B.astype(jnp.int32)[:, None],
    )
    if logits_at_B is not None:
      at_BxKx1x1 = jnp.broadcast_to(logits_at_B[:, None, None, None], (b, k, 1, 1))
      x_BxKxD = jnp.take_along_axis(x_BxKxTxD, at_BxKx1x1, axis=2)[:, :, 0]
      return self._logits(x_BxKxD), cache
    return self._logits(x_BxKxTxD), cache
