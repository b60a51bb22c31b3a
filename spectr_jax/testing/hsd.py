"""Hierarchical Speculative Decoding (HSD) on one draft chain, in three readings of its
authors' code and paper, and the exact output law of each.

Zhou et al., "Overcoming Joint Intractability with Lossless Hierarchical Speculative
Decoding" (arXiv 2601.05724, ICLR 2026). Their q is our draft p, their p our target q.
Sources, the rule, the witness and why two readings fail: docs/BLOCK_VERIFICATION.md, "HSD".

The rule's knobs, at each prefix X^i with rho_i = Q(X^i) / P(X^i) and rho_0 = 1:
- `CAPPINGS`, the cap c_i: "prefix" min(1, rho_i); "running" rho_i / max(1, rho_1..rho_i)
  (block verification's weight w_i); "none" rho_i (the code's `approxi` path).
- `OVERRIDES`: "next" sets the stop probability h_i = 1 where rho_{i+1} >= 1; "none" not.
- `FINALS`, the whole chain's acceptance: "joint" min(1, rho_L); "weight" c_L.
`READINGS` names the three readings as (capping, override, final). "clean" (the defaults,
`algorithm_clean.py`) and "published" (the paper's Listing 2) are NOT EXACT from L = 2 on.
"equations" is Sun et al.'s block verification, and exact.

Entry points: `verify_chain` (jit/vmap-able, static shapes), `chain_stops` (h_i and
plus_i along one chain) and `chain_law` (the enumerated output law, float64). Neither
inexact reading is in `methods.METHODS`: a registry record declares a method exact.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax.sampling import categorical
from spectr_jax.verdict import BlockVerdict

__all__ = [
  "CAPPINGS",
  "FINALS",
  "OVERRIDES",
  "READINGS",
  "chain_law",
  "chain_stops",
  "verify_chain",
]

CAPPINGS = ("prefix", "running", "none")
OVERRIDES = ("next", "none")
FINALS = ("joint", "weight")
# The authors' rule as read from each source (module docstring): (capping, override, final).
READINGS = {
  "clean": ("prefix", "next", "joint"),
  "published": ("running", "none", "joint"),
  "equations": ("running", "none", "weight"),
}


def _check(capping, override, final):
  if capping not in CAPPINGS or override not in OVERRIDES or final not in FINALS:
    raise ValueError(
      f"unknown HSD variant ({capping!r}, {override!r}, {final!r}); expected capping in "
      f"{CAPPINGS}, override in {OVERRIDES}, final in {FINALS}"
    )


def chain_stops(ratio_L, p_LxV, q_LxV, capping="prefix", override="next", final="joint", xp=jnp):
  """HSD's numbers along one chain (docs/BLOCK_VERIFICATION.md, "HSD"), in `xp` (jnp or np).

  Args:
    ratio_L: q(X_t | X^t) / p(X_t | X^t) for t = 0..L-1 (the drafted tokens).
    p_LxV, q_LxV: p(. | X^t), q(. | X^t) for t = 0..L-1.

  Returns:
    (stop_L1, plus_LxV): stop_L1[i] = h_i for i < L and stop_L1[L] = the full-chain
    acceptance probability; plus_LxV[i] = max(c_i q_i - p_i, 0) (unnormalised).
  """
  _check(capping, override, final)
  draft_len = p_LxV.shape[0]
  rho_L1 = xp.concatenate([xp.ones((1,), ratio_L.dtype), xp.cumprod(ratio_L)])
  if capping == "prefix":
    cap_L1 = xp.minimum(1.0, rho_L1)
  elif capping == "none":
    cap_L1 = rho_L1
  else:
    cap_L1 = rho_L1 / xp.maximum(1.0, _cummax(rho_L1, xp))
  plus_LxV = xp.maximum(cap_L1[:draft_len, None] * q_LxV - p_LxV, 0.0)
  minus_LxV = xp.maximum(p_LxV - cap_L1[:draft_len, None] * q_LxV, 0.0)
  plus_L, den_L = plus_LxV.sum(-1), xp.maximum(plus_LxV.sum(-1), minus_LxV.sum(-1))
  stop_L = xp.where(den_L > 0, plus_L / xp.where(den_L > 0, den_L, 1.0), 0.0)
  if override == "next":
    stop_L = xp.where(rho_L1[1:] >= 1.0, 1.0, stop_L)
  last = xp.minimum(1.0, rho_L1[draft_len]) if final == "joint" else cap_L1[draft_len]
  return xp.concatenate([stop_L, xp.reshape(last, (1,))]), plus_LxV


def _cummax(x, xp):
  if xp is np:
    return np.maximum.accumulate(x)
  return jax.lax.cummax(x)


def verify_chain(
  key, drafts_KxL, p_KxLxV, q_KxL1xV, *, capping="prefix", override="next", final="joint"
) -> BlockVerdict:
  """HSD on one draft chain (K = 1; index convention of `methods.verify_drafts`).

  The defaults are the "clean" reading; `READINGS` names the others (module docstring).
  Only "equations" (block verification) is exact.

  Returns:
    `methods.BlockVerdict`: tokens_L1[:num_tokens] emitted (the rest 0).
  """
  if drafts_KxL.shape[0] != 1:
    raise ValueError(f"HSD verifies one draft chain, got K = {drafts_KxL.shape[0]}")
  draft_len = drafts_KxL.shape[1]
  x_L = drafts_KxL[0]
  p_LxV, q_LxV = p_KxLxV[0], q_KxL1xV[0, :draft_len]
  steps = jnp.arange(draft_len)
  p_x, q_x = p_LxV[steps, x_L], q_LxV[steps, x_L]
  ratio_L = jnp.where(p_x > 0, q_x / jnp.where(p_x > 0, p_x, 1.0), 0.0)
  stop_L1, plus_LxV = chain_stops(ratio_L, p_LxV, q_LxV, capping, override, final)
  accept_key, back_key, residual_key = jax.random.split(key, 3)
  accepted = jax.random.uniform(accept_key) < stop_L1[draft_len]
  # Walk back: the last i < L whose test succeeds (i = L - 1 where none does).
  success_L = jax.random.uniform(back_key, (draft_len,)) < stop_L1[:draft_len]
  stop = jnp.where(jnp.any(success_L), jnp.max(jnp.where(success_L, steps, -1)), draft_len - 1)
  n = jnp.where(accepted, draft_len, stop)
  row_V = plus_LxV[jnp.minimum(n, draft_len - 1)]
  empty = (n < draft_len) & (jnp.sum(row_V) <= 0)
  law_V = jnp.where(n == draft_len, q_KxL1xV[0, draft_len], row_V)
  y = categorical(residual_key, law_V)
  index_L1 = jnp.arange(draft_len + 1)
  path_L1 = jnp.concatenate([x_L, jnp.zeros((1,), x_L.dtype)]).astype(jnp.int32)
  # No correction token where plus_n is all 0: X^{n+1} is emitted instead.
  y = jnp.where(empty, path_L1[jnp.minimum(n, draft_len - 1)], y)
  tokens_L1 = jnp.where(index_L1 < n, path_L1, 0).at[n].set(y)
  survivors_L1 = (index_L1 < draft_len).astype(jnp.int32)  # one chain, as "block" at K = 1
  return BlockVerdict(tokens_L1.astype(jnp.int32), (n + 1).astype(jnp.int32), survivors_L1)


def chain_law(p_tab, q_tab, draft_len: int, capping="prefix", override="next", final="joint"):
  """The exact output law of `verify_chain` on an enumerable tree (float64, every draft
  chain enumerated; tree layout of `block_bound`), each output completed by exact target
  draws.

  Returns:
    (law, tokens): the law over the V^(L+1) completed strings (base-V code, first token
    most significant) and the expected number of tokens per round. The rule is exact
    where law equals `sequences.target_law(q_tab, L)`. The knobs are `verify_chain`'s:
    `chain_law(p_tab, q_tab, L, *READINGS["published"])` is the published rule.
  """
  _check(capping, override, final)
  p_tab, q_tab = np.asarray(p_tab, np.float64), np.asarray(q_tab, np.float64)
  vocab = p_tab.shape[-1]
  law, tokens = np.zeros(vocab ** (draft_len + 1)), 0.0
  for path in itertools.product(range(vocab), repeat=draft_len):
    codes = [0]
    for z in path:
      codes.append(codes[-1] * vocab + z)
    p_LxV = np.array([p_tab[t, codes[t]] for t in range(draft_len)])
    q_LxV = np.array([q_tab[t, codes[t]] for t in range(draft_len)])
    p_x = p_LxV[np.arange(draft_len), list(path)]
    prob = float(np.prod(p_x))
    if prob <= 0:
      continue
    ratio = q_LxV[np.arange(draft_len), list(path)] / p_x
    stop, plus = chain_stops(ratio, p_LxV, q_LxV, capping, override, final, xp=np)
    # P(n = i): the chain is rejected, the tests above i fail and the one at i succeeds.
    n_law = np.zeros(draft_len + 1)
    n_law[draft_len] = stop[draft_len]
    none_above = 1.0 - stop[draft_len]
    for i in range(draft_len - 1, -1, -1):
      n_law[i] = none_above * stop[i]
      none_above *= 1.0 - stop[i]
    n_law[draft_len - 1] += none_above
    for n in range(draft_len + 1):
      mass = prob * n_law[n]
      if mass <= 0:
        continue
      if n == draft_len:
        y_law = q_tab[draft_len, codes[draft_len]]
      elif plus[n].sum() > 0:
        y_law = plus[n] / plus[n].sum()
      else:
        y_law = np.eye(vocab)[path[n]]
      tokens += mass * (n + 1)
      out = np.zeros(vocab ** (n + 1))
      out[codes[n] * vocab : (codes[n] + 1) * vocab] = mass * y_law
      for t in range(n + 1, draft_len + 1):  # complete with exact target draws
        out = (out[:, None] * q_tab[t, : vocab**t]).ravel()
      law += out
  return law, float(tokens)
