"""Where a decode's parameters live: their shardings and, on TPU, their device layouts.

Shardings come from `sharding.RULES` and the parameters' logical axes. On a TPU, an
array's default device layout tiles its two minor dimensions, and a fused weight such as
w_gate_up (D x 2 x F) or w_qkv (D x Hk x (G + 2) x Dh) then has a small dimension second
minor: the matmul wants D there, so a program taking the default layout copies the weight
into its own layout at every call, held for the whole decode (60% more HBM for bench_
device's target). Instead, `decode_placement` asks the compiler once which layout each
parameter's matmuls want (a probe: one `prefill` of the model compiled with
`Layout.AUTO` for its parameters) and places the parameters so; the engine's programs
then read them as they are. Elsewhere (CPU, GPU) the default layouts are kept: the
matmuls read them in place.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout
from jax.sharding import SingleDeviceSharding

from spectr_jax import sharding
from spectr_jax.models.config import ModelConfig
from spectr_jax.models.protocol import decoder

# Platforms whose parameters are placed in the layouts the compiler asks for.
LAYOUT_PLATFORMS = ("tpu",)


def platform_of(mesh: jax.sharding.Mesh | None) -> str:
  """The platform a decode on `mesh` runs on (the default backend's without a mesh)."""
  return jax.default_backend() if mesh is None else mesh.devices.flat[0].platform


def decode_placement(config: ModelConfig, params: Any, mesh: jax.sharding.Mesh | None) -> Any:
  """The placement of `params` (arrays or `jax.ShapeDtypeStruct`s, laid out as the decode
  runs them) for a decode on `mesh`: a pytree like `params` of `NamedSharding`s by the
  rules, or on a TPU of `Format`s (those shardings with the probed layouts: module
  docstring); None without a mesh off a TPU (the arrays stay as they are).
  """
  platform = platform_of(mesh)
  if mesh is None:
    if platform not in LAYOUT_PLATFORMS:
      return None
    device = jax.devices()[0]
    shardings = jax.tree.map(lambda _: SingleDeviceSharding(device), params)
  else:
    axes = decoder(config).param_axes(params)
    shardings = sharding.param_shardings(params, mesh, axes=axes)
  if platform not in LAYOUT_PLATFORMS:
    return shardings
  abstract = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, shardings
  )
  leaves, tree = jax.tree.flatten(abstract)
  return jax.tree.unflatten(tree, _probe(config, tree, tuple(leaves)))


@functools.lru_cache(maxsize=32)
def _probe(config: ModelConfig, tree, leaves: tuple[jax.ShapeDtypeStruct, ...]) -> list[Format]:
  """The formats the compiler picks for the parameters of one prefill (module docstring)."""
  params = jax.tree.unflatten(tree, leaves)
  model = decoder(config)
  first = leaves[0].sharding
  replicated = first if isinstance(first, SingleDeviceSharding) else first.update(spec=())

  def prefill(params, tokens_BxP):
    b, p = tokens_BxP.shape
    cache = model.init_cache(b, 1, 1, p + 1)
    lengths_B = jnp.full((b,), p, jnp.int32)
    # A head reads the target's features with its prompt (zeros: only the layouts matter).
    features_BxPxD = jnp.zeros((b, p, config.d_model)) if model.reads_features else None
    return model.prefill(params, tokens_BxP, lengths_B, cache, features_BxPxD)[0]

  auto = jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), params)
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32, sharding=replicated)
  compiled = jax.jit(prefill, in_shardings=(auto, replicated)).lower(params, tokens).compile()
  return jax.tree.leaves(compiled.input_formats[0][0])
