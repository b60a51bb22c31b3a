"""A model config with its parameters; fresh parameters and the parameters' logical axes
of a config."""

import functools
from typing import Any

import jax
import numpy as np
from flax import struct

from spectr_jax import sharding
from spectr_jax.models import layout, placement
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.protocol import Decoder, decoder
from spectr_jax.models.transformer import Transformer


@struct.dataclass
class ModelBundle:
  """A model config with its parameters: what training returns and decoding takes.

  Attributes:
    config: the hyper-parameters (static: not a pytree leaf, so a bundle can cross jit).
    params: the parameter pytree of the config's decoder (plain arrays).
  """

  config: ModelConfig = struct.field(pytree_node=False)
  params: Any

  @property
  def decoder(self) -> Decoder:
    """The decoder of this config (it runs the parameters stacked or split:
    `models.layout`)."""
    return decoder(self.config)

  def for_decoding(self, scan_layers: bool | None = None, platform: str = "") -> "ModelBundle":
    """The bundle as a decode holds it: every float in the compute dtype, the layers
    stacked for a scanned stack or split for an unrolled one (`layout.for_decoding`,
    `scan_layers` and `platform` as there; a no-op where it already is)."""
    params = layout.for_decoding(self.params, self.config, scan_layers, platform)
    return self.replace(params=params)

  def placed(self, mesh: jax.sharding.Mesh | None = None) -> "ModelBundle":
    """The bundle as a decode on `mesh` holds it (without a mesh: on this process's
    default device): `for_decoding` for its platform, the parameters where
    `placement.decode_placement` puts them (on a TPU, in the layouts the matmuls want),
    so no call of `engine.generate` converts or moves them."""
    bundle = self.for_decoding(platform=placement.platform_of(mesh))
    where = placement.decode_placement(self.config, bundle.params, mesh)
    return bundle if where is None else bundle.replace(params=sharding.put(bundle.params, where))

  @property
  def model(self) -> Transformer:
    """The flax module of this config: `model.apply({"params": params}, tokens_BxT)` is
    the causal forward (`decoder.logits`; a head's `Head` also reads features)."""
    return self.decoder.module


def init_params(config: ModelConfig, key: jax.Array) -> Any:
  """Returns freshly initialised parameters of the config's decoder, layers stacked (the
  layout of training and checkpoints).

  Args:
    config: the model config.
    key: a PRNG key.

  Returns:
    The parameter pytree (the "params" collection), float32.
  """
  return decoder(config).init_params(key)


def param_axes(config: ModelConfig, params: Any = None) -> Any:
  """The logical axes of every parameter of the config's decoder, as attached where each
  is created: a pytree like the parameters with tuples of axis names as leaves (for
  `spectr_jax.sharding`'s param_specs, shard_params, describe); layers stacked, as
  `init_params` makes them, or laid out like `params` (split for an unrolled decode:
  `models.layout`)."""
  return decoder(config).param_axes(params)


def count_params(params: Any) -> int:
  """Returns the total number of scalars in a parameter pytree."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@functools.cache
def _param_shapes(config: ModelConfig, split: bool) -> dict[tuple[str, ...], tuple[int, ...]]:
  shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
  if split:
    shapes = layout.split_layers(shapes, config)
  return {
    tuple(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape)
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)
  }


def check_params(bundle: ModelBundle, name: str = "model") -> None:
  """Raises ValueError when `bundle.params` is not a parameter tree of `bundle.config`
  (a missing, extra or misshapen parameter, named by its path): parameters of another
  config would otherwise fail deep inside a compiled program, or not at all."""
  want = _param_shapes(bundle.config, layout.is_split(bundle.params))
  got = {
    tuple(str(getattr(k, "key", k)) for k in path): tuple(np.shape(leaf))
    for path, leaf in jax.tree_util.tree_leaves_with_path(bundle.params)
  }
  for path in sorted(set(want) | set(got)):
    if want.get(path) != got.get(path):
      where = "/".join(path)
      raise ValueError(
        f"the {name}'s parameters do not match its config: {where} has shape "
        f"{got.get(path, 'missing')}, the config implies {want.get(path, 'none')}"
      )
