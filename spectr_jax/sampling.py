"""Sampling from probability vectors: an exact categorical draw and the logit transform."""

import jax
import jax.numpy as jnp

# Each level quantises its weights to integer masses summing to about 2^MASS_BITS.
MASS_BITS = 30


def block_shape(vocab: int) -> tuple[int, int]:
  """(num_blocks, block_size) of the two-level draw over `vocab` tokens.

  The block size is the smallest power of two whose square is at least `vocab`; the
  weights are padded with zeros to num_blocks * block_size.
  """
  block_size = 1
  while block_size * block_size < vocab:
    block_size *= 2
  return -(-vocab // block_size), block_size


def integer_masses(weights_A: jax.Array, total: jax.Array) -> jax.Array:
  """Quantises non-negative weights to int32 masses: round(w / total * 2^MASS_BITS).

  A positive weight keeps mass at least 1 and a zero (or negative, or NaN) weight has mass
  exactly 0, so the support is preserved by construction.

  Args:
    weights_A: weights (any shape), float32 or float64.
    total: their sum, broadcastable to `weights_A` (at least the largest weight).

  Returns:
    int32 masses, the shape of `weights_A`; they sum to at most 2^MASS_BITS + 1.5 n for n weights.
  """
  scaled_A = jnp.round(weights_A / total * 2.0**MASS_BITS)
  mass_A = jnp.clip(scaled_A, 1, 2**MASS_BITS)
  return jnp.where(weights_A > 0, mass_A, 0).astype(jnp.int32)


def _blocks(weights_V):
  """Cleaned weights as (num_blocks, block_size) rows, with the rows' float sums."""
  num_blocks, block_size = block_shape(weights_V.shape[-1])
  weights_V = jnp.where(weights_V > 0, weights_V, 0)
  pad = num_blocks * block_size - weights_V.shape[-1]
  weights_VbxVt = jnp.pad(weights_V, (0, pad)).reshape(num_blocks, block_size)
  return weights_VbxVt, jnp.sum(weights_VbxVt, axis=1)


def level_masses(weights_V: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The integer masses of both levels of `categorical_from_bits`, for every block.

  Args:
    weights_V: non-negative weights.

  Returns:
    (block_masses_Vb, token_masses_VbxVt), int32, with (Vb, Vt) = block_shape(V): the
    masses the first level draws a block from, and those the second level draws a token
    from inside each block (token b * Vt + j; padding tokens have mass 0).
  """
  weights_VbxVt, sums_Vb = _blocks(weights_V)
  return integer_masses(sums_Vb, jnp.sum(sums_Vb)), integer_masses(weights_VbxVt, sums_Vb[:, None])


def _mul_hi(a, b):
  """floor(a * b / 2^32) for uint32 a, b, exactly, from 16-bit halves (no 64-bit types)."""
  a_hi, a_lo = a >> 16, a & 0xFFFF
  b_hi, b_lo = b >> 16, b & 0xFFFF
  hi_lo, lo_hi = a_hi * b_lo, a_lo * b_hi
  mid = ((a_lo * b_lo) >> 16) + (hi_lo & 0xFFFF) + (lo_hi & 0xFFFF)
  return a_hi * b_hi + (hi_lo >> 16) + (lo_hi >> 16) + (mid >> 16)


def _draw(bits, masses_A):
  """The index i with C_{i-1} <= floor(bits * C_N / 2^32) < C_i, C the prefix sums."""
  cum_A = jnp.cumsum(masses_A.astype(jnp.uint32))
  u = _mul_hi(bits, cum_A[-1])
  return jnp.minimum(jnp.sum(cum_A <= u), masses_A.shape[-1] - 1).astype(jnp.int32)


def categorical_from_bits(bits_2: jax.Array, weights_V: jax.Array) -> jax.Array:
  """The index `categorical` draws from the random words `bits_2`: a pure, exact map.

  Two levels over blocks of the (zero-padded) vocabulary, see `block_shape`: word 0 picks
  a block from the block sums, word 1 a token inside it. At each level the weights are
  quantised by `integer_masses` (prefix sums of integers are exact and monotone, and flat
  across zero masses), and a 32-bit word maps to u = floor(bits * N / 2^32) in [0, N),
  N the level's total mass, by an exact multiply-high; the index is the number of prefix
  sums <= u. Index i of masses m then gets ceil(C_i 2^32 / N) - ceil(C_{i-1} 2^32 / N) of
  the 2^32 words, within one word of m_i 2^32 / N, and rounding moves m_i / N by at most
  about 2^-31 plus its share of the renormalisation. So a level of n entries is within
  total variation about n 2^-31 of its float shares: at V = 256k (n = 500 and 512)
  under 5e-7 in all, measured 2e-7 at worst on peaked, flat, tiny-mass and truncated
  vectors (the float rounding of the block sums adds about 2e-8). A positive weight
  always keeps positive probability, and a zero weight has none: its mass is 0, so no
  word maps to it. (One float32 uniform has 2^23 values, too few at these vocabularies;
  an exponential race would need V random numbers and logarithms per draw.)

  Args:
    bits_2: two uint32 words.
    weights_V: non-negative finite weights (float32 or float64; NaN and negative entries
      count as 0) with positive sum. If every weight is 0 the result is V - 1.

  Returns:
    An int32 index in [0, V).
  """
  vocab = weights_V.shape[-1]
  weights_VbxVt, sums_Vb = _blocks(weights_V)
  bits_2 = jnp.asarray(bits_2, jnp.uint32)
  block = _draw(bits_2[0], integer_masses(sums_Vb, jnp.sum(sums_Vb)))
  row_Vt = jax.lax.dynamic_index_in_dim(weights_VbxVt, block, keepdims=False)
  token = _draw(bits_2[1], integer_masses(row_Vt, sums_Vb[block]))
  return jnp.minimum(block * weights_VbxVt.shape[1] + token, vocab - 1)


def categorical(key: jax.Array, weights_V: jax.Array) -> jax.Array:
  """Draws one index with probability proportional to the non-negative `weights_V`.

  Exact to the resolution of the weights (see `categorical_from_bits`, which this is with
  two random uint32 words): within total variation 1e-6 of the normalised weights at
  V = 256k, and an index of zero weight is never returned, by construction. Costs one pass
  over the weights (the block sums) plus two passes over about sqrt(V) entries.

  Args:
    key: PRNG key.
    weights_V: non-negative weights with positive sum (float32 or float64). If every
      weight is 0 the result is V - 1.

  Returns:
    An int32 index in [0, V).
  """
  return categorical_from_bits(jax.random.bits(key, (2,), jnp.uint32), weights_V)


def top_tokens(p_V: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The k most likely tokens of p, most likely first; ties go to the lower index.

  Only tokens with positive mass count (NaN counts as 0). Where s < k tokens have mass,
  entries s + 1..k are marked invalid and repeat the first token.

  Args:
    p_V: non-negative weights (float32 or float64).
    k: how many tokens (static).

  Returns:
    (tokens_K int32, valid_K bool): valid_K[i] = i < number of tokens with p > 0.
  """
  mass_V = jnp.where(p_V > 0, p_V, 0.0)
  if k > p_V.shape[-1]:  # more tokens than the vocabulary: the padding has no mass
    mass_V = jnp.pad(mass_V, [(0, 0)] * (p_V.ndim - 1) + [(0, k - p_V.shape[-1])])
  values_K, tokens_K = jax.lax.top_k(mass_V, k)
  valid_K = values_K > 0
  return jnp.where(valid_K, tokens_K, tokens_K[..., :1]).astype(jnp.int32), valid_K


def transform_probs(logits_AxV, temperature, *, top_k=None, top_p=None, greedy=None):
  """Logits -> the sampling distribution after temperature, top-k and top-p.

  The same transform is applied to draft and target logits, so speculative decoding is
  exact with respect to the *transformed* target distribution. Greedy decoding and
  sampling are different programs, chosen statically (no branch on the device).

  Args:
    logits_AxV: float logits (any leading shape).
    temperature: scalar >= 0 (may be traced when `greedy` is given); 0 is greedy.
    top_k: static int or None: keep the k largest logits (ties at the k-th kept).
    top_p: scalar in (0, 1] (may be traced) or None: keep the smallest set of most likely
      tokens whose mass reaches top_p (nucleus sampling), computed after temperature;
      every token as likely as the least likely kept one is kept too (ties).
    greedy: True for one-hot on the argmax (temperature and truncation unused), False to
      sample (temperature > 0); None decides from a concrete temperature (0 is greedy).

  Returns:
    probs_AxV, float32, rows summing to 1.

  Raises:
    ValueError: `greedy` is None and the temperature is traced.
  """
  logits_AxV = logits_AxV.astype(jnp.float32)
  if greedy is None:
    if isinstance(temperature, jax.core.Tracer):
      raise ValueError(
        "a traced temperature needs greedy=True or False: greedy decoding and sampling "
        "compile to different programs"
      )
    greedy = float(temperature) <= 0
  if greedy:
    return jax.nn.one_hot(jnp.argmax(logits_AxV, axis=-1), logits_AxV.shape[-1])
  temperature = jnp.asarray(temperature, jnp.float32)
  return _sampling_probs(logits_AxV, temperature=temperature, top_k=top_k, top_p=top_p)


def _sampling_probs(logits_AxV, *, temperature, top_k, top_p):
  """`transform_probs` for temperature > 0."""
  if top_k is not None and top_k < logits_AxV.shape[-1]:
    kth_Ax1 = jax.lax.top_k(logits_AxV, top_k)[0][..., -1:]
    logits_AxV = jnp.where(logits_AxV >= kth_Ax1, logits_AxV, -jnp.inf)
  probs_AxV = jax.nn.softmax(logits_AxV / temperature, axis=-1)
  if top_p is not None:
    sorted_AxV = -jnp.sort(-probs_AxV, axis=-1)
    # The smallest kept probability is the one at the first rank where the sorted mass
    # reaches top_p (the last rank if rounding never gets there). Only the first crossing
    # counts, so a float cumsum that is not monotone cannot grow the set, and keeping every
    # token at least that likely makes it a set of most likely tokens, ties included.
    reached_AxV = jnp.cumsum(sorted_AxV, axis=-1) >= jnp.asarray(top_p, jnp.float32)
    first_Ax1 = jnp.argmax(reached_AxV, axis=-1, keepdims=True)
    any_Ax1 = jnp.any(reached_AxV, axis=-1, keepdims=True)
    last_Ax1 = jnp.where(any_Ax1, first_Ax1, probs_AxV.shape[-1] - 1)
    floor_Ax1 = jnp.take_along_axis(sorted_AxV, last_Ax1, axis=-1)
    probs_AxV = jnp.where(probs_AxV >= floor_Ax1, probs_AxV, 0.0)
    probs_AxV = probs_AxV / jnp.sum(probs_AxV, axis=-1, keepdims=True)
  return probs_AxV


def nonfinite_rows(logits_BxAxV: jax.Array) -> jax.Array:
  """Rows with a non-finite logit anywhere: bool [B] (any shape after the row axis)."""
  return ~jnp.all(jnp.isfinite(logits_BxAxV), axis=tuple(range(1, logits_BxAxV.ndim)))
