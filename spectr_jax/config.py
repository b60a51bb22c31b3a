"""The configuration boundary: every frozen dataclass the library takes, built in one place.

Config files (`configs/*.py`) return `ml_collections.ConfigDict`s; the entry points turn
them into these dataclasses with the `from_dict` builders here (`ConfigDict.to_dict()`
or saved JSON in, a validated, frozen config out), and nothing below the entry points
reads a ConfigDict.

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
import json
import math
import numbers
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from spectr_jax import acceptance, engine, memory
from spectr_jax.data import EOS_ID, DataConfig, default_workdir
from spectr_jax.models import ModelConfig, get_model_config

METHODS = engine.METHODS  # "autoregressive" and every method of `verify.METHODS`.
PAIR_KINDS = ("embedded", "trained", "pretrained")
DIVERGENCES = ("forward_kl", "reverse_kl", "tv", "jsd")
DISTILL_SOURCES = ("corpus", "target", "on_policy")


def _known(cls, values: Mapping[str, Any]) -> dict[str, Any]:
  """`values` as a dict, with a clear error for names that are not fields of `cls`."""
  values = dict(values)
  unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
  if unknown:
    raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
  return values


def _integers(name: str, values: Sequence[Any], low: int) -> None:
  for value in values:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"every value of {name} must be an integer >= {low}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
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
    """The `sampling.transform_probs` / `engine.generate` keyword arguments."""
    return dict(
      temperature=float(self.temperature),
      top_k=self.top_k or None,
      top_p=None if self.top_p >= 1 else float(self.top_p),
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
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

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
    """Builds a config from a nested mapping (a `ConfigDict.to_dict()` or saved JSON)."""
    values = _known(cls, values)
    data = DataConfig(**dict(values.pop("data", {})))
    overrides = dict(values.pop("model_overrides", {}))
    distill = DistillConfig(**_known(DistillConfig, values.pop("distill", {})))
    return cls(data=data, model_overrides=overrides, distill=distill, **values)

  def to_dict(self) -> dict[str, Any]:
    """Returns a JSON-able nested dict; `from_dict` inverts it."""
    values = dataclasses.asdict(self)
    values["model_overrides"] = dict(self.model_overrides)
    return values

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
class PairConfig:
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

  kind: str
  draft_workdir: str
  target_workdir: str
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

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "PairConfig":
    """Builds the config from a nested mapping (a `ConfigDict.to_dict()`)."""
    values = _known(cls, values)
    for role in ("draft", "target", "draft_base"):
      if values.get(role):
        values[role] = TrainConfig.from_dict(values[role])
      else:
        values[role] = None
    return cls(**values)

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


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How prompts are drawn and decoded (everything of a cell but method, K, L, rho, seed).

  Attributes:
    temperature: sampling temperature of both models (0 is greedy).
    top_k: keep the top_k most likely tokens (0 = all).
    top_p: nucleus mass (1.0 = no truncation).
    num_prompts: held-out sentence starts decoded per seed.
    prompt_len: sentence tokens per prompt (after BOS).
    max_new_tokens: tokens generated per prompt.
    stop_at_eos: stop a row at EOS (False: decode on into the next sentence).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  num_prompts: int = 32
  prompt_len: int = 8
  max_new_tokens: int = 64
  stop_at_eos: bool = False

  def __post_init__(self):
    _integers("num_prompts", [self.num_prompts], 1)
    _integers("prompt_len", [self.prompt_len], 1)
    _integers("max_new_tokens", [self.max_new_tokens], 1)
    _integers("top_k", [self.top_k], 0)
    if not (isinstance(self.temperature, numbers.Real) and 0 <= self.temperature < math.inf):
      raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
    if not (isinstance(self.top_p, numbers.Real) and 0 < self.top_p <= 1):
      raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
    # Normalise the types, so equal settings hash (and key cells) equally.
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "DecodeSettings":
    """Builds the settings from a mapping (a `ConfigDict.to_dict()`)."""
    return cls(**_known(cls, values))

  def sampling_args(self, eos_ids: Sequence[int] = (EOS_ID,)) -> dict[str, Any]:
    """The `engine.generate` arguments these settings fix: temperature, top_k, top_p,
    eos_id (None where there is no truncation or no stop token).

    Args:
      eos_ids: the pair's stop tokens (`Pair.special.eos`).
    """
    return dict(
      temperature=self.temperature,
      top_k=self.top_k or None,
      top_p=None if self.top_p >= 1 else self.top_p,
      eos_id=tuple(eos_ids) if self.stop_at_eos else None,
    )


def check_rho(rho: str | float) -> str | float:
  """A K-SEQ split factor as the grid stores it: "star", "k" or a float >= 1.

  Raises ValueError otherwise (the check is `acceptance.split_rho`'s, the one parser).
  """
  acceptance.split_rho(rho)
  return rho if isinstance(rho, str) else float(rho)


def rhos_for(rhos: Sequence[str | float], k: int) -> list[str | float]:
  """The strategies that differ at k drafts: a fixed rho above k would be clipped to k."""
  return [r for r in rhos if isinstance(r, str) or r <= k]


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """A sweep (see `configs/lm1b_spectr.py` for the meaning of every field)."""

  name: str
  results_dir: str
  pair: PairConfig
  methods: tuple[str, ...]
  num_drafts: tuple[int, ...]
  draft_lens: tuple[int, ...]
  rhos: tuple[str | float, ...]
  seeds: tuple[int, ...]
  decoding: DecodeSettings
  batch_size: int
  shard: bool
  compilation_cache: str
  mesh_model: int = 1
  device_memory: str = ""

  def __post_init__(self):
    unknown = set(self.methods) - set(METHODS)
    if unknown:
      raise ValueError(f"unknown methods {sorted(unknown)}; this build has {METHODS}")
    for rho in self.rhos:
      try:
        check_rho(rho)
      except ValueError:
        raise ValueError(f"rho must be 'star', 'k' or a number >= 1, got {rho!r}") from None
    _integers("batch_size", [self.batch_size], 1)
    _integers("mesh_model", [self.mesh_model], 1)
    if self.mesh_model > 1 and not self.shard:
      raise ValueError(f"mesh_model = {self.mesh_model} needs shard = True (a mesh)")
    if self.device_memory:
      memory.device_bytes(self.device_memory)  # A known name or a number of GiB.
    _integers("num_drafts", self.num_drafts, 1)
    _integers("draft_lens", self.draft_lens, 1)
    _integers("seeds", self.seeds, 0)
    self._check_models()

  def _check_models(self) -> None:
    """The grid against the pair's models (vocabulary, max_len), before any is loaded."""
    settings = self.decoding
    longest = max(self.draft_lens) if set(self.methods) - {"autoregressive"} else 0
    needed = settings.prompt_len + 1 + settings.max_new_tokens + longest + 1
    for model in self.pair.model_configs():
      if settings.top_k > model.vocab_size:
        raise ValueError(
          f"decoding.top_k = {settings.top_k} exceeds the vocabulary ({model.vocab_size})"
        )
      if needed > model.max_len:
        raise ValueError(
          f"decoding.prompt_len + 1 + max_new_tokens + max(draft_lens) + 1 = {needed} "
          f"exceeds the pair's max_len {model.max_len}"
        )

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "SweepConfig":
    """Builds the config from a nested mapping (a `ConfigDict.to_dict()`)."""
    values = _known(cls, values)
    values["pair"] = PairConfig.from_dict(values["pair"])
    values["decoding"] = DecodeSettings.from_dict(values["decoding"])
    for name in ("methods", "num_drafts", "draft_lens", "rhos", "seeds"):
      values[name] = tuple(values[name])
    return cls(**values)

  @property
  def results_path(self) -> pathlib.Path:
    """The directory of results.jsonl ($SPECTR_WORKDIR/experiments/<name> by default)."""
    return resolve(self.results_dir or f"experiments/{self.name}")


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
  """The per-position part of the rho ablation (see `configs/rho_ablation.py`).

  The prompts are the first `num_prompts` of the sweep's prompt set for its first seed;
  rhos and decoding settings are the sweep's.
  """

  num_drafts: tuple[int, ...]
  num_prompts: int
  num_tokens: int
  batch_size: int

  def __post_init__(self):
    _integers("analysis.num_drafts", self.num_drafts, 1)
    for name in ("num_prompts", "num_tokens", "batch_size"):
      _integers(f"analysis.{name}", [getattr(self, name)], 1)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "AnalysisConfig":
    """Builds the config from a mapping (a `ConfigDict.to_dict()`)."""
    values = _known(cls, values)
    return cls(**dict(values, num_drafts=tuple(values["num_drafts"])))


@dataclasses.dataclass(frozen=True)
class RhoAblationConfig:
  """The block-level sweep and the per-position analysis of `configs/rho_ablation.py`."""

  sweep: SweepConfig
  analysis: AnalysisConfig

  def __post_init__(self):
    if self.analysis.num_prompts > self.sweep.decoding.num_prompts:
      raise ValueError(
        f"analysis.num_prompts ({self.analysis.num_prompts}) exceeds the sweep's prompt set "
        f"({self.sweep.decoding.num_prompts})"
      )

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "RhoAblationConfig":
    """Builds the config from a nested mapping (a `ConfigDict.to_dict()`)."""
    values = _known(cls, values)
    return cls(SweepConfig.from_dict(values["sweep"]), AnalysisConfig.from_dict(values["analysis"]))


@dataclasses.dataclass(frozen=True)
class EvalConfig:
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

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "EvalConfig":
    """Builds the config from a mapping (a `ConfigDict.to_dict()`)."""
    return cls(**_known(cls, values))
