"""The SpecTr decoding engine: batched, jitted, sharded generation with K drafts of length L.

One round, for every row (prompt) of the batch at once:
  1. draft: K sequences of L tokens from the draft model under `lax.scan`, on the shared
     prefix cache plus one tail per draft, keeping the draft distributions p;
  2. target: one call scoring all K x (L + 1) positions (every draft prefix plus the bonus
     position), giving q;
  3. verify: the block walk `verify.walk` per row (vmapped), emitting 1..L+1 tokens;
  4. commit: both caches append the accepted tail of a surviving draft (ragged per row).
The whole generation is one `lax.while_loop` of rounds inside one jitted function (under
`shard_map` over a data axis when a mesh is given), with no host round trips. The pieces
of a round are in `spectr_jax.rounds`.

Exactness: draft and target logits go through the same `sampling.transform_probs`
(temperature, top-k, top-p), and the output is distributed exactly as autoregressive
sampling from the *transformed* target distribution.

Cache bookkeeping (see docs/CACHE.md). The target prefix holds every emitted token but the
last one, `last`, which opens each tail of the next target call: `[last, d_1..d_L]`. The
draft tails hold `[pending.., d_1..d_{L-1}]`; the draft never sees d_L, so after a full
hit (L + 1 tokens) it has two pending tokens, fed together at the start of the next round.
"""

import functools
import inspect
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from spectr_jax import acceptance, checks, methods, rounds, sharding, verify
from spectr_jax.drafting import check_branching
from spectr_jax.models import ModelBundle, check_params
from spectr_jax.rounds import DecodeSpec, DecodeStats, Traced
from spectr_jax.sharding import DATA_AXIS

__all__ = ["DecodeSpec", "DecodeStats", "GenerateOutput", "compiled_program", "generate"]


class GenerateOutput(NamedTuple):
  """tokens_BxT (0 past each row's length), lengths_B, and `DecodeStats`."""

  tokens_BxT: jax.Array
  lengths_B: jax.Array
  stats: DecodeStats


def _decode(
  spec, lockstep, key, prompt_ids_B, prompts_BxP, lengths_B, draft_params, target_params, traced
):
  row_key_B = jax.vmap(jax.random.fold_in, (None, 0))(key, prompt_ids_B)
  state = rounds.init_state(spec, draft_params, target_params, prompts_BxP, lengths_B)

  def running(s):
    if not lockstep:
      return ~jnp.all(s.done_B)
    # Every device runs the same rounds, so the model-parallel collectives of one round
    # meet across all devices (finished rows pass rounds unchanged).
    return jax.lax.psum(jnp.any(~s.done_B).astype(jnp.int32), DATA_AXIS) > 0

  state = jax.lax.while_loop(
    running,
    lambda s: rounds.run_round(spec, draft_params, target_params, row_key_B, s, traced),
    state,
  )
  n = spec.max_new_tokens
  tokens_BxT = jnp.where(jnp.arange(n) < state.num_out_B[:, None], state.out_BxW[:, :n], 0)
  return GenerateOutput(tokens_BxT, state.num_out_B, state.stats)


@functools.cache
def compiled_program(spec: DecodeSpec, mesh: jax.sharding.Mesh | None = None):
  """The jitted program that `generate` runs for `spec` (cached; for inspecting its HLO,
  memory or profile): (key, prompt_ids_B, prompts_BxP, lengths_B, draft_params,
  target_params, traced) -> GenerateOutput."""
  lockstep = sharding.model_size(mesh) > 1
  fn = functools.partial(_decode, spec, lockstep)
  if mesh is not None:
    # Rows are split over "data" by hand (each device's rows run their own rounds); the
    # "model" axis stays automatic: GSPMD partitions the model calls by the parameters'
    # and caches' shardings (`sharding.RULES`).
    data, rep = PartitionSpec(DATA_AXIS), PartitionSpec()
    fn = jax.shard_map(
      fn,
      mesh=mesh,
      in_specs=(rep, data, data, data, rep, rep, rep),
      out_specs=data,
      axis_names={DATA_AXIS},
      check_vma=False,
    )
  return jax.jit(fn, compiler_options=compiler_options(mesh))


def compiler_options(mesh: jax.sharding.Mesh | None = None) -> dict[str, bool | str]:
  """XLA options of the engine's program for the platform it runs on.

  CPU: copy insertion without region analysis copies a cache prefix twice per round (the
  target's layer reads and the commit's in-place write share one while-loop buffer);
  with it the commit updates the prefix in place (checked by
  tests/test_engine.py::test_round_has_no_full_cache_copy).

  GPU:
  - `xla_gpu_copy_insertion_use_region_analysis`: the same analysis on GPU (off there by
    default), so the commit's writes into the caches need no copy of them.
  - `xla_gpu_enable_command_buffer`: XLA's default command types (kernels, cuBLAS,
    cuBLASLt, custom calls, cuDNN) plus WHILE and CONDITIONAL, so a round's fixed-trip
    loops and the tree round's node-count switch are captured into CUDA graphs (with
    conditional nodes) instead of launching their kernels one by one and copying each
    predicate to the host.
  Not yet measured on a GPU (docs/PERFORMANCE.md, "On an accelerator"); `XLA_FLAGS`
  set by the user apply on top (e.g. `--xla_gpu_autotune_level=0` to skip autotuning
  the matmuls: faster compiles, possibly slower steps). Left off until measured:
  `--xla_gpu_enable_dynamic_slice_fusion` (a scanned stack's matmuls reading their
  layer of the stacked weights in place; without it each iteration copies its layer).
  """
  platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
  if platform == "cpu":
    return {"xla_cpu_copy_insertion_use_region_analysis": True}
  if platform in ("gpu", "cuda", "rocm"):
    return {
      "xla_gpu_copy_insertion_use_region_analysis": True,
      "xla_gpu_enable_command_buffer": GPU_COMMAND_BUFFER,
    }
  return {}


GPU_COMMAND_BUFFER = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"


def _check_method(draft, target, method, num_drafts, draft_len, rho):
  """The method, K, L, rho and the draft (see `generate`)."""
  record = methods.get(method)
  for name, value, low in (("num_drafts", num_drafts, 1), ("draft_len", draft_len, 0)):
    checks.integer(name, value, low)
  if record.speculative:
    if draft is None:
      raise ValueError(f"method {method!r} needs a draft model")
    verify.check_method(method, num_drafts)
    if draft_len < 1:
      raise ValueError(f"draft_len must be >= 1 for method {method!r}, got {draft_len}")
    if draft.config.num_logits != target.config.num_logits:
      raise ValueError(
        f"draft and target vocabularies differ: {draft.config.num_logits} vs "
        f"{target.config.num_logits}"
      )
  fixed = record.takes_rho and not isinstance(rho, str) and checks.is_concrete(rho)
  if fixed and np.ndim(rho) == 0 and np.isfinite(rho):
    if float(rho) > num_drafts:
      raise ValueError(f"rho must be 'star', 'k' or a number in [1, K = {num_drafts}], got {rho}")


def _check_sampling(vocab_size, max_new_tokens, temperature, top_k, top_p, eos_id):
  """max_new_tokens, temperature, top_k, top_p and eos_id (see `generate`)."""
  checks.integer("max_new_tokens", max_new_tokens, 1)
  if checks.is_concrete(temperature) and not 0 <= float(temperature) < float("inf"):
    raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
  if top_k is not None:
    checks.integer("top_k", top_k, 1, vocab_size)
  if top_p is not None and checks.is_concrete(top_p) and not 0 < float(top_p) <= 1:
    raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
  for eos in _eos_ids(eos_id):
    checks.integer("eos_id", eos, 0, vocab_size - 1)


def _eos_ids(eos_id: int | Sequence[int] | None) -> tuple[int, ...]:
  """The stop tokens as a tuple: none, one id, or a set of ids (Llama 3, Gemma)."""
  if eos_id is None:
    return ()
  if isinstance(eos_id, Sequence) and not isinstance(eos_id, str):
    if not eos_id:
      raise ValueError("eos_id must be None, an id or a non-empty sequence of ids, got []")
    return tuple(eos_id)
  return (eos_id,)


def _check_prompts(vocab_size, prompts, prompt_lengths, prompt_ids):
  """Shapes, dtypes and values of prompts, prompt_lengths and prompt_ids."""
  checks.shape("prompts", prompts, (None, None))
  b, width = np.shape(prompts)
  if b == 0 or width == 0:
    raise ValueError(f"prompts must hold at least one row and one token, got shape {(b, width)}")
  checks.token_ids("prompts", prompts, vocab_size)
  checks.shape("prompt_lengths", prompt_lengths, (b,))
  if checks.is_concrete(prompt_lengths):
    lengths = np.asarray(prompt_lengths)
    if lengths.min() < 1 or lengths.max() > width:
      raise ValueError(
        f"prompt_lengths must lie in [1, {width}], got {lengths.min()}..{lengths.max()}"
      )
  checks.int32_values("prompt_lengths", prompt_lengths)
  if prompt_ids is not None:
    checks.shape("prompt_ids", prompt_ids, (b,))
    checks.int32_values("prompt_ids", prompt_ids)


def _check_inputs(key, draft, target, prompts, prompt_lengths, method, num_drafts, draft_len,
                  max_new_tokens, temperature, top_k, top_p, eos_id, rho, prompt_ids):  # fmt: skip
  checks.prng_key("key", key)
  _check_method(draft, target, method, num_drafts, draft_len, rho)
  for name, bundle in (("target", target), ("draft", draft if draft_len else None)):
    if bundle is not None:
      check_params(bundle, name)
  _check_sampling(target.config.num_logits, max_new_tokens, temperature, top_k, top_p, eos_id)
  _check_prompts(target.config.vocab_size, prompts, prompt_lengths, prompt_ids)
  needed = np.shape(prompts)[1] + max_new_tokens + draft_len + 1
  for name, bundle in (("target", target), ("draft", draft)):
    if bundle is not None and needed > bundle.config.max_len:
      raise ValueError(
        f"prompt width {np.shape(prompts)[1]} + max_new_tokens {max_new_tokens} + "
        f"draft_len + 1 = {needed} exceeds the {name}'s max_len {bundle.config.max_len}"
      )


def _pad_rows(pad: int, prompts_BxP, lengths_B, ids_B):
  """Appends `pad` dummy rows (length 1) so the batch splits evenly over a mesh."""
  prompts_BxP = jnp.pad(prompts_BxP, ((0, pad), (0, 0)))
  return prompts_BxP, jnp.pad(lengths_B, (0, pad), constant_values=1), jnp.pad(ids_B, (0, pad))


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
  token_limit: int | None = None,
  temperature: float = 1.0,
  top_k: int | None = None,
  top_p: float | None = None,
  eos_id: int | Sequence[int] | None = None,
  rho="star",
  prompt_ids: jax.Array | None = None,
  mesh: jax.sharding.Mesh | None = None,
  tree: bool = False,
  branching: Sequence[int] | str | None = None,
  scan_layers: bool | None = None,
  drafting: str | None = None,
) -> GenerateOutput:
  """Decodes a batch of prompts with speculative decoding (or autoregressively).

  Args:
    key: PRNG key (`jax.random.key`; a raw `jax.random.PRNGKey` is taken as the same
      bits); row b uses fold_in(key, prompt_ids[b]), so its output does not depend
      on the batch it is in, its padding or the sharding.
    draft: the draft model bundle (None for "autoregressive").
    target: the target model bundle. Both are decoded as `ModelBundle.for_decoding`
      holds them (weights in the compute dtype, layers stacked or split as
      `scan_layers` runs them): load them that way (`pairs.load_pair`,
      `runs.load_bundle(for_decoding=True)`), else every call converts them first.
    prompts: B x P int token ids, right-padded.
    prompt_lengths: B ints in [1, P].
    method: a name of the method registry (`spectr_jax.methods`): "autoregressive"
      (target only, one token per round), "sd" (K = 1), "kseq" (SpecTr), "specinfer",
      "optimal", "rrs", "block" (K = 1), "gbv", "gbv_tp", "traversal".
    num_drafts: K. draft_len: L (ignored by "autoregressive").
    max_new_tokens: T, tokens generated per row (fewer when EOS is emitted); it sets the
      program's buffers (one compile per value).
    token_limit: stop each row after this many tokens, in [1, max_new_tokens] (traced:
      one program serves every limit; None = max_new_tokens).
    temperature: >= 0, a number (0 is greedy: compiled apart from sampling; other
      temperatures share one program). top_k: static int or None.
    top_p: in (0, 1] or None (traced). eos_id: stop token, a sequence of stop tokens
      (any of them ends a row) or None.
    rho: the split factor of methods that take one (K-SEQ): "star", "k" or a number
      (traced); ignored by the others.
    prompt_ids: B ints naming the prompts for the randomness (default 0..B-1).
    mesh: optional `sharding.make_mesh` mesh: rows are split over "data" (the batch is
      padded to a multiple of its size), parameters and caches over "model" by
      `sharding.RULES`; it may span processes (every process passes the same inputs and
      gets the whole output).
    tree: score each round's drafts as their deduplicated token tree (one target
      position per distinct prefix, `spectr_jax.tree`) instead of K tails, and draft
      them as one too (the pending tokens on one tail, a static tree's nodes once each,
      `spectr_jax.drafting`): the same output law for every method, fewer target and
      draft positions.
    branching: for a method whose drafting scheme draws a static tree
      (`methods.Drafting.branches`: "rrs"), the children per node at each depth, L
      integers whose product is K (e.g. (4, 2, 1, 1) for K = 8, L = 4), or "proportional"
      (`drafting.PROPORTIONAL`: each node's children and their shares of the K paths
      follow the draft's probabilities); None for the scheme's default.
    scan_layers: run the models' layers under `lax.scan` (one compiled layer: compiles
      fast; layers stacked) or unrolled (False; layers split); None: scan models of
      `models.layout.SCAN_MIN_LAYERS` layers or more. The same tokens either way, to
      rounding.
    drafting: the drafting scheme (a name in `methods.DRAFTING`, e.g. "iid" or "wor");
      None for the method's default. The method must be exact for the scheme's law
      (`methods.Method.exact_for`): other pairs are refused, naming why.

  Returns:
    `GenerateOutput(tokens_BxT, lengths_B, stats)`.
  """
  program, args, b = _prepare(**locals())
  out = program(*args)
  if mesh is not None:
    out = jax.tree.map(lambda x: x[:b], sharding.fetch(out))
  return out


def lower(key: jax.Array, **kwargs) -> jax.stages.Lowered:
  """The lowered program `generate(key, **kwargs)` runs (for its HLO, cost or memory:
  `.compile().as_text()`, `.compile().memory_analysis()`)."""
  call = inspect.signature(generate).bind(key, **kwargs)
  call.apply_defaults()
  program, args, _ = _prepare(**call.arguments)
  return program.lower(*args)


def _prepare(
  key, *, draft, target, prompts, prompt_lengths, method, num_drafts, draft_len,
  max_new_tokens, token_limit, temperature, top_k, top_p, eos_id, rho, prompt_ids, mesh, tree,
  branching, scan_layers, drafting,
):  # fmt: skip
  """Checks the inputs of `generate`; returns its program, the placed arguments and B."""
  if not methods.get(method).speculative:
    num_drafts, draft_len = 1, 0
  if scan_layers not in (None, True, False):
    raise ValueError(f"scan_layers must be True, False or None, got {scan_layers!r}")
  target = target.for_decoding(scan_layers)
  if draft is not None and draft_len:
    draft = draft.for_decoding(scan_layers)
  _check_inputs(key, draft, target, prompts, prompt_lengths, method, num_drafts, draft_len,
                max_new_tokens, temperature, top_k, top_p, eos_id, rho, prompt_ids)  # fmt: skip
  key = checks.typed_key(key)
  if mesh is not None and DATA_AXIS not in mesh.axis_names:
    raise ValueError(
      f"the mesh needs a {DATA_AXIS!r} axis (sharding.make_mesh), got axes {mesh.axis_names}"
    )
  if not isinstance(tree, bool):
    raise ValueError(f"tree must be True or False, got {tree!r}")
  token_limit = max_new_tokens if token_limit is None else token_limit
  checks.integer("token_limit", token_limit, 1, max_new_tokens)
  if not checks.is_concrete(temperature):
    raise ValueError(
      "temperature must be a number, not a traced value: greedy decoding (0) and sampling "
      "compile to different programs"
    )
  if drafting is not None and not isinstance(drafting, str):
    raise ValueError(f"drafting must be a scheme name or None, got {drafting!r}")
  scheme = methods.scheme(method, drafting or "")
  if branching is not None:
    branching = branching if isinstance(branching, str) else tuple(branching)
    if scheme is None or not scheme.branches:
      name = "no scheme" if scheme is None else f"scheme {scheme.name!r}"
      raise ValueError(f"method {method!r} with {name} drafts no tree: branching must be None")
    check_branching(branching, num_drafts, draft_len)
  rho_mode, rho_value = acceptance.split_rho(rho)
  if not methods.get(method).takes_rho:  # not part of the program: one compile for any rho
    rho_mode, rho_value = "", jnp.float32(0.0)
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
    tree=tree,
    branching=branching,
    greedy=float(temperature) <= 0,
    scan_layers=scan_layers,
    # "" for the method's own scheme: one program (and spec) however it is named.
    drafting="" if scheme is None or scheme.name == methods.get(method).drafting else scheme.name,
  )
  traced = Traced(
    temperature=jnp.float32(temperature),
    top_p=jnp.float32(1.0 if top_p is None else top_p),
    rho_value=rho_value,
    eos_ids=jnp.asarray(_eos_ids(eos_id) or (-1,), jnp.int32),
    token_limit=jnp.int32(token_limit),
  )
  prompts = jnp.asarray(prompts, jnp.int32)
  lengths = jnp.asarray(prompt_lengths, jnp.int32)
  b = prompts.shape[0]
  ids = jnp.arange(b, dtype=jnp.int32) if prompt_ids is None else jnp.asarray(prompt_ids, jnp.int32)
  draft_params = None if draft_len == 0 else draft.params
  target_params = target.params
  if mesh is not None:
    axes = spec.target.param_axes(target_params)
    target_params = sharding.shard_params(target_params, mesh, axes=axes)
    if draft_params is not None:
      axes = spec.draft.param_axes(draft_params)
      draft_params = sharding.shard_params(draft_params, mesh, axes=axes)
    rows = _pad_rows(-b % mesh.shape[DATA_AXIS], prompts, lengths, ids)
    ids, prompts, lengths = sharding.put(
      (rows[2], rows[0], rows[1]), NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    )
    key, traced = sharding.put((key, traced), NamedSharding(mesh, PartitionSpec()))
  args = (key, ids, prompts, lengths, draft_params, target_params, traced)
  return compiled_program(spec, mesh), args, b
