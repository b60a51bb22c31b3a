"""Input validation with clear errors, applied only to concrete (non-traced) values.

Inside `jax.jit` the values are tracers and only shapes can be checked; the public
functions call these helpers before tracing, so bad input fails early and by name.
"""

import jax
import numpy as np

_SUM_TOL = 1e-3
_NEG_TOL = 1e-6


class NonFiniteError(ValueError):
  """A model's outputs were not finite (e.g. parameters damaged on disk or diverged)."""


def is_concrete(x) -> bool:
  """Whether `x` has values to check (not a tracer, not a `jax.ShapeDtypeStruct`)."""
  return not isinstance(x, jax.core.Tracer | jax.ShapeDtypeStruct)


def distributions(**named) -> None:
  """Checks that each named array is a probability vector (or a batch of them).

  Raises:
    ValueError naming the argument when it has no entries, is not finite, has negative
    entries, or its last axis does not sum to 1; or when the last axes differ in size.
  """
  sizes = {}
  for name, x in named.items():
    shape = np.shape(x)
    if len(shape) == 0 or shape[-1] == 0:
      raise ValueError(f"{name} must have a vocabulary axis, got shape {shape}")
    sizes[name] = shape[-1]
    if not is_concrete(x):
      continue
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
      raise ValueError(f"{name} has non-finite entries")
    if np.any(x < -_NEG_TOL):
      raise ValueError(f"{name} has negative entries (min {x.min():.3g})")
    sums = x.sum(axis=-1)
    if np.any(np.abs(sums - 1.0) > _SUM_TOL):
      bad = sums.ravel()[np.argmax(np.abs(sums - 1.0).ravel())]
      raise ValueError(f"{name} is not normalised: its last axis sums to {bad:.6g}, not 1")
  if len(set(sizes.values())) > 1:
    raise ValueError(f"vocabulary sizes differ: {sizes}")


def num_drafts(k) -> None:
  """Checks that a concrete number of drafts is an integer >= 1."""
  if not is_concrete(k):
    return
  k_arr = np.asarray(k)
  if k_arr.shape != () or k_arr != np.round(k_arr) or k_arr < 1:
    raise ValueError(f"the number of drafts k must be an integer >= 1, got {k!r}")


def shape(name: str, x, expected: tuple) -> None:
  """Checks `x.shape` against `expected` (None entries match any size)."""
  got = tuple(np.shape(x))
  if len(got) != len(expected) or any(
    e is not None and e != g for e, g in zip(expected, got, strict=True)
  ):
    want = "x".join("?" if e is None else str(e) for e in expected)
    raise ValueError(f"{name} has shape {got}, expected {want}")


def block(what: str, drafts_KxL, p_KxLxV, q_KxL1xV) -> tuple[int, int]:
  """Checks the inputs of a block verifier (index convention of `methods.verify_drafts`).

  Returns:
    (K, L).
  """
  shape("drafts_KxL", drafts_KxL, (None, None))
  num_drafts, draft_len = np.shape(drafts_KxL)
  if draft_len < 1:
    raise ValueError(f"{what} needs a draft length L >= 1")
  shape("p_KxLxV", p_KxLxV, (num_drafts, draft_len, None))
  shape("q_KxL1xV", q_KxL1xV, (num_drafts, draft_len + 1, np.shape(p_KxLxV)[-1]))
  distributions(p_KxLxV=p_KxLxV, q_KxL1xV=q_KxL1xV)
  return num_drafts, draft_len


def integer(name: str, value, low: int, high: int | None = None) -> None:
  """Checks that a concrete `value` is an integer (not a bool) in [low, high]."""
  if not is_concrete(value):
    return
  ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
  if ok and low <= value and (high is None or value <= high):
    return
  span = f">= {low}" if high is None else f"in [{low}, {high}]"
  raise ValueError(f"{name} must be an integer {span}, got {value!r}")


def integer_dtype(name: str, x) -> None:
  """Checks that the array `x` has an integer dtype (a float would be silently cast)."""
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f"{name} must hold integers, got dtype {dtype}")


def int32_values(name: str, x, low: int | None = None, high: int | None = None) -> None:
  """Checks that `x` holds integers (any integer dtype, never a float or bool that would
  be cast) and, when concrete, that every entry fits int32 and lies in [low, high]."""
  dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f"{name} must hold integers, got dtype {dtype}")
  if not is_concrete(x):
    return
  values = np.asarray(x)
  if not values.size:
    return
  info = np.iinfo(np.int32)
  low = info.min if low is None else max(low, info.min)
  high = info.max if high is None else min(high, info.max)
  if values.min() < low or values.max() > high:
    raise ValueError(
      f"{name} must hold integers in [{low}, {high}], got {values.min()}..{values.max()}"
    )


def prng_key(name: str, key) -> None:
  """Checks that `key` is one PRNG key: a typed key array (`jax.random.key`) or a raw
  uint32[2] key (`jax.random.PRNGKey`), not an int seed or a batch of keys."""
  dtype = getattr(key, "dtype", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    if np.shape(key) != ():
      raise ValueError(f"{name} must be one PRNG key, got a batch of shape {np.shape(key)}")
    return
  if dtype == np.uint32 and np.shape(key) == (2,):
    return
  raise ValueError(
    f"{name} must be a PRNG key such as jax.random.key(0), got {type(key).__name__}"
    + (f" of dtype {dtype} and shape {np.shape(key)}" if dtype is not None else "")
  )


def typed_key(key) -> jax.Array:
  """`key` as a typed key array: a raw uint32[2] key (`jax.random.PRNGKey`) is wrapped
  (`jax.random.wrap_key_data`: the same random bits as `jax.random.key` of its seed), so
  code that splits, folds or vmaps keys sees one kind."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    return key
  return jax.random.wrap_key_data(key)


def token_ids(name: str, ids, vocab_size: int) -> None:
  """Checks that `ids` has an integer dtype and (when concrete) entries in [0, vocab_size)."""
  integer_dtype(name, ids)
  if is_concrete(ids):
    values = np.asarray(ids)
    if values.size and (values.min() < 0 or values.max() >= vocab_size):
      raise ValueError(
        f"{name} must hold token ids in [0, {vocab_size}), got {values.min()}..{values.max()}"
      )
