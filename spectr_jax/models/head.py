"""A draft head that reads the target's features (EAGLE-style: Li et al., arXiv 2401.15077).

A head is a Transformer of the target's family and width with its own few blocks. Its
input at position i is fc([f_{i-1}; e(x_i)]): f_{i-1} the target's last-layer output
after token x_{i-1}, e the target's embedding. Its logits come through the target's
output layer. Embedding and output layer are the target's own arrays (`share_target`),
so a head's tokens and logits live in the target's space, and it adds only fc and its
blocks. While drafting, the feature after a drafted token is the head's own output there.

The round hands the head the target's features of the tokens it has not seen
(`HeadDecoder.receive`, after every commit; the prompt's features at prefill). Exactness
never depends on this wiring: the verifiers read the p the drafts were drawn from.

Usage:
  head = decoder(HeadConfig.of(target_config, num_layers=1))
  params = share_target(head.init_params(key), target_params)
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.core import meta

from spectr_jax.models import cache as cache_lib
from spectr_jax.models import layers, layout
from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import HeadConfig
from spectr_jax.models.transformer import Transformer

__all__ = ["Head", "HeadCache", "HeadConfig", "HeadDecoder", "SHARED", "share_target"]

# The target's parameters a head reads rather than holds.
SHARED = ("embed", "out_embedding")


@struct.dataclass
class HeadCache(KVCache):
  """A head's KV cache and the features it reads next.

  pending_features: B x 2 x D, the target's features before each pending token.
  tail_features: B x K x D, the head's own output after each tail's last token.
  """

  pending_features: jax.Array
  tail_features: jax.Array


class Head(Transformer):
  """The head's module: the Transformer's, its input fc([f; e(x)]) (`_embed`)."""

  def setup(self):
    super().setup()
    d = self.config.d_model
    init = layers.logical(nn.initializers.lecun_normal(), "features", "embed")
    self.fc = self.param("fc", init, (2 * d, d), jnp.float32)

  def _embed(self, tokens_XxT, pos_XxT, features_XxTxD=None):
    if features_XxTxD is None:
      raise ValueError("a head reads the target's features with its tokens")
    x_XxTxD = super()._embed(tokens_XxT, pos_XxT)
    joined_XxTx2D = jnp.concatenate([features_XxTxD.astype(x_XxTxD.dtype), x_XxTxD], -1)
    return joined_XxTx2D @ self.fc.astype(x_XxTxD.dtype)


def share_target(head_params: Any, target_params: Any) -> Any:
  """The head's parameters reading the target's embedding and output layer (`SHARED`)."""
  return {**head_params, **{k: target_params[k] for k in SHARED if k in target_params}}


def _previous(features_BxTxD: jax.Array) -> jax.Array:
  """Each position's predecessor's features (zeros before the first)."""
  return jnp.pad(features_BxTxD, ((0, 0), (1, 0), (0, 0)))[:, :-1]


@dataclasses.dataclass(frozen=True)
class HeadDecoder:
  """The `Decoder` of a head (`HeadConfig`): a drafting model only (it scores no trees).

  Attributes:
    config: the head's `HeadConfig`.
  """

  config: HeadConfig
  reads_features = True
  cache_class = HeadCache

  @property
  def num_logits(self) -> int:
    return self.config.num_logits

  @property
  def module(self) -> Head:
    """The flax module of the stacked layout: `apply({"params": params}, tokens_BxT,
    features_BxTxD)` reads each position's predecessor's features (`logits` shifts)."""
    return Head(self.config)

  def _apply(self, params, *args, method=None):
    module = Head(self.config, not layout.is_split(params))
    return module.apply({"params": params}, *args, method=method)

  def _boxed_init(self, key):
    dummy = jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1, self.config.d_model), jnp.float32)
    return Head(self.config).init(key, *dummy)["params"]

  def init_params(self, key: jax.Array) -> Any:
    """Fresh parameters of the head's module (float32), its own embedding and output
    layer included: `share_target` replaces them by the target's."""
    return meta.unbox(jax.jit(self._boxed_init)(key))

  def param_axes(self, params: Any = None) -> Any:
    axes = jax.tree.map(
      lambda leaf: leaf.names,
      jax.eval_shape(self._boxed_init, jax.random.key(0)),
      is_leaf=lambda x: isinstance(x, layers.Logical),
    )
    if params is not None and layout.is_split(params):
      axes = layout.split_layers(axes, self.config)
    return axes

  def init_cache(self, batch_size: int, num_tails: int, tail_capacity: int,
                 cache_len: int | None = None) -> HeadCache:  # fmt: skip
    config = (
      self.config if cache_len is None else dataclasses.replace(self.config, max_len=cache_len)
    )
    kv = cache_lib.init_cache(config, batch_size, num_tails, tail_capacity)
    d = self.config.d_model
    return HeadCache(
      **{f.name: getattr(kv, f.name) for f in dataclasses.fields(KVCache)},
      pending_features=jnp.zeros((batch_size, 2, d), jnp.float32),
      tail_features=jnp.zeros((batch_size, num_tails, d), jnp.float32),
    )

  def prefill(self, params, tokens_BxP, lengths_B, cache: HeadCache, features_BxPxD=None,
              return_features: bool = False):  # fmt: skip
    """The prompts with the target's features of the same positions; the token after
    the prefix (pending) reads the feature at lengths_B - 1 (zeros for an empty prefix)."""
    if features_BxPxD is None:
      raise ValueError("a head's prefill reads the target's features of the prompt")
    logits, x, cache = self._apply(
      params, tokens_BxP, lengths_B, cache, _previous(features_BxPxD), True,
      method=Head.prefill,
    )  # fmt: skip
    at_B = jnp.maximum(lengths_B - 1, 0)
    last_BxD = jnp.take_along_axis(features_BxPxD, at_B[:, None, None], 1)[:, 0]
    last_BxD = jnp.where((lengths_B > 0)[:, None], last_BxD, 0.0)
    pending = jnp.stack([last_BxD, jnp.zeros_like(last_BxD)], 1).astype(jnp.float32)
    cache = cache.replace(pending_features=pending)
    return (logits, x, cache) if return_features else (logits, cache)

  def extend(self, params, tokens_BxKxT, cache: HeadCache, num_new_B=None, logits_at_B=None,
             tails_empty: bool = False, return_features: bool = False):  # fmt: skip
    """`Decoder.extend`: the opening call of a round (tails_empty, T <= 2 pending tokens)
    reads the target's features (`receive`); later calls (T = 1) the head's own output
    after each tail's last token."""
    b, k, t = tokens_BxKxT.shape
    if logits_at_B is None and t != 1:
      raise ValueError("a head returns the logits of one position per tail: give logits_at_B")
    if tails_empty:
      if t > 2:
        raise ValueError(f"a head's opening call takes the 1 or 2 pending tokens, got T = {t}")
      pending_Bx1xTxD = cache.pending_features[:, None, :t]
      f_BxKxTxD = jnp.broadcast_to(pending_Bx1xTxD, (b, k) + pending_Bx1xTxD.shape[2:])
    else:
      if t != 1:
        raise ValueError(f"a head drafts one token per call after the opening, got T = {t}")
      f_BxKxTxD = cache.tail_features[:, :, None]
    at_B = jnp.full((b,), t - 1, jnp.int32) if logits_at_B is None else logits_at_B
    logits_BxKxV, x_BxKxD, cache = self._apply(
      params, tokens_BxKxT, cache, num_new_B, at_B, tails_empty, f_BxKxTxD, True,
      method=Head.extend,
    )  # fmt: skip
    cache = cache.replace(tail_features=x_BxKxD.astype(jnp.float32))
    if logits_at_B is None:  # the caller asked for every position: T = 1 here
      logits_BxKxV, x_BxKxD = logits_BxKxV[:, :, None], x_BxKxD[:, :, None]
    return (logits_BxKxV, x_BxKxD, cache) if return_features else (logits_BxKxV, cache)

  def take_tails(self, cache: HeadCache, tails_BxW) -> HeadCache:
    cache = cache_lib.take_tails(cache, tails_BxW)
    index_BxWx1 = tails_BxW.astype(jnp.int32)[..., None]
    return cache.replace(
      tail_features=jnp.take_along_axis(cache.tail_features, index_BxWx1, axis=1)
    )

  def commit(self, cache: HeadCache, tail_B, num_B) -> HeadCache:
    return cache_lib.commit(cache, tail_B, num_B)

  def receive(self, cache: HeadCache, features_Bx2xD) -> HeadCache:
    return cache.replace(pending_features=features_Bx2xD.astype(jnp.float32))

  def extend_tree(self, *args, **kwargs):
    raise NotImplementedError("a head drafts: it scores no token trees")

  def commit_nodes(self, *args, **kwargs):
    raise NotImplementedError("a head drafts: it commits no token trees")

  def logits(self, params, tokens_BxT, features_BxTxD=None, return_features: bool = False):
    """The causal forward of whole sequences with the target's features of the same
    positions (each token reads its predecessor's): logits_BxTxV, float32."""
    if features_BxTxD is None:
      raise ValueError("a head's forward reads the target's features")
    return self._apply(params, tokens_BxT, _previous(features_BxTxD), return_features)
