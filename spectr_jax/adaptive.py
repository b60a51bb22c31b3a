"""Adaptive speculation: each round's draft length chosen from the draft's own law, exactly.

A round drafts L positions (static shapes) and verifies a prefix of them, l of L per
block, chosen position by position from what was drafted before: position j
(1 <= j < L) is verified iff the likeliest draft prefix before it,

  max_k prod_{t < j} p_k,t(x_k,t),

is at least `threshold` (position 0 always is); the walk then draws its bonus token
after position l - 1 from the target (`verify.walk_positions(length=l)`). A confident
draft is verified further, a doubtful one is cut where its prefix became unlikely, the
SpecDec++ / DISCO idea (arXiv 2405.19715, 2405.04304) with the draft's own
probabilities as the predictor.

Why it stays exact for every token-level walk: the decision to verify position j is a
function of the tokens drafted before j (a stopping time of the drafting). Given those,
each surviving draft's token at j is still a fresh draw from p given its own prefix, so
the verifier at j sees the law it is exact for, whether j was reached or the walk
stopped before it (and then the bonus comes from q). A rule that looks at position j's
own token to decide whether j is verified (its draft probability, its target
probability) changes the law of the tokens the verifier sees: such rules are not exact,
and the tests show the harness rejecting them (tests/test_adaptive.py).

The engine runs it with `DecodeSpec(adaptive=threshold)`: the draft loop stops when no
row of the batch verifies the next position (`drafting`, a `lax.while_loop`), the target
scores the drafts up to the smallest of `length_buckets` that holds the batch's longest
length (one compiled call per bucket), and each row's walk verifies its own length
(`rounds.run_round`). Static shapes throughout: positions never drafted hold p = 0,
which never passes the rule and is never read by the walk.

The length is the run of leading positions that pass (position 0 always does), so it is
well defined by construction, whatever the rounding of the running sums.
"""

import jax.numpy as jnp

__all__ = ["confident_length", "length_buckets"]


def length_buckets(draft_len: int) -> tuple[int, ...]:
  """The lengths the target's call is compiled for: the powers of two below L, and L."""
  return tuple(sorted({2**i for i in range(draft_len.bit_length()) if 2**i < draft_len}
                      | {draft_len}))  # fmt: skip


def confident_length(drafts_KxL, p_KxLxV, threshold) -> jnp.ndarray:
  """The number of positions to verify, 1 <= l <= L (module docstring): 1 plus the
  positions j >= 1 whose likeliest draft prefix before j has probability >= threshold.
  threshold <= 0 verifies every position (l = L).

  Args:
    drafts_KxL: the K drafts' tokens.
    p_KxLxV: the draft distributions they were drawn from (p[k, t] given drafts[k, :t]).
    threshold: float scalar (may be traced).
  """
  p_KxL = jnp.take_along_axis(p_KxLxV, drafts_KxL[..., None], -1)[..., 0].astype(jnp.float32)
  log_p_KxL = jnp.log(p_KxL)  # a token drawn from p has p > 0; -inf would only stop earlier
  # The log-probability of each draft's prefix before position j: the sum over t < j.
  through_KxL = jnp.cumsum(log_p_KxL, axis=1)
  before_KxL = jnp.concatenate([jnp.zeros_like(through_KxL[:, :1]), through_KxL[:, :-1]], 1)
  passes_L = jnp.max(before_KxL, axis=0) >= jnp.log(jnp.float32(threshold))
  passes_L = passes_L.at[0].set(True)
  return jnp.sum(jnp.cumprod(passes_L.astype(jnp.int32))).astype(jnp.int32)
