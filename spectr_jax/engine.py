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

import contextlib
import dataclasses
import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from spectr_jax import checks, loops, plan, rounds, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, ModelConfig, check_params, placement
from spectr_jax.plan import DecodePlan, Traced
from spectr_jax.rounds import DecodeStats
from spectr_jax.sharding import DATA_AXIS

__all__ = [
  "DecodeSpec",
  "DecodeStats",
  "GenerateOutput",
  "compiled_program",
  "generate",
  "lower",
  "lower_round",
  "round_program",
]


class GenerateOutput(NamedTuple):
  """tokens_BxT (0 past each row's length), lengths_B, and `DecodeStats`."""

  tokens_BxT: jax.Array
  lengths_B: jax.Array
  stats: DecodeStats


def _decode(
  decode_plan, lockstep, key, prompt_ids_B, prompts_BxP, lengths_B, draft_params, target_params,
  traced,
):  # fmt: skip
  row_key_B = jax.vmap(jax.random.fold_in, (None, 0))(key, prompt_ids_B)
  state = rounds.init_state(decode_plan, draft_params, target_params, prompts_BxP, lengths_B)

  def running(s):
    if not lockstep:
      return ~jnp.all(s.done_B)
    # Every device runs the same rounds, so the model-parallel collectives of one round
    # meet across all devices (finished rows pass rounds unchanged).
    return jax.lax.psum(jnp.any(~s.done_B).astype(jnp.int32), DATA_AXIS) > 0

  state = jax.lax.while_loop(
    running,
    lambda s: rounds.run_round(decode_plan, draft_params, target_params, row_key_B, s, traced),
    state,
  )
  n = decode_plan.max_new_tokens
  tokens_BxT = jnp.where(jnp.arange(n) < state.num_out_B[:, None], state.out_BxW[:, :n], 0)
  return GenerateOutput(tokens_BxT, state.num_out_B, state.stats)


@functools.cache
def compiled_program(decode_plan: DecodePlan, mesh: jax.sharding.Mesh | None = None):
  """The jitted program that `generate` runs for a plan (`plan.resolve`; cached; for
  inspecting its HLO, memory or profile): (key, prompt_ids_B, prompts_BxP, lengths_B,
  draft_params, target_params, traced) -> GenerateOutput."""
  lockstep = sharding.model_size(mesh) > 1
  fn = functools.partial(_decode, decode_plan, lockstep)
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
  tests/decoding/test_engine.py::test_round_has_no_full_cache_copy).

  GPU:
  - `xla_gpu_copy_insertion_use_region_analysis`: the same analysis on GPU (off there by
    default), so the commit's writes into the caches need no copy of them.
  - `xla_gpu_enable_command_buffer`: XLA's default command types (kernels, cuBLAS,
    cuBLASLt, custom calls, cuDNN) plus WHILE and CONDITIONAL, so the loop of rounds, a
    round's fixed-trip loops and its data-dependent ones (the tree's node-count switch,
    the adaptive draft loop) are recorded into one CUDA graph, conditional nodes
    included: no iteration or branch waits on the host. Checked on compile-only H100,
    H200 and B200 targets for every program of the program report (docs/
    ACCELERATORS.md), which needs the models' layers unrolled on a GPU (`models.layout.
    scans`) and no tiny in-place updates in a round's loops (XLA:GPU runs those as copy
    thunks outside any graph); not yet timed on a device.
  `XLA_FLAGS` set by the user apply on top (e.g. `--xla_gpu_autotune_level=0` to skip
  autotuning the matmuls: faster compiles, possibly slower steps).
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


def _pad_rows(pad: int, prompts_BxP, lengths_B, ids_B):
  """Appends `pad` dummy rows (length 1) so the batch splits evenly over a mesh (shapes
  only for abstract rows)."""
  if isinstance(prompts_BxP, jax.ShapeDtypeStruct):
    b, width = prompts_BxP.shape
    return (
      jax.ShapeDtypeStruct((b + pad, width), jnp.int32),
      jax.ShapeDtypeStruct((b + pad,), jnp.int32),
      jax.ShapeDtypeStruct((b + pad,), jnp.int32),
    )
  prompts_BxP = jnp.pad(prompts_BxP, ((0, pad), (0, 0)))
  return prompts_BxP, jnp.pad(lengths_B, (0, pad), constant_values=1), jnp.pad(ids_B, (0, pad))


def generate(
  key: jax.Array,
  spec: DecodeSpec,
  *,
  draft: ModelBundle | None,
  target: ModelBundle,
  prompts: jax.Array,
  prompt_lengths: jax.Array,
  prompt_ids: jax.Array | None = None,
  mesh: jax.sharding.Mesh | None = None,
) -> GenerateOutput:
  """Decodes a batch of prompts as `spec` says (speculatively, or autoregressively).

  Args:
    key: PRNG key (`jax.random.key`; a raw `jax.random.PRNGKey` is taken as the same
      bits); row b uses fold_in(key, prompt_ids[b]), so its output does not depend
      on the batch it is in, its padding or the sharding.
    spec: what to decode (`config.DecodeSpec`: the verifier, drafting scheme, tree
      shape, K, L, rho, sampling, stop tokens, token counts, layer stack, adaptive
      speculation). Specs that differ only in temperature > 0, top_p < 1, rho's number,
      token_limit, adaptive > 0 or node_budget >= 1 share one compiled program.
    draft: the draft model bundle (None for "autoregressive").
    target: the target model bundle. Both are decoded as `ModelBundle.for_decoding`
      holds them (weights in the compute dtype, layers stacked or split as
      `spec.layer_stack` runs them): load them that way (`pairs.load_pair`,
      `runs.load_bundle(for_decoding=True)`), else every call converts them first.
    prompts: B x P int token ids, right-padded.
    prompt_lengths: B ints in [1, P].
    prompt_ids: B ints naming the prompts for the randomness (default 0..B-1).
    mesh: optional `sharding.make_mesh` mesh: rows are split over "data" (the batch is
      padded to a multiple of its size), parameters and caches over "model" by
      `sharding.RULES`; it may span processes (every process passes the same inputs and
      gets the whole output).

  Returns:
    `GenerateOutput(tokens_BxT, lengths_B, stats)`, T = `spec.max_new_tokens`.
  """
  decode_plan, args, b = _prepare(
    key, spec, draft, target, prompts, prompt_lengths, prompt_ids, mesh
  )
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args)):
    raise ValueError(
      "generate needs arrays on devices that run: got abstract parameters or a mesh of "
      "compile-only devices (engine.lower builds the program for them)"
    )
  out = compiled_program(decode_plan, mesh)(*args)
  if mesh is not None:
    out = jax.tree.map(lambda x: x[:b], sharding.fetch(out))
  return out


def lower(
  key: jax.Array,
  spec: DecodeSpec,
  *,
  draft: ModelBundle | None,
  target: ModelBundle,
  prompts: jax.Array,
  prompt_lengths: jax.Array,
  prompt_ids: jax.Array | None = None,
  mesh: jax.sharding.Mesh | None = None,
) -> jax.stages.Lowered:
  """The lowered program `generate` runs for these arguments (for its HLO, cost or
  memory: `.compile().as_text()`, `.compile().memory_analysis()`)."""
  decode_plan, args, _ = _prepare(
    key, spec, draft, target, prompts, prompt_lengths, prompt_ids, mesh
  )
  return compiled_program(decode_plan, mesh).lower(*args)


def lower_round(
  key: jax.Array,
  spec: DecodeSpec,
  *,
  draft: ModelBundle | None,
  target: ModelBundle,
  prompts: jax.Array,
  prompt_lengths: jax.Array,
  prompt_ids: jax.Array | None = None,
  mesh: jax.sharding.Mesh | None = None,
  unroll: bool = False,
) -> jax.stages.Lowered:
  """The lowered program of one round of the decode `lower` builds (its loop's body, as
  a program of its own: `round_program`), on the state after the prefill. An
  autoregressive spec gives one step.

  With `unroll` the round's fixed-trip loops are unrolled (`spectr_jax.loops`; give the
  spec `layer_stack="unroll"` for the models' layers too): XLA's cost analysis counts a
  loop's body once, so only then are the compiler's flops and bytes those of a round.
  """
  decode_plan, args, _ = _prepare(
    key, spec, draft, target, prompts, prompt_lengths, prompt_ids, mesh
  )
  key, ids, prompts_BxP, lengths_B, draft_params, target_params, traced = args
  state = jax.eval_shape(
    functools.partial(rounds.init_state, decode_plan),
    *sharding.abstract((draft_params, target_params, prompts_BxP, lengths_B)),
  )
  if mesh is not None:
    state = sharding.put(state, _state_shardings(state, mesh))
  with loops.unrolled() if unroll else contextlib.nullcontext():
    return round_program(decode_plan, mesh).lower(
      key, ids, draft_params, target_params, traced, state
    )


def _state_shardings(state: rounds.State, mesh: jax.sharding.Mesh) -> rounds.State:
  """A round's state on `mesh`: rows over "data" (the caches by `sharding.CACHE_AXES`)."""
  rows = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  specs = jax.tree.map(lambda _: rows, state)
  for name in ("target_cache", "draft_cache"):
    cache = getattr(state, name)
    if cache is not None:
      cache_specs = sharding.cache_specs(cache, mesh)
      specs = specs.replace(
        **{name: jax.tree.map(lambda spec: NamedSharding(mesh, spec), cache_specs)}
      )
  return specs


def _state_specs(decode_plan: DecodePlan) -> rounds.State:
  """The `PartitionSpec`s of a round's state over "data" (a prefix of `rounds.State`): every
  field's batch axis (a cache's by `sharding.CACHE_AXES`)."""
  rows = PartitionSpec(DATA_AXIS)

  def cache(model):
    return model.cache_class(
      **{
        f.name: PartitionSpec(*[None] * sharding.CACHE_AXES[f.name].index("batch"), DATA_AXIS)
        for f in dataclasses.fields(model.cache_class)
      }
    )

  return rounds.State(
    rounds_B=rows, done_B=rows, last_B=rows, pending_Bx2=rows, num_pending_B=rows,
    out_BxW=rows, num_out_B=rows, target_cache=cache(decode_plan.target),
    draft_cache=None if decode_plan.draft is None else cache(decode_plan.draft), stats=rows,
  )  # fmt: skip


@functools.cache
def round_program(decode_plan: DecodePlan, mesh: jax.sharding.Mesh | None = None):
  """The jitted program of one round (`rounds.run_round`; cached): (key, prompt_ids_B,
  draft_params, target_params, traced, state) -> state, the state donated (its caches
  are updated in place, as in the decode's loop)."""

  def one_round(key, ids_B, draft_params, target_params, traced, state):
    row_key_B = jax.vmap(jax.random.fold_in, (None, 0))(key, ids_B)
    return rounds.run_round(decode_plan, draft_params, target_params, row_key_B, state, traced)

  fn = one_round
  if mesh is not None:
    data, rep = PartitionSpec(DATA_AXIS), PartitionSpec()
    fn = jax.shard_map(
      one_round,
      mesh=mesh,
      in_specs=(rep, data, rep, rep, rep, _state_specs(decode_plan)),
      out_specs=_state_specs(decode_plan),
      axis_names={DATA_AXIS},
      check_vma=False,
    )
  return jax.jit(fn, donate_argnums=5, compiler_options=compiler_options(mesh))


def round_spec(spec: DecodeSpec, draft: ModelConfig | None, target: ModelConfig) -> DecodePlan:
  """Deprecated: `plan.resolve(spec, draft, target)`."""
  warnings.warn(
    "engine.round_spec is deprecated: use spectr_jax.plan.resolve", DeprecationWarning,
    stacklevel=2,
  )  # fmt: skip
  return plan.resolve(spec, draft, target)


def traced_values(spec: DecodeSpec) -> Traced:
  """Deprecated: `plan.traced(spec)`."""
  warnings.warn(
    "engine.traced_values is deprecated: use spectr_jax.plan.traced", DeprecationWarning,
    stacklevel=2,
  )  # fmt: skip
  return plan.traced(spec)


def _prepare(key, spec, draft, target, prompts, prompt_lengths, prompt_ids, mesh):
  """Checks the inputs of `generate`; returns its program, the placed arguments and B.

  Parameters given as `jax.ShapeDtypeStruct`s, or a mesh of compile-only devices
  (`spectr_jax.targets`), make every argument abstract (shapes and placements: for
  `lower`). Parameters go where `placement.decode_placement` says (sharded by the rules on
  a mesh; on a TPU in the layouts its matmuls want)."""
  if not isinstance(spec, DecodeSpec):
    raise ValueError(
      f"spec must be a spectr_jax.DecodeSpec (e.g. DecodeSpec(method='kseq', num_drafts=4, "
      f"draft_len=4)), got {type(spec).__name__}"
    )
  checks.prng_key("key", key)
  _check_prompts(target.config.vocab_size, prompts, prompt_lengths, prompt_ids)
  platform = placement.platform_of(mesh)
  target = target.for_decoding(spec.scan_layers, platform)
  if spec.speculative and draft is not None:
    draft = draft.for_decoding(spec.scan_layers, platform)
  else:
    draft = None
  spec.check_models(target.config, None if draft is None else draft.config, np.shape(prompts)[1])
  for name, bundle in (("target", target), ("draft", draft)):
    if bundle is not None:
      check_params(bundle, name)
  key = checks.typed_key(key)
  if mesh is not None and DATA_AXIS not in mesh.axis_names:
    raise ValueError(
      f"the mesh needs a {DATA_AXIS!r} axis (sharding.make_mesh), got axes {mesh.axis_names}"
    )
  decode_plan = plan.resolve(spec, None if draft is None else draft.config, target.config)
  b = np.shape(prompts)[0]
  ids = jnp.arange(b, dtype=jnp.int32) if prompt_ids is None else prompt_ids
  rows = tuple(
    x if isinstance(x, jax.ShapeDtypeStruct) else jnp.asarray(x, jnp.int32)
    for x in (ids, prompts, prompt_lengths)
  )
  traced = plan.traced(spec, decode_plan)
  args = [key, *rows, None if draft is None else draft.params, target.params, traced]
  leaves = jax.tree.leaves(args)
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves) or (
    mesh is not None and sharding.is_compile_only(mesh)
  ):
    args = sharding.abstract(args)
  for i, bundle in ((4, draft), (5, target)):
    where = None if bundle is None else placement.decode_placement(bundle.config, args[i], mesh)
    if where is not None:
      args[i] = sharding.put(args[i], where)
  if mesh is not None:
    prompts, lengths, ids = _pad_rows(-b % mesh.shape[DATA_AXIS], args[2], args[3], args[1])
    rows = sharding.put((ids, prompts, lengths), NamedSharding(mesh, PartitionSpec(DATA_AXIS)))
    replicated = sharding.put((args[0], args[6]), NamedSharding(mesh, PartitionSpec()))
    args = [replicated[0], *rows, args[4], args[5], replicated[1]]
  return decode_plan, tuple(args), b
