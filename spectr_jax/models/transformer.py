"""The decoder LM shared by every family: embedding, N blocks, final norm, logits.

The family of the config (`spectr_jax.models.families`) gives the pieces: its token
embedding, an optional additive position embedding, its block (models/layers.py holds
the shared attention and MLP), its final norm and its logits transform; the output layer
(the tied embedding or `out_embedding`, restricted to output_vocab_size) is common.

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity, X any leading shape; in
`extend_tree` N is the number of tree nodes (the layers are the cache's leading axis).

The KV cache is an explicit pytree (`KVCache`) passed in and returned, never a mutable
flax collection, so every method is a pure function of (params, inputs, cache).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import attention, layers
from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import family_of


class Transformer(nn.Module):
  """Decoder-only LM with a speculative-decoding KV cache.

  The family's token embedding (PaLM, Llama, GPT-2: N(0, 1) rows; Gemma: times sqrt(D)),
  plus its position embedding (GPT-2's learned rows), feeds N of the family's blocks;
  the logits are final_norm(x) @ E.T with E the input embedding (tied) or
  `out_embedding`, through the family's transform (PaLM: / sqrt(D); Gemma 2: soft-cap).
  Logits are float32.

  Attributes:
    config: the model hyper-parameters.
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    family = family_of(cfg)
    self.embed = family.embedding(cfg)
    self.pos_embed = family.position_embedding(cfg)
    if not cfg.tied_embedding:
      init = layers.logical(nn.initializers.normal(1.0), "vocab", "embed")
      self.out_embedding = self.param(
        "out_embedding", init, (cfg.vocab_size, cfg.d_model), jnp.float32
      )
    self.blocks = [family.block(cfg, layer=i, name=f"block_{i}") for i in range(cfg.num_layers)]
    self.final_norm = family.norm(cfg)

  def _embed(self, tokens_XxT: jax.Array, pos_XxT: jax.Array) -> jax.Array:
    x_XxTxD = self.embed(tokens_XxT)
    if self.pos_embed is not None:
      x_XxTxD = x_XxTxD + self.pos_embed(pos_XxT)
    return x_XxTxD

  def _logits(self, x_XxD: jax.Array) -> jax.Array:
    cfg = self.config
    y_XxD = self.final_norm(x_XxD)
    if cfg.tied_embedding and cfg.output_vocab_size is None:
      logits_XxV = self.embed.attend(y_XxD)
    else:
      table_VxD = self.embed.embedding if cfg.tied_embedding else self.out_embedding
      logits_XxV = y_XxD @ table_VxD[: cfg.num_logits].astype(y_XxD.dtype).T
    return family_of(cfg).finish_logits(cfg, logits_XxV)

  def _causal(self, tokens_BxT: jax.Array) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """The causal forward at positions 0..T-1; returns logits and every layer's (k, v)."""
    b, t = tokens_BxT.shape
    pos_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
    x_BxTxD = self._embed(tokens_BxT, pos_BxT)
    kvs = []
    for block in self.blocks:
      x_BxTxD, kv = block(x_BxTxD, pos_BxT, attention.causal)
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
    k_YxBxTxHkxDh = jnp.stack([k for k, _ in kvs]).astype(cache.prefix_k.dtype)
    v_YxBxTxHkxDh = jnp.stack([v for _, v in kvs]).astype(cache.prefix_v.dtype)
    cache = cache.replace(
      prefix_k=cache.prefix_k.at[:, :, :t].set(k_YxBxTxHkxDh),
      prefix_v=cache.prefix_v.at[:, :, :t].set(v_YxBxTxHkxDh),
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
    # Each layer's new entries go straight into the stacked tails (updated in place
    # under jit; each layer reads its slice from the running array, never a stale one).
    tail_k_all, tail_v_all = cache.tail_k, cache.tail_v
    for n, block in enumerate(self.blocks):

      def attend(q, k_new, v_new, *, window, softcap, n=n, old_k=tail_k_all[n],
                 old_v=tail_v_all[n]):  # fmt: skip
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
          window=window,
          softcap=softcap,
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

  def extend_tree(
    self,
    tokens_BxN: jax.Array,
    depth_BxN: jax.Array,
    visible_BxNxN: jax.Array,
    cache: KVCache,
  ) -> tuple[jax.Array, KVCache]:
    """Scores a token tree of N nodes per row in one call (docs/CACHE.md, "Token trees").

    Node i of row b sits at position prefix_len[b] + depth_BxN[b, i] and attends to the
    row's prefix and to the nodes visible_BxNxN[b, i] marks (its ancestors and itself):
    its logits are those of the causal forward of the prefix followed by the path from
    its root to it. The node region is tail 0 of the cache: node i's keys and values go
    to slot i of tail 0; slots N..R-1 and the other tails are not touched, and no length
    moves (`commit_nodes` appends a path to the prefix).

    Args:
      tokens_BxN: int token ids of the nodes; any order (a parent may follow its child).
      depth_BxN: int, each node's depth: 0 for a child of the prefix (the first token
        after it), its parent's depth + 1 otherwise.
      visible_BxNxN: bool, node i sees node j; must hold the diagonal and, for the
        causal forward of each path, exactly the ancestors (`attention.ancestor_mask`).
        Padding nodes are ones no real node sees.
      cache: the cache; its tails hold R >= N slots (one tail suffices).

    Returns:
      logits_BxNxV (arbitrary at padding nodes) and the cache with the nodes' keys and
      values in slots [0, N) of tail 0.
    """
    b, n = tokens_BxN.shape
    if b != cache.B:
      raise ValueError(f"tokens are {b} rows, the cache {cache.B}")
    if n > cache.R:
      raise ValueError(f"a tree of {n} nodes does not fit the cache's R={cache.R} tail slots")
    if visible_BxNxN.shape != (b, n, n):
      raise ValueError(f"visible_BxNxN is {visible_BxNxN.shape}, expected {(b, n, n)}")
    pos_BxN = cache.prefix_len[:, None] + depth_BxN.astype(jnp.int32)
    # Slots past the tree are never visible (and their positions never read).
    visible_BxNxR = jnp.pad(visible_BxNxN.astype(bool), ((0, 0), (0, 0), (0, cache.R - n)))
    node_pos_BxR = jnp.pad(pos_BxN, ((0, 0), (0, cache.R - n)))
    x_BxNxD = self._embed(tokens_BxN, pos_BxN)
    # Each layer's nodes go straight into tail 0 of the stacked tails (as in `extend`).
    tail_k_all, tail_v_all = cache.tail_k, cache.tail_v
    for layer, block in enumerate(self.blocks):

      def attend(q, k_new, v_new, *, window, softcap, layer=layer,
                 old_k=tail_k_all[layer, :, 0], old_v=tail_v_all[layer, :, 0]):  # fmt: skip
        node_k = old_k.at[:, :n].set(k_new.astype(old_k.dtype))
        node_v = old_v.at[:, :n].set(v_new.astype(old_v.dtype))
        o = attention.tree(
          q,
          cache.prefix_k[layer],
          cache.prefix_v[layer],
          cache.prefix_len,
          node_k,
          node_v,
          visible_BxNxR,
          pos_BxN,
          node_pos_BxR,
          window=window,
          softcap=softcap,
        )
        return o, (node_k, node_v)

      x_BxNxD, (node_k, node_v) = block(x_BxNxD, pos_BxN, attend)
      tail_k_all = tail_k_all.at[layer, :, 0].set(node_k)
      tail_v_all = tail_v_all.at[layer, :, 0].set(node_v)
    cache = cache.replace(tail_k=tail_k_all, tail_v=tail_v_all)
    return self._logits(x_BxNxD), cache
