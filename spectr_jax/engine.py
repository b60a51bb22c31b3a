"""The SpecTr decoding engine: batched, jitted, sharded generation with K drafts of length L.

One round, for every row (prompt) of the batch at once:
  1. draft: K sequences of L tokens from the draft model under `lax.scan`, on the shared
     prefix cache plus one tail per draft, keeping the draft distributions p;
  2. target: one call scoring all K x (L + 1) positions (every draft prefix plus the bonus
     position), giving q;
  3. verify: `verify.verify_block` per row (vmapped), emitting 1..L+1 tokens;
  4. commit: both caches append the accepted tail of a surviving draft (ragged per row).
The whole generation is one `lax.while_loop` of rounds inside one jitted function (under
`shard_map` over a data axis when a mesh is given), with no host round trips.

Exactness: draft and target logits go through the same `sampling.transform_probs`
(temperature, top-k, top-p), and the output is distributed exactly as autoregressive
sampling from the *transformed* target distribution.

Cache bookkeeping (see docs/CACHE.md). The target prefix holds every emitted token but the
last one, `last`, which opens each tail of the next target call: `[last, d_1..d_L]`. The
draft tails hold `[pending.., d_1..d_{L-1}]`; the draft never sees d_L, so after a full
hit (L + 1 tokens) it has two pending tokens, fed together at the start of the next round.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from spectr_jax import acceptance, checks, sampling, verify
from spectr_jax.models import KVCache, ModelBundle, ModelConfig, Transformer, commit, init_cache
from spectr_jax.sharding import DATA_AXIS

METHODS = ("autoregressive",) + verify.METHODS


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Everything that fixes the compiled program (static under jit)."""

  method: str
  num_drafts: int
  draft_len: int
  max_new_tokens: int
  top_k: int | None
  use_top_p: bool
  rho_mode: str
  draft_config: ModelConfig | None
  target_config: ModelConfig

  @property
  def round_width(self) -> int:
    """L + 1: the most tokens one round can emit."""
    return self.draft_len + 1


@struct.dataclass
class DecodeStats:
  """Per-row statistics (B leading); tokens cut by max_new_tokens or EOS are not counted.

  rounds_B: rounds run (= target calls, the prefill excluded).
  draft_calls_B: draft model calls (L per round).
  emitted_B: tokens emitted.
  tokens_per_round_BxL2: histogram of tokens emitted per round (index 0..L+1).
  reached_BxL1: rounds whose walk reached position t (t = L is the bonus draw).
  hits_BxL1: ... where the token at t equalled a surviving draft.
  accepted_BxL1: ... where the token at t came from the accept branch.
  survivors_BxL1: sum over rounds of the number of drafts verified at t.
  nonfinite_B: rounds stopped by non-finite draft or target logits (the row ends there).
  """

  rounds_B: jax.Array
  draft_calls_B: jax.Array
  emitted_B: jax.Array
  tokens_per_round_BxL2: jax.Array
  reached_BxL1: jax.Array
  hits_BxL1: jax.Array
  accepted_BxL1: jax.Array
  survivors_BxL1: jax.Array
  nonfinite_B: jax.Array

  @property
  def target_calls_B(self) -> jax.Array:
    return self.rounds_B

  @property
  def block_efficiency(self) -> jax.Array:
    """Emitted tokens per target call over the whole batch (autoregressive = 1)."""
    return jnp.sum(self.emitted_B) / jnp.maximum(jnp.sum(self.rounds_B), 1)


class GenerateOutput(NamedTuple):
  """tokens_BxN (0 past each row's length), lengths_B, and `DecodeStats`."""

  tokens_BxN: jax.Array
  lengths_B: jax.Array
  stats: DecodeStats


@struct.dataclass
class _State:
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


class _Traced(NamedTuple):
  temperature: jax.Array
  top_p: jax.Array
  rho_value: jax.Array
  eos_id: jax.Array


def _probs(spec: DecodeSpec, logits_XxV, traced: _Traced):
  top_p = traced.top_p if spec.use_top_p else None
  return sampling.transform_probs(logits_XxV, traced.temperature, top_k=spec.top_k, top_p=top_p)


def _nonfinite_B(logits_BxXxV):
  return ~jnp.all(jnp.isfinite(logits_BxXxV), axis=tuple(range(1, logits_BxXxV.ndim)))


def _sample_BxK(key_B, step, probs_BxKxV):
  """One draw per (row, tail) with key fold_in(fold_in(row key, step), tail)."""

  def row(key, probs_KxV):
    keys_K = jax.vmap(jax.random.fold_in, (None, 0))(
      jax.random.fold_in(key, step), jnp.arange(probs_KxV.shape[0])
    )
    return jax.vmap(sampling.categorical)(keys_K, probs_KxV)

  return jax.vmap(row)(key_B, probs_BxKxV)


def _draft(spec, params, cache, state, key_B, traced):
  """K drafts of L tokens per row: (drafts_BxKxL, p_BxKxLxV, cache, nonfinite_B)."""
  model = Transformer(spec.draft_config)
  b, k = state.last_B.shape[0], spec.num_drafts
  tokens_BxKx2 = jnp.broadcast_to(state.pending_Bx2[:, None, :], (b, k, 2))
  logits_BxKx2xV, cache = model.apply(
    {"params": params}, tokens_BxKx2, cache, state.num_pending_B, method=Transformer.extend
  )
  index_BxKx1x1 = jnp.broadcast_to((state.num_pending_B - 1)[:, None, None, None], (b, k, 1, 1))
  logits_BxKxV = jnp.take_along_axis(logits_BxKx2xV, index_BxKx1x1, axis=2)[:, :, 0]
  bad_B = _nonfinite_B(logits_BxKxV)
  p_BxKxV = _probs(spec, logits_BxKxV, traced)
  x_BxK = _sample_BxK(key_B, 0, p_BxKxV)

  def step(carry, t):
    cache, x_BxK, bad_B = carry
    logits_BxKx1xV, cache = model.apply(
      {"params": params}, x_BxK[:, :, None], cache, method=Transformer.extend
    )
    bad_B |= _nonfinite_B(logits_BxKx1xV)
    p_BxKxV = _probs(spec, logits_BxKx1xV[:, :, 0], traced)
    nxt_BxK = _sample_BxK(key_B, t, p_BxKxV)
    return (cache, nxt_BxK, bad_B), (nxt_BxK, p_BxKxV)

  (cache, _, bad_B), (rest_TxBxK, rest_TxBxKxV) = jax.lax.scan(
    step, (cache, x_BxK, bad_B), jnp.arange(1, spec.draft_len)
  )
  drafts_BxKxL = jnp.concatenate([x_BxK[:, :, None], jnp.moveaxis(rest_TxBxK, 0, 2)], axis=2)
  p_BxKxLxV = jnp.concatenate([p_BxKxV[:, :, None], jnp.moveaxis(rest_TxBxKxV, 0, 2)], axis=2)
  return drafts_BxKxL, p_BxKxLxV, cache, bad_B


def _verify(spec, key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, traced):
  """Runs the block walk per row: (tokens_BxL1, num_B, verify.BlockStats)."""
  if spec.draft_len == 0:
    tokens_B = jax.vmap(sampling.categorical)(key_B, q_BxKxL1xV[:, 0, 0])
    zeros_Bx1 = jnp.zeros((key_B.shape[0], 1), bool)
    stats = verify.BlockStats(zeros_Bx1, zeros_Bx1, zeros_Bx1.astype(jnp.int32), zeros_Bx1 * 0.0)
    return tokens_B[:, None], jnp.ones_like(tokens_B), stats
  walk = functools.partial(
    verify._walk, rho_value=traced.rho_value, method=spec.method, rho_mode=spec.rho_mode
  )
  return jax.vmap(walk)(key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV)


def _round(spec, draft_params, target_params, row_key_B, state: _State, traced: _Traced):
  k, w = spec.num_drafts, spec.round_width
  b = state.last_B.shape[0]
  active_B = ~state.done_B
  round_key_B = jax.vmap(jax.random.fold_in)(row_key_B, state.rounds_B)
  draft_key_B = jax.vmap(jax.random.fold_in, (0, None))(round_key_B, 0)
  verify_key_B = jax.vmap(jax.random.fold_in, (0, None))(round_key_B, 1)

  if spec.draft_len > 0:
    drafts_BxKxL, p_BxKxLxV, draft_cache, bad_B = _draft(
      spec, draft_params, state.draft_cache, state, draft_key_B, traced
    )
  else:
    drafts_BxKxL = jnp.zeros((b, k, 0), jnp.int32)
    p_BxKxLxV, draft_cache, bad_B = None, state.draft_cache, jnp.zeros((b,), bool)

  last_BxKx1 = jnp.broadcast_to(state.last_B[:, None, None], (b, k, 1))
  logits_BxKxL1xV, target_cache = Transformer(spec.target_config).apply(
    {"params": target_params},
    jnp.concatenate([last_BxKx1, drafts_BxKxL], axis=2),
    state.target_cache,
    method=Transformer.extend,
  )
  bad_B |= _nonfinite_B(logits_BxKxL1xV)
  q_BxKxL1xV = _probs(spec, logits_BxKxL1xV, traced)
  tokens_BxW, num_B, block = _verify(
    spec, verify_key_B, drafts_BxKxL, p_BxKxLxV, q_BxKxL1xV, traced
  )

  # Emit: stop after the first EOS and at the token budget; bad rows emit nothing.
  pos_W = jnp.arange(w)
  eos_BxW = (tokens_BxW == traced.eos_id) & (pos_W < num_B[:, None])
  first_eos_B = jnp.where(jnp.any(eos_BxW, axis=1), jnp.argmax(eos_BxW, axis=1), w)
  emit_B = jnp.minimum(jnp.minimum(num_B, first_eos_B + 1), spec.max_new_tokens - state.num_out_B)
  live_B = active_B & ~bad_B
  emit_B = jnp.where(live_B, emit_B, 0)
  out_BxW = jax.vmap(lambda out, new, at: jax.lax.dynamic_update_slice(out, new, (at,)))(
    state.out_BxW, tokens_BxW, state.num_out_B
  )
  num_out_B = state.num_out_B + emit_B
  done_B = (
    state.done_B | bad_B | (live_B & (first_eos_B < emit_B)) | (num_out_B >= spec.max_new_tokens)
  )

  # Commit the accepted tokens of a surviving draft: the one whose first num - 1 tokens
  # are the emitted ones (any survivor; they are identical there).
  keep_B = jnp.where(live_B, num_B, 0)
  agree_BxK = jnp.all(
    (drafts_BxKxL == tokens_BxW[:, None, : spec.draft_len])
    | (jnp.arange(spec.draft_len) >= num_B[:, None, None] - 1),
    axis=2,
  )
  tail_B = jnp.argmax(agree_BxK, axis=1)
  target_cache = commit(target_cache, tail_B, keep_B)
  last_B = jnp.where(
    live_B, jnp.take_along_axis(tokens_BxW, (num_B - 1)[:, None], 1)[:, 0], state.last_B
  )
  pending_Bx2, num_pending_B = state.pending_Bx2, state.num_pending_B
  if spec.draft_len > 0:
    seen_B = jnp.minimum(num_B - 1, spec.draft_len - 1)
    draft_cache = commit(draft_cache, tail_B, jnp.where(live_B, num_pending_B + seen_B, 0))
    full_B = num_B == w
    one_Bx2 = jnp.stack([last_B, jnp.zeros_like(last_B)], axis=1)
    new_pending_Bx2 = jnp.where(full_B[:, None], tokens_BxW[:, w - 2 :], one_Bx2)
    pending_Bx2 = jnp.where(live_B[:, None], new_pending_Bx2, pending_Bx2)
    num_pending_B = jnp.where(live_B, jnp.where(full_B, 2, 1), num_pending_B)

  counted_BxW = live_B[:, None] & (pos_W < emit_B[:, None])
  s = state.stats
  stats = DecodeStats(
    rounds_B=s.rounds_B + live_B,
    draft_calls_B=s.draft_calls_B + live_B * spec.draft_len,
    emitted_B=s.emitted_B + emit_B,
    tokens_per_round_BxL2=s.tokens_per_round_BxL2
    + (live_B[:, None] & (jnp.arange(w + 1) == emit_B[:, None])),
    reached_BxL1=s.reached_BxL1 + counted_BxW,
    hits_BxL1=s.hits_BxL1 + (counted_BxW & block.hit_L1),
    accepted_BxL1=s.accepted_BxL1 + (counted_BxW & block.accepted_L1),
    survivors_BxL1=s.survivors_BxL1 + jnp.where(counted_BxW, block.survivors_L1, 0),
    nonfinite_B=s.nonfinite_B + (active_B & bad_B),
  )
  return _State(
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


def _init_state(spec, draft_params, target_params, prompts_BxP, lengths_B) -> _State:
  b, width = prompts_BxP.shape
  w = spec.round_width
  cache_len = width + spec.max_new_tokens + w

  def prefill(config, params, num_tails):
    config = dataclasses.replace(config, max_len=cache_len)
    cache = init_cache(config, b, num_tails, w)
    _, cache = Transformer(config).apply(
      {"params": params}, prompts_BxP, lengths_B - 1, cache, method=Transformer.prefill
    )
    return cache

  last_B = jnp.take_along_axis(prompts_BxP, (lengths_B - 1)[:, None], 1)[:, 0]
  draft_cache = None
  if spec.draft_len > 0:
    draft_cache = prefill(spec.draft_config, draft_params, spec.num_drafts)
  zeros_B = jnp.zeros((b,), jnp.int32)
  zeros_BxW = jnp.zeros((b, w), jnp.int32)
  return _State(
    rounds_B=zeros_B,
    done_B=jnp.zeros((b,), bool),
    last_B=last_B,
    pending_Bx2=jnp.stack([last_B, zeros_B], axis=1),
    num_pending_B=jnp.ones((b,), jnp.int32),
    out_BxW=jnp.zeros((b, spec.max_new_tokens + w), jnp.int32),
    num_out_B=zeros_B,
    target_cache=prefill(spec.target_config, target_params, spec.num_drafts),
    draft_cache=draft_cache,
    stats=DecodeStats(
      rounds_B=zeros_B,
      draft_calls_B=zeros_B,
      emitted_B=zeros_B,
      tokens_per_round_BxL2=jnp.zeros((b, w + 1), jnp.int32),
      reached_BxL1=zeros_BxW,
      hits_BxL1=zeros_BxW,
      accepted_BxL1=zeros_BxW,
      survivors_BxL1=zeros_BxW,
      nonfinite_B=zeros_B,
    ),
  )


def _decode(spec, key, prompt_ids_B, prompts_BxP, lengths_B, draft_params, target_params, traced):
  row_key_B = jax.vmap(jax.random.fold_in, (None, 0))(key, prompt_ids_B)
  state = _init_state(spec, draft_params, target_params, prompts_BxP, lengths_B)
  state = jax.lax.while_loop(
    lambda s: ~jnp.all(s.done_B),
    lambda s: _round(spec, draft_params, target_params, row_key_B, s, traced),
    state,
  )
  n = spec.max_new_tokens
  tokens_BxN = jnp.where(jnp.arange(n) < state.num_out_B[:, None], state.out_BxW[:, :n], 0)
  return GenerateOutput(tokens_BxN, state.num_out_B, state.stats)


@functools.cache
def _compiled(spec: DecodeSpec, mesh: jax.sharding.Mesh | None):
  fn = functools.partial(_decode, spec)
  if mesh is not None:
    data, rep = PartitionSpec(DATA_AXIS), PartitionSpec()
    fn = jax.shard_map(
      fn,
      mesh=mesh,
      in_specs=(rep, data, data, data, rep, rep, rep),
      out_specs=data,
      check_vma=False,
    )
  return jax.jit(fn)


def _check_inputs(draft, target, prompts, prompt_lengths, method, num_drafts, draft_len,
                  max_new_tokens, temperature, top_k, top_p):  # fmt: skip
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
  if method != "autoregressive":
    if draft is None:
      raise ValueError(f"method {method!r} needs a draft model")
    verify.check_method(method, num_drafts)
    if draft_len < 1:
      raise ValueError(f"draft_len must be >= 1 for method {method!r}, got {draft_len}")
    if draft.config.vocab_size != target.config.vocab_size:
      raise ValueError(
        f"draft and target vocabularies differ: {draft.config.vocab_size} vs "
        f"{target.config.vocab_size}"
      )
  if num_drafts < 1:
    raise ValueError(f"num_drafts must be >= 1, got {num_drafts}")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  checks.shape("prompts", prompts, (None, None))
  checks.shape("prompt_lengths", prompt_lengths, (np.shape(prompts)[0],))
  if checks.is_concrete(prompt_lengths):
    lengths = np.asarray(prompt_lengths)
    if lengths.size and (lengths.min() < 1 or lengths.max() > np.shape(prompts)[1]):
      raise ValueError(
        f"prompt_lengths must lie in [1, {np.shape(prompts)[1]}], "
        f"got {lengths.min()}..{lengths.max()}"
      )
  if checks.is_concrete(temperature) and not float(temperature) >= 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if top_k is not None and not 1 <= top_k:
    raise ValueError(f"top_k must be >= 1, got {top_k}")
  if top_p is not None and checks.is_concrete(top_p) and not 0 < float(top_p) <= 1:
    raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
  needed = np.shape(prompts)[1] + max_new_tokens + draft_len + 1
  for name, bundle in (("target", target), ("draft", draft)):
    if bundle is not None and needed > bundle.config.max_len:
      raise ValueError(
        f"prompt width {np.shape(prompts)[1]} + max_new_tokens {max_new_tokens} + "
        f"draft_len + 1 = {needed} exceeds the {name}'s max_len {bundle.config.max_len}"
      )


def generate(
  key: jax.Array,
  *,
  draft: ModelBundle | None,
  target: ModelBundle,
  prompts: jax.Array,
  prompt_lengths: jax.Array,
  method: str = "kseq",
  num_drafts: int = 1,
  draft_len: int = 4,
  max_new_tokens: int = 32,
  temperature: float = 1.0,
  top_k: int | None = None,
  top_p: float | None = None,
  eos_id: int | None = None,
  rho="star",
  prompt_ids: jax.Array | None = None,
  mesh: jax.sharding.Mesh | None = None,
) -> GenerateOutput:
  """Decodes a batch of prompts with speculative decoding (or autoregressively).

  Args:
    key: PRNG key; row b uses fold_in(key, prompt_ids[b]), so its output does not depend
      on the batch it is in, its padding or the sharding.
    draft: the draft model bundle (None for "autoregressive").
    target: the target model bundle.
    prompts: B x P int token ids, right-padded.
    prompt_lengths: B ints in [1, P].
    method: "autoregressive" (target only, one token per round), "sd" (K = 1),
      "kseq" (SpecTr), "specinfer", or any other method of `verify.METHODS`.
    num_drafts: K. draft_len: L (ignored by "autoregressive").
    max_new_tokens: N, tokens generated per row (fewer when EOS is emitted).
    temperature: >= 0 (traced; 0 is greedy). top_k: static int or None.
    top_p: in (0, 1] or None (traced). eos_id: stop token or None.
    rho: K-SEQ split factor "star", "k" or a number (traced).
    prompt_ids: B ints naming the prompts for the randomness (default 0..B-1).
    mesh: optional mesh with a "data" axis: rows are split over it (the batch is padded
      to a multiple of its size); parameters are replicated.

  Returns:
    `GenerateOutput(tokens_BxN, lengths_B, stats)`.
  """
  if method == "autoregressive":
    num_drafts, draft_len = 1, 0
  _check_inputs(draft, target, prompts, prompt_lengths, method, num_drafts, draft_len,
                max_new_tokens, temperature, top_k, top_p)  # fmt: skip
  rho_mode, rho_value = acceptance.split_rho(rho)
  spec = DecodeSpec(
    method=method,
    num_drafts=num_drafts,
    draft_len=draft_len,
    max_new_tokens=max_new_tokens,
    top_k=top_k,
    use_top_p=top_p is not None,
    rho_mode=rho_mode,
    draft_config=None if draft_len == 0 else draft.config,
    target_config=target.config,
  )
  traced = _Traced(
    temperature=jnp.float32(temperature),
    top_p=jnp.float32(1.0 if top_p is None else top_p),
    rho_value=rho_value,
    eos_id=jnp.int32(-1 if eos_id is None else eos_id),
  )
  prompts = jnp.asarray(prompts, jnp.int32)
  lengths = jnp.asarray(prompt_lengths, jnp.int32)
  b = prompts.shape[0]
  ids = jnp.arange(b, dtype=jnp.int32) if prompt_ids is None else jnp.asarray(prompt_ids, jnp.int32)
  draft_params = None if draft_len == 0 else draft.params
  target_params = target.params
  if mesh is not None:
    replicated = NamedSharding(mesh, PartitionSpec())
    draft_params, target_params = jax.device_put((draft_params, target_params), replicated)
    pad = -b % mesh.shape[DATA_AXIS]
    prompts = jnp.pad(prompts, ((0, pad), (0, 0)))
    lengths = jnp.pad(lengths, (0, pad), constant_values=1)
    ids = jnp.pad(ids, (0, pad))
  out = _compiled(spec, mesh)(key, ids, prompts, lengths, draft_params, target_params, traced)
  if mesh is not None:
    out = jax.tree.map(lambda x: x[:b], out)
  return out
