"""The pieces of one decoding round of `spectr_jax.engine` (public for benchmarks).

A round, for every row of the batch at once: `draft` (K sequences of L tokens from the
draft model under `lax.scan`, keeping the distributions p; with a tree, each distinct
prefix computed once per depth), `score` (one target call on all K x (L + 1) positions,
or on the distinct prefixes of their token tree, giving q),
`verify_rows` (the block walk of `verify.walk` per row) and the commit of the accepted
tokens to both caches (`run_round` runs all of them).
`init_state` prefills the caches. Everything here runs inside the engine's jitted
`lax.while_loop`; `RoundSpec` is static, `Traced` holds the traced settings. The models
are reached through the decoder protocol only (`spectr_jax.models.decoder`: init_cache,
prefill, extend (and take_tails) or extend_tree, commit or commit_nodes), whatever their
family.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from spectr_jax import adaptive, methods, sampling, sharding, tree, verify
from spectr_jax.models import Decoder, KVCache, ModelConfig, ancestor_mask, decoder


@dataclasses.dataclass(frozen=True)
class RoundSpec:
  """Everything that fixes the compiled program (static under jit; `engine.round_spec`
  makes it from a `config.DecodeSpec` and the models' configs)."""

  method: str
  num_drafts: int
  draft_len: int
  max_new_tokens: int
  top_k: int | None
  use_top_p: bool
  rho_mode: str
  draft_config: ModelConfig | None
  target_config: ModelConfig
  dedup: bool = False
  # A tree's children per depth, or drafting.PROPORTIONAL (`drafting.without_replacement`).
  branching: tuple[int, ...] | str | None = None
  # Greedy decoding (one-hot on the argmax) rather than sampling at `Traced.temperature`.
  greedy: bool = False
  # The models' layer stacks under lax.scan (True, parameters stacked) or unrolled (False,
  # parameters split per layer); None: scan deep models (`models.layout.scans`). The
  # engine lays the parameters out so (the decoders run the layout they are given).
  scan_layers: bool | None = None
  # The drafting scheme (a name in `methods.DRAFTING`); "": the method's default.
  drafting: str = ""
  # Adaptive draft length (`spectr_jax.adaptive`; its threshold is `Traced.threshold`):
  # each row verifies its confident length, drafting stops at the batch's longest and the
  # target scores a bucket of lengths (`adaptive.length_buckets`).
  adaptive: bool = False
  # The batch's tree budget (`adaptive.budget_nodes`; nodes per row: `Traced.node_budget`):
  # the default "wor" tree drafted whole, each path verified and scored to its kept depth.
  node_budget: bool = False

  @property
  def scores_tree(self) -> bool:
    """Whether the target scores the round's deduplicated token tree (`spectr_jax.tree`)
    instead of K tails (only rounds with drafts have a tree)."""
    return self.dedup and self.draft_len > 0

  @property
  def round_width(self) -> int:
    """L + 1: the most tokens one round can emit."""
    return self.draft_len + 1

  @property
  def draft(self) -> Decoder:
    """The draft model's decoder (L > 0)."""
    return decoder(self.draft_config)

  @property
  def target(self) -> Decoder:
    """The target model's decoder."""
    return decoder(self.target_config)


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


class Traced(NamedTuple):
  """The settings that are traced (a sweep changes them without recompiling; greedy or
  sampling is static: `RoundSpec.greedy`)."""

  temperature: jax.Array
  top_p: jax.Array
  rho_value: jax.Array
  eos_ids: jax.Array  # int32 [A] stop tokens (-1: none)
  # Tokens a row emits at most (int32; never more than RoundSpec.max_new_tokens).
  token_limit: jax.Array | int = 2**31 - 1
  # Adaptive draft length's threshold (float32; read only with RoundSpec.adaptive).
  threshold: jax.Array | float = 0.0
  # Drafted nodes per live row (float32; read only with RoundSpec.node_budget).
  node_budget: jax.Array | float = 0.0


def probs(spec: RoundSpec, logits_AxV, traced: Traced):
  """Sampling distributions of logits [..., V] under the spec's transforms (float32)."""
  top_p = traced.top_p if spec.use_top_p else None
  logits_AxV = sharding.replicate_over_model(logits_AxV)
  return sampling.transform_probs(
    logits_AxV, traced.temperature, top_k=spec.top_k, top_p=top_p, greedy=spec.greedy
  )


def draft(spec, params, cache, state, key_B, traced):
  """The decode's drafting scheme (`methods.scheme`) on the draft model: its
  `drafting.Drafts` (tokens_BxKxL, p_BxKxLxV, cache, nonfinite_B, positions). A round
  that scores a tree drafts it too: each prefix the scheme's draws share computed once."""
  scheme = methods.resolve(methods.scheme(spec.method, spec.drafting).draft)
  return scheme(
    spec.draft.extend,
    params,
    cache,
    state.pending_Bx2,
    state.num_pending_B,
    key_B,
    functools.partial(probs, spec, traced=traced),
    num_drafts=spec.num_drafts,
    draft_len=spec.draft_len,
    take_tails=spec.draft.take_tails if spec.scores_tree else None,
    **({} if spec.branching is None else {"branching": spec.branching}),
    **({"threshold": traced.threshold} if spec.adaptive else {}),
  )


def verify_rows(spec, key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, traced, length_BxK=None):
  """Runs the block walk per row, path k of row b verified to length_BxK[b, k] (default
  L): (tokens_BxL1, num_B, verify.BlockStats)."""
  if spec.draft_len == 0:
    tokens_B = jax.vmap(sampling.categorical)(key_B, q_BxKxL1xV[:, 0, 0])
    zeros_Bx1 = jnp.zeros((key_B.shape[0], 1), bool)
    zeros_f_Bx1 = jnp.zeros(zeros_Bx1.shape)
    stats = verify.BlockStats(
      zeros_Bx1, zeros_Bx1, zeros_Bx1.astype(jnp.int32), zeros_f_Bx1, zeros_f_Bx1
    )
    return tokens_B[:, None], jnp.ones_like(tokens_B), stats
  walk = functools.partial(
    verify.walk, rho_value=traced.rho_value, method=spec.method, rho_mode=spec.rho_mode
  )
  if length_BxK is None:
    return jax.vmap(walk)(key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV)
  return jax.vmap(lambda *a: walk(*a[:-1], length=a[-1]))(
    key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, length_BxK
  )


class Scored(NamedTuple):
  """The target's call of a round.

  q_BxKxL1xV: the target's distributions after every path prefix (transformed).
  cache: the target cache holding the scored entries.
  nonfinite_B: rows with non-finite logits.
  path_node_BxKxL1: with a tree, the node slot of path k at depth t (None for tails).
  nodes_B: the distinct prefixes scored per row (K * (L + 1) for tails).
  positions: the positions the call computed per row (the compiled tree size for trees).
  """

  q_BxKxL1xV: jax.Array
  cache: KVCache
  nonfinite_B: jax.Array
  path_node_BxKxL1: jax.Array | None
  nodes_B: jax.Array
  positions: jax.Array


def score(spec, target_params, cache: KVCache, last_B, drafts_BxKxL, traced: Traced,
          length_BxK=None) -> Scored:  # fmt: skip
  """One target call on `[last, d_1..d_L]` of every tail, or on the nodes of their tree
  (each path's first length_BxK tokens); tails with length_BxK (adaptive) on
  `[last, d_1..d_m]`, m the smallest of `adaptive.length_buckets` >= every path's length
  (one compiled call per bucket, under a data-dependent conditional; q after m is never
  read)."""
  if spec.scores_tree:
    return _score_tree(spec, target_params, cache, last_B, drafts_BxKxL, traced, length_BxK)
  b, k, length = drafts_BxKxL.shape
  last_BxKx1 = jnp.broadcast_to(last_B[:, None, None], (b, k, 1))
  tokens_BxKxL1 = jnp.concatenate([last_BxKx1, drafts_BxKxL], axis=2)

  def prefix(m):
    def run(cache):
      # A round's target call follows a commit (or the prefill): its tails are empty.
      logits, cache = spec.target.extend(
        target_params, tokens_BxKxL1[:, :, : m + 1], cache, tails_empty=True
      )
      return jnp.pad(logits, ((0, 0), (0, 0), (0, length - m), (0, 0))), cache

    return run

  if length_BxK is None:
    logits_BxKxL1xV, cache = prefix(length)(cache)
    positions = jnp.int32(k * (length + 1))
  else:
    sizes = adaptive.length_buckets(length)
    bucket = jnp.searchsorted(jnp.asarray(sizes), jnp.max(length_BxK))
    logits_BxKxL1xV, cache = jax.lax.switch(bucket, [prefix(m) for m in sizes], cache)
    positions = k * (jnp.asarray(sizes, jnp.int32)[bucket] + 1)
  bad_B = sampling.nonfinite_rows(logits_BxKxL1xV)
  nodes_B = jnp.full((b,), positions)
  return Scored(probs(spec, logits_BxKxL1xV, traced), cache, bad_B, None, nodes_B, positions)


def _score_tree(spec, target_params, cache: KVCache, last_B, drafts_BxKxL, traced: Traced,
                length_BxK=None):  # fmt: skip
  """The target on each distinct prefix once: the tree's first n nodes, n the smallest
  of `tree.node_buckets` that holds every row's tree (one compiled target call per size,
  under the round's one data-dependent conditional); each path reads q from its nodes,
  so the verifiers see the tails' q. The mask and the probabilities are computed once,
  outside the branches (a prefix of the depth-major node table is a whole tree)."""
  t = tree.from_paths(last_B, drafts_BxKxL, length_BxK)
  capacity = t.tokens_BxN.shape[1]
  sizes = tree.node_buckets(spec.num_drafts, spec.draft_len)
  visible_BxNxN = ancestor_mask(t.parent_BxN)

  def branch(n):
    def run(cache):
      logits_BxnxV, cache = spec.target.extend_tree(
        target_params, t.tokens_BxN[:, :n], t.depth_BxN[:, :n], visible_BxNxN[:, :n, :n], cache
      )
      return jnp.pad(logits_BxnxV, ((0, 0), (0, capacity - n), (0, 0))), cache

    return run

  bucket = tree.bucket_index(t.num_nodes_B, sizes)
  logits_BxNxV, cache = jax.lax.switch(bucket, [branch(n) for n in sizes], cache)
  real_BxN = jnp.arange(capacity) < t.num_nodes_B[:, None]
  bad_B = sampling.nonfinite_rows(jnp.where(real_BxN[..., None], logits_BxNxV, 0.0))
  q_BxNxV = probs(spec, logits_BxNxV, traced)
  q_BxKxL1xV = jax.vmap(lambda q_NxV, node_KxL1: q_NxV[node_KxL1])(q_BxNxV, t.path_node_BxKxL1)
  positions = jnp.asarray(sizes, jnp.int32)[bucket]
  return Scored(q_BxKxL1xV, cache, bad_B, t.path_node_BxKxL1, t.num_nodes_B, positions)


def _token_limit(spec: RoundSpec, traced: Traced) -> jax.Array:
  return jnp.minimum(traced.token_limit, spec.max_new_tokens)


class _Emitted(NamedTuple):
  live_B: jax.Array
  emit_B: jax.Array
  first_eos_B: jax.Array


def _emit(spec, state: State, tokens_BxL1, num_B, bad_B, traced) -> _Emitted:
  """How many of a round's tokens each row emits: stop after the first EOS and at the
  token budget; rows that are done or hit non-finite logits emit nothing."""
  w = spec.round_width
  is_eos_BxL1 = jnp.any(tokens_BxL1[..., None] == traced.eos_ids, axis=-1)
  eos_BxL1 = is_eos_BxL1 & (jnp.arange(w) < num_B[:, None])
  first_eos_B = jnp.where(jnp.any(eos_BxL1, axis=1), jnp.argmax(eos_BxL1, axis=1), w)
  left_B = _token_limit(spec, traced) - state.num_out_B
  emit_B = jnp.minimum(jnp.minimum(num_B, first_eos_B + 1), left_B)
  live_B = ~state.done_B & ~bad_B
  return _Emitted(live_B, jnp.where(live_B, emit_B, 0), first_eos_B)


def _commit(spec, state: State, target_cache, draft_cache, drafts_BxKxL, path_node_BxKxL1,
            tokens_BxL1, num_B, live_B, length_BxK):  # fmt: skip
  """Appends the accepted tokens of a surviving draft to both caches (any survivor: they
  agree on the emitted tokens; with a tree, the target's entries are the survivor's
  nodes): (target_cache, draft_cache, last_B, pending_Bx2, num_pending_B). A row whose
  walk accepted all the drafts its survivor verifies (length_BxK) keeps its last draft
  and the bonus pending (the draft never fed its last draft)."""
  agree_BxK = jnp.all(
    (drafts_BxKxL == tokens_BxL1[:, None, : spec.draft_len])
    | (jnp.arange(spec.draft_len) >= num_B[:, None, None] - 1),
    axis=2,
  )
  tail_B = jnp.argmax(agree_BxK, axis=1)
  length_B = jnp.take_along_axis(length_BxK, tail_B[:, None], 1)[:, 0]
  target_num_B = jnp.where(live_B, num_B, 0)
  if path_node_BxKxL1 is None:
    target_cache = spec.target.commit(target_cache, tail_B, target_num_B)
  else:
    slots_BxL1 = jnp.take_along_axis(path_node_BxKxL1, tail_B[:, None, None], axis=1)[:, 0]
    target_cache = spec.target.commit_nodes(target_cache, slots_BxL1, target_num_B)
  last_B = jnp.where(
    live_B, jnp.take_along_axis(tokens_BxL1, (num_B - 1)[:, None], 1)[:, 0], state.last_B
  )
  pending_Bx2, num_pending_B = state.pending_Bx2, state.num_pending_B
  if spec.draft_len > 0:
    seen_B = jnp.minimum(num_B - 1, length_B - 1)
    draft_cache = spec.draft.commit(
      draft_cache, tail_B, jnp.where(live_B, num_pending_B + seen_B, 0)
    )
    full_B = num_B == length_B + 1
    one_Bx2 = jnp.stack([last_B, jnp.zeros_like(last_B)], axis=1)
    ends_Bx2 = jnp.take_along_axis(tokens_BxL1, length_B[:, None] + jnp.arange(-1, 1), 1)
    new_pending_Bx2 = jnp.where(full_B[:, None], ends_Bx2, one_Bx2)
    pending_Bx2 = jnp.where(live_B[:, None], new_pending_Bx2, pending_Bx2)
    num_pending_B = jnp.where(live_B, jnp.where(full_B, 2, 1), num_pending_B)
  return target_cache, draft_cache, last_B, pending_Bx2, num_pending_B


def _count(spec, s: DecodeStats, emitted: _Emitted, block: verify.BlockStats, bad_B, draft_bad_B,
           active_B, scored: Scored, draft_positions, draft_calls, length_B):  # fmt: skip
  """The statistics after a round (see `DecodeStats`)."""
  live_B, emit_B = emitted.live_B, emitted.emit_B
  counted_BxL1 = live_B[:, None] & (jnp.arange(spec.round_width) < emit_B[:, None])
  return DecodeStats(
    rounds_B=s.rounds_B + live_B,
    draft_calls_B=s.draft_calls_B + live_B * draft_calls,
    emitted_B=s.emitted_B + emit_B,
    tokens_per_round_BxL2=s.tokens_per_round_BxL2
    + (live_B[:, None] & (jnp.arange(spec.round_width + 1) == emit_B[:, None])),
    reached_BxL1=s.reached_BxL1 + counted_BxL1,
    hits_BxL1=s.hits_BxL1 + (counted_BxL1 & block.hit_L1),
    accepted_BxL1=s.accepted_BxL1 + (counted_BxL1 & block.accepted_L1),
    survivors_BxL1=s.survivors_BxL1 + jnp.where(counted_BxL1, block.survivors_L1, 0),
    invalid_BxL1=s.invalid_BxL1 + (counted_BxL1 & (block.overshoot_L1 > methods.OVERSHOOT_TOL)),
    overshoot_BxL1=s.overshoot_BxL1 + jnp.where(counted_BxL1, block.overshoot_L1, 0.0),
    nonfinite_B=s.nonfinite_B + (active_B & bad_B),
    nonfinite_draft_B=s.nonfinite_draft_B + (active_B & draft_bad_B),
    nodes_B=s.nodes_B + jnp.where(live_B, scored.nodes_B, 0),
    positions_B=s.positions_B + jnp.where(live_B, scored.positions, 0),
    draft_positions_B=s.draft_positions_B + jnp.where(live_B, draft_positions, 0),
    lengths_BxL1=s.lengths_BxL1
    + (live_B[:, None] & (jnp.arange(spec.round_width) == length_B[:, None])),
  )


def run_round(spec, draft_params, target_params, row_key_B, state: State, traced: Traced) -> State:
  """One round for every row: draft, score, verify, emit and commit.

  Args:
    spec: the static decoding spec.
    draft_params, target_params: the models' parameters (draft None when L = 0).
    row_key_B: one PRNG key per row; round r uses fold_in(row key, r).
    state: the decoding state.
    traced: the traced settings.

  Returns:
    The state after the round.
  """
  b, k = state.last_B.shape[0], spec.num_drafts
  active_B = ~state.done_B
  with jax.named_scope("keys"):
    round_key_B = jax.vmap(jax.random.fold_in)(row_key_B, state.rounds_B)
    # fold_in(round key, 0) drafts, fold_in(round key, 1) verifies: one batched call.
    fold = jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)), (0, None))
    key_Bx2 = fold(round_key_B, jnp.arange(2))
    draft_key_B, verify_key_B = key_Bx2[:, 0], key_Bx2[:, 1]
  if spec.draft_len > 0:
    with jax.named_scope("draft"):
      drafts = draft(spec, draft_params, state.draft_cache, state, draft_key_B, traced)
    drafts_BxKxL, p_BxKxLxV, draft_cache = drafts.tokens_BxKxL, drafts.p_BxKxLxV, drafts.cache
    bad_B, draft_positions = drafts.nonfinite_B, drafts.positions
    length_BxK = jnp.full((b, k), spec.draft_len, jnp.int32)
    if spec.adaptive:
      length_B = jax.vmap(adaptive.confident_length, (0, 0, None))(
        drafts_BxKxL, p_BxKxLxV, traced.threshold
      )
      length_BxK = jnp.broadcast_to(length_B[:, None], (b, k))
    if spec.node_budget:
      length_BxK = adaptive.budget_nodes(drafts_BxKxL, p_BxKxLxV, traced.node_budget, active_B)
    # The draft ran to the batch's longest length (adaptive) or to L.
    draft_calls = jnp.max(length_BxK) if spec.adaptive else spec.draft_len
  else:
    drafts_BxKxL = jnp.zeros((b, k, 0), jnp.int32)
    p_BxKxLxV, draft_cache, bad_B = None, state.draft_cache, jnp.zeros((b,), bool)
    draft_positions = draft_calls = jnp.int32(0)
    length_BxK = jnp.zeros((b, k), jnp.int32)
  # Per-path lengths where a round verifies fewer than L positions.
  lengths = length_BxK if spec.adaptive or spec.node_budget else None
  with jax.named_scope("score"):
    scored = score(
      spec, target_params, state.target_cache, state.last_B, drafts_BxKxL, traced, lengths
    )
    q_BxKxL1xV, target_cache, target_bad_B = scored.q_BxKxL1xV, scored.cache, scored.nonfinite_B
  draft_bad_B = bad_B
  bad_B |= target_bad_B
  with jax.named_scope("verify"):
    tokens_BxL1, num_B, block = verify_rows(
      spec, verify_key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, traced, lengths
    )
  with jax.named_scope("commit"):
    emitted = _emit(spec, state, tokens_BxL1, num_B, bad_B, traced)
    out_BxW = jax.vmap(lambda out, new, at: jax.lax.dynamic_update_slice(out, new, (at,)))(
      state.out_BxW, tokens_BxL1, state.num_out_B
    )
    num_out_B = state.num_out_B + emitted.emit_B
    ended_B = emitted.live_B & (emitted.first_eos_B < emitted.emit_B)
    done_B = state.done_B | bad_B | ended_B | (num_out_B >= _token_limit(spec, traced))
    target_cache, draft_cache, last_B, pending_Bx2, num_pending_B = _commit(
      spec,
      state,
      target_cache,
      draft_cache,
      drafts_BxKxL,
      scored.path_node_BxKxL1,
      tokens_BxL1,
      num_B,
      emitted.live_B,
      length_BxK,
    )
  with jax.named_scope("stats"):
    stats = _count(
      spec, state.stats, emitted, block, bad_B, draft_bad_B, active_B, scored, draft_positions,
      draft_calls, jnp.max(length_BxK, axis=1),
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


def init_state(spec, draft_params, target_params, prompts_BxP, lengths_B) -> State:
  b, width = prompts_BxP.shape
  w = spec.round_width
  cache_len = width + spec.max_new_tokens + w

  def prefill(model: Decoder, params, num_tails, tail_capacity=w):
    cache = model.init_cache(b, num_tails, tail_capacity, cache_len)
    cache = sharding.constrain_cache(cache)
    _, cache = model.prefill(params, prompts_BxP, lengths_B - 1, cache)
    return cache

  last_B = jnp.take_along_axis(prompts_BxP, (lengths_B - 1)[:, None], 1)[:, 0]
  draft_cache = None
  if spec.draft_len > 0:
    draft_cache = prefill(spec.draft, draft_params, spec.num_drafts)
  # A tree's nodes live in one tail of N slots (docs/CACHE.md, "Token trees").
  target_tails = (spec.num_drafts,)
  if spec.scores_tree:
    target_tails = (1, tree.capacity(spec.num_drafts, spec.draft_len))
  zeros_B = jnp.zeros((b,), jnp.int32)
  zeros_BxL1 = jnp.zeros((b, w), jnp.int32)
  return State(
    rounds_B=zeros_B,
    done_B=jnp.zeros((b,), bool),
    last_B=last_B,
    pending_Bx2=jnp.stack([last_B, zeros_B], axis=1),
    num_pending_B=jnp.ones((b,), jnp.int32),
    out_BxW=jnp.zeros((b, spec.max_new_tokens + w), jnp.int32),
    num_out_B=zeros_B,
    target_cache=prefill(spec.target, target_params, *target_tails),
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
