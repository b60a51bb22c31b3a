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


def transform_probs(logits_XxV, temperature, *, top_k=None, top_p=None):
  """Logits -> the sampling distribution after temperature, top-k and top-p.

  The same transform is applied to draft and target logits, so speculative decoding is
  exact with respect to the *transformed* target distribution.

  Args:
    logits_XxV: float logits (any leading shape).
    temperature: scalar >= 0 (may be traced); 0 is greedy: one-hot on the argmax.
    top_k: static int or None: keep the k largest logits (ties at the k-th kept).
    top_p: scalar in (0, 1] (may be traced) or None: keep the smallest set of most likely
      tokens whose mass reaches top_p (nucleus sampling), computed after temperature.

  Returns:
    probs_XxV, float32, rows summing to 1.
  """
  logits_XxV = logits_XxV.astype(jnp.float32)
  if top_k is not None and top_k < logits_XxV.shape[-1]:
    kth_Xx1 = jax.lax.top_k(logits_XxV, top_k)[0][..., -1:]
    logits_XxV = jnp.where(logits_XxV >= kth_Xx1, logits_XxV, -jnp.inf)
  temperature = jnp.asarray(temperature, jnp.float32)
  greedy = temperature <= 0
  scaled_XxV = logits_XxV / jnp.where(greedy, 1.0, temperature)
  probs_XxV = jax.nn.softmax(scaled_XxV, axis=-1)
  if top_p is not None:
    sorted_XxV = -jnp.sort(-probs_XxV, axis=-1)
    mass_before_XxV = jnp.cumsum(sorted_XxV, axis=-1) - sorted_XxV
    # The smallest probability that is still kept: tokens at least this likely survive.
    kept_XxV = mass_before_XxV < jnp.asarray(top_p, jnp.float32)
    floor_Xx1 = jnp.min(jnp.where(kept_XxV, sorted_XxV, jnp.inf), axis=-1, keepdims=True)
    probs_XxV = jnp.where(probs_XxV >= floor_Xx1, probs_XxV, 0.0)
    probs_XxV = probs_XxV / jnp.sum(probs_XxV, axis=-1, keepdims=True)
  onehot_XxV = jax.nn.one_hot(jnp.argmax(logits_XxV, axis=-1), logits_XxV.shape[-1])
  return jnp.where(greedy, onehot_XxV, probs_XxV)
