"""The decoder LM shared by every family: embedding, a stack of Y blocks, final norm, logits.

The family of the config (`spectr_jax.models.families`) gives the pieces: its token
embedding, an optional additive position embedding, its block (models/layers.py holds
the shared attention and MLP), its final norm and its logits transform; the output layer
(the tied embedding or `out_embedding`, restricted to output_vocab_size) is common.

The layers are one stack. Scanned (`scan_layers=True`: one compiled layer, whatever the
depth), every block parameter carries a leading "layers" axis of Y (params["layers"]) and
the stack runs under `lax.scan`; unrolled, each layer's parameters are their own entry
("layers_<i>", `layout.split_layers`), so no layer slices a stacked weight (a copy per call
on CPU and GPU). Training and checkpoints hold the stacked layout. Each layer reads its
slice of the cache; its new keys and values leave the stack stacked, and the call writes
them to the cache once (`attention.write_tail`), not once per layer.

Letters beyond the package legend: Hk key/value heads, G = H // Hk query heads per
key/value head, Dh head width, F MLP width, R tail capacity, X any leading shape; in
`extend_tree` N is the number of tree nodes.

The KV cache is an explicit pytree (`KVCache`) passed in and returned, never a mutable
flax collection, so every method is a pure function of (params, inputs, cache).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from spectr_jax.models import attention, layers
from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import family_of


class _Layer(nn.Module):
  """One layer of the stack: the family's block (sharing this module's scope, so its
  parameters sit directly under "layers"), called with the layer's slice of the cache
  (`view`) and the mode's attention (`spectr_jax.models.attention`)."""

  config: ModelConfig

  def setup(self):
    self.block = family_of(self.config).block(self.config)
    nn.share_scope(self, self.block)

  def __call__(self, x_XxD: jax.Array, layer_and_view, mode):
    layer, view = layer_and_view
    return self.block(x_XxD, mode.pos, functools.partial(mode, view, layer=layer))


class Transformer(nn.Module):
  """Decoder-only LM with a speculative-decoding KV cache.

  The family's token embedding (PaLM, Llama, GPT-2: N(0, 1) rows; Gemma: times sqrt(D)),
  plus its position embedding (GPT-2's learned rows), feeds a stack of Y of the family's
  blocks; the logits are final_norm(x) @ E.T with E the input embedding (tied) or
  `out_embedding`, through the family's transform (PaLM: / sqrt(D); Gemma 2: soft-cap).
  Logits are float32.

  Attributes:
    config: the model hyper-parameters.
    scan_layers: run the stack under `lax.scan` (one compiled layer, parameters stacked)
      rather than unrolled (parameters split per layer: `layout.split_layers`).
  """

  config: ModelConfig
  scan_layers: bool = True

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
    if self.scan_layers:
      stack = nn.scan(
        _Layer,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast),
        length=cfg.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      self.layers = stack(cfg)
    else:  # a list attribute: its modules are named layers_0, layers_1, ...
      self.layers = [_Layer(cfg) for _ in range(cfg.num_layers)]
    self.final_norm = family.norm(cfg)

  def _embed(self, tokens_XxT: jax.Array, pos_XxT: jax.Array, features_XxTxD=None) -> jax.Array:
    """The stack's input: the tokens' embeddings (input features are a draft head's:
    `spectr_jax.models.head`)."""
    if features_XxTxD is not None:
      raise ValueError("a transformer reads tokens only: input features are a head's")
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

  def _stack(self, x_XxD: jax.Array, mode, view=None):
    """The Y layers on x in `mode`; `view` holds each layer's slice of the cache (leading
    axis Y). Returns x and every layer's new (k, v), stacked along a leading Y."""
    if self.scan_layers:
      return self.layers(x_XxD, (jnp.arange(self.config.num_layers), view), mode)
    new_kv = []
    for i, layer in enumerate(self.layers):
      x_XxD, kv = layer(x_XxD, (i, jax.tree.map(lambda a, i=i: a[i], view)), mode)
      new_kv.append(kv)
    if new_kv[0] is None:  # the training forward keeps no keys and values
      return x_XxD, new_kv[0]
    return x_XxD, jax.tree.map(lambda *xs: jnp.stack(xs), *new_kv)

  def _causal(self, tokens_BxT: jax.Array, keep_kv: bool, features_BxTxD=None):
    """The causal forward at positions 0..T-1: the last layer's output x_BxTxD (the
    features a draft head reads) and (with keep_kv) every layer's (k_YxBxTxHkxDh,
    v_YxBxTxHkxDh)."""
    b, t = tokens_BxT.shape
    pos_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
    x_BxTxD = self._embed(tokens_BxT, pos_BxT, features_BxTxD)
    return self._stack(x_BxTxD, attention.Causal(pos_BxT, keep_kv))

  def __call__(self, tokens_BxT: jax.Array, features_BxTxD=None, return_features=False):
    """The causal forward for training.

    Args:
      tokens_BxT: int token ids at positions 0..T-1.
      features_BxTxD: a draft head's input features (`spectr_jax.models.head`).
      return_features: also return the last layer's output x_BxTxD (static).

    Returns:
      logits_BxTxV, float32 (position t predicts token t + 1); with return_features,
      (logits_BxTxV, x_BxTxD).
    """
    x_BxTxD, _ = self._causal(tokens_BxT, False, features_BxTxD)
    return (self._logits(x_BxTxD), x_BxTxD) if return_features else self._logits(x_BxTxD)

  def prefill(
    self,
    tokens_BxT: jax.Array,
    lengths_B: jax.Array,
    cache: KVCache,
    features_BxTxD=None,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    """Runs right-padded ragged prompts and stores them as the cache prefix.

    Args:
      tokens_BxT: int prompt ids, row b valid in [0, lengths_B[b]); T <= S.
      lengths_B: int prompt lengths.
      cache: a cache of batch size B (its previous contents are replaced).

    Returns:
      logits_BxTxV (arbitrary at padded positions) and the cache with
      prefix_len = lengths_B and empty tails; with return_features (static) the last
      layer's output x_BxTxD between them. (features_BxTxD: a head's input features.)
    """
    t = tokens_BxT.shape[1]
    if t > cache.S:
      raise ValueError(f"prompt length {t} exceeds the cache capacity S={cache.S}")
    x_BxTxD, (k_YxBxTxHkxDh, v_YxBxTxHkxDh) = self._causal(tokens_BxT, True, features_BxTxD)
    cache = cache.replace(
      prefix_k=cache.prefix_k.at[:, :, :t].set(k_YxBxTxHkxDh.astype(cache.prefix_k.dtype)),
      prefix_v=cache.prefix_v.at[:, :, :t].set(v_YxBxTxHkxDh.astype(cache.prefix_v.dtype)),
      prefix_len=lengths_B.astype(jnp.int32),
      tail_len=jnp.zeros_like(cache.tail_len),
    )
    if return_features:
      return self._logits(x_BxTxD), x_BxTxD, cache
    return self._logits(x_BxTxD), cache

  def extend(
    self,
    tokens_BxKxT: jax.Array,
    cache: KVCache,
    num_new_B: jax.Array | None = None,
    logits_at_B: jax.Array | None = None,
    tails_empty: bool = False,
    features_BxKxTxD=None,
    return_features: bool = False,
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
      tails_empty: every tail is empty before this call (static; the caller knows it,
        e.g. right after a commit): the tails' earlier entries are not attended to.

    Returns:
      logits_BxKxTxV (arbitrary at padded tokens), or logits_BxKxV with logits_at_B, and
      the cache with tail_len += num_new_B (padding is written past the new length,
      never attended); with return_features (static) the last layer's output at the same
      positions between them. (features_BxKxTxD: a head's input features.)
    """
    b, k, t = tokens_BxKxT.shape
    if (b, k) != (cache.B, cache.K):
      raise ValueError(f"tokens are {b} x {k} rows x tails, the cache {cache.B} x {cache.K}")
    pos_BxKxT = cache.prefix_len[:, None, None] + cache.tail_len[:, :, None] + jnp.arange(t)
    x_BxKxTxD = self._embed(tokens_BxKxT, pos_BxKxT, features_BxKxTxD)
    mode = attention.Tails(cache.prefix_len, cache.tail_len, pos_BxKxT, not tails_empty)
    view = (cache.prefix_k, cache.prefix_v, cache.tail_k, cache.tail_v)
    x_BxKxTxD, (k_YxBxKxTxHkxDh, v_YxBxKxTxHkxDh) = self._stack(x_BxKxTxD, mode, view)
    num_new_B = jnp.full((b,), t, jnp.int32) if num_new_B is None else num_new_B
    cache = cache.replace(
      tail_k=attention.write_tail(cache.tail_k, k_YxBxKxTxHkxDh, cache.tail_len),
      tail_v=attention.write_tail(cache.tail_v, v_YxBxKxTxHkxDh, cache.tail_len),
      tail_len=cache.tail_len + num_new_B.astype(jnp.int32)[:, None],
    )
    if logits_at_B is not None:
      at_BxKx1x1 = jnp.broadcast_to(logits_at_B[:, None, None, None], (b, k, 1, 1))
      x_BxKxTxD = jnp.take_along_axis(x_BxKxTxD, at_BxKx1x1, axis=2)[:, :, 0]
    if return_features:
      return self._logits(x_BxKxTxD), x_BxKxTxD, cache
    return self._logits(x_BxKxTxD), cache

  def extend_tree(
    self,
    tokens_BxN: jax.Array,
    depth_BxN: jax.Array,
    visible_BxNxN: jax.Array,
    cache: KVCache,
    return_features: bool = False,
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
      values in slots [0, N) of tail 0; with return_features (static) the last layer's
      output x_BxNxD between them.
    """
    b, n = tokens_BxN.shape
    if b != cache.B:
      raise ValueError(f"tokens are {b} rows, the cache {cache.B}")
    if n > cache.R:
      raise ValueError(f"a tree of {n} nodes does not fit the cache's R={cache.R} tail slots")
    if visible_BxNxN.shape != (b, n, n):
      raise ValueError(f"visible_BxNxN is {visible_BxNxN.shape}, expected {(b, n, n)}")
    pos_BxN = cache.prefix_len[:, None] + depth_BxN.astype(jnp.int32)
    x_BxNxD = self._embed(tokens_BxN, pos_BxN)
    mode = attention.Tree(cache.prefix_len, visible_BxNxN.astype(bool), pos_BxN)
    x_BxNxD, (k_YxBxNxHkxDh, v_YxBxNxHkxDh) = self._stack(
      x_BxNxD, mode, (cache.prefix_k, cache.prefix_v)
    )
    cache = cache.replace(
      tail_k=cache.tail_k.at[:, :, 0, :n].set(k_YxBxNxHkxDh.astype(cache.tail_k.dtype)),
      tail_v=cache.tail_v.at[:, :, 0, :n].set(v_YxBxNxHkxDh.astype(cache.tail_v.dtype)),
    )
    if return_features:
      return self._logits(x_BxNxD), x_BxNxD, cache
    return self._logits(x_BxNxD), cache
