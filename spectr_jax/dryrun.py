"""A decode's programs built for an accelerator from this host, measured without running.

For a (draft, target) pair of model configs with abstract weights (shapes only), a
`DecodeSpec`, a batch and a compile-only `targets.Target` with its mesh (`Build`):

- `program_report` compiles the decode program `engine.generate` runs and reads it:
  per-chip memory against the chip's HBM and against `memory.plan`, weight-sized copies
  and converts, the data-dependent control flow, kernels per round, and on a GPU how the
  loop of rounds runs (command buffers, host waits: `programs.gpu_execution`, read from
  XLA's thunk sequence);
- `round_report` compiles one round as a program of its own with its fixed-trip loops and
  layers unrolled (`engine.lower_round`), so its flops and bytes are per round: the
  compiler's (`cost_analysis`, TPU only), the HBM traffic of its kernels
  (`programs.computation_costs`), the bytes a round must move, and its time under
  `metrics.roofline_seconds`;
- `dry_run` compiles every distinct program of a sweep for a target before anything
  runs (the pod dry run: `experiments/dry_run.py`) and refuses a cell that does not fit.

Figures are per chip. What the compiler's estimates are and are not: docs/ACCELERATORS.md.
"""

import collections
import dataclasses
import functools
import glob
import math
import os
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from spectr_jax import engine, memory, metrics, plan, programs, sharding, targets
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, ModelConfig, init_params, param_axes

__all__ = [
  "Build",
  "ProgramReport",
  "RoundReport",
  "abstract_bundle",
  "build",
  "must_move_bytes",
  "program_report",
  "round_report",
]

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Build:
  """A compile-only target and the ("data", "model") mesh of its devices."""

  target: targets.Target
  mesh: jax.sharding.Mesh

  @property
  def chip(self) -> targets.Chip:
    return self.target.chip


def build(target: str, model: int = 1) -> Build:
  """The `Build` of target `target` (`targets.parse`) with `model` devices per "model"
  group (the rest along "data")."""
  parsed = targets.parse(target)
  devices = parsed.devices()
  if len(devices) % model:
    raise ValueError(f"model = {model} does not divide the {len(devices)} devices of {target}")
  return Build(parsed, sharding.make_mesh(model=model, devices=devices))


def abstract_bundle(config: ModelConfig) -> ModelBundle:
  """A bundle of `config` whose parameters are `jax.ShapeDtypeStruct`s in the compute
  dtype (nothing allocated); the engine lays them out for the decode."""
  shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
  dtype = config.compute_dtype
  return ModelBundle(config, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), shapes))


def _lower_kwargs(spec: DecodeSpec, draft: ModelConfig, target: ModelConfig, batch: int,
                  prompt_width: int) -> dict[str, Any]:  # fmt: skip
  prompts = jax.ShapeDtypeStruct((batch, prompt_width), jnp.int32)
  return dict(
    draft=abstract_bundle(draft) if spec.speculative else None,
    target=abstract_bundle(target),
    prompts=prompts,
    prompt_lengths=jax.ShapeDtypeStruct((batch,), jnp.int32),
  )


def _compile(lowered: jax.stages.Lowered, platform: str) -> tuple[Any, float, str | None]:
  """(compiled, seconds, the GPU thunk sequence's text or None)."""
  if platform != "gpu":
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start, None
  with tempfile.TemporaryDirectory() as dump:
    start = time.perf_counter()
    compiled = lowered.compile(compiler_options={"xla_dump_to": dump})
    seconds = time.perf_counter() - start
    # The sequence after XLA's thunk passes (command buffers formed) when they changed it.
    found = sorted(glob.glob(os.path.join(dump, "*thunk_sequence_after_thunk_passes.txt")))
    found = found or sorted(glob.glob(os.path.join(dump, "*thunk_sequence.txt")))
    text = open(found[-1]).read() if found else None
  return compiled, seconds, text


@dataclasses.dataclass(frozen=True)
class ProgramReport:
  """The decode program of one spec on one target (see the module docstring).

  Attributes:
    label: the spec's `DecodeSpec.label`, "tails" or "tree" marked where it drafts.
    target: the target's name. batch: rows of the call (the whole mesh's).
    compile_s: seconds of the compile here.
    argument_bytes, output_bytes, temp_bytes, alias_bytes: `memory_analysis()`, per chip.
    chip_bytes: the chip's HBM. plan_bytes: `memory.plan`'s total per device for this
      program (without the draft's weights where it has no drafts: a sweep's plan counts
      them, resident beside its autoregressive cells).
    weight_copies: kernels that copy, transpose or convert a weight (`programs.
      weight_copies`): each a weight-sized buffer and its traffic.
    data_dependent: the op_names of the data-dependent loops and conditionals besides
      the loop of rounds (`programs.control_flow`; on a GPU, outside a command buffer
      each waits on the host).
    kernels_per_round: kernels one round runs (fixed loops times their trips).
    gpu: how the loop of rounds runs on a GPU (None elsewhere).
  """

  label: str
  target: str
  batch: int
  compile_s: float
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  chip_bytes: int
  plan_bytes: int
  weight_copies: int
  data_dependent: tuple[str, ...]
  kernels_per_round: int
  gpu: programs.GpuExecution | None

  @property
  def peak_bytes(self) -> int:
    """Arguments, outputs and temporaries held at once (aliased outputs once)."""
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

  @property
  def fits(self) -> bool:
    return self.peak_bytes <= self.chip_bytes

  @property
  def temp_share(self) -> float:
    """Temporaries / arguments (the weights, mostly)."""
    return self.temp_bytes / max(self.argument_bytes, 1)


def label(spec: DecodeSpec) -> str:
  """The spec's label, with "tails" or "tree" for a decode with drafts, and its adaptive
  length or node budget."""
  if not spec.speculative:
    return spec.label()
  extra = " adaptive" if spec.adaptive else ""
  extra += f" budget {spec.node_budget:g}" if spec.node_budget else ""
  base = spec.replace(dedup=False, adaptive=0.0, node_budget=0.0).label()
  return f"{base} {'tree' if spec.dedup else 'tails'}{extra}"


def program_report(
  spec: DecodeSpec,
  draft: ModelConfig,
  target: ModelConfig,
  where: Build,
  *,
  batch: int,
  prompt_width: int,
) -> ProgramReport:
  """Compiles the decode program of `spec` for `where` and reads it (see `ProgramReport`).

  Args:
    spec: the decode. draft, target: the models' configs (weights abstract).
    where: the target and its mesh.
    batch: B, the rows of one call. prompt_width: P, the prompt buffer's width.
  """
  kwargs = _lower_kwargs(spec, draft, target, batch, prompt_width)
  lowered = engine.lower(jax.random.key(0), spec, mesh=where.mesh, **kwargs)
  compiled, seconds, thunks = _compile(lowered, where.target.platform)
  stats = compiled.memory_analysis()
  module = programs.parse(compiled.as_text())
  # The weights (1 MiB or more) as the program takes them; "layers" holds stacked ones.
  weights = [
    (path, x)
    for params in lowered.args_info[0][4:6]
    for path, x in jax.tree_util.tree_leaves_with_path(params)
    if math.prod(x.shape) * x.dtype.itemsize >= 2**20
  ]
  stacked = [x.shape for path, x in weights if getattr(path[0], "key", None) == "layers"]
  plan = memory.plan(draft, target, where.mesh, batch_size=batch, prompt_width=prompt_width,
                     spec=spec, platform=where.target.platform)  # fmt: skip
  return ProgramReport(
    label=label(spec),
    target=where.target.name,
    batch=batch,
    compile_s=seconds,
    argument_bytes=stats.argument_size_in_bytes,
    output_bytes=stats.output_size_in_bytes,
    temp_bytes=stats.temp_size_in_bytes,
    alias_bytes=stats.alias_size_in_bytes,
    chip_bytes=where.chip.hbm_bytes,
    plan_bytes=plan.total - (0 if spec.speculative else plan.weights["draft"]),
    weight_copies=len(programs.weight_copies(module, [x.shape for _, x in weights], stacked)),
    data_dependent=tuple(
      c.op_name or c.name
      for c in programs.control_flow(module)
      if c.data_dependent and c.name != programs.round_loop(module)[0].name
    ),
    kernels_per_round=programs.round_costs(module).kernels,
    gpu=None if thunks is None else programs.gpu_execution(programs.parse_thunks(thunks)),
  )


REPORT_COLS = [
  ("target", "target", "{}"),
  ("program", "program", "{}"),
  ("batch", "B", "{}"),
  ("args", "args GB", "{}"),
  ("temp", "temp GB (/ args)", "{}"),
  ("out", "out GB", "{}"),
  ("peak", "peak / HBM GB", "{}"),
  ("plan", "plan GB (/ peak)", "{}"),
  ("weight_copies", "weight copies", "{}"),
  ("loops", "data-dependent", "{}"),
  ("kernels_per_round", "kernels / round", "{}"),
  ("gpu", "GPU: round loop, host waits, launches / round, kernels in graphs", "{}"),
  ("compile_s", "compile s", "{:.1f}"),
]


def _gb(value: float) -> str:
  return f"{value / GB:.2f}"


def report_row(report: ProgramReport) -> dict:
  """A `ProgramReport` as a row of `REPORT_COLS` (and of JSON: its fields too)."""
  gpu = report.gpu
  scopes = collections.Counter(programs.scope(n) or n for n in report.data_dependent)
  return dict(
    dataclasses.asdict(report),
    program=report.label,
    args=_gb(report.argument_bytes),
    temp=f"{_gb(report.temp_bytes)} ({report.temp_share:.0%})",
    out=_gb(report.output_bytes),
    peak=f"{_gb(report.peak_bytes)} / {_gb(report.chip_bytes)}{'' if report.fits else ' NO FIT'}",
    plan=f"{_gb(report.plan_bytes)} ({report.plan_bytes / max(report.peak_bytes, 1):.2f})",
    loops=", ".join(f"{k} x{n}" if n > 1 else k for k, n in scopes.items()) or "none",
    gpu="-" if gpu is None else (
      f"{'graph' if gpu.round_loop_in_graph else 'host'}, {gpu.host_waits}, {gpu.launches}, "
      f"{gpu.in_graphs:.0%}"
    ),
  )  # fmt: skip


def must_move_bytes(
  spec: DecodeSpec, draft: ModelConfig, target: ModelConfig, mesh: Any, *, batch: int,
  prompt_width: int,
) -> float:  # fmt: skip
  """The HBM bytes a round must move per device: every model call reads its model's
  weights once (a table only gathered from, an untied input embedding, not) and its KV
  cache once (static shapes: the whole capacity S); the target is called once a round,
  the draft L times (its opening call and L - 1 steps)."""
  cache_len = prompt_width + spec.max_new_tokens + spec.draft_len + 1

  def per_call(config: ModelConfig) -> float:
    params = memory.param_shapes(config)
    axes = param_axes(config)
    weights = memory.weight_bytes(params, mesh, axes)
    if not config.tied_embedding:
      table = params["embed"]["embedding"]
      weights -= memory.shard_bytes(table.shape, table.dtype, jax.sharding.PartitionSpec(), mesh)
    cache = memory.cache_bytes(config, batch, spec.num_drafts, spec.draft_len, cache_len, mesh)
    return weights + cache

  total = per_call(target)
  if spec.speculative:
    total += spec.draft_len * per_call(draft)
  return total


@dataclasses.dataclass(frozen=True)
class RoundReport:
  """One round (or autoregressive step) as a program of its own (module docstring).

  Attributes:
    label, target, batch: as in `ProgramReport`.
    flops: matmul flops per round per chip: the compiler's on a TPU, else the dots of
      the compiled program (`programs.Costs.flops`).
    hbm_bytes: HBM traffic per round per chip (`programs.Costs.hbm_bytes`).
    compiler_bytes: the compiler's "bytes accessed" (TPU; None elsewhere): on a TPU it
      also counts the copies that stage weights into on-chip memory.
    must_move: `must_move_bytes`.
    kernels: kernels per round of the decode program (the looped one).
    seconds: `metrics.roofline_seconds` of the round on the target's chip.
    compile_s: seconds of the round program's compile here.
  """

  label: str
  target: str
  batch: int
  flops: float
  hbm_bytes: float
  compiler_bytes: float | None
  must_move: float
  kernels: int
  seconds: float
  compile_s: float


def round_report(
  spec: DecodeSpec,
  draft: ModelConfig,
  target: ModelConfig,
  where: Build,
  *,
  batch: int,
  prompt_width: int,
  kernels: int,
) -> RoundReport:
  """Compiles one round of `spec` for `where`, unrolled (module docstring), and projects
  its time. `kernels` is the decode program's kernels per round (`ProgramReport`)."""
  unrolled = spec.replace(layer_stack="unroll")
  kwargs = _lower_kwargs(unrolled, draft, target, batch, prompt_width)
  lowered = engine.lower_round(jax.random.key(0), unrolled, mesh=where.mesh, unroll=True, **kwargs)
  compiled, seconds, _ = _compile(lowered, "tpu")  # no thunks needed
  module = programs.parse(compiled.as_text())
  costs = programs.computation_costs(module, module.entry)
  analysis = compiled.cost_analysis() or {}
  flops = analysis.get("flops", costs.flops) if where.target.platform == "tpu" else costs.flops
  chip = where.chip
  kernel_s = metrics.GPU_KERNEL_S if where.target.platform == "gpu" else 0.0
  return RoundReport(
    label=label(spec),
    target=where.target.name,
    batch=batch,
    flops=float(flops),
    hbm_bytes=costs.hbm_bytes,
    compiler_bytes=analysis.get("bytes accessed"),
    must_move=must_move_bytes(
      spec, draft, target, where.mesh, batch=batch, prompt_width=prompt_width
    ),
    kernels=kernels,
    seconds=metrics.roofline_seconds(
      flops, costs.hbm_bytes, kernels, chip.matmul_flops, chip.hbm_bandwidth, kernel_s
    ),
    compile_s=seconds,
  )


def fitting_model_axis(
  spec: DecodeSpec, draft: ModelConfig, target: ModelConfig, devices: int, chip_bytes: int, *,
  batch: int, prompt_width: int, platform: str = "",
) -> int | None:  # fmt: skip
  """The smallest "model" axis size (a divisor of `devices`) whose `memory.plan` fits
  `chip_bytes` per device, None when none does."""
  for model in (m for m in range(1, devices + 1) if devices % m == 0):
    mesh = memory.abstract_mesh(devices // model, model)
    plan = memory.plan(draft, target, mesh, batch_size=batch, prompt_width=prompt_width,
                       spec=spec, platform=platform)  # fmt: skip
    if plan.total <= chip_bytes:
      return model
  return None


@dataclasses.dataclass(frozen=True)
class CellBuild:
  """One distinct program of a sweep built for a target (`dry_run`).

  Attributes:
    cells: the labels of the sweep's cells that run this program.
    report: its `ProgramReport`, None when the compiler refused it.
    refused: why it cannot run there ("" when it fits): its bytes per chip against the
      chip's, and a mesh that would fit (`fitting_model_axis`), or none.
  """

  cells: tuple[str, ...]
  report: ProgramReport | None
  refused: str


def _refusal(spec, draft, target, where, batch, prompt_width, needed: str) -> str:
  devices = where.mesh.size
  model = fitting_model_axis(
    spec, draft, target, devices, where.chip.hbm_bytes, batch=batch, prompt_width=prompt_width,
    platform=where.target.platform,
  )  # fmt: skip
  fits = (
    f"'model' = {model} (data = {devices // model}) fits by the memory plan"
    if model is not None
    else f"no (data, model) mesh of the {devices} chips fits by the memory plan: more chips"
  )
  return f"{needed} of {where.chip.hbm_bytes / GB:.2f} GB per chip; {fits}"


def dry_run(
  specs: Iterable[tuple[str, DecodeSpec]],
  draft: ModelConfig,
  target: ModelConfig,
  where: Build,
  *,
  batch: int,
  prompt_width: int,
  progress=None,
) -> list[CellBuild]:
  """Compiles each distinct program of `specs` ((cell label, spec) pairs: a sweep's
  cells) for `where` and reads it (`program_report`); a program that does not fit the
  chip's HBM, or that the compiler refuses for memory, is refused (`CellBuild.refused`).
  `progress(build)` is called after each."""
  grouped: dict[Any, tuple[DecodeSpec, list[str]]] = {}
  for cell, spec in specs:
    key = plan.resolve(spec, draft if spec.speculative else None, target)
    grouped.setdefault(key, (spec, []))[1].append(cell)
  builds = []
  for spec, cells in grouped.values():
    try:
      report = program_report(spec, draft, target, where, batch=batch, prompt_width=prompt_width)
    except jax.errors.JaxRuntimeError as error:
      if "RESOURCE_EXHAUSTED" not in str(error) and "out of memory" not in str(error).lower():
        raise
      needed = str(error).strip().splitlines()[0][:300]
      refused = _refusal(spec, draft, target, where, batch, prompt_width, needed)
      builds.append(CellBuild(tuple(cells), None, refused))
    else:
      refused = ""
      if not report.fits:
        needed = f"needs {report.peak_bytes / GB:.2f} GB"
        refused = _refusal(spec, draft, target, where, batch, prompt_width, needed)
      builds.append(CellBuild(tuple(cells), report, refused))
    if progress is not None:
      progress(builds[-1])
  return builds
