"""Sampling from probability vectors."""

import jax
import jax.numpy as jnp


def categorical(key, weights_V):
  """Draws one index with probability proportional to the non-negative `weights_V`.

  Inverse CDF with a single uniform: far cheaper than Gumbel-max over a large vocabulary.
  An index of zero weight is never returned; the weights must have positive mass.

  Args:
    key: PRNG key.
    weights_V: non-negative weights.

  Returns:
    An int32 index in [0, V).
  """
  weights_V = jnp.maximum(weights_V, 0.0)
  cdf_V = jnp.cumsum(weights_V)
  u = jax.random.uniform(key, dtype=cdf_V.dtype)
  index = jnp.searchsorted(cdf_V, u * cdf_V[-1], side="right")
  last_positive = weights_V.shape[-1] - 1 - jnp.argmax(weights_V[::-1] > 0)
  return jnp.minimum(index, last_positive).astype(jnp.int32)
