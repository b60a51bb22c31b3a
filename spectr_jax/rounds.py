"""One decoding round of `spectr_jax.engine`, for every row of the batch at once.

`run_round` reads the `plan.DecodePlan` as a straight line: draft (the plan's drafter on
the draft model), choose each path's length (its length policy), score (one target call
on tails or on their tree), verify (`verify.walk` per row), emit and commit the accepted
tokens to both caches. `init_state` prefills the caches. Everything runs inside the
engine's jitted `lax.while_loop`; the plan is static, `plan.Traced` holds the traced
settings. The models are reached through the decoder protocol only
(`spectr_jax.models.decoder`), whatever their family.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax import sharding, verify
from spectr_jax.drafting import Drafts
from spectr_jax.models import Decoder, KVCache
from spectr_jax.plan import DecodePlan, Traced
from spectr_jax.scoring import Scored
from spectr_jax.verdict import OVERSHOOT_TOL

__all__ = ["DecodeStats", "State", "draw", "init_state", "run_round", "score", "walk"]


@struct.dataclass
class DecodeStats:
  """Per-row statistics (B leading); tokens cut by the token limit or EOS are not counted.

  rounds_B: rounds run (= target calls, the prefill excluded).
  draft_calls_B: draft model calls (L per round; with `adaptive`, the batch's longest
    length).
  emitted_B: tokens emitted.
  tokens_per_round_BxL2: histogram of tokens emitted per round (index 0..L+1).
  reached_BxL1: rounds whose walk reached position t (t = L is the bonus draw).
  hits_BxL1: ... where the token at t equalled a surviving draft.
  accepted_BxL1: ... where the token at t came from the accept branch.
  survivors_BxL1: sum over rounds of the number of drafts verified at t.
  invalid_BxL1: ... where the verifier was not exact: its accept branch overshot q by
    more than `methods.OVERSHOOT_TOL` (a fixed rho below what the position needs).
  overshoot_BxL1: sum over rounds of that overshoot mass at t.
  nonfinite_B: rounds stopped by non-finite draft or target logits (the row ends there).
  nonfinite_draft_B: ... of which the draft's logits were non-finite (else the target's).
  nodes_B: distinct draft prefixes the target scored, summed over rounds (K * (L + 1)
    per round for tails; the nodes of the round's token tree with `tree`).
  positions_B: target positions computed, summed over rounds (K * (L + 1) for tails; the
    compiled tree size a round used with `tree`).
  draft_positions_B: draft positions computed, summed over rounds (K * (L + 1) for tails:
    two pending tokens, then L - 1 steps; with `tree`, the pending tokens once and a
    static tree's nodes once each: `drafting`; with `adaptive`, K (m + 1) for the
    batch's longest length m).
  lengths_BxL1: histogram of the positions a round verified on its longest path (index
    1..L; every round at L unless `adaptive` or `node_budget`; index 0 for rounds
    without drafts). With `node_budget`, nodes_B - rounds_B counts the drafted nodes
    verified (the budget spent).
  """

  rounds_B: jax.Array
  draft_calls_B: jax.Array
  emitted_B: jax.Array
  tokens_per_round_BxL2: jax.Array
  reached_BxL1: jax.Array
  hits_BxL1: jax.Array
  accepted_BxL1: jax.Array
  survivors_BxL1: jax.Array
  invalid_BxL1: jax.Array
  overshoot_BxL1: jax.Array
  nonfinite_B: jax.Array
  nonfinite_draft_B: jax.Array
  nodes_B: jax.Array
  positions_B: jax.Array
  draft_positions_B: jax.Array
  lengths_BxL1: jax.Array

  @property
  def block_efficiency(self) -> jax.Array:
    """Emitted tokens per target call over the whole batch (autoregressive = 1)."""
    return jnp.sum(self.emitted_B) / jnp.maximum(jnp.sum(self.rounds_B), 1)


@struct.dataclass
class State:
  """The decoding state carried by the engine's while_loop (B rows, W = T + L + 1 slots
  of output, where T is max_new_tokens)."""

  rounds_B: jax.Array
  done_B: jax.Array
  last_B: jax.Array
  pending_Bx2: jax.Array
  num_pending_B: jax.Array
  out_BxW: jax.Array
  num_out_B: jax.Array
  target_cache: KVCache
  draft_cache: KVCache | None
  stats: DecodeStats


def _token_limit(plan: DecodePlan, traced: Traced) -> jax.Array:
  return jnp.minimum(traced.token_limit, plan.max_new_tokens)


class _Emitted(NamedTuple):
  live_B: jax.Array
  emit_B: jax.Array
  first_eos_B: jax.Array


def _emit(plan: DecodePlan, state: State, tokens_BxL1, num_B, bad_B, traced) -> _Emitted:
  """How many of a round's tokens each row emits: stop after the first EOS and at the
  token budget; rows that are done or hit non-finite logits emit nothing."""
  w = plan.round_width
  is_eos_BxL1 = jnp.any(tokens_BxL1[..., None] == traced.eos_ids, axis=-1)
  eos_BxL1 = is_eos_BxL1 & (jnp.arange(w) < num_B[:, None])
  first_eos_B = jnp.where(jnp.any(eos_BxL1, axis=1), jnp.argmax(eos_BxL1, axis=1), w)
  left_B = _token_limit(plan, traced) - state.num_out_B
  emit_B = jnp.minimum(jnp.minimum(num_B, first_eos_B + 1), left_B)
  live_B = ~state.done_B & ~bad_B
  return _Emitted(live_B, jnp.where(live_B, emit_B, 0), first_eos_B)


def _survivor(drafts_BxKxL, tokens_BxL1, num_B):
  """The first path of each row that agrees with the emitted tokens (any survivor: they
  agree on every emitted token), int32 [B]."""
  draft_len = drafts_BxKxL.shape[2]
  agree_BxK = jnp.all(
    (drafts_BxKxL == tokens_BxL1[:, None, :draft_len])
    | (jnp.arange(draft_len) >= num_B[:, None, None] - 1),
    axis=2,
  )
  return jnp.argmax(agree_BxK, axis=1)


def _count(plan: DecodePlan, s: DecodeStats, emitted: _Emitted, walked: verify.WalkStats,
           bad_B, draft_bad_B, active_B, scored: Scored, draft_positions, draft_calls,
           length_B) -> DecodeStats:  # fmt: skip
  """The statistics after a round (see `DecodeStats`)."""
  live_B, emit_B = emitted.live_B, emitted.emit_B
  counted_BxL1 = live_B[:, None] & (jnp.arange(plan.round_width) < emit_B[:, None])
  return DecodeStats(
    rounds_B=s.rounds_B + live_B,
    draft_calls_B=s.draft_calls_B + live_B * draft_calls,
    emitted_B=s.emitted_B + emit_B,
    tokens_per_round_BxL2=s.tokens_per_round_BxL2
    + (live_B[:, None] & (jnp.arange(plan.round_width + 1) == emit_B[:, None])),
    reached_BxL1=s.reached_BxL1 + counted_BxL1,
    hits_BxL1=s.hits_BxL1 + (counted_BxL1 & walked.hit_L1),
    accepted_BxL1=s.accepted_BxL1 + (counted_BxL1 & walked.accepted_L1),
    survivors_BxL1=s.survivors_BxL1 + jnp.where(counted_BxL1, walked.survivors_L1, 0),
    invalid_BxL1=s.invalid_BxL1 + (counted_BxL1 & (walked.overshoot_L1 > OVERSHOOT_TOL)),
    overshoot_BxL1=s.overshoot_BxL1 + jnp.where(counted_BxL1, walked.overshoot_L1, 0.0),
    nonfinite_B=s.nonfinite_B + (active_B & bad_B),
    nonfinite_draft_B=s.nonfinite_draft_B + (active_B & draft_bad_B),
    nodes_B=s.nodes_B + jnp.where(live_B, scored.nodes_B, 0),
    positions_B=s.positions_B + jnp.where(live_B, scored.positions, 0),
    draft_positions_B=s.draft_positions_B + jnp.where(live_B, draft_positions, 0),
    lengths_BxL1=s.lengths_BxL1
    + (live_B[:, None] & (jnp.arange(plan.round_width) == length_B[:, None])),
  )


def _keys(row_key_B, rounds_B):
  """(draft_key_B, verify_key_B): fold_in(round key, 0) and fold_in(round key, 1), the
  round key fold_in(row key, round), in one batched call."""
  round_key_B = jax.vmap(jax.random.fold_in)(row_key_B, rounds_B)
  fold = jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)), (0, None))
  key_Bx2 = fold(round_key_B, jnp.arange(2))
  return key_Bx2[:, 0], key_Bx2[:, 1]


def draw(plan: DecodePlan, params, cache, state: State, key_B, traced: Traced) -> Drafts:
  """The round's drafts (`drafting.Drafts`): the plan's drafter on the draft model, each
  shared prefix computed once when the target scores a tree, stopping early where the
  length policy says."""
  return plan.drafter.draft(
    plan.draft, params, cache, state.pending_Bx2, state.num_pending_B, key_B,
    lambda logits: plan.probs(logits, traced), num_drafts=plan.num_drafts,
    draft_len=plan.draft_len, share_prefixes=plan.scoring.shares_prefixes,
    stop=plan.length.stop_drafting(traced.length),
  )  # fmt: skip


def score(plan: DecodePlan, params, cache, last_B, drafts_BxKxL, traced: Traced,
          length_BxK=None) -> Scored:  # fmt: skip
  """The target's call on the drafts (`scoring.Scored`), each path to length_BxK where
  given (ragged lengths), with the target's features where the draft reads them."""
  probs = lambda logits: plan.probs(logits, traced)  # noqa: E731
  return plan.scoring.score(
    plan.target, params, cache, last_B, drafts_BxKxL, probs, length_BxK, plan.features
  )


def walk(plan: DecodePlan, key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, traced: Traced,
           length_BxK=None):  # fmt: skip
  """`verify.walk` per row, path k of row b verified to length_BxK[b, k] where given:
  (tokens_BxL1, num_B, verify.WalkStats)."""

  def row(key, drafts_KxL, p_KxLxV, q_KxL1xV, length_K):
    return verify.walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, traced.rho_value, plan.verifier,
                       plan.rho_mode, length_K)  # fmt: skip

  lengths = None if length_BxK is None else 0
  return jax.vmap(row, in_axes=(0, 0, 0, 0, lengths))(
    key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, length_BxK
  )


def run_round(plan: DecodePlan, draft_params, target_params, row_key_B, state: State,
              traced: Traced) -> State:  # fmt: skip
  """One round for every row: draft, choose lengths, score, verify, emit and commit.

  Args:
    plan: the static plan (`plan.resolve`).
    draft_params, target_params: the models' parameters (draft None without drafts).
    row_key_B: one PRNG key per row; round r uses fold_in(row key, r).
    state: the decoding state.
    traced: the traced settings.

  Returns:
    The state after the round.
  """
  active_B = ~state.done_B
  with jax.named_scope("keys"):
    draft_key_B, verify_key_B = _keys(row_key_B, state.rounds_B)
  with jax.named_scope("draft"):
    drafts = draw(plan, draft_params, state.draft_cache, state, draft_key_B, traced)
    lengths = plan.length.lengths(drafts.tokens_BxKxL, drafts.p_BxKxLxV, traced.length, active_B)
  with jax.named_scope("score"):
    scored = score(
      plan, target_params, state.target_cache, state.last_B, drafts.tokens_BxKxL, traced,
      lengths.ragged_BxK,
    )  # fmt: skip
  bad_B = drafts.nonfinite_B | scored.nonfinite_B
  with jax.named_scope("verify"):
    tokens_BxL1, num_B, walked = walk(
      plan, verify_key_B, drafts.tokens_BxKxL, drafts.p_BxKxLxV, scored.q_BxKxL1xV, traced,
      lengths.ragged_BxK,
    )  # fmt: skip
  with jax.named_scope("commit"):
    emitted = _emit(plan, state, tokens_BxL1, num_B, bad_B, traced)
    out_BxW = jax.vmap(lambda out, new, at: jax.lax.dynamic_update_slice(out, new, (at,)))(
      state.out_BxW, tokens_BxL1, state.num_out_B
    )
    num_out_B = state.num_out_B + emitted.emit_B
    ended_B = emitted.live_B & (emitted.first_eos_B < emitted.emit_B)
    done_B = state.done_B | bad_B | ended_B | (num_out_B >= _token_limit(plan, traced))
    live_B = emitted.live_B
    tail_B = _survivor(drafts.tokens_BxKxL, tokens_BxL1, num_B)
    length_B = jnp.take_along_axis(lengths.all_BxK, tail_B[:, None], 1)[:, 0]
    target_cache = plan.scoring.commit(
      plan.target, scored.cache, tail_B, scored.path_node_BxKxL1, jnp.where(live_B, num_B, 0)
    )
    last_B = jnp.where(
      live_B, jnp.take_along_axis(tokens_BxL1, (num_B - 1)[:, None], 1)[:, 0], state.last_B
    )
    draft_cache, pending_Bx2, num_pending_B = plan.drafter.commit(
      plan.draft, drafts.cache, tail_B, tokens_BxL1, num_B, length_B, last_B, live_B,
      state.pending_Bx2, state.num_pending_B, scored.features_BxKxL1xD,
    )  # fmt: skip
  with jax.named_scope("stats"):
    stats = _count(
      plan, state.stats, emitted, walked, bad_B, drafts.nonfinite_B, active_B, scored,
      drafts.positions, plan.length.draft_calls(lengths.all_BxK, plan.draft_len),
      jnp.max(lengths.all_BxK, axis=1),
    )  # fmt: skip
  return State(
    rounds_B=state.rounds_B + active_B,
    done_B=done_B,
    last_B=last_B,
    pending_Bx2=pending_Bx2,
    num_pending_B=num_pending_B,
    out_BxW=out_BxW,
    num_out_B=num_out_B,
    target_cache=target_cache,
    draft_cache=draft_cache,
    stats=stats,
  )


def init_state(plan: DecodePlan, draft_params, target_params, prompts_BxP, lengths_B) -> State:
  """The state after prefilling both caches with the prompts (B x P, right-padded; each
  row's length in lengths_B)."""
  b, width = prompts_BxP.shape
  w = plan.round_width
  cache_len = width + plan.max_new_tokens + w

  def prefill(model: Decoder, params, num_tails, tail_capacity=w, **features):
    cache = model.init_cache(b, num_tails, tail_capacity, cache_len)
    cache = sharding.constrain_cache(cache)
    *out, cache = model.prefill(params, prompts_BxP, lengths_B - 1, cache, **features)
    return out[1:], cache

  last_B = jnp.take_along_axis(prompts_BxP, (lengths_B - 1)[:, None], 1)[:, 0]
  target_tails = plan.scoring.cache_tails(plan.num_drafts, plan.draft_len)
  # The target's prompt features, where the draft reads them (a head).
  feature, target_cache = prefill(
    plan.target, target_params, *target_tails, return_features=plan.features
  )
  reads = dict(features_BxPxD=feature[0]) if feature else {}
  draft_cache = plan.drafter.prefill(
    lambda: prefill(plan.draft, draft_params, plan.num_drafts, **reads)[1]
  )
  zeros_B = jnp.zeros((b,), jnp.int32)
  zeros_BxL1 = jnp.zeros((b, w), jnp.int32)
  return State(
    rounds_B=zeros_B,
    done_B=jnp.zeros((b,), bool),
    last_B=last_B,
    pending_Bx2=jnp.stack([last_B, zeros_B], axis=1),
    num_pending_B=jnp.ones((b,), jnp.int32),
    out_BxW=jnp.zeros((b, plan.max_new_tokens + w), jnp.int32),
    num_out_B=zeros_B,
    target_cache=target_cache,
    draft_cache=draft_cache,
    stats=DecodeStats(
      rounds_B=zeros_B,
      draft_calls_B=zeros_B,
      emitted_B=zeros_B,
      tokens_per_round_BxL2=jnp.zeros((b, w + 1), jnp.int32),
      reached_BxL1=zeros_BxL1,
      hits_BxL1=zeros_BxL1,
      accepted_BxL1=zeros_BxL1,
      survivors_BxL1=zeros_BxL1,
      invalid_BxL1=zeros_BxL1,
      overshoot_BxL1=jnp.zeros((b, w), jnp.float32),
      nonfinite_B=zeros_B,
      nonfinite_draft_B=zeros_B,
      nodes_B=zeros_B,
      positions_B=zeros_B,
      draft_positions_B=zeros_B,
      lengths_BxL1=zeros_BxL1,
    ),
  )
