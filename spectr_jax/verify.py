"""Exact verification of speculative drafts (pure functions, no model knowledge).

Per-position verifiers take k drafts X_1..X_k (a mask `valid_K` selects them) and return
a token Y ~ q exactly, with whether Y came from the accept branch:

- `speculative_sampling`: the single-draft rule (accept min(1, q/p), else the residual).
- `kseq`: SpecTr's K-SEQ with split factor rho ("star", "k" or a fixed number).
- `specinfer`: SpecInfer's recursive rejection sampling.
- `optimal`: the OT-optimal verifier that reaches alpha* (`spectr_jax.optimal`).
- `rrs`: recursive rejection without replacement, for distinct drafts drawn without
  replacement (`drafting.distinct_tokens`; Jeon et al., RSD, arXiv 2402.14160).
- `certain_verdict`: Y ~ q, a hit where a draft equals it, for drafts that are a
  deterministic function of the context (the "topk" tree: `drafting.topk_depths`).

Each has a verdict function `<name>_verdict(key, drafts_K, p_V, q_V, valid_K) ->
Verdict` (K-SEQ also takes rho_mode, rho_value): the signature the method registry
(`spectr_jax.methods`) holds. `walk` runs a registered method over one block of K draft
paths: position by position for token-level methods, at once for block-level ones
(`spectr_jax.block`, `spectr_jax.traversal`).

All functions are jit/vmap-able with static shapes and work in float32. A fixed rho is
traced, so sweeping it does not recompile.
"""

import dataclasses
import functools
import importlib
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import acceptance, checks, loops
from spectr_jax.acceptance import rho_star
from spectr_jax.optimal import optimal
from spectr_jax.sampling import categorical
from spectr_jax.verdict import OVERSHOOT_TOL, BlockVerdict, Verdict

__all__ = [
  "OVERSHOOT_TOL",
  "BlockVerdict",
  "Verdict",
  "WalkStats",
  "certain_verdict",
  "kseq",
  "kseq_verdict",
  "optimal",
  "rho_star",
  "rho_star_KxL",
  "rrs",
  "rrs_verdict",
  "sd_verdict",
  "specinfer",
  "specinfer_verdict",
  "speculative_sampling",
  "walk",
  "walk_positions",
]


def _as_valid(valid_K, num_drafts: int):
  if valid_K is None:
    return jnp.ones((num_drafts,), bool)
  checks.shape("valid_K", valid_K, (num_drafts,))
  return jnp.asarray(valid_K, bool)


def _check_position(drafts_K, p_V, q_V):
  checks.distributions(p_V=p_V, q_V=q_V)
  checks.shape("drafts_K", drafts_K, (None,))
  checks.shape("p_V", p_V, (None,))
  checks.shape("q_V", q_V, (p_V.shape[-1],))


def sd_verdict(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Single-draft speculative sampling of drafts_K[0] (token-level verify function)."""
  accept_key, residual_key = jax.random.split(key)
  x, valid = drafts_K[0], valid_K[0]
  ratio = jnp.where(p_V[x] > 0, q_V[x] / jnp.where(p_V[x] > 0, p_V[x], 1.0), 0.0)
  accepted = valid & (jax.random.uniform(accept_key) < ratio)
  residual_V = jnp.where(valid, acceptance.residual(q_V, p_V), q_V)
  y = categorical(residual_key, residual_V)
  return Verdict(jnp.where(accepted, x, y).astype(jnp.int32), accepted, jnp.float32(1.0))


def kseq_verdict(key, drafts_K, p_V, q_V, valid_K, *, rho_mode, rho_value) -> Verdict:
  """K-SEQ on the valid drafts (token-level verify function; see `kseq`).

  The overshoot of the accept branch, sum max(A - q, 0), is 0 for rho* and rho = k; a
  fixed rho below what the position needs makes it positive, and then the clipped
  residual makes the output law differ from q (the engine counts such positions).
  """
  accept_key, residual_key = jax.random.split(key)
  k = jnp.sum(valid_K)
  plan = acceptance.kseq_plan(p_V, q_V, k, rho_mode, rho_value)
  px_K = p_V[drafts_K]
  ratio_K = jnp.where(px_K > 0, plan.m_V[drafts_K] / jnp.where(px_K > 0, px_K, 1.0), 0.0)
  accept_K = valid_K & (jax.random.uniform(accept_key, drafts_K.shape) < ratio_K)
  accepted = jnp.any(accept_K)
  y = categorical(residual_key, acceptance.residual(q_V, plan.accept_mass_V))
  token = jnp.where(accepted, drafts_K[jnp.argmax(accept_K)], y)
  overshoot = jnp.sum(jnp.maximum(-plan.residual_V, 0.0))
  return Verdict(token.astype(jnp.int32), accepted, plan.rho, overshoot)


def specinfer_verdict(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """SpecInfer's recursive rejection on the valid drafts (token-level verify function)."""
  accept_key, residual_key = jax.random.split(key)
  # The chain of targets r_1 = q, r_{j+1} = norm(max(r_j - p, 0)) does not depend on the
  # rejected draft values, so it is computed once; the j-th valid draft is tried against r_j.
  r_K1xV, _ = acceptance.specinfer_residuals(p_V, q_V, drafts_K.shape[0])
  stage_K = jnp.cumsum(valid_K) - 1
  px_K = p_V[drafts_K]
  rx_K = r_K1xV[jnp.maximum(stage_K, 0), drafts_K]
  ratio_K = jnp.where(px_K > 0, rx_K / jnp.where(px_K > 0, px_K, 1.0), 0.0)
  accept_K = valid_K & (jax.random.uniform(accept_key, drafts_K.shape) < ratio_K)
  accepted = jnp.any(accept_K)
  y = categorical(residual_key, r_K1xV[jnp.sum(valid_K)])
  token = jnp.where(accepted, drafts_K[jnp.argmax(accept_K)], y)
  return Verdict(token.astype(jnp.int32), accepted)


def rrs_verdict(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Recursive rejection without replacement on the valid drafts (token-level verify
  function; SPEC section 5).

  The drafts are distinct tokens drawn without replacement, in the order drawn (the
  "wor" scheme). With r_1 = q and p_1 = p: draft X_i is accepted with probability
  min(1, r_i(X_i) / p_i(X_i)); after a rejection r_{i+1} = norm(max(r_i - p_i, 0)) and
  p_{i+1} = p_i with X_i removed, renormalised; if all are rejected the output is drawn
  from the last r. Each stage is single-draft speculative sampling of r_i with a draft
  from p_i, so the output is q. A valid draft whose p_i is 0 (a token drawn earlier, as
  the copies of `drafting.distinct_tokens`, or one outside p's support) is skipped: it
  neither is accepted nor changes r. On a static tree (`drafting.without_replacement`
  with a branching) the walk's surviving paths at each depth are one node's children in
  the order drawn, each repeated over its block of paths, so the tree is verified node
  by node; with the default branching the later positions see one surviving token,
  where this is single-draft sampling.
  Every rejected token gets r = 0 from then on, so the final draw never hits a draft.
  """
  accept_key, residual_key = jax.random.split(key)
  u_K = jax.random.uniform(accept_key, drafts_K.shape)

  def stage(carry, inputs):
    r_V, left_V, accepted, token = carry
    x, valid, u = inputs
    mass = jnp.sum(left_V)
    p_i_V = left_V / jnp.where(mass > 0, mass, 1.0)
    px = p_i_V[x]
    tried = valid & (px > 0) & ~accepted
    accept = tried & (u < r_V[x] / jnp.where(px > 0, px, 1.0))
    r_V = jnp.where(tried & ~accept, acceptance.residual(r_V, p_i_V), r_V)
    left_V = jnp.where(tried, left_V.at[x].set(0.0), left_V)
    return (r_V, left_V, accepted | accept, jnp.where(accept, x, token)), None

  init = (q_V, p_V, jnp.bool_(False), jnp.int32(0))
  (r_V, _, accepted, token), _ = loops.scan(stage, init, (drafts_K, valid_K, u_K))
  y = categorical(residual_key, r_V)
  return Verdict(jnp.where(accepted, token, y).astype(jnp.int32), accepted)


def certain_verdict(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """The engines' verification of a deterministic tree (token-level verify function):
  draw Y ~ q; the walk moves to the valid draft equal to Y, else emits Y and stops.

  Each draft is verified as if the draft were certain of it (p one-hot on it): recursive
  rejection then accepts child j with probability r_j(x_j), which is this draw. The
  draft law p_V is not read. The output is q at every position whatever the drafts, as
  long as they do not depend on this key: so any tree the draft builds is exact. (On
  sampled drafts it stays exact, as it never reads how they were drawn, but there it
  hits only q's mass on the drawn tokens; the registry pairs it with "topk" only.)
  """
  del p_V
  y = categorical(key, q_V)
  return Verdict(y.astype(jnp.int32), jnp.any(valid_K & (drafts_K == y)))


def _bind_rho(fn: Callable, takes_rho: bool, rho_mode: str, rho_value) -> Callable:
  """A verdict function with rho bound where it takes one."""
  if takes_rho:
    return functools.partial(fn, rho_mode=rho_mode, rho_value=rho_value)
  return fn


@functools.partial(jax.jit, static_argnames=("fn", "takes_rho", "rho_mode"))
def _verify_position(key, drafts_K, p_V, q_V, valid_K, rho_value, *, fn, takes_rho, rho_mode):
  verdict = _bind_rho(fn, takes_rho, rho_mode, rho_value)(key, drafts_K, p_V, q_V, valid_K)
  return verdict.token, verdict.accepted


def speculative_sampling(key, draft, p_V, q_V):
  """Single-draft speculative sampling.

  Accepts `draft` ~ p with probability min(1, q/p); otherwise draws from the residual
  (q - min(p, q)) / (1 - sum min(p, q)). The output is distributed as q.

  Args:
    key: PRNG key.
    draft: int token drawn from p_V.
    p_V: draft distribution. q_V: target distribution.

  Returns:
    (token, accepted): int32 token ~ q and whether the draft was accepted.
  """
  drafts_K = jnp.reshape(jnp.asarray(draft, jnp.int32), (1,))
  _check_position(drafts_K, p_V, q_V)
  return _verify_position(
    key, drafts_K, p_V, q_V, jnp.ones((1,), bool), jnp.float32(0.0), fn=sd_verdict,
    takes_rho=False, rho_mode="k",
  )  # fmt: skip


def kseq(key, drafts_K, p_V, q_V, *, valid_K=None, rho="star"):
  """K-SEQ (SpecTr) verification of the valid drafts at one position.

  With k valid drafts and split factor rho: try the drafts in order, accepting X_i with
  probability min(1, q(X_i) / (rho p(X_i))); if all are rejected, draw from the residual
  q - A, clipped at 0 and normalised by its own sum, where A = P_A / beta * min(p, q/rho).
  The output is distributed as q whenever rho is valid (rho* and k always are).

  Args:
    key: PRNG key.
    drafts_K: int drafts, i.i.d. from p_V.
    p_V, q_V: draft and target distributions.
    valid_K: optional bool mask; k = number of valid drafts (0 means: sample q).
    rho: "star" (rho*), "k" (rho = k) or a number (fixed split factor, clipped to [1, k];
      it may be invalid for some (p, q, k): see `acceptance.kseq_acceptance`).

  Returns:
    (token, accepted): int32 token and whether it came from the accept branch.
  """
  _check_position(drafts_K, p_V, q_V)
  valid_K = _as_valid(valid_K, drafts_K.shape[0])
  rho_mode, rho_value = acceptance.split_rho(rho)
  return _verify_position(
    key, drafts_K, p_V, q_V, valid_K, rho_value, fn=kseq_verdict, takes_rho=True,
    rho_mode=rho_mode,
  )  # fmt: skip


def specinfer(key, drafts_K, p_V, q_V, *, valid_K=None):
  """SpecInfer's multi-step speculative sampling of the valid drafts at one position.

  The target starts at r = q; draft X_i is accepted with probability min(1, r(X_i)/p(X_i));
  after a rejection r becomes norm(max(r - p, 0)). If every draft is rejected, the output
  is drawn from the last r. The output is distributed as q.

  Args and Returns: as `kseq`, without rho.
  """
  _check_position(drafts_K, p_V, q_V)
  valid_K = _as_valid(valid_K, drafts_K.shape[0])
  return _verify_position(
    key, drafts_K, p_V, q_V, valid_K, jnp.float32(0.0), fn=specinfer_verdict, takes_rho=False,
    rho_mode="k",
  )  # fmt: skip


def rrs(key, drafts_K, p_V, q_V, *, valid_K=None):
  """Recursive rejection sampling without replacement of the valid drafts at one position
  (see `rrs_verdict`).

  The drafts must be distinct tokens drawn without replacement from p_V in their order
  (`drafting.distinct_tokens`); on i.i.d. drafts the output law is not q. A repeated
  token counts as an invalid draft. The output is distributed as q.

  Args and Returns: as `kseq`, without rho.
  """
  _check_position(drafts_K, p_V, q_V)
  valid_K = _as_valid(valid_K, drafts_K.shape[0])
  return _verify_position(
    key, drafts_K, p_V, q_V, valid_K, jnp.float32(0.0), fn=rrs_verdict, takes_rho=False,
    rho_mode="k",
  )  # fmt: skip


class WalkStats(NamedTuple):
  """Per-position diagnostics of one walk (index t = 0..L; t = L is the bonus).

  Positions at or beyond `num_tokens` hold False / 0.

  hit_L1: the emitted token equals a surviving draft (the walk continues).
  accepted_L1: the token came from the accept branch.
  survivors_L1: number of drafts verified at that position (0 for the bonus draw).
  rho_L1: split factor used (K-SEQ only; 1 for "sd", 0 for methods without one).
  overshoot_L1: the accept branch's overshoot of q there (`Verdict`): 0 where the
    verifier is exact; > 0 marks a position whose output law is not q.
  """

  hit_L1: jax.Array
  accepted_L1: jax.Array
  survivors_L1: jax.Array
  rho_L1: jax.Array
  overshoot_L1: jax.Array


def walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, rho_value, verifier=None, rho_mode: str = "star",
         length=None, *, method: str | None = None):  # fmt: skip
  """Verifies one block of K draft paths with a registered method (inside jit; no input
  checks: `methods.verify_drafts` checks them).

  Token-level methods run `walk_positions`: a fixed-trip `lax.scan` over the L + 1
  positions, K-SEQ's rho* computed for the whole block first (`rho_star_KxL`).
  Block-level methods decide at once. A method without drafts samples q at t = 0.

  Args:
    key: PRNG key; position t uses fold_in(key, t).
    drafts_KxL: int draft tokens. p_KxLxV: draft distributions, p[i, t] = p(. | h,
      d_i[:t]). q_KxL1xV: target distributions, q[i, t] = q(. | h, d_i[:t]).
    rho_value: float32 scalar, the fixed split factor (read when rho_mode is "fixed").
    verifier: the method's `methods.Method` record.
    rho_mode: "star", "k" or "fixed" (`acceptance.split_rho`).
    length: verify only positions t < length of each draft, a scalar or one per draft
      [K] (`walk_positions`); None: L. Block-level methods take it where their record
      says `takes_length`.
    method: deprecated: the method's name (pass its record as `verifier`).

  Returns:
    (tokens_L1, num_tokens, WalkStats).
  """
  if isinstance(verifier, str) or method is not None:
    warnings.warn(
      "verify.walk with a method's name is deprecated: pass its record, methods.get(name)",
      DeprecationWarning, stacklevel=2,
    )  # fmt: skip
    verifier = _REGISTRY["get"](method or verifier)
  if isinstance(verifier.verify, str):  # the deprecated "module:function" form, imported
    module, _, name = verifier.verify.partition(":")
    verify_fn = getattr(importlib.import_module(module), name)
    verifier = dataclasses.replace(verifier, verify=verify_fn)
  if verifier.level == "none":
    return _sample_target(key, q_KxL1xV)
  if verifier.level == "block":
    fn = verifier.verify
    if length is not None:
      if not verifier.takes_length:
        raise ValueError(f"method {verifier.name!r} verifies whole blocks: it takes no length")
      fn = functools.partial(fn, length_K=_per_draft(length, drafts_KxL))
    return _block_walk(fn, key, drafts_KxL, p_KxLxV, q_KxL1xV)
  if verifier.takes_rho and rho_mode == "star":
    # K-SEQ's rho* for the whole block; each position reads its own as a fixed rho.
    rho_KxL = rho_star_KxL(drafts_KxL, p_KxLxV, q_KxL1xV)
    if length is not None:  # beyond the length p may be 0: its rho* is never used
      held_KxL = jnp.arange(drafts_KxL.shape[1]) < _per_draft(length, drafts_KxL)[:, None]
      rho_KxL = jnp.where(held_KxL, rho_KxL, 1.0)

    def verifier_at(rep, t_draft):
      return _bind_rho(verifier.verify, True, "fixed", rho_KxL[rep, t_draft])
  else:
    fixed = _bind_rho(verifier.verify, verifier.takes_rho, rho_mode, rho_value)

    def verifier_at(rep, t_draft):
      return fixed

  return walk_positions(verifier_at, key, drafts_KxL, p_KxLxV, q_KxL1xV, length)


def _sample_target(key, q_KxL1xV):
  """One token from q after the prefix: a round without drafts."""
  token = categorical(key, q_KxL1xV[0, 0])
  zeros_1 = jnp.zeros((1,), bool)
  stats = WalkStats(zeros_1, zeros_1, zeros_1.astype(jnp.int32), jnp.zeros(1), jnp.zeros(1))
  return token[None], jnp.int32(1), stats


# The registry's calls that the deprecated forms naming a method need. `spectr_jax.methods`
# installs them when it is imported: it imports this module, never the other way round.
_REGISTRY: dict[str, Callable] = {}


def install_registry(get: Callable, verify_drafts: Callable) -> None:
  """Called by `spectr_jax.methods` on import: `get(name)` -> record, and `verify_drafts`."""
  _REGISTRY.update(get=get, verify_drafts=verify_drafts)


def _per_draft(length, drafts_KxL) -> jax.Array:
  """A length (scalar or [K]) as one per draft, int32 [K]."""
  return jnp.broadcast_to(jnp.asarray(length, jnp.int32), drafts_KxL.shape[:1])


def walk_positions(verifier_at: Callable, key, drafts_KxL, p_KxLxV, q_KxL1xV, length=None):
  """The token-level walk of `walk` for any verify function: position t runs
  verifier_at(rep, t)(fold_in(key, t), drafts_K, p_V, q_V, valid_K) (-> `Verdict`;
  rep is the first surviving draft, whose p and q every survivor shares), the drafts
  equal to the emitted token survive, and after a miss the walk stops; at t = L no draft
  is valid and the function draws the bonus from q. Used by the engine (through `walk`)
  and by `spectr_jax.testing.check_verifier` for functions outside the registry.

  `length` (int, a scalar or one per draft [K], may be traced; default L) verifies only
  positions t < length of each draft, as if it ended there: a draft is valid at t only
  within its length, and where no surviving draft is, the bonus comes from q after the
  t tokens (`spectr_jax.adaptive`: exact when a draft's length at t is decided from the
  tokens before t and from draws independent of its own).

  Returns:
    (tokens_L1, num_tokens, WalkStats).
  """
  num_drafts, draft_len = drafts_KxL.shape
  length_K = _per_draft(draft_len if length is None else length, drafts_KxL)
  # The position keys fold_in(key, t), drawn in one batched call before the loop.
  keys_L1 = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(draft_len + 1))

  def step(carry, t):
    (live, alive_K), outs = carry  # live: the walk reaches position t.
    # Surviving drafts agree on all earlier tokens, so they share p and q at t (p read
    # from one whose length reaches t).
    valid_K = alive_K & (t < length_K)
    rep = jnp.argmax(jnp.where(jnp.any(valid_K), valid_K, alive_K))
    t_draft = jnp.minimum(t, draft_len - 1)
    q_V = q_KxL1xV[rep, t]
    # Past every survivor's length (at t = L always) the verifier draws the bonus from q.
    p_V = jnp.where(jnp.any(valid_K), p_KxLxV[rep, t_draft], q_V)
    x_K = drafts_KxL[:, t_draft]
    verdict = verifier_at(rep, t_draft)(keys_L1[t], x_K, p_V, q_V, valid_K)
    match_K = valid_K & (x_K == verdict.token)
    hit = jnp.any(match_K)
    out = (
      jnp.where(live, verdict.token, 0),
      live & hit,
      live & verdict.accepted,
      jnp.where(live, jnp.sum(valid_K), 0),
      jnp.where(live, verdict.rho, 0.0),
      jnp.where(live, verdict.overshoot, 0.0),
    )
    # Position t's outputs written by a select over the L + 1 slots rather than as the
    # scan's stacked outputs: XLA:GPU turns those tiny in-place updates into copy thunks
    # that keep the round out of its CUDA graph (docs/ACCELERATORS.md).
    at_L1 = jnp.arange(draft_len + 1) == t
    outs = tuple(jnp.where(at_L1, o, acc) for o, acc in zip(out, outs, strict=True))
    # After a miss no draft survives: the masked positions verify none (cheap).
    return ((live & hit, match_K), outs), None

  slots_L1 = jnp.zeros((draft_len + 1,))
  init = (
    (jnp.bool_(True), jnp.ones((num_drafts,), bool)),
    (slots_L1.astype(drafts_KxL.dtype), slots_L1.astype(bool), slots_L1.astype(bool),
     slots_L1.astype(jnp.int32), slots_L1, slots_L1),
  )  # fmt: skip
  (_, outs), _ = loops.scan(step, init, jnp.arange(draft_len + 1))
  tokens_L1, hit_L1, accepted_L1, survivors_L1, rho_L1, overshoot_L1 = outs
  # The walk emits a token at position 0 and one more after every hit.
  num_tokens = 1 + jnp.sum(hit_L1).astype(jnp.int32)
  stats = WalkStats(hit_L1, accepted_L1, survivors_L1.astype(jnp.int32), rho_L1, overshoot_L1)
  return tokens_L1.astype(jnp.int32), num_tokens, stats


def rho_star_KxL(drafts_KxL, p_KxLxV, q_KxL1xV):
  """K-SEQ's rho* at every (draft i, position t) where the walk can verify two or more
  drafts with i as its representative, as one batched computation; 1 elsewhere.

  If the walk reaches position t with representative i (the first surviving draft), the
  survivors are the drafts that share i's t-prefix, so k, p[i, t] and q[i, t] are known
  before the walk. At each t at most K // 2 drafts are the first of a prefix class with
  k >= 2 (each such class has two members or more), so L (K // 2) rows are solved
  (`acceptance.rho_star`, vmapped), not K L.
  """
  num_drafts, draft_len = drafts_KxL.shape
  rho_KxL = jnp.ones((num_drafts, draft_len), jnp.float32)
  slots = num_drafts // 2
  if slots == 0:
    return rho_KxL
  # agree_KxKxL[i, j, t]: drafts i and j share their t-prefix.
  same_KxKxL = (drafts_KxL[:, None, :] == drafts_KxL[None, :, :]).astype(jnp.int32)
  shifted_KxKxL = jnp.concatenate([jnp.ones_like(same_KxKxL[..., :1]), same_KxKxL[..., :-1]], -1)
  agree_KxKxL = jnp.cumprod(shifted_KxKxL, axis=2).astype(bool)
  k_KxL = jnp.sum(agree_KxKxL, axis=1)
  earlier_KxK = jnp.tril(jnp.ones((num_drafts, num_drafts), bool), -1)  # [i, j]: j < i
  solve_KxL = ~jnp.any(agree_KxKxL & earlier_KxK[..., None], axis=1) & (k_KxL >= 2)
  # At each t the drafts to solve come first (a stable sort keeps the others after them).
  draft_X = jnp.argsort(~solve_KxL.T, axis=1, stable=True)[:, :slots].ravel()
  t_X = jnp.repeat(jnp.arange(draft_len), slots)
  rho_X = jax.vmap(acceptance.rho_star)(
    p_KxLxV[draft_X, t_X], q_KxL1xV[draft_X, t_X], k_KxL[draft_X, t_X]
  )
  return rho_KxL.at[draft_X, t_X].set(jnp.where(solve_KxL[draft_X, t_X], rho_X, 1.0))


def _block_walk(verify_fn, key, drafts_KxL, p_KxLxV, q_KxL1xV):
  """A block-level verifier with the walk's return values: positions before the stopping
  point tau = num_tokens - 1 count as hit and accepted; tau holds the correction (or bonus)
  draw; survivors are the paths agreeing with the verified path there."""
  tokens_L1, num_tokens, survivors_L1 = verify_fn(key, drafts_KxL, p_KxLxV, q_KxL1xV)
  index_L1 = jnp.arange(drafts_KxL.shape[1] + 1)
  accepted_L1 = index_L1 < num_tokens - 1
  survivors_L1 = jnp.where(index_L1 < num_tokens, survivors_L1, 0)
  zeros_L1 = jnp.zeros(index_L1.shape)
  stats = WalkStats(accepted_L1, accepted_L1, survivors_L1, zeros_L1, zeros_L1)
  return tokens_L1, num_tokens, stats


def check_method(method: str, num_drafts: int) -> None:
  """Deprecated: `methods.get(method).check_drafts(num_drafts)`."""
  warnings.warn(
    "verify.check_method is deprecated: use methods.get(method).check_drafts(K)",
    DeprecationWarning, stacklevel=2,
  )  # fmt: skip
  record = _REGISTRY["get"](method)
  if not record.speculative:
    raise ValueError(f"method {method!r} verifies no drafts")
  record.check_drafts(num_drafts)


def verify_block(key, drafts_KxL, p_KxLxV, q_KxL1xV, **kwargs):
  """Deprecated name of `methods.verify_drafts` (the same arguments)."""
  warnings.warn(
    "verify.verify_block is deprecated: use spectr_jax.methods.verify_drafts",
    DeprecationWarning, stacklevel=2,
  )  # fmt: skip
  return _REGISTRY["verify_drafts"](key, drafts_KxL, p_KxLxV, q_KxL1xV, **kwargs)


_RENAMED = {
  "BlockStats": "WalkStats",
  "sd_position": "sd_verdict",
  "kseq_position": "kseq_verdict",
  "specinfer_position": "specinfer_verdict",
  "rrs_position": "rrs_verdict",
}


def __getattr__(name: str):
  if name in _RENAMED:
    warnings.warn(
      f"verify.{name} is deprecated: use verify.{_RENAMED[name]}", DeprecationWarning,
      stacklevel=2,
    )  # fmt: skip
    return globals()[_RENAMED[name]]
  raise AttributeError(f"module 'spectr_jax.verify' has no attribute {name!r}")
