"""Device-memory arithmetic of a decode: weights, KV caches and round arrays per device.

For a (draft, target) pair of `ModelConfig`s on a ("data", "model") mesh, `plan` adds up
what one device holds while `engine.generate` decodes B rows with K drafts of L tokens:

  weights        each parameter's shard under `sharding.RULES` and its logical axes
                 (shapes only: the parameters of `init_params` via `jax.eval_shape`, in
                 the config's dtype, or the shapes and dtypes of loaded parameters);
  KV cache       both models' caches (`init_cache`: a prefix of S = P + T + L + 1 and K
                 tails of R = L + 1 entries) for the padded batch, batch over "data" and
                 key/value heads over "model" by the same rules;
  probabilities  the round's float32 K (L + 1) x V arrays per row (docs/PERFORMANCE.md,
                 checked against the compiled program by tests/decoding/test_engine_memory.py);
                 the engine gathers logits over "model", so each device holds its rows'
                 full arrays;
  activations    an estimate: one layer's K (L + 1) x (D + F) float32 activations and
                 the target's K (L + 1) x V logits in the compute dtype, per row.

The decode is named by a method, K, L and T, or by a `config.DecodeSpec` (`plan(spec=)`).
Only the verifier, K, L and T enter the arithmetic: the drafting scheme, the tree's
branching and dedup do not change what is planned (the round's arrays are held for K
drafts of L tokens either way); the plan records the spec's label (`DecodeSpec.label`)
and its table prints it.

`check_fits` compares the sum with a device's memory (`device_bytes`: a known
accelerator's HBM by name, or what the device reports) and says what to change.
"""

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, NamedSharding

from spectr_jax import methods, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelConfig, init_cache, init_params, param_axes

GB = 1e9

GIB = 2**30
# Nominal HBM per chip / GPU (the usable limit a device reports is a little lower).
DEVICE_MEMORY: Mapping[str, int] = {
  "tpu-v4": 32 * GIB,
  "tpu-v5e": 16 * GIB,
  "tpu-v5p": 95 * GIB,
  "tpu-v6e": 32 * GIB,
  "a100-40gb": 40 * GIB,
  "a100-80gb": 80 * GIB,
  "h100": 80 * GIB,
  "h200": 141 * GIB,
}


def device_memory_bytes(name: str) -> int:
  """The bytes of a device memory setting: a key of `DEVICE_MEMORY` (e.g. "tpu-v5e") or
  a positive number of GiB (e.g. "16"); a clear error otherwise."""
  if name.lower() in DEVICE_MEMORY:
    return DEVICE_MEMORY[name.lower()]
  try:
    gib = float(name)
  except ValueError:
    gib = 0.0
  if not 0 < gib < math.inf:
    raise ValueError(
      f"device memory must be a number of GiB or one of {', '.join(DEVICE_MEMORY)}, got {name!r}"
    )
  return int(gib * GIB)


class DoesNotFitError(ValueError):
  """A decode's arithmetic exceeds the device memory."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes one device holds during a decode (see the module docstring).

  Attributes:
    mesh: {"data": size, "model": size}.
    batch_size: B, the rows of one engine call (padded to a multiple of data).
    rows: ceil(B / data), the rows each device decodes.
    method, num_drafts, draft_len: the cell (K, L).
    cache_len: S, the prefix capacity; R = L + 1 tail slots.
    weights: bytes of each model's parameter shards ({"draft": .., "target": ..}).
    cache: bytes of each model's KV-cache shard.
    probabilities: bytes of the round's float32 probability arrays (and of the optimal
      plan's workspace, the method record's `workspace_bytes`).
    activations: the estimate of activations and logits.
    label: the decode's `DecodeSpec.label` (e.g. "rrs/wor:8:4:4x2x1x1") when it was
      planned from a spec (it names the drafting scheme, branching and dedup); "" else.
  """

  mesh: Mapping[str, int]
  batch_size: int
  rows: int
  method: str
  num_drafts: int
  draft_len: int
  cache_len: int
  weights: Mapping[str, int]
  cache: Mapping[str, int]
  probabilities: int
  activations: int
  label: str = ""

  @property
  def parts(self) -> dict[str, int]:
    """Each term's bytes, by name ("target weights", "draft KV cache", ...)."""
    out = {f"{role} weights": b for role, b in self.weights.items()}
    out.update({f"{role} KV cache": b for role, b in self.cache.items()})
    out.update(probabilities=self.probabilities, activations=self.activations)
    return out

  @property
  def total(self) -> int:
    """The sum of all terms, in bytes."""
    return sum(self.parts.values())

  @property
  def per_row(self) -> int:
    """The bytes that scale with the rows per device (caches, probabilities, activations)."""
    return (sum(self.cache.values()) + self.probabilities + self.activations) // self.rows

  def table(self, device_bytes: int | None = None, device: str = "") -> str:
    """The plan as a text table (GB = 1e9 bytes), with the device's memory if known."""
    decode = self.label or f"{self.method} K={self.num_drafts} L={self.draft_len}"
    lines = [
      f"memory per device: mesh data={self.mesh['data']} x model={self.mesh['model']}, "
      f"batch {self.batch_size} ({self.rows} rows per device), {decode}, "
      f"S={self.cache_len} R={self.draft_len + 1}",
      f"  {'':16s} {'draft':>9s} {'target':>9s} {'total':>9s}",
    ]
    for name, values in (("weights", self.weights), ("KV cache", self.cache)):
      cols = [values.get(r, 0) / GB for r in ("draft", "target")]
      lines.append(f"  {name:16s} {cols[0]:9.3f} {cols[1]:9.3f} {sum(cols):9.3f}")
    for name in ("probabilities", "activations"):
      lines.append(f"  {name:16s} {'':9s} {'':9s} {getattr(self, name) / GB:9.3f}")
    total = f"  {'total':16s} {'':9s} {'':9s} {self.total / GB:9.3f} GB"
    if device_bytes:
      share = self.total / device_bytes
      total += f" of {device_bytes / GB:.2f} GB{f' ({device})' if device else ''}: {share:.0%}"
    lines.append(total)
    return "\n".join(lines)


def abstract_mesh(data: int, model: int = 1) -> AbstractMesh:
  """A ("data", "model") mesh of the given sizes without devices (for arithmetic)."""
  return AbstractMesh((data, model), sharding.MESH_AXES)


@functools.lru_cache(maxsize=16)
def param_shapes(config: ModelConfig) -> Any:
  """The parameters of the config's decoder as `ShapeDtypeStruct`s in the config's dtype.

  Nothing is allocated (`jax.eval_shape` of `init_params`); a checkpoint loaded in the
  config's dtype has these shapes and dtypes.
  """
  shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, config.compute_dtype), shapes)


def shard_bytes(shape: tuple[int, ...], dtype: Any, spec: Any, mesh: Any) -> int:
  """Bytes of one device's shard of an array of `shape` partitioned by `spec`."""
  shard = NamedSharding(mesh, spec).shard_shape(tuple(shape))
  return math.prod(shard) * np.dtype(dtype).itemsize


def weight_bytes(params: Any, mesh: Any, axes: Any) -> int:
  """Bytes of one device's parameter shards under `sharding.RULES` (arrays or shapes;
  `axes`: their logical axes, `models.param_axes(config)`)."""
  specs = sharding.param_specs(params, mesh, axes=axes)
  return sum(
    shard_bytes(x.shape, x.dtype, spec, mesh)
    for x, spec in zip(
      jax.tree.leaves(params),
      jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)),
      strict=True,
    )
  )


def cache_bytes(
  config: ModelConfig, batch_size: int, num_drafts: int, draft_len: int, cache_len: int, mesh: Any
) -> int:
  """Bytes of one device's shard of a model's KV cache (`init_cache`, by the rules).

  Args:
    config: the model; its compute dtype is the cache's.
    batch_size: B, the whole batch (a multiple of the mesh's "data" size).
    num_drafts: K tails per row. draft_len: L (R = L + 1 tail slots).
    cache_len: S, the prefix capacity.
    mesh: the mesh (a `Mesh` or an `AbstractMesh`).
  """
  config = dataclasses.replace(config, max_len=cache_len)
  cache = jax.eval_shape(lambda: init_cache(config, batch_size, num_drafts, draft_len + 1))
  specs = sharding.cache_specs(cache, mesh)
  names = [f.name for f in dataclasses.fields(cache)]
  return sum(
    shard_bytes(getattr(cache, n).shape, getattr(cache, n).dtype, getattr(specs, n), mesh)
    for n in names
  )


# How many times the arrays of `probability_bytes` a program holds at its peak, by
# platform: the CPU's buffer assignment reuses them (tests/decoding/test_engine_memory.py); a TPU
# program holds about twice as many at its peak (the round's q, p and the sampler's
# tables at once: compiled Llama-3 70B / 8B and Gemma-2 27B / 2B rounds on v5p and v5e
# slices, docs/ACCELERATORS.md).
PROBABILITY_COPIES = {"tpu": 2}


def probability_bytes(
  method: str | methods.Method,
  num_drafts: int,
  draft_len: int,
  vocab_size: int,
  platform: str = "",
) -> int:
  """Bytes of one row's float32 probability arrays in a round (docs/PERFORMANCE.md).

  Two K (L + 1) x V arrays (the target's logits and q) and two K L x V (the draft's p and
  the draft loop's carry of it); the block-level verifiers hold four more K (L + 1) x V
  (their per-position residuals); times `PROBABILITY_COPIES` of `platform`.
  """
  record = methods.get(method) if isinstance(method, str) else method
  r = draft_len + 1
  block_level = record.level == "block"
  arrays = 2 * r + 2 * draft_len + (4 * r if block_level else 0)
  return PROBABILITY_COPIES.get(platform, 1) * arrays * num_drafts * vocab_size * 4


def activation_bytes(config: ModelConfig, num_drafts: int, draft_len: int, width: int) -> int:
  """The estimate of one row's activations: one layer's max(K (L + 1), P) x (D + F)
  float32 values and the K (L + 1) x V logits in the compute dtype."""
  positions = num_drafts * (draft_len + 1)
  layer = max(positions, width) * (config.d_model + config.mlp_dim) * 4
  return layer + positions * config.num_logits * config.compute_dtype.itemsize


def plan(
  draft: ModelConfig,
  target: ModelConfig,
  mesh: Any,
  *,
  batch_size: int,
  prompt_width: int,
  method: str | None = None,
  num_drafts: int | None = None,
  draft_len: int | None = None,
  max_new_tokens: int | None = None,
  spec: DecodeSpec | None = None,
  params: Mapping[str, Any] | None = None,
  platform: str | None = None,
) -> MemoryPlan:
  """The bytes one device holds while `engine.generate` decodes one batch.

  Args:
    draft: the draft's config (its weights count for every method, its cache only
      with L > 0: "autoregressive" decodes without it).
    target: the target's config.
    mesh: the ("data", "model") mesh: a `Mesh` or `abstract_mesh(data, model)`.
    batch_size: B, the rows of one call (padded to a multiple of data, as the engine does).
    prompt_width: P, the width of the prompt buffer.
    method, num_drafts, draft_len: the cell ("autoregressive": K = 1, L = 0).
    max_new_tokens: T, the tokens generated per row.
    spec: the decode as a `DecodeSpec`, instead of method, K, L and T (which it gives);
      its drafting scheme, branching and dedup are recorded in the plan's label, not
      planned (module docstring).
    params: {"draft": params, "target": params} of loaded models (arrays or shapes);
      default: `param_shapes` of each config.
    platform: where the decode runs ("tpu" holds more probability arrays:
      `PROBABILITY_COPIES`); None: the mesh's devices' (a `Mesh`), else this process's
      default backend.

  Returns:
    The `MemoryPlan`.

  Raises:
    ValueError: both a spec and any of method, K, L, T, or neither.
  """
  cell = (method, num_drafts, draft_len, max_new_tokens)
  label = ""
  if spec is not None:
    if any(v is not None for v in cell):
      raise ValueError("give a spec or method, num_drafts, draft_len and max_new_tokens, not both")
    label = spec.label()
  elif any(v is None for v in cell):
    raise ValueError("give a spec, or method, num_drafts, draft_len and max_new_tokens")
  else:
    spec = DecodeSpec(method, num_drafts, draft_len, max_new_tokens=max_new_tokens)
  method, num_drafts, draft_len = spec.method, spec.num_drafts, spec.draft_len
  max_new_tokens = spec.max_new_tokens
  if platform is None:
    concrete = isinstance(mesh, jax.sharding.Mesh)
    platform = mesh.devices.flat[0].platform if concrete else jax.default_backend()
  sizes = dict(mesh.shape)
  data = sizes.get(sharding.DATA_AXIS, 1)
  rows = -(-batch_size // data)
  cache_len = prompt_width + max_new_tokens + draft_len + 1
  models = {"draft": draft, "target": target}
  if params is None:
    params = {role: param_shapes(c) for role, c in models.items()}
  weights = {
    role: weight_bytes(params[role], mesh, param_axes(c, params[role]))
    for role, c in models.items()
  }
  cache = {
    role: cache_bytes(c, rows * data, num_drafts, draft_len, cache_len, mesh)
    for role, c in models.items()
    if role == "target" or draft_len > 0
  }
  return MemoryPlan(
    mesh={sharding.DATA_AXIS: data, sharding.MODEL_AXIS: sizes.get(sharding.MODEL_AXIS, 1)},
    batch_size=batch_size,
    rows=rows,
    method=method,
    num_drafts=num_drafts,
    draft_len=draft_len,
    cache_len=cache_len,
    weights=weights,
    cache=cache,
    probabilities=rows
    * (
      probability_bytes(spec.verifier, num_drafts, draft_len, target.num_logits, platform)
      + spec.verifier.workspace_bytes
    ),
    activations=rows * activation_bytes(target, num_drafts, draft_len, prompt_width),
    label=label,
  )


def device_bytes(memory: str = "") -> int | None:
  """A device's memory in bytes.

  Args:
    memory: a key of `config.DEVICE_MEMORY` (e.g. "tpu-v5e"), a number of GiB (e.g. "16"), or
      "" for what this process's first device reports (`memory_stats()["bytes_limit"]`).

  Returns:
    The bytes, or None when `memory` is "" and the device reports none (e.g. a CPU).
  """
  if memory:
    return device_memory_bytes(memory)
  # This process's device: memory_stats() of another process's device is an error.
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")


def check_fits(memory_plan: MemoryPlan, device_memory: int) -> None:
  """Raises `DoesNotFitError` when the plan's total exceeds `device_memory` bytes.

  The message names the largest term and what to change: more "model" devices when the
  weights alone do not fit (or dominate), else the largest batch whose rows fit.
  """
  total = memory_plan.total
  if total <= device_memory:
    return
  parts = memory_plan.parts
  largest = max(parts, key=parts.get)
  weights = sum(memory_plan.weights.values())
  model = memory_plan.mesh[sharding.MODEL_AXIS]
  data = memory_plan.mesh[sharding.DATA_AXIS]
  advice = []
  if weights >= device_memory or "weights" in largest:
    advice.append(
      f"more model devices (mesh_model > {model}: the weights take {weights / GB:.2f} GB "
      "per device)"
    )
  if weights < device_memory:
    fit_rows = (device_memory - weights) // max(memory_plan.per_row, 1)
    advice.append(
      f"a smaller batch (batch_size <= {fit_rows * data}: {fit_rows} rows per device at "
      f"{memory_plan.per_row / 1e6:.1f} MB per row)"
      if fit_rows
      else f"more model devices (mesh_model > {model}): not one row fits beside the weights"
    )
  raise DoesNotFitError(
    f"the decode needs {total / GB:.2f} GB per device, the device has "
    f"{device_memory / GB:.2f} GB; the largest part is the {largest} "
    f"({parts[largest] / GB:.2f} GB). Use {' or '.join(advice)}.\n"
    + memory_plan.table(device_memory)
  )
