"""The runner's schemas: a decoding sweep (`SweepConfig`: a grid over a `DecodeSpec`
template), its prompts, and the rho ablation (`AnalysisConfig`, `RhoAblationConfig`)."""

import dataclasses
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from spectr_jax import memory, methods
from spectr_jax.data import EOS_ID
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.pair_config import PairConfig, resolve
from spectr_jax.schema import Schema
from spectr_jax.schema import integers as _integers

__all__ = [
  "KEY_WHEN_SET_FIELDS",
  "LEGACY_DECODING",
  "METHODS",
  "SWEEP_BRANCHINGS",
  "AnalysisConfig",
  "Prompts",
  "RhoAblationConfig",
  "SweepConfig",
  "cell_record",
  "rhos_for",
]

METHODS = methods.names()  # Every method of the registry (`spectr_jax.methods`).
# The tree shapes a sweep can ask of a drafting scheme that takes one: its default, or
# `methods.PROPORTIONAL` (a static branching fits one K and L only).
SWEEP_BRANCHINGS = ("", methods.PROPORTIONAL)
# The settings block of records and configs before the template (issue 49), at its
# defaults: a config's "decoding" block is folded into `decode` and `prompts`.
LEGACY_DECODING: Mapping[str, Any] = {
  "temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_prompts": 32, "prompt_len": 8,
  "max_new_tokens": 64, "stop_at_eos": False, "dedup": False, "branching": "",
  "layer_stack": "auto", "drafting": "", "adaptive": 0.0, "node_budget": 0.0,
}  # fmt: skip
# Template fields a cell record holds only where they differ from the default (fields
# added after results were first stored keep the older cells' keys), by stored name.
KEY_WHEN_SET_FIELDS = {
  "dedup": "tree", "branching": "branching", "layer_stack": "layer_stack",
  "drafting": "drafting", "adaptive": "adaptive", "node_budget": "node_budget",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Prompts(Schema):
  """A sweep's prompts.

  Attributes:
    num_prompts: held-out sentence starts decoded per seed.
    prompt_len: sentence tokens per prompt (after BOS).
    stop_at_eos: stop a row at the pair's EOS (False: decode on into the next sentence).
  """

  num_prompts: int = 32
  prompt_len: int = 8
  stop_at_eos: bool = False

  def __post_init__(self):
    _integers("num_prompts", [self.num_prompts], 1)
    _integers("prompt_len", [self.prompt_len], 1)
    if not isinstance(self.stop_at_eos, bool):
      raise ValueError(f"stop_at_eos must be true or false, got {self.stop_at_eos!r}")


def cell_record(spec: DecodeSpec, prompts: Prompts) -> dict[str, Any]:
  """A cell's settings as its record (and so its key) holds them: sampling, T and the
  prompts always; dedup (stored as "tree"), branching, layer_stack, drafting, adaptive
  and node_budget where they differ from the default."""
  record = dict(
    temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
    num_prompts=prompts.num_prompts, prompt_len=prompts.prompt_len,
    max_new_tokens=spec.max_new_tokens, stop_at_eos=prompts.stop_at_eos,
  )  # fmt: skip
  for name, stored in KEY_WHEN_SET_FIELDS.items():
    value = getattr(spec, name)
    if value != LEGACY_DECODING[name]:
      record[stored] = value
  return record


def rhos_for(rhos: Sequence[str | float], k: int) -> list[str | float]:
  """The strategies that differ at k drafts: a fixed rho above k would be clipped to k."""
  return [r for r in rhos if isinstance(r, str) or r <= k]


def _nonempty(name: str, values: Sequence[Any]) -> None:
  if not values:
    raise ValueError(f"{name} is empty: the sweep would have no cells of it")
  if len(set(values)) != len(values):
    raise ValueError(f"{name} lists a value twice: {tuple(values)}")


def _fold_legacy(decode: Mapping[str, Any], prompts: Mapping[str, Any], legacy: Mapping[str, Any]):
  """A "decoding" block (the settings before the template) as `decode` and `prompts`
  fields: (decode, prompts) with the block's values on top."""
  legacy = {("dedup" if k == "tree" else k): v for k, v in legacy.items()}
  unknown = set(legacy) - set(LEGACY_DECODING)
  if unknown:
    raise ValueError(f"unknown SweepConfig.decoding fields {sorted(unknown)}")
  prompt_fields = {f.name for f in dataclasses.fields(Prompts)}
  decode, prompts = dict(decode), dict(prompts)
  for name, value in legacy.items():
    (prompts if name in prompt_fields else decode)[name] = value
  return decode, prompts


@dataclasses.dataclass(frozen=True)
class SweepConfig(Schema):
  """A decoding sweep: the grid methods x K x L x rho x seeds over one pair.

  Attributes:
    name: the sweep's name; results go to $SPECTR_WORKDIR/experiments/<name>.
    results_dir: overrides that directory (relative to $SPECTR_WORKDIR unless absolute).
    pair: the draft/target pair.
    methods: decoding methods (names of the registry, `python -m spectr_jax.methods`).
    num_drafts: K values (multi-draft methods run at K >= 2: at K = 1 they are their
      single-draft method, e.g. "kseq" is "sd").
    draft_lens: L, draft tokens per round.
    rhos: split factors of the methods that take one (K-SEQ): "star", "k" or numbers
      >= 1 (a number above K is skipped at that K: it would be clipped to K).
    seeds: each seed draws its own prompt set and decoding randomness.
    decode: the template every cell decodes (a `DecodeSpec` with method ''): each cell
      sets its method, K, L and rho. Its drafting, branching, dedup, adaptive and
      node_budget apply to the cells with drafts (each method exact for the scheme).
    prompts: the prompts of each seed.
    batch_size: prompts per engine call (split over all devices when `shard`).
    shard: split each batch over all devices of all hosts (a data mesh).
    compilation_cache: persistent XLA cache directory ("" = none).
    mesh_model: devices per "model" group (rows go over devices / mesh_model groups).
    device_memory: memory per device for the check before compiling: a name of
      `memory.DEVICE_MEMORY` ("h100", ...), GiB ("16"), or "" = what the device reports
      (none on CPU: the arithmetic is printed, not checked).
    refuse_inexact: stop, unsaved, at a cell whose verifier was not exact somewhere (a
      fixed rho too low); by default such cells are saved and reports mark them apart.
    decoding: deprecated: the settings block before the template (a mapping or the old
      `DecodeSettings`), folded into `decode` and `prompts`.
  """

  name: str = "sweep"
  results_dir: str = ""
  pair: PairConfig = PairConfig()
  methods: tuple[str, ...] = METHODS
  num_drafts: tuple[int, ...] = (1, 2, 4, 8)
  draft_lens: tuple[int, ...] = (2, 4, 8)
  rhos: tuple[str | float, ...] = ("star",)
  seeds: tuple[int, ...] = (0, 1, 2)
  decode: DecodeSpec = DecodeSpec(method="", max_new_tokens=64)
  prompts: Prompts = Prompts()
  batch_size: int = 200
  shard: bool = True
  compilation_cache: str = "jax_cache"
  mesh_model: int = 1
  device_memory: str = ""
  refuse_inexact: bool = False
  decoding: Any = None

  @staticmethod
  def upgrade(values: dict[str, Any]) -> dict[str, Any]:
    """A mapping written before the template: its "decoding" block folded into "decode"
    and "prompts" (values at the old defaults leave the new blocks as they are)."""
    legacy = values.pop("decoding", None)
    if legacy:
      changed = {
        k: v for k, v in dict(legacy).items()
        if LEGACY_DECODING.get("dedup" if k == "tree" else k, object()) != v
      }  # fmt: skip
      if changed:
        warnings.warn(
          "SweepConfig.decoding is deprecated: set decode (the DecodeSpec template) and "
          f"prompts; read {sorted(changed)} from it", DeprecationWarning, stacklevel=4,
        )  # fmt: skip
      decode = values.get("decode", {"method": "", "max_new_tokens": 64})
      if isinstance(decode, Mapping):
        decode, prompts = _fold_legacy(decode, values.get("prompts", {}), changed)
        values.update(decode=decode, prompts=prompts)
    return values

  @classmethod
  def defaults(cls):
    """`Schema.defaults` with the old "decoding" block at its defaults, so config files
    written before the template still load (set `decode` and `prompts` instead)."""
    config = super().defaults()
    config.decoding = dict(LEGACY_DECODING)
    return config

  def __post_init__(self):
    if self.decoding is not None:  # an old constructor call: SweepConfig(decoding=...)
      warnings.warn(
        "SweepConfig(decoding=...) is deprecated: set decode (a DecodeSpec template) and "
        "prompts", DeprecationWarning, stacklevel=3,
      )  # fmt: skip
      legacy = self.decoding
      legacy = dataclasses.asdict(legacy) if dataclasses.is_dataclass(legacy) else dict(legacy)
      base = dict(self.decode.to_dict(), method="")
      decode, prompts = _fold_legacy(base, self.prompts.to_dict(), legacy)
      object.__setattr__(self, "decode", DecodeSpec.from_dict(decode))
      object.__setattr__(self, "prompts", Prompts.from_dict(prompts))
      object.__setattr__(self, "decoding", None)
    if not self.decode.is_template:
      raise ValueError(
        "decode is the sweep's template: its method must be '' (each cell sets its own), "
        f"got {self.decode.method!r}"
      )
    if self.decode.eos_ids:
      raise ValueError("decode.eos_ids: a sweep stops at the pair's EOS (prompts.stop_at_eos)")
    unknown = [m for m in self.methods if m not in METHODS]
    if unknown:
      raise ValueError(f"unknown methods {unknown}; this build has {METHODS}")
    for name in ("methods", "num_drafts", "draft_lens", "rhos", "seeds"):
      _nonempty(name, getattr(self, name))
    for rho in self.rhos:
      try:
        methods.check_rho(rho)
      except ValueError:
        raise ValueError(f"rhos: rho must be 'star', 'k' or a number >= 1, got {rho!r}") from None
    _integers("batch_size", [self.batch_size], 1)
    _integers("mesh_model", [self.mesh_model], 1)
    if self.mesh_model > 1 and not self.shard:
      raise ValueError(f"mesh_model = {self.mesh_model} needs shard = True (a mesh)")
    if self.device_memory:
      memory.device_memory_bytes(self.device_memory)
    _integers("num_drafts", self.num_drafts, 1)
    _integers("draft_lens", self.draft_lens, 1)
    _integers("seeds", self.seeds, 0)
    self._check_grid()
    self._check_models()

  def replace(self, **changes: Any) -> "SweepConfig":
    """A copy with `changes`: the sweep's own fields, or those of its template
    (`decode`) or its `prompts`, by name (e.g. `replace(temperature=0.5, num_prompts=3,
    methods=("kseq",))`)."""
    own = {f.name for f in dataclasses.fields(self)}
    prompt_fields = {f.name for f in dataclasses.fields(Prompts)}
    decode = {k: v for k, v in changes.items() if k not in own and k not in prompt_fields}
    prompts = {k: v for k, v in changes.items() if k in prompt_fields}
    rest = {k: v for k, v in changes.items() if k in own}
    if decode:
      rest["decode"] = rest.get("decode", self.decode).replace(**decode)
    if prompts:
      rest["prompts"] = dataclasses.replace(rest.get("prompts", self.prompts), **prompts)
    return dataclasses.replace(self, **rest)

  def cell_spec(self, method: str, num_drafts: int = 1, draft_len: int = 0,
                rho: str | float = "star",
                eos_ids: Sequence[int] = (EOS_ID,)) -> DecodeSpec:  # fmt: skip
    """The `DecodeSpec` of one cell: the template with its method, K, L and rho; the
    pair's stop tokens where `prompts.stop_at_eos`; the template's branching for a
    scheme that draws trees.

    Raises:
      ValueError: the spec's own (e.g. a method not exact for the template's drafting).
    """
    scheme = methods.scheme(method, self.decode.drafting)
    return self.decode.replace(
      method=method,
      num_drafts=num_drafts,
      draft_len=draft_len,
      rho=rho,
      branching=self.decode.branching if scheme is not None and scheme.branches else "",
      eos_ids=tuple(eos_ids) if self.prompts.stop_at_eos else (),
    )

  def decoding_record(self) -> dict[str, Any]:
    """The template and prompts as the settings block before the template held them
    (what keys a stored rho ablation)."""
    prompts = self.prompts.to_dict()
    return {
      name: prompts[name] if name in prompts else getattr(self.decode, name)
      for name in LEGACY_DECODING
    }

  def _check_grid(self) -> None:
    """Every method gets cells: no combination of the grid drops a method's cells."""
    for method in map(methods.get, self.methods):
      ks = method.grid_drafts(self.num_drafts)
      if not ks:
        raise ValueError(
          f"num_drafts {self.num_drafts} gives method {method.name!r} no cell: it runs at "
          f"K >= 2 (at K = 1 it is {method.single!r}); add a K >= 2 or drop the method"
        )
      for k in ks if method.takes_rho else ():
        if not rhos_for(self.rhos, k):
          raise ValueError(
            f"rhos {self.rhos} give method {method.name!r} no cell at K = {k} (a fixed rho "
            f"above K is skipped); add 'star', 'k' or a rho <= {k}"
          )
      # Every cell's spec, so a setting a cell cannot take is named before any decode.
      for k in ks if method.speculative else ():
        for n in self.draft_lens:
          try:
            self.cell_spec(method.name, k, n)
          except ValueError as error:
            raise ValueError(
              f"decode with method {method.name!r} at K = {k}, L = {n}: {error}"
            ) from None

  def _check_models(self) -> None:
    """The grid against the pair's models (vocabulary, max_len), before any is loaded:
    the spec of the longest cell checked against each model known (`DecodeSpec.
    check_models`)."""
    speculative = [m for m in self.methods if methods.get(m).speculative]
    method = speculative[0] if speculative else self.methods[0]
    k = methods.get(method).grid_drafts(self.num_drafts)[0]
    spec = self.cell_spec(method, k, max(self.draft_lens) if speculative else 0)
    known = self.pair.model_configs()  # [draft, target] where both are known
    for draft, target in [tuple(known)] if len(known) == 2 else [(m, m) for m in known]:
      try:
        spec.check_models(target, draft if spec.speculative else None, self.prompts.prompt_len + 1)
      except ValueError as error:
        raise ValueError(f"decode: {error}") from None

  @property
  def results_path(self) -> pathlib.Path:
    """The directory of results.jsonl ($SPECTR_WORKDIR/experiments/<name> by default)."""
    return resolve(self.results_dir or f"experiments/{self.name}")


@dataclasses.dataclass(frozen=True)
class AnalysisConfig(Schema):
  """The per-position part of the rho ablation (see `configs/rho_ablation.py`).

  The prompts are the first `num_prompts` of the sweep's prompt set for its first seed;
  rhos and decoding settings are the sweep's.

  Attributes:
    num_drafts: K of the per-position analysis.
    num_prompts: first prompts of the sweep's first seed that are sampled.
    num_tokens: target samples per prompt (positions per prompt).
    batch_size: prompts per sampling call.
  """

  num_drafts: tuple[int, ...] = (2, 4, 8)
  num_prompts: int = 256
  num_tokens: int = 64
  batch_size: int = 32

  def __post_init__(self):
    _nonempty("analysis.num_drafts", self.num_drafts)
    _integers("analysis.num_drafts", self.num_drafts, 1)
    for name in ("num_prompts", "num_tokens", "batch_size"):
      _integers(f"analysis.{name}", [getattr(self, name)], 1)


@dataclasses.dataclass(frozen=True)
class RhoAblationConfig(Schema):
  """The block-level sweep and the per-position analysis of `configs/rho_ablation.py`."""

  sweep: SweepConfig = dataclasses.field(default_factory=SweepConfig)
  analysis: AnalysisConfig = AnalysisConfig()

  def __post_init__(self):
    if self.analysis.num_prompts > self.sweep.prompts.num_prompts:
      raise ValueError(
        f"analysis.num_prompts ({self.analysis.num_prompts}) exceeds the sweep's prompt set "
        f"({self.sweep.prompts.num_prompts})"
      )
