"""Meshes, the sharding rules of every parameter and cache, multi-host start, compile cache.

One 2-D mesh, ("data", "model"), serves decoding, training and checkpoint restore. Every
array dimension carries a *logical* axis name: a parameter's are attached where the layer
creates it (`spectr_jax.models.param_axes(config)` reads them: a pytree like the
parameters with tuples of names as leaves, the `axes` argument below), the cache's are
`CACHE_AXES`. One rule table (`RULES`, Megatron-style) maps logical axes to mesh axes:

  batch    -> data    rows of a decode or training batch
  heads    -> model   query heads (w_o)
  kv_heads -> model   key/value heads (w_qkv, b_qkv: each head with its group of queries;
                      the caches)
  mlp      -> model   MLP width (w_gate_up, w_up, w_down)
  vocab    -> model   embedding and output-layer rows
  embed    -> None    model width (-> data with `fsdp=True`: FSDP for training)
  other    -> None    layers, positions, head_dim, qkv, gate_up, sequence, drafts,
                      tail slots

An axis that does not divide by its mesh axis' size is replicated, by rule (the single
KV head of multi-query attention, GPT-2's 50,257-entry vocabulary on an even "model"
axis); `describe` prints what each parameter gets, and entry points log it. With q, k and
v fused by key/value head (`w_qkv`), a model with fewer key/value heads than the "model"
axis has devices keeps its query projection replicated too (one matmul per layer
instead of three, for that sharding).
"""

import dataclasses
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.experimental.layout import Format
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"
MODEL_AXIS = "model"
MESH_AXES = (DATA_AXIS, MODEL_AXIS)

RULES: Mapping[str, str | None] = {
  "batch": DATA_AXIS,
  "heads": MODEL_AXIS,
  "kv_heads": MODEL_AXIS,
  "mlp": MODEL_AXIS,
  "vocab": MODEL_AXIS,
  "embed": None,
}
FSDP_RULES: Mapping[str, str | None] = {**RULES, "embed": DATA_AXIS}

# The logical axes of the KV cache's fields (`spectr_jax.models.KVCache`, and the two a
# draft head's cache adds: `spectr_jax.models.head.HeadCache`).
CACHE_AXES: Mapping[str, tuple[str, ...]] = {
  "prefix_k": ("layers", "batch", "seq", "kv_heads", "head_dim"),
  "prefix_v": ("layers", "batch", "seq", "kv_heads", "head_dim"),
  "prefix_len": ("batch",),
  "tail_k": ("layers", "batch", "drafts", "tail", "kv_heads", "head_dim"),
  "tail_v": ("layers", "batch", "drafts", "tail", "kv_heads", "head_dim"),
  "tail_len": ("batch", "drafts"),
  "pending_features": ("batch", "pending", "embed"),
  "tail_features": ("batch", "drafts", "embed"),
}


def maybe_initialize_distributed(
  heartbeat_timeout_s: int = 30, shutdown_timeout_s: int = 120
) -> None:
  """Calls `jax.distributed.initialize()` when this process is one of several.

  Multi-process runs are recognised by the variables that launchers set: a TPU pod's
  `TPU_WORKER_HOSTNAMES` listing several workers, or an explicit coordinator
  (`JAX_COORDINATOR_ADDRESS` with `JAX_NUM_PROCESSES` > 1, and `JAX_PROCESS_ID` where no
  cluster manager such as SLURM tells each process its index). Single-host runs do nothing.

  The timeouts are shorter than JAX's defaults (100 s and 300 s): when one process dies
  (killed, out of memory, a crashed host), the others fail at their next collective and
  then wait at JAX's exit barrier until the dead one misses its heartbeats, so they exit
  within about `heartbeat_timeout_s` instead of hanging (tests/accelerators/test_multiprocess.py
  measures it; docs/RELIABILITY.md).

  Args:
    heartbeat_timeout_s: a process that sends no heartbeat for this long is declared dead
      (and the others stop with an error).
    shutdown_timeout_s: how long a process that has finished waits at exit for the others
      to finish too (a live but slower peer; a dead one ends the wait at its heartbeat
      timeout).
  """
  workers = [w for w in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if w]
  num_processes = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
  if len(workers) > 1 or num_processes > 1:
    process_id = os.environ.get("JAX_PROCESS_ID")
    jax.distributed.initialize(
      num_processes=num_processes if num_processes > 1 else None,
      process_id=None if process_id is None else int(process_id),
      heartbeat_timeout_seconds=heartbeat_timeout_s,
      shutdown_timeout_seconds=shutdown_timeout_s,
    )


def make_mesh(
  data: int | None = None, model: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """The ("data", "model") mesh over `devices` (default: all, across processes).

  Args:
    data: the "data" axis size (default: the devices left by `model`).
    model: the "model" axis size (1: parameters replicated, rows split over all devices).
    devices: the devices; `data * model` must equal their number. A process's devices
      stay consecutive along "model" (model-parallel collectives stay within a host).

  Returns:
    A mesh with Auto axes (GSPMD propagates shardings through the decode and train steps).
  """
  devices = list(jax.devices() if devices is None else devices)
  for name, size in (("data", data), ("model", model)):
    if size is not None and (not isinstance(size, int | np.integer) or size < 1):
      raise ValueError(f"mesh axis {name!r} must be a positive int, got {size!r}")
  if data is None:
    if len(devices) % model:
      raise ValueError(f"model={model} does not divide the {len(devices)} devices")
    data = len(devices) // model
  if data * model != len(devices):
    raise ValueError(
      f"mesh (data={data}, model={model}) needs {data * model} devices, there are "
      f"{len(devices)} (data x model must use them all)"
    )
  grid = np.asarray(devices, dtype=object).reshape(data, model)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def model_size(mesh: Mesh | None) -> int:
  """The size of the mesh's "model" axis (1 without a mesh or without the axis)."""
  return 1 if mesh is None else dict(mesh.shape).get(MODEL_AXIS, 1)


def logical_spec(
  axes: Sequence[str],
  shape: Sequence[int],
  mesh: Mesh | jax.sharding.AbstractMesh,
  rules: Mapping[str, str | None] = RULES,
) -> PartitionSpec:
  """The partition of an array whose dimensions have logical `axes`, by `rules`.

  A dimension gets its rule's mesh axis when that axis is in the mesh, not yet used by
  an earlier dimension and divides the dimension; otherwise it is replicated.
  """
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
  sizes = dict(mesh.shape)
  used, spec = set(), []
  for axis, dim in zip(axes, shape, strict=True):
    target = rules.get(axis)
    if target is None or target not in sizes or target in used or dim % sizes[target]:
      spec.append(None)
      continue
    used.add(target)
    spec.append(target)
  while spec and spec[-1] is None:
    spec.pop()
  return PartitionSpec(*spec)


def _path_names(path: Sequence[Any]) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", k)) for k in path)


def _names_at(by_path: Mapping[tuple[str, ...], tuple[str, ...]], path: Sequence[Any]):
  names = _path_names(path)
  if names not in by_path:
    raise KeyError(f"no logical axes for parameter {'/'.join(names)}")
  return by_path[names]


def axes_by_path(axes: Any) -> dict[tuple[str, ...], tuple[str, ...]]:
  """{parameter path (its keys): logical axes} of a parameter-axes pytree."""
  leaves = jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))
  return {_path_names(path): names for path, names in leaves}


def param_specs(
  params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES, *, axes: Any
) -> Any:
  """The `PartitionSpec` of every parameter (a pytree like `params`; arrays or shapes).

  Args:
    params: the parameters (or their shapes).
    mesh: the mesh (a `Mesh` or an `AbstractMesh`).
    rules: logical axis -> mesh axis.
    axes: the parameters' logical axes (`spectr_jax.models.param_axes(config)`).

  Raises:
    KeyError: a parameter without logical axes in `axes`, named by its path.
  """
  by_path = axes_by_path(axes)
  return jax.tree_util.tree_map_with_path(
    lambda path, x: logical_spec(_names_at(by_path, path), np.shape(x), mesh, rules), params
  )


def param_shardings(
  params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES, *, axes: Any
) -> Any:
  """The `NamedSharding` of every parameter over `mesh` (see `param_specs`)."""
  return jax.tree.map(
    lambda spec: NamedSharding(mesh, spec),
    param_specs(params, mesh, rules, axes=axes),
    is_leaf=lambda x: isinstance(x, PartitionSpec),
  )


def shard_params(
  params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES, *, axes: Any
) -> Any:
  """Places `params` on `mesh` by the rules and their logical `axes` (every process
  passes the same values)."""
  return put(params, param_shardings(params, mesh, rules, axes=axes))


def put(tree: Any, shardings: Any) -> Any:
  """Places arrays whose full value every process holds onto `shardings` (a sharding, a
  `Format` (a sharding and a device layout), or a pytree of them), across processes too;
  arrays already placed so stay as they are. Abstract leaves (`jax.ShapeDtypeStruct`, for
  lowering on compile-only devices) come back abstract, carrying the placement."""

  def place(x, target):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)
    if isinstance(target, Format):
      return x if isinstance(x, jax.Array) and x.format == target else jax.device_put(x, target)
    if isinstance(x, jax.Array) and x.sharding == target:
      return x
    if target.is_fully_addressable:
      return jax.device_put(x, target)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = place(jax.random.key_data(x), target)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, target, lambda index: host[index])

  if isinstance(shardings, jax.sharding.Sharding | Format):
    return jax.tree.map(lambda x: place(x, shardings), tree)
  return jax.tree.map(place, tree, shardings)


def abstract(tree: Any) -> Any:
  """The arrays of `tree` as `jax.ShapeDtypeStruct`s (shapes, dtypes and placements only;
  abstract leaves stay), for lowering on devices that cannot hold them."""

  def shape(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None))

  return jax.tree.map(shape, tree)


def is_compile_only(mesh: Mesh) -> bool:
  """Whether `mesh` is made of compile-only devices (`spectr_jax.targets`): programs for
  it lower and compile, and no array can be placed on it."""
  device = mesh.devices.flat[0]
  try:
    return device not in jax.devices(device.platform)
  except RuntimeError:  # no backend of that platform in this process
    return True


def fetch(tree: Any) -> Any:
  """The full value of every array of `tree` on every process (as numpy arrays when the
  arrays span several processes; unchanged otherwise)."""
  if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
    return tree
  return multihost_utils.process_allgather(tree, tiled=True)


def cache_specs(cache: Any, mesh: Mesh | jax.sharding.AbstractMesh, skip_batch=False) -> Any:
  """The `PartitionSpec` of every field of a `KVCache` (same structure).

  With `skip_batch` the batch axis is left out (inside the engine's `shard_map`, where
  rows are already split over "data" by hand).
  """
  rules = {**RULES, "batch": None} if skip_batch else RULES
  return type(cache)(
    **{
      f.name: logical_spec(CACHE_AXES[f.name], getattr(cache, f.name).shape, mesh, rules)
      for f in dataclasses.fields(cache)
    }
  )


def constrain_cache(cache: Any) -> Any:
  """Pins a cache built inside a traced program to the rules' sharding over "model".

  A no-op outside a mesh context or where the context has no "model" axis (a plain jit,
  or a data-only mesh); inside the engine's `shard_map` the batch is already local.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or dict(mesh.shape).get(MODEL_AXIS, 1) == 1:
    return cache
  specs = cache_specs(cache, mesh, skip_batch=True)
  return jax.tree.map(jax.lax.with_sharding_constraint, cache, specs)


def replicate_over_model(x: Any) -> Any:
  """Gathers arrays sharded over "model" inside a traced program (a no-op elsewhere).

  The engine gathers the logits of every model call before sampling and verifying:
  the verifiers' data-dependent loops then hold no model-axis collectives (rows on
  different "data" devices may loop a different number of times).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or dict(mesh.shape).get(MODEL_AXIS, 1) == 1:
    return x
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, PartitionSpec()), x)


def per_device_bytes(x: jax.Array) -> int:
  """Bytes of one device's shard of `x` (by its sharding)."""
  return int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize


def describe(params: Any, mesh: Mesh, rules: Mapping[str, str | None] = RULES, *, axes: Any) -> str:
  """A table of the rules and of each parameter's shape, logical axes (`axes`, as in
  `param_specs`) and partition (a block parameter once, for all layers: "layers/...")."""
  lines = [
    f"mesh {dict(mesh.shape)} over {mesh.size} devices ({jax.process_count()} processes)",
    "rules: " + ", ".join(f"{k}->{v}" for k, v in rules.items()) + ", other->None",
  ]
  by_path = axes_by_path(axes)
  seen = {}
  for path, x in jax.tree_util.tree_leaves_with_path(params):
    names = _names_at(by_path, path)
    spec = logical_spec(names, np.shape(x), mesh, rules)
    seen["/".join(_path_names(path))] = (tuple(np.shape(x)), names, spec)
  for name, (shape, axes, spec) in sorted(seen.items()):
    lines.append(f"  {name:32s} {str(shape):18s} {str(axes):36s} {spec}")
  return "\n".join(lines)


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_OP = re.compile(r"= [^=]*? (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_CHILD = re.compile(
  r"(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def collective_counts(hlo_text: str) -> dict[str, dict[str, int]]:
  """Collectives a compiled program executes, from its optimised HLO text.

  Returns {"once": counts, "per_iteration": counts}, each op kind -> executions: ops
  outside the program's outermost loop of unknown trip count run once; those inside it
  (the engine's round loop) per iteration. Loops of known trip count (a draft's scan
  over L steps) multiply their bodies; a data-dependent loop inside the outer one
  counts once.
  """
  computations, name, entry = {}, None, None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header:
      name = header.group(1)
      computations[name] = []
      entry = name if line.startswith("ENTRY") else entry
    elif name is not None and line.strip() and line.strip() != "}":
      computations[name].append(line)
  totals = {"once": dict.fromkeys(COLLECTIVES, 0), "per_iteration": dict.fromkeys(COLLECTIVES, 0)}

  def walk(comp: str, times: int, bucket: str) -> None:
    for line in computations.get(comp, ()):
      op = _OP.search(line)
      if op:
        totals[bucket][op.group(1)] += times
      children = [c for _, c in _CHILD.findall(line)]
      for branches in _BRANCHES.findall(line):
        children += [b.strip().lstrip("%") for b in branches.split(",")]
      trip = _TRIP.search(line)
      loop = " while(" in line
      for child in children:
        if loop and trip:
          walk(child, times * int(trip.group(1)), bucket)
        elif loop and bucket == "once":
          walk(child, 1, "per_iteration")
        else:
          walk(child, times, bucket)

  walk(entry, 1, "once")
  return totals


def enable_compilation_cache(directory: str | pathlib.Path) -> None:
  """Persists compiled programs under `directory`, so a rerun skips compilation."""
  path = pathlib.Path(directory).expanduser()
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
