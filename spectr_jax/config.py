"""The configuration boundary: every frozen dataclass the library takes, built in one place.

Config files (`configs/*.py`) return `ml_collections.ConfigDict`s; the entry points turn
them into these dataclasses with `from_dict` (`ConfigDict.to_dict()` or saved JSON in, a
validated, frozen config out), and nothing below the entry points reads a ConfigDict.

One schema: every field is declared once, here, with its type, default and meaning.
Config files start from `Cls.defaults()` (a ConfigDict of the defaults, nested configs
nested) and set what differs; `from_dict` builds any of these classes from a nested
mapping by the field types (unknown fields are errors naming the field). This module
and the registry it validates method names with (`spectr_jax.methods`) import no JAX,
so loading a config file does not either.

  TrainConfig        one training run (model, data, optimizer, logistics).
  DistillConfig      its distillation part: the frozen target, divergence, data sources.
  PairConfig         where a draft/target pair comes from: "embedded" (trained by this
                     repository from two TrainConfigs), "trained" (existing run
                     directories) or "pretrained" (Hugging Face checkpoint directories).
  DecodeSettings     how prompts are drawn and decoded (shared by sweep, cell and bench).
  SweepConfig        a decoding sweep: a pair, the grid and the decoding settings.
  AnalysisConfig     the per-position part of the rho ablation.
  RhoAblationConfig  the rho ablation: a sweep and an analysis.
  EvalConfig         the evaluation of a pair (perplexity, single-draft acceptance).
"""

import dataclasses
import functools
import importlib.util
import json
import math
import numbers
import pathlib
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from spectr_jax import methods
from spectr_jax.data import EOS_ID, DataConfig, default_workdir
from spectr_jax.models import ModelConfig, get_model_config

METHODS = methods.names()  # Every method of the registry (`spectr_jax.methods`).
PAIR_KINDS = ("embedded", "trained", "pretrained")
DIVERGENCES = ("forward_kl", "reverse_kl", "tv", "jsd")
DISTILL_SOURCES = ("corpus", "target", "on_policy")

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


def _dataclass_of(hint: Any) -> tuple[type | None, bool]:
  """(the dataclass a field type names, whether None is allowed) for `X` or `X | None`."""
  if dataclasses.is_dataclass(hint):
    return hint, False
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = typing.get_args(hint)
    found = [a for a in args if dataclasses.is_dataclass(a)]
    if len(found) == 1:
      return found[0], type(None) in args
  return None, False


def build(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
  """An instance of the config dataclass `cls` from a nested mapping (a
  `ConfigDict.to_dict()` or saved JSON): nested config fields are built from their
  mappings (an optional one from an empty mapping or None is None), tuple fields from
  sequences, mapping fields from mappings; the classes validate in `__post_init__`.

  Raises:
    ValueError: naming a field that `cls` (at `where`, e.g. "SweepConfig.decoding") lacks.
  """
  where = where or cls.__name__
  fields = dataclasses.fields(cls)
  renamed = {f.metadata[STORED_AS]: f.name for f in fields if STORED_AS in f.metadata}
  values = {renamed.get(name, name): value for name, value in values.items()}
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = set(values) - fields
  if unknown:
    raise ValueError(f"unknown {where} fields {sorted(unknown)}; known: {sorted(fields)}")
  hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
  for name, value in values.items():
    hint = hints[name]
    nested, optional = _dataclass_of(hint)
    if nested is not None and not isinstance(value, nested):
      if optional and not value:
        values[name] = None
      elif isinstance(value, Mapping):
        values[name] = build(nested, value, f"{where}.{name}")
      else:
        raise ValueError(f"{where}.{name} must be a mapping of {nested.__name__} fields")
    elif typing.get_origin(hint) is tuple and not isinstance(value, str | bytes):
      values[name] = tuple(value)
    elif typing.get_origin(hint) in (Mapping, dict) and isinstance(value, Mapping):
      values[name] = dict(value)
  return cls(**values)


def _plain(value: Any) -> Any:
  """Mappings as dicts, recursively (for JSON and ConfigDicts)."""
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  return value


class Schema:
  """What every config dataclass here shares: `from_dict`, `to_dict` and `defaults`."""

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]):
    """Builds the config from a nested mapping (see `build`)."""
    return build(cls, values)

  def to_dict(self) -> dict[str, Any]:
    """A JSON-able nested dict; `from_dict` inverts it."""
    return _plain(dataclasses.asdict(self))

  @classmethod
  def defaults(cls) -> ml_collections.ConfigDict:
    """A ConfigDict of every field at its default (nested configs nested): the skeleton
    a config file starts from."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    values = {}
    for f in dataclasses.fields(cls):
      nested, optional = _dataclass_of(hints[f.name])
      if nested is not None and not optional:
        # A nested config's own field defaults (no instance is built: nothing is read).
        values[f.name] = (
          nested.defaults().to_dict()
          if issubclass(nested, Schema)
          else dataclasses.asdict(nested())
        )
      elif f.default is not dataclasses.MISSING:
        values[f.name] = f.default
      elif f.default_factory is not dataclasses.MISSING:
        values[f.name] = f.default_factory()
      else:
        raise TypeError(f"{cls.__name__}.{f.name} has no default")
    return ml_collections.ConfigDict(_plain(values))


def _integers(name: str, values: Sequence[Any], low: int) -> None:
  for value in values:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"every value of {name} must be an integer >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DistillConfig(Schema):
  """Distillation of the trained model (the draft) against a frozen target.

  Off when `target_workdir` is "" (plain next-token training). On, every step scores its
  rows with both models in the same jitted step (the target's distributions are never
  cached) and minimises the divergence between the two next-token distributions, both
  under the decoding transform below (the one the draft will serve).

  Attributes:
    target_workdir: the frozen target's run directory (relative to $SPECTR_WORKDIR unless
      absolute; same tokenizer and vocabulary as this run); "" = no distillation.
    init_workdir: start from the final parameters of this run ("" = fresh initialisation);
      its model must be this run's.
    divergence: per position, between the draft's p and the target's q: "forward_kl"
      KL(q || p), "reverse_kl" KL(p || q), "tv" total variation 1 - sum min(p, q) (the
      single-draft rejection rate), "jsd" the skew Jensen-Shannon divergence
      skew KL(q || m) + (1 - skew) KL(p || m), m = skew q + (1 - skew) p.
    skew: "jsd" only, in (0, 1): the target's weight (0.5 is the symmetric JSD).
    data: where each step's rows come from: "corpus" (the packed training rows),
      "target" (continuations sampled from the target), "on_policy" (sampled from the
      current draft and scored by the target), or a mix such as "corpus:1,on_policy:3"
      (shares of the `batch_size` rows, rounded). Sampled rows open with the first
      `prompt_len` tokens of training rows (never held-out text).
    temperature, top_k, top_p: the decoding transform of both models (top_k 0 = all,
      top_p 1 = no truncation), also used to sample the rows; temperature > 0.
    prompt_len: corpus tokens that open each sampled row.
    sample_tokens: tokens sampled after them.
    eval_prompts: held-out prompts of the alignment metrics (per-token acceptance
      sum min(p, q) and the K = 8 alpha* along target samples) at each evaluation.
    eval_tokens: tokens sampled from the target after each of them. (Unlike the top-level
      logistics fields, these two are part of the config a resumed run must match.)
  """

  target_workdir: str = ""
  init_workdir: str = ""
  divergence: str = "forward_kl"
  skew: float = 0.5
  data: str = "corpus"
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  prompt_len: int = 8
  sample_tokens: int = 64
  eval_prompts: int = 64
  eval_tokens: int = 64

  def __post_init__(self):
    if self.divergence not in DIVERGENCES:
      raise ValueError(
        f"unknown distill.divergence {self.divergence!r}; expected one of {DIVERGENCES}"
      )
    if not (isinstance(self.skew, numbers.Real) and 0 < self.skew < 1):
      raise ValueError(f"distill.skew must lie in (0, 1), got {self.skew!r}")
    self.shares()
    if not (isinstance(self.temperature, numbers.Real) and 0 < self.temperature < math.inf):
      raise ValueError(
        f"distill.temperature must be finite and > 0 (greedy targets have no gradient), "
        f"got {self.temperature!r}"
      )
    if not (isinstance(self.top_p, numbers.Real) and 0 < self.top_p <= 1):
      raise ValueError(f"distill.top_p must lie in (0, 1], got {self.top_p!r}")
    _integers("distill.top_k", [self.top_k], 0)
    for name in ("prompt_len", "sample_tokens", "eval_prompts", "eval_tokens"):
      _integers(f"distill.{name}", [getattr(self, name)], 1)
    if not self.target_workdir and (self.init_workdir or self.data != "corpus"):
      raise ValueError(
        "distill.init_workdir and a distill.data other than 'corpus' need a "
        "distill.target_workdir (the frozen target)"
      )

  @property
  def enabled(self) -> bool:
    """Whether the run distills (a target is named)."""
    return bool(self.target_workdir)

  def shares(self) -> dict[str, float]:
    """The data sources with their shares of each step's rows (summing to 1)."""
    weights = {}
    for item in self.data.split(","):
      name, _, weight = item.strip().partition(":")
      if name not in DISTILL_SOURCES or name in weights:
        raise ValueError(
          f"distill.data {self.data!r}: expected a source of {DISTILL_SOURCES} or a mix "
          "such as 'corpus:1,on_policy:3' (each source once)"
        )
      try:
        weights[name] = float(weight) if weight else 1.0
      except ValueError:
        raise ValueError(f"distill.data {self.data!r}: weight {weight!r} is not a number") from None
      if not 0 < weights[name] < math.inf:
        raise ValueError(f"distill.data {self.data!r}: weights must be positive")
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}

  def rows(self, batch_size: int) -> dict[str, int]:
    """Rows of each data source in a step of `batch_size` rows (each at least 1).

    Raises:
      ValueError: a source's share rounds to no row.
    """
    shares = self.shares()
    names = list(shares)
    counts, given = {}, 0
    for i, name in enumerate(names):
      count = batch_size - given if i == len(names) - 1 else round(shares[name] * batch_size)
      counts[name], given = count, given + count
    if min(counts.values()) < 1:
      raise ValueError(
        f"distill.data {self.data!r} gives a source no row of a batch of {batch_size}: {counts}"
      )
    return counts

  def transform(self) -> dict[str, Any]:
    """The `sampling.transform_probs` keyword arguments."""
    return dict(
      temperature=float(self.temperature),
      top_k=self.top_k or None,
      top_p=None if self.top_p >= 1 else float(self.top_p),
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig(Schema):
  """Everything that decides a training run.

  Attributes:
    model: a name accepted by `spectr_jax.models.get_model_config`.
    model_overrides: `ModelConfig` fields that replace the named values.
    data: the data configuration (its `vocab_size` is the model's).
    seed: seeds the initial parameters and the batch order.
    batch_size: rows per step (each `data.seq_len` tokens).
    num_steps: optimizer steps of the whole run.
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up from 0 to the peak.
    min_lr_ratio: the cosine decay ends at `learning_rate * min_lr_ratio`.
    weight_decay: AdamW decoupled weight decay (matrices only, not norm scales).
    adam_b1: AdamW beta1.
    adam_b2: AdamW beta2.
    grad_clip_norm: clip gradients to this global norm.
    eval_every: steps between held-out evaluations (and at the end).
    eval_rows: held-out rows of `seq_len + 1` tokens per evaluation (0 = all).
    checkpoint_every: steps between checkpoints (and at the end).
    keep_checkpoints: how many recent checkpoints to keep (at least 2, see docs/RELIABILITY.md).
    log_every: steps between progress lines.
    num_devices: the "data" axis size: batch rows are split over it (0 = all devices, of
      every process, that `mesh_model` leaves).
    mesh_model: the "model" axis size: weights are split over it by `sharding.RULES`
      (heads, MLP width, vocabulary); the mesh takes the first `num_devices * mesh_model`
      devices. A run may resume on another mesh (docs/RELIABILITY.md, "Training on a mesh").
    fsdp: also split parameters and optimizer state over "data" (`sharding.FSDP_RULES`).
    distill: distillation against a frozen target (off by default; see `DistillConfig`).
  """

  model: str = "target-small"
  model_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  data: DataConfig = DataConfig()
  seed: int = 0
  batch_size: int = 32
  num_steps: int = 1000
  learning_rate: float = 3e-3
  warmup_steps: int = 100
  min_lr_ratio: float = 0.1
  weight_decay: float = 0.1
  adam_b1: float = 0.9
  adam_b2: float = 0.95
  grad_clip_norm: float = 1.0
  eval_every: int = 200
  eval_rows: int = 512
  checkpoint_every: int = 200
  keep_checkpoints: int = 3
  log_every: int = 20
  num_devices: int = 1
  mesh_model: int = 1
  fsdp: bool = False
  distill: DistillConfig = DistillConfig()

  def __post_init__(self):
    if self.distill.enabled:
      self.distill.rows(self.batch_size)
      needed = self.distill.prompt_len + self.distill.sample_tokens + 1
      if set(self.distill.shares()) - {"corpus"} and needed > self.data.seq_len:
        raise ValueError(
          f"distill.prompt_len + sample_tokens + 1 = {needed} exceeds data.seq_len = "
          f"{self.data.seq_len} (sampled rows are at most as long as training rows)"
        )

  def model_config(self) -> ModelConfig:
    """Returns the model's hyper-parameters."""
    return get_model_config(self.model, self.data.vocab_size, **self.model_overrides)


def saved_train_config(workdir: str | pathlib.Path) -> TrainConfig | None:
  """The `TrainConfig` in `workdir`/config.json (None when there is none)."""
  path = pathlib.Path(workdir).expanduser().absolute() / "config.json"
  return TrainConfig.from_dict(json.loads(path.read_text())) if path.is_file() else None


def resolve(path: str | pathlib.Path) -> pathlib.Path:
  """`path` itself when absolute, else relative to $SPECTR_WORKDIR."""
  return default_workdir() / pathlib.Path(path).expanduser()


@dataclasses.dataclass(frozen=True)
class PairConfig(Schema):
  """Where a draft/target pair comes from.

  Attributes:
    kind: "embedded": the pair this repository trains from `draft` and `target` (a run of
      another config in a workdir is an error); "trained": existing run directories, read
      as they are; "pretrained": Hugging Face checkpoint directories (config.json,
      safetensors, tokenizer.json; docs/MODELS.md), never trained.
    draft_workdir, target_workdir: the two directories ("embedded" and "trained":
      relative to $SPECTR_WORKDIR unless absolute; "pretrained": relative to the
      current directory unless absolute).
    draft, target: the training configs ("embedded" only).
    train_missing: train an "embedded" model whose final checkpoint is missing (else a
      missing model is an error that names the command that trains it).
    draft_base: "embedded" only, for a draft distilled from a warm start: the training
      config of the plain draft in `draft.distill.init_workdir` (trained there first when
      missing); None when the draft is not warm-started.
    dtype: "pretrained" only: the parameter and compute dtype ("" = as stored).
    max_len: "pretrained" only: the KV-cache capacity S (0 = the loader's default).
    text: "pretrained" only: the source of the held-out sentences that prompts start
      (a `DataConfig.source`: "embedded", "lm1b_text" or "tfds"), tokenized by the
      pair's tokenizer.
    text_path: the directory of that source ("lm1b_text", "tfds").
  """

  kind: str = "trained"
  draft_workdir: str = "draft"
  target_workdir: str = "target"
  draft: TrainConfig | None = None
  target: TrainConfig | None = None
  train_missing: bool = False
  draft_base: TrainConfig | None = None
  dtype: str = ""
  max_len: int = 0
  text: str = "embedded"
  text_path: str = ""

  def __post_init__(self):
    if self.kind not in PAIR_KINDS:
      raise ValueError(f"unknown pair kind {self.kind!r}; expected one of {PAIR_KINDS}")
    if self.kind == "embedded" and (self.draft is None or self.target is None):
      raise ValueError("an 'embedded' pair needs the draft and target training configs")
    if self.train_missing and self.kind != "embedded":
      raise ValueError(f"train_missing needs an 'embedded' pair, not {self.kind!r}")
    if self.kind == "pretrained" and not (self.draft_workdir and self.target_workdir):
      raise ValueError(
        "a 'pretrained' pair needs both checkpoint directories: "
        "--config.pair.draft_workdir=DIR --config.pair.target_workdir=DIR"
      )
    _integers("max_len", [self.max_len], 0)
    if self.draft_base is not None and not (
      self.kind == "embedded" and self.draft.distill.init_workdir
    ):
      raise ValueError(
        "draft_base needs an 'embedded' pair whose draft distills from "
        "distill.init_workdir (the plain draft's run directory)"
      )

  @property
  def workdirs(self) -> tuple[pathlib.Path, pathlib.Path]:
    """The draft's and the target's directories, resolved."""
    given = (self.draft_workdir, self.target_workdir)
    if self.kind == "pretrained":
      draft, target = (pathlib.Path(d).expanduser().absolute() for d in given)
      return draft, target
    return resolve(given[0]), resolve(given[1])

  def model_configs(self) -> list[ModelConfig]:
    """The models' configs as far as known before loading: from the run folders'
    config.json where they exist, else from the training configs (none for pretrained)."""
    found = []
    if self.kind == "pretrained":
      return []
    for workdir, train in zip(self.workdirs, (self.draft, self.target), strict=True):
      train = saved_train_config(workdir) or train
      if train is not None:
        found.append(train.model_config())
    return found


# Metadata of a config field whose default value is left out of a cell's key
# (`DecodeSettings.cell_fields`).
KEY_WHEN_SET = "key_when_set"
# Metadata of a renamed config field: the name records hold it under (and config files
# written before the rename use; `build` takes either).
STORED_AS = "stored_as"
# The tree shapes a sweep can ask of a drafting scheme that takes one: its default, or
# `methods.PROPORTIONAL` (a static branching fits one K and L only: a `DecodeSpec`'s).
SWEEP_BRANCHINGS = ("", methods.PROPORTIONAL)
# `DecodeSpec.layer_stack` -> the models' `scan_layers` (`DecodeSpec.scan_layers`).
LAYER_STACKS = {"auto": None, "scan": True, "unroll": False}


def _eos_tuple(eos_ids: Any) -> tuple[int, ...]:
  """The stop tokens as a tuple: None or () for none, one id, or a sequence of ids."""
  if eos_ids is None:
    return ()
  if isinstance(eos_ids, Sequence) and not isinstance(eos_ids, str):
    return tuple(eos_ids)
  return (eos_ids,)


def _branching(value: Any) -> str | tuple[int, ...]:
  """A tree shape as the spec holds it: "" (the scheme's default), "proportional", or a
  tuple of children per depth (from a sequence or text such as "4x2x1x1")."""
  if value is None:
    return ""
  if isinstance(value, str):
    if value in ("", methods.PROPORTIONAL):
      return value
    try:
      return tuple(int(b) for b in value.split("x"))
    except ValueError:
      raise ValueError(
        f"branching must be '', {methods.PROPORTIONAL!r} or children per depth such as "
        f"'4x2x1x1', got {value!r}"
      ) from None
  if isinstance(value, Sequence):
    return tuple(value)
  raise ValueError(f"branching must be a string or a sequence of integers, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DecodeSpec(Schema):
  """What `engine.generate` decodes: the one decode specification, validated here.

  Config files, sweeps (`DecodeSettings.spec`), the engine, `engine.lower` and the
  benchmarks (`DecodeSpec.parse`) all describe a decode with it. Three independent axes
  name what a round does: the verifier (`method`), how its drafts are drawn (`drafting`)
  and, for a scheme that draws a tree, the tree's shape (`branching`).

  Vocabulary (one meaning each): the *tree* of a round is the prefix tree of its K
  drafts (`spectr_jax.tree`); `branching` is the shape a tree drafting scheme draws it
  in; `dedup` scores and drafts that tree's distinct prefixes once instead of K tails.

  Attributes:
    method: the verifier, a name of the method registry (`spectr_jax.methods`):
      "autoregressive" (target only, one token per round), "sd", "kseq" (SpecTr),
      "specinfer", "optimal", "rrs", "block", "gbv", "gbv_tp", "traversal".
    num_drafts: K, draft sequences per round (1 for "autoregressive").
    draft_len: L, draft tokens per sequence (0 for "autoregressive").
    drafting: the drafting scheme (a name in `methods.DRAFTING`, e.g. "iid", "wor");
      "" for the method's own. The method must be exact for its law
      (`methods.Method.exact_for`): other pairs are refused, naming why.
    branching: for a scheme that draws a tree (`methods.Drafting.branches`), its
      children per node at each depth (L integers whose product is K, e.g. (4, 2, 1, 1),
      or the text "4x2x1x1"), "proportional" (`methods.PROPORTIONAL`: shaped by the
      draft's path probabilities) or "" for the scheme's default.
    rho: the split factor of a method that takes one (K-SEQ): "star", "k" or a number
      in [1, K] (traced: one program serves every number); ignored by the others.
    max_new_tokens: T, tokens generated per row (fewer when a stop token is emitted);
      it sets the program's buffers (one program per value).
    token_limit: stop each row after this many tokens, in [1, max_new_tokens] (traced:
      one program serves every limit); None = max_new_tokens.
    temperature: >= 0 (0 is greedy, compiled apart from sampling; other temperatures
      share one program).
    top_k: keep the top_k most likely tokens (0 = all; static).
    top_p: nucleus mass in (0, 1] (1 = no truncation; other values share one program).
    eos_ids: the stop tokens (any of them ends a row); () for none. One id is taken too.
    dedup: score each round's drafts as their deduplicated tree (one target position per
      distinct prefix) and draft them as one, instead of K tails: the same output law
      for every method, fewer target and draft positions.
    layer_stack: how the models' layers run: "scan" (one compiled layer under
      `lax.scan`; compiles fast), "unroll", or "auto" (scan models of
      `models.layout.SCAN_MIN_LAYERS` layers or more). The same tokens, to rounding.
    adaptive: adaptive draft length (`spectr_jax.adaptive`): a confidence threshold in
      (0, 1]; each round drafts and verifies position j >= 1 only while the likeliest
      draft prefix before j is at least this probable (L becomes the longest length),
      and the target scores the drafts up to the batch's longest length. 0 = off (every
      round drafts and verifies L positions). The same output law; token-level verifiers
      on tails only (not `dedup`, not a block-level method). Any value > 0 shares one
      program.
    node_budget: the batch's tree budget, for a scheme that draws a tree ("wor") in its
      default shape (K distinct first tokens, each path continuing alone) with `dedup`:
      the tree is drafted whole, then the live rows (of each data shard, on a mesh)
      share floor(node_budget x live rows) of its K L drafted nodes per round, at least
      one each, given greedily to the nodes the walk is likeliest to reach were the
      target the draft (`adaptive.budget_nodes`); each path is verified, and the target
      scores it, to the depth its kept nodes reach (the compiled tree size is the
      batch's largest). In [1, K L]; 0 = off. Any value >= 1 shares one program.

  `DecodeSpec.parse("kseq:8:4")` reads the benchmarks' short form.
  """

  method: str = "kseq"
  num_drafts: int = 1
  draft_len: int = 4
  drafting: str = ""
  branching: str | tuple[int, ...] = ""
  rho: str | float = "star"
  max_new_tokens: int = 32
  token_limit: int | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_ids: tuple[int, ...] = ()
  dedup: bool = False
  layer_stack: str = "auto"
  adaptive: float = 0.0
  node_budget: float = 0.0

  def __post_init__(self):
    record = methods.get(self.method)
    set_ = functools.partial(object.__setattr__, self)
    _integers("max_new_tokens", [self.max_new_tokens], 1)
    if not record.speculative:  # nothing drafted: one spec (and program) however named
      for name, value in (("num_drafts", 1), ("draft_len", 0), ("drafting", ""),
                          ("branching", ""), ("rho", "star"), ("dedup", False),
                          ("adaptive", 0.0), ("node_budget", 0.0)):  # fmt: skip
        set_(name, value)
    _integers("num_drafts", [self.num_drafts], 1)
    _integers("draft_len", [self.draft_len], 1 if record.speculative else 0)
    record.check_drafts(self.num_drafts)
    if not isinstance(self.drafting, str):
      raise ValueError(f"drafting must be a scheme name or '', got {self.drafting!r}")
    scheme = methods.scheme(self.method, self.drafting)  # refuses an inexact pair
    # "" for the method's own scheme: one spec (and program) however it is named.
    set_("drafting", "" if scheme is None or scheme.name == record.drafting else scheme.name)
    set_("branching", _branching(self.branching))
    if self.branching != "":
      if scheme is None or not scheme.branches:
        name = "no drafts" if scheme is None else f"scheme {scheme.name!r}"
        raise ValueError(f"method {self.method!r} with {name} draws no tree: branching must be ''")
      methods.check_branching(self.branching, self.num_drafts, self.draft_len)
    set_("rho", methods.check_rho(self.rho) if record.takes_rho else "star")
    if not isinstance(self.rho, str) and self.rho > self.num_drafts:
      raise ValueError(
        f"rho must be 'star', 'k' or a number in [1, K = {self.num_drafts}], got {self.rho}"
      )
    if self.token_limit is not None:
      _integers("token_limit", [self.token_limit], 1)
      if self.token_limit > self.max_new_tokens:
        raise ValueError(
          f"token_limit must lie in [1, max_new_tokens = {self.max_new_tokens}], "
          f"got {self.token_limit}"
        )
    if not isinstance(self.temperature, numbers.Real):
      raise ValueError(
        "temperature must be a number, not a traced value: greedy decoding (0) and sampling "
        f"compile to different programs; got {self.temperature!r}"
      )
    if not 0 <= self.temperature < math.inf:
      raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
    _integers("top_k", [self.top_k], 0)
    if not (isinstance(self.top_p, numbers.Real) and 0 < self.top_p <= 1):
      raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
    set_("eos_ids", _eos_tuple(self.eos_ids))
    _integers("eos_ids", self.eos_ids, 0)
    if not isinstance(self.dedup, bool):
      raise ValueError(f"dedup must be true or false, got {self.dedup!r}")
    if self.layer_stack not in LAYER_STACKS:
      raise ValueError(
        f"layer_stack must be one of {tuple(LAYER_STACKS)}, got {self.layer_stack!r}"
      )
    # Normalise the types, so equal specs hash (and key programs) equally.
    set_("temperature", float(self.temperature))
    set_("top_p", float(self.top_p))
    set_("dedup", self.dedup and self.draft_len > 0)
    self._check_adaptive(record)
    self._check_node_budget(scheme)

  def _check_node_budget(self, scheme: "methods.Drafting | None") -> None:
    nodes = self.num_drafts * self.draft_len
    if not (isinstance(self.node_budget, numbers.Real) and (
        self.node_budget == 0 or 1 <= self.node_budget <= nodes)):  # fmt: skip
      raise ValueError(
        f"node_budget must lie in [1, K L = {nodes}], or be 0 for off, got {self.node_budget!r}"
      )
    object.__setattr__(self, "node_budget", float(self.node_budget))
    if self.node_budget == 0:
      return
    if scheme is None or not scheme.branches or self.branching != "":
      raise ValueError(
        "node_budget shares the nodes of a tree drafting scheme in its default shape "
        f"(drafting 'wor' with branching ''): method {self.method!r} draws "
        f"{'no tree' if scheme is None or not scheme.branches else 'a tree'}"
        f"{f' of branching {self.branching!r}' if self.branching != '' else ''}"
      )
    if not self.dedup:
      raise ValueError(
        "node_budget needs dedup: the target scores the kept nodes of the round's tree "
        "(tails would score every path's L + 1 positions whatever it keeps)"
      )
    if self.adaptive:
      raise ValueError("node_budget and adaptive are not combined: choose one")

  def _check_adaptive(self, record: "methods.Method") -> None:
    if not (isinstance(self.adaptive, numbers.Real) and 0 <= self.adaptive <= 1):
      raise ValueError(
        f"adaptive must be a threshold in (0, 1], or 0 for off, got {self.adaptive!r}"
      )
    object.__setattr__(self, "adaptive", float(self.adaptive))
    if self.adaptive == 0:
      return
    if record.level != "token":
      raise ValueError(
        f"adaptive draft length needs a token-level verifier: method {self.method!r} "
        "verifies whole blocks (its walk cannot stop at a chosen position); use one of "
        f"{[m.name for m in methods.METHODS.values() if m.level == 'token']}"
      )
    if self.dedup:
      raise ValueError("adaptive draft length drafts and scores tails: set dedup false")

  @property
  def speculative(self) -> bool:
    """Whether it verifies drafts (every method but "autoregressive")."""
    return methods.get(self.method).speculative

  @property
  def scheme(self) -> "methods.Drafting | None":
    """The drafting scheme its drafts come from (None for "autoregressive")."""
    return methods.scheme(self.method, self.drafting)

  @property
  def scan_layers(self) -> bool | None:
    """`layer_stack` as the models take it: True (scan), False (unroll), None (auto)."""
    return LAYER_STACKS[self.layer_stack]

  @property
  def greedy(self) -> bool:
    """Whether it decodes greedily (temperature 0)."""
    return self.temperature <= 0

  def replace(self, **changes) -> "DecodeSpec":
    """A copy with `changes`, validated again."""
    return dataclasses.replace(self, **changes)

  def check_models(self, target: ModelConfig, draft: ModelConfig | None, prompt_width: int) -> None:
    """Raises a clear error where the spec does not fit the models: no draft for a
    speculative method, vocabularies that differ, top_k or a stop token outside the
    vocabulary, or prompt_width + max_new_tokens + L + 1 positions beyond a max_len."""
    if self.speculative and draft is None:
      raise ValueError(f"method {self.method!r} needs a draft model")
    if self.speculative and draft.num_logits != target.num_logits:
      raise ValueError(
        f"draft and target vocabularies differ: {draft.num_logits} vs {target.num_logits}"
      )
    if self.top_k > target.num_logits:
      raise ValueError(f"top_k = {self.top_k} exceeds the vocabulary ({target.num_logits})")
    for eos in self.eos_ids:
      if eos >= target.num_logits:
        raise ValueError(
          f"every value of eos_ids must lie in [0, {target.num_logits - 1}], got {eos}"
        )
    needed = prompt_width + self.max_new_tokens + self.draft_len + 1
    for name, model in (("target", target), ("draft", draft if self.speculative else None)):
      if model is not None and needed > model.max_len:
        raise ValueError(
          f"prompt width {prompt_width} + max_new_tokens {self.max_new_tokens} + "
          f"draft_len + 1 = {needed} exceeds the {name}'s max_len {model.max_len}"
        )

  @classmethod
  def parse(cls, text: str, **fields) -> "DecodeSpec":
    """The spec of the benchmarks' short form `method[/drafting]:K:L[:branching]`, e.g.
    "kseq:8:4", "rrs:8:4:4x2x1x1", "sd/iid:1:4", "autoregressive"; `fields` set the
    rest (max_new_tokens, temperature, ...).

    Raises:
      ValueError: naming the text and the form it should have.
    """
    parts = text.split(":")
    method, _, drafting = parts[0].partition("/")
    sizes = parts[1:3]
    if len(parts) not in (1, 3, 4) or not all(s.isdigit() for s in sizes):
      raise ValueError(
        f"{text!r}: expected method[/drafting]:K:L[:branching] with K and L integers (e.g. "
        "'kseq:8:4', 'rrs/wor:8:4:4x2x1x1') or a method alone ('autoregressive')"
      )
    if sizes:
      fields.update(num_drafts=int(sizes[0]), draft_len=int(sizes[1]))
    branching = parts[3] if len(parts) == 4 else fields.pop("branching", "")
    return cls(method=method, drafting=drafting, branching=branching, **fields)

  def label(self) -> str:
    """The short form `parse` reads (with rho where it is not "star", dedup marked)."""
    text = self.method + (f"/{self.drafting}" if self.drafting else "")
    if self.speculative:
      text += f":{self.num_drafts}:{self.draft_len}"
      if self.branching:
        shape = self.branching
        text += ":" + (shape if isinstance(shape, str) else "x".join(map(str, shape)))
    if self.rho != "star":
      text += f" rho={self.rho}"
    return text + (" dedup" if self.dedup else "")


@dataclasses.dataclass(frozen=True)
class DecodeSettings(Schema):
  """How a sweep's prompts are drawn and decoded (everything of a cell but method, K, L,
  rho and seed): `spec` makes each cell's `DecodeSpec`, which validates the fields they
  share.

  Attributes:
    temperature: sampling temperature of both models (0 is greedy).
    top_k: keep the top_k most likely tokens (0 = all).
    top_p: nucleus mass (1.0 = no truncation).
    num_prompts: held-out sentence starts decoded per seed.
    prompt_len: sentence tokens per prompt (after BOS).
    max_new_tokens: tokens generated per prompt.
    stop_at_eos: stop a row at EOS (False: decode on into the next sentence).
    dedup: score and draft each round's drafts as their deduplicated tree
      (`DecodeSpec.dedup`; config files and records written before the name call it
      "tree").
    branching: the tree a drafting scheme that takes one draws (`DecodeSpec.branching`):
      "" for its default, or "proportional" (shaped by the draft's probabilities, any K
      and L). Cells of other schemes ignore it.
    layer_stack: how the models' layers run (`DecodeSpec.layer_stack`).
    drafting: the drafting scheme of every speculative cell (`DecodeSpec.drafting`); ""
      for each method's default. A sweep's methods must be exact for it
      (`methods.exact_for(drafting)` lists them).
    adaptive: adaptive draft length's threshold for every speculative cell
      (`DecodeSpec.adaptive`; 0 = off): L is then each round's longest length. A sweep's
      speculative methods must be token-level.
    node_budget: the batch's tree budget of every cell with drafts (`DecodeSpec.
      node_budget`; 0 = off): drafted nodes per row on average, at most each cell's
      K L. A sweep's methods must draw trees ("wor"), with dedup.

  A field added after results were first stored carries `KEY_WHEN_SET` in its metadata:
  a cell's record (and so its key) holds it only where it differs from its default, so
  the cells stored before it keep their keys (`cell_fields`). A renamed field carries
  its stored name (`STORED_AS`), which records keep and config files may still use.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_prompts: int = 32
  prompt_len: int = 8
  max_new_tokens: int = 64
  stop_at_eos: bool = False
  dedup: bool = dataclasses.field(default=False, metadata={KEY_WHEN_SET: True, STORED_AS: "tree"})
  branching: str = dataclasses.field(default="", metadata={KEY_WHEN_SET: True})
  layer_stack: str = dataclasses.field(default="auto", metadata={KEY_WHEN_SET: True})
  drafting: str = dataclasses.field(default="", metadata={KEY_WHEN_SET: True})
  adaptive: float = dataclasses.field(default=0.0, metadata={KEY_WHEN_SET: True})
  node_budget: float = dataclasses.field(default=0.0, metadata={KEY_WHEN_SET: True})

  def __post_init__(self):
    _integers("num_prompts", [self.num_prompts], 1)
    _integers("prompt_len", [self.prompt_len], 1)
    if not isinstance(self.stop_at_eos, bool):
      raise ValueError(f"stop_at_eos must be true or false, got {self.stop_at_eos!r}")
    if self.branching not in SWEEP_BRANCHINGS:
      raise ValueError(f"branching must be one of {SWEEP_BRANCHINGS}, got {self.branching!r}")
    if self.drafting:
      methods.get_drafting(self.drafting)
    if not isinstance(self.dedup, bool):
      raise ValueError(f"dedup must be true or false, got {self.dedup!r}")
    # The fields a DecodeSpec shares are checked by it (one place).
    DecodeSpec(method="autoregressive", **self._shared())
    DecodeSpec(method="sd", adaptive=self.adaptive)
    object.__setattr__(self, "adaptive", float(self.adaptive))
    if not (isinstance(self.node_budget, numbers.Real) and (
        self.node_budget == 0 or self.node_budget >= 1)):  # fmt: skip
      raise ValueError(f"node_budget must be >= 1, or 0 for off, got {self.node_budget!r}")
    object.__setattr__(self, "node_budget", float(self.node_budget))
    # Normalise the types, so equal settings hash (and key cells) equally.
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))

  def _shared(self) -> dict[str, Any]:
    return dict(
      temperature=self.temperature,
      top_k=self.top_k,
      top_p=self.top_p,
      max_new_tokens=self.max_new_tokens,
      layer_stack=self.layer_stack,
    )

  def cell_fields(self) -> dict[str, Any]:
    """The settings as a cell's record holds them: every field by its stored name,
    except a `KEY_WHEN_SET` field at its default."""
    return {
      f.metadata.get(STORED_AS, f.name): getattr(self, f.name)
      for f in dataclasses.fields(self)
      if not (f.metadata.get(KEY_WHEN_SET) and getattr(self, f.name) == f.default)
    }

  def spec(
    self, method: str, num_drafts: int = 1, draft_len: int = 0, rho: str | float = "star",
    eos_ids: Sequence[int] = (EOS_ID,),
  ) -> DecodeSpec:  # fmt: skip
    """The `DecodeSpec` of one cell: these settings with its method, K, L and rho; the
    pair's stop tokens (`Pair.special.eos`) where `stop_at_eos`; `branching` for a
    scheme that draws a tree (ignored by others), `dedup` for cells with drafts.

    Raises:
      ValueError: the spec's own (e.g. a method not exact for `drafting`).
    """
    scheme = methods.scheme(method, self.drafting)
    return DecodeSpec(
      method=method,
      num_drafts=num_drafts,
      draft_len=draft_len,
      drafting=self.drafting,
      branching=self.branching if scheme is not None and scheme.branches else "",
      rho=rho,
      eos_ids=tuple(eos_ids) if self.stop_at_eos else (),
      dedup=self.dedup,
      adaptive=self.adaptive,
      node_budget=self.node_budget,
      **self._shared(),
    )


def rhos_for(rhos: Sequence[str | float], k: int) -> list[str | float]:
  """The strategies that differ at k drafts: a fixed rho above k would be clipped to k."""
  return [r for r in rhos if isinstance(r, str) or r <= k]


def _nonempty(name: str, values: Sequence[Any]) -> None:
  if not values:
    raise ValueError(f"{name} is empty: the sweep would have no cells of it")
  if len(set(values)) != len(values):
    raise ValueError(f"{name} lists a value twice: {tuple(values)}")


@dataclasses.dataclass(frozen=True)
class SweepConfig(Schema):
  """A decoding sweep: the grid methods x K x L x rho x seeds over one pair.

  Attributes:
    name: the sweep's name; results go to $SPECTR_WORKDIR/experiments/<name>.
    results_dir: overrides that directory (relative to $SPECTR_WORKDIR unless absolute).
    pair: the draft/target pair.
    methods: decoding methods (names of the registry, `spectr_jax.methods`).
    num_drafts: K values (multi-draft methods run at K >= 2: at K = 1 they are their
      single-draft method, e.g. "kseq" is "sd").
    draft_lens: L, draft tokens per round.
    rhos: split factors of the methods that take one (K-SEQ): "star", "k" or numbers
      >= 1 (a number above K is skipped at that K: it would be clipped to K).
    seeds: each seed draws its own prompt set and decoding randomness.
    decoding: how prompts are drawn and decoded.
    batch_size: prompts per engine call (split over all devices when `shard`).
    shard: split each batch over all devices of all hosts (a data mesh).
    compilation_cache: persistent XLA cache directory ("" = none).
    mesh_model: devices per "model" group: parameters and caches split by the rules of
      `spectr_jax.sharding` (rows go over the data = devices / mesh_model groups).
    device_memory: memory per device for the check before compiling: a name of
      `DEVICE_MEMORY` ("tpu-v5e", "h100", ...), GiB ("16"), or "" = what the device
      reports (none on CPU: the arithmetic is printed, not checked).
    refuse_inexact: stop (without saving it) at a cell whose verifier was not exact at
      some position (a fixed rho below what the position needs); by default such cells
      are saved and every report ranks them apart, marked as not exact.
  """

  name: str = "sweep"
  results_dir: str = ""
  pair: PairConfig = PairConfig()
  methods: tuple[str, ...] = METHODS
  num_drafts: tuple[int, ...] = (1, 2, 4, 8)
  draft_lens: tuple[int, ...] = (2, 4, 8)
  rhos: tuple[str | float, ...] = ("star",)
  seeds: tuple[int, ...] = (0, 1, 2)
  decoding: DecodeSettings = DecodeSettings()
  batch_size: int = 200
  shard: bool = True
  compilation_cache: str = "jax_cache"
  mesh_model: int = 1
  device_memory: str = ""
  refuse_inexact: bool = False

  def __post_init__(self):
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
      device_memory_bytes(self.device_memory)
    _integers("num_drafts", self.num_drafts, 1)
    _integers("draft_lens", self.draft_lens, 1)
    _integers("seeds", self.seeds, 0)
    self._check_grid()
    self._check_models()
    for method in self.methods:  # an inexact (method, drafting) pair is refused here
      methods.scheme(method, self.decoding.drafting)

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
            self.decoding.spec(method.name, k, n)
          except ValueError as error:
            raise ValueError(
              f"decoding with method {method.name!r} at K = {k}, L = {n}: {error}"
            ) from None

  def _check_models(self) -> None:
    """The grid against the pair's models (vocabulary, max_len), before any is loaded:
    the spec of the longest cell checked against each model known (`DecodeSpec.
    check_models`)."""
    speculative = [m for m in self.methods if methods.get(m).speculative]
    method = speculative[0] if speculative else self.methods[0]
    k = methods.get(method).grid_drafts(self.num_drafts)[0]
    spec = self.decoding.spec(method, k, max(self.draft_lens) if speculative else 0)
    known = self.pair.model_configs()  # [draft, target] where both are known
    for draft, target in [tuple(known)] if len(known) == 2 else [(m, m) for m in known]:
      try:
        spec.check_models(target, draft if spec.speculative else None, self.decoding.prompt_len + 1)
      except ValueError as error:
        raise ValueError(f"decoding: {error}") from None

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
    if self.analysis.num_prompts > self.sweep.decoding.num_prompts:
      raise ValueError(
        f"analysis.num_prompts ({self.analysis.num_prompts}) exceeds the sweep's prompt set "
        f"({self.sweep.decoding.num_prompts})"
      )


@dataclasses.dataclass(frozen=True)
class EvalConfig(Schema):
  """What `evaluate.evaluate_pair` measures.

  Attributes:
    eval_rows: held-out rows of `seq_len + 1` tokens for perplexity and teacher-forced
      acceptance (0 = all).
    batch_size: rows per forward pass.
    num_prompts: prompts (held-out sentence starts) for the sampled acceptance.
    prompt_len: sentence ids per prompt (after BOS).
    num_tokens: tokens sampled from the target after each prompt.
    temperature: sampling temperature of the target (and of both distributions).
    seed: selects the prompts and seeds the sampling.
  """

  eval_rows: int = 0
  batch_size: int = 32
  num_prompts: int = 64
  prompt_len: int = 8
  num_tokens: int = 32
  temperature: float = 1.0
  seed: int = 0


def _config_file(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of a `--config PATH[:ARG]` value (as ml_collections loads it)."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_config_file", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*([arg] if arg else []))


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing for the entry points (`app.run(main, flags_parser=parse_flags)`),
  with a clear error for an override of a field the config does not have
  (`--config.decoding.foo=1`, which ml_collections reports as AttributeError: "'foo'").

  Returns:
    The arguments left after the flags (as `flags.FLAGS(argv)`).
  """
  from absl import flags  # the entry points' parser (absl is not needed to build configs)

  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    args = [a.partition("=") for a in argv[1:]]
    files = {  # --config=FILE or --config FILE
      name[2:]: value if eq else (argv[i + 2] if i + 2 < len(argv) else "")
      for i, (name, eq, value) in enumerate(args)
      if name.startswith("--") and "." not in name
    }
    for name, _, _ in args:
      flag, _, path = name[2:].partition(".")
      if not path or flag not in files:
        continue
      node, where = _config_file(files[flag]), f"--{flag}"
      for key in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or key not in node:
          fields = ", ".join(sorted(node)) if isinstance(node, ml_collections.ConfigDict) else ""
          sys.exit(f"{name}: {where} has no field {key!r}" + (f" ({fields})" if fields else ""))
        node, where = node[key], f"{where}.{key}"
    raise error
