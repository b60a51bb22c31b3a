"""The decoder protocol: what the engine's round, training and analysis call of a model.

A `Decoder` is static (hashable, no arrays: it lives in the engine's static `plan.DecodePlan`
and crosses jit as a static argument); parameters and caches are passed in and returned.
`decoder(config)` gives the decoder of a config, whatever its family: the round never
names a model class. `extend` and `take_tails` are the drafting seam's calls
(`spectr_jax.drafting`); `extend_tree` and `commit_nodes` score and keep a token tree
(docs/CACHE.md, "Token trees"; there N is the number of tree nodes).
"""

import dataclasses
import functools
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax.core import meta

from spectr_jax.models import cache as cache_lib
from spectr_jax.models import layers, layout
from spectr_jax.models.cache import KVCache
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.families import family_of
from spectr_jax.models.head import HeadConfig, HeadDecoder
from spectr_jax.models.transformer import Transformer


@runtime_checkable
class Decoder(Protocol):
  """A decoder LM with the speculative-decoding cache of docs/CACHE.md.

  Every call that runs the model takes `return_features` (static): it then also returns
  the last layer's output at the same positions, x_...xD (what a draft head reads:
  `spectr_jax.models.head`), between the logits and the cache.

  Attributes:
    config: the model hyper-parameters.
    reads_features: the model drafts from a target's features (a head): the round hands
      it the target's features of the tokens it has not seen (`receive`).
    cache_class: the type of its cache (`KVCache`, or a subclass with more fields).
  """

  config: ModelConfig
  reads_features: bool
  cache_class: type

  @property
  def num_logits(self) -> int:
    """V, the last dimension of the logits."""

  def init_params(self, key: jax.Array) -> Any:
    """Fresh parameters (plain arrays, float32)."""

  def param_axes(self, params: Any = None) -> Any:
    """The logical axis names of every parameter: a pytree like the parameters (laid out
    like `params` where given) whose leaves are tuples of names (`spectr_jax.sharding`
    maps them to mesh axes)."""

  def init_cache(
    self, batch_size: int, num_tails: int, tail_capacity: int, cache_len: int | None = None
  ) -> KVCache:
    """An empty cache of B rows, K tails of R slots and a prefix of S = cache_len
    (default config.max_len) slots."""

  def prefill(
    self,
    params: Any,
    tokens_BxP: jax.Array,
    lengths_B: jax.Array,
    cache: KVCache,
    features_BxPxD: jax.Array | None = None,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    """Stores right-padded prompts as the cache prefix: (logits_BxPxV, cache). A head
    reads the target's features of the prompt (features_BxPxD); other models none."""

  def extend(
    self,
    params: Any,
    tokens_BxKxT: jax.Array,
    cache: KVCache,
    num_new_B: jax.Array | None = None,
    logits_at_B: jax.Array | None = None,
    tails_empty: bool = False,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    """Appends T tokens to each of the K tails: (logits_BxKxTxV, or logits_BxKxV at
    logits_at_B, and the cache). With tails_empty (static) the caller knows every tail
    is empty before the call, and their earlier entries are not read."""

  def commit(self, cache: KVCache, tail_B: jax.Array, num_B: jax.Array) -> KVCache:
    """Appends the first num_B[b] entries of tail tail_B[b] to each row's prefix."""

  def take_tails(self, cache: KVCache, tails_BxW: jax.Array) -> KVCache:
    """The cache whose tail j of row b is tail tails_BxW[b, j] (W tails, prefix shared):
    the drafting seam computes each distinct draft prefix once with it (`extend` on the
    distinct tails, then their entries spread back to the tails that share them)."""

  def receive(self, cache: KVCache, features_Bx2xD: jax.Array) -> KVCache:
    """Hands a head the target's features of its 1 or 2 pending tokens (each token's
    predecessor's); a model that reads no features returns the cache as it is."""

  def extend_tree(
    self,
    params: Any,
    tokens_BxN: jax.Array,
    depth_BxN: jax.Array,
    visible_BxNxN: jax.Array,
    cache: KVCache,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    """Scores a token tree of N nodes per row in one call: (logits_BxNxV, cache).

    Node i sits at position prefix_len + depth_BxN[:, i] and attends to the prefix and
    to the nodes visible_BxNxN[:, i] marks (itself and its ancestors:
    `models.ancestor_mask(parent_BxN)`), so its logits are those of the causal forward
    of the prefix plus its root-to-node path; its keys and values go to slot i of tail 0
    (the cache needs R >= N tail slots; no length moves)."""

  def commit_nodes(self, cache: KVCache, slots_BxW: jax.Array, num_B: jax.Array) -> KVCache:
    """Appends node slots slots_BxW[b, :num_B[b]] of tail 0 (a root-to-node path after
    `extend_tree`, in depth order) to each row's prefix; empties the tails."""

  def logits(self, params: Any, tokens_BxT: jax.Array) -> jax.Array:
    """The causal forward of whole sequences: logits_BxTxV, float32."""


@dataclasses.dataclass(frozen=True)
class TransformerDecoder:
  """The `Decoder` of every family built on the shared `Transformer`.

  Its methods run whichever parameter layout they are given: layers stacked (under
  `lax.scan`) or split per layer (unrolled: `layout.split_layers`); `init_params` makes
  them stacked (training's and the checkpoints' layout).

  Attributes:
    config: the model hyper-parameters.
  """

  config: ModelConfig
  reads_features = False
  cache_class = KVCache

  @property
  def module(self) -> Transformer:
    """The flax module of the stacked layout (its `apply({"params": params},
    tokens_BxT)` is `logits`)."""
    return Transformer(self.config)

  def _apply(self, params: Any, *args, method=None):
    """The module that runs `params` (scanned where the layers are stacked, unrolled where
    they are split), applied."""
    module = Transformer(self.config, not layout.is_split(params))
    return module.apply({"params": params}, *args, method=method)

  @property
  def num_logits(self) -> int:
    return self.config.num_logits

  def init_params(self, key: jax.Array) -> Any:
    return _init(self.config, key)

  def param_axes(self, params: Any = None) -> Any:
    """The parameters' logical axes, laid out like `params` where given (else stacked)."""
    axes = _param_axes(self.config)
    if params is not None and layout.is_split(params):
      axes = layout.split_layers(axes, self.config)
    return axes

  def init_cache(
    self, batch_size: int, num_tails: int, tail_capacity: int, cache_len: int | None = None
  ) -> KVCache:
    config = self.config
    if cache_len is not None:
      config = dataclasses.replace(config, max_len=cache_len)
    return cache_lib.init_cache(config, batch_size, num_tails, tail_capacity)

  def prefill(
    self,
    params: Any,
    tokens_BxP: jax.Array,
    lengths_B: jax.Array,
    cache: KVCache,
    features_BxPxD: jax.Array | None = None,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    return self._apply(
      params, tokens_BxP, lengths_B, cache, features_BxPxD, return_features,
      method=Transformer.prefill,
    )  # fmt: skip

  def extend(
    self,
    params: Any,
    tokens_BxKxT: jax.Array,
    cache: KVCache,
    num_new_B: jax.Array | None = None,
    logits_at_B: jax.Array | None = None,
    tails_empty: bool = False,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    return self._apply(
      params, tokens_BxKxT, cache, num_new_B, logits_at_B, tails_empty, None, return_features,
      method=Transformer.extend,
    )  # fmt: skip

  def commit(self, cache: KVCache, tail_B: jax.Array, num_B: jax.Array) -> KVCache:
    return cache_lib.commit(cache, tail_B, num_B)

  def take_tails(self, cache: KVCache, tails_BxW: jax.Array) -> KVCache:
    return cache_lib.take_tails(cache, tails_BxW)

  def receive(self, cache: KVCache, features_Bx2xD: jax.Array) -> KVCache:
    del features_Bx2xD
    return cache

  def extend_tree(
    self,
    params: Any,
    tokens_BxN: jax.Array,
    depth_BxN: jax.Array,
    visible_BxNxN: jax.Array,
    cache: KVCache,
    return_features: bool = False,
  ) -> tuple[jax.Array, KVCache]:
    return self._apply(
      params, tokens_BxN, depth_BxN, visible_BxNxN, cache, return_features,
      method=Transformer.extend_tree,
    )  # fmt: skip

  def commit_nodes(self, cache: KVCache, slots_BxW: jax.Array, num_B: jax.Array) -> KVCache:
    return cache_lib.commit_nodes(cache, slots_BxW, num_B)

  def logits(self, params: Any, tokens_BxT: jax.Array) -> jax.Array:
    return self._apply(params, tokens_BxT)


def decoder(config: ModelConfig) -> Decoder:
  """The decoder of `config` (its family and options checked).

  Raises:
    ValueError: an unknown family, or options the family does not take.
  """
  family_of(config)
  if isinstance(config, HeadConfig):
    return HeadDecoder(config)
  return TransformerDecoder(config)


def _boxed_init(config: ModelConfig, key: jax.Array) -> Any:
  """The "params" collection of the module's init: parameters boxed in `layers.Logical`."""
  return Transformer(config).init(key, jnp.zeros((1, 1), jnp.int32))["params"]


def _init(config: ModelConfig, key: jax.Array) -> Any:
  return meta.unbox(jax.jit(functools.partial(_boxed_init, config))(key))


@functools.cache
def _param_axes(config: ModelConfig) -> Any:
  boxed = jax.eval_shape(functools.partial(_boxed_init, config), jax.random.key(0))
  is_box = lambda x: isinstance(x, layers.Logical)

  def names(path, leaf):
    if not is_box(leaf):
      where = "/".join(str(getattr(k, "key", k)) for k in path)
      raise ValueError(
        f"parameter {where} of the {config.family} family was created without logical "
        "axes (layers.logical)"
      )
    return leaf.names

  return jax.tree_util.tree_map_with_path(names, boxed, is_leaf=is_box)
