"""The training layer's schemas: one training run (`TrainConfig`) and its distillation
part (`DistillConfig`)."""

import dataclasses
import json
import math
import numbers
import pathlib
from collections.abc import Mapping
from typing import Any

from spectr_jax.data import DataConfig
from spectr_jax.data.config import resolve
from spectr_jax.models import HeadConfig, ModelConfig, get_model_config
from spectr_jax.schema import Schema
from spectr_jax.schema import integers as _integers

__all__ = [
  "DISTILL_SOURCES",
  "DIVERGENCES",
  "HEAD",
  "DistillConfig",
  "TrainConfig",
  "saved_train_config",
]

DIVERGENCES = ("forward_kl", "reverse_kl", "tv", "jsd")
DISTILL_SOURCES = ("corpus", "target", "on_policy")
# The `TrainConfig.model` of a draft head (`spectr_jax.models.head`): its model is its
# distillation target's, with the head's own blocks (`HeadConfig.of`).
HEAD = "head"


@dataclasses.dataclass(frozen=True)
class DistillConfig(Schema):
  """Distillation of the trained model (the draft) against a frozen target.

  Off when `target_workdir` is "" (plain next-token training). On, each jitted step
  scores its rows with both models and minimises the divergence between their
  next-token laws, under the decoding transform the draft will serve (docs/DISTILLATION.md).

  Attributes:
    target_workdir: the frozen target's run directory (relative to $SPECTR_WORKDIR unless
      absolute; same tokenizer and vocabulary as this run); "" = no distillation.
    init_workdir: start from the final parameters of this run ("" = fresh initialisation);
      its model must be this run's.
    divergence: per position, between the draft's p and the target's q: "forward_kl"
      KL(q || p), "reverse_kl" KL(p || q), "tv" 1 - sum min(p, q), or "jsd"
      skew KL(q || m) + (1 - skew) KL(p || m), m = skew q + (1 - skew) p.
    skew: "jsd" only, in (0, 1): the target's weight (0.5 is the symmetric JSD).
    data: where each step's rows come from: "corpus" (packed training rows), "target"
      (sampled from the target), "on_policy" (sampled from the current draft), or a mix
      such as "corpus:1,on_policy:3" (shares of the `batch_size` rows, rounded).
    temperature, top_k, top_p: the decoding transform of both models (top_k 0 = all,
      top_p 1 = no truncation), also used to sample the rows; temperature > 0.
    prompt_len: training-row tokens that open each sampled row (never held-out text).
    sample_tokens: tokens sampled after them.
    eval_prompts: held-out prompts of the alignment metrics (per-token acceptance
      sum min(p, q) and the K = 8 alpha* along target samples) at each evaluation.
    eval_tokens: tokens sampled from the target after each of them. These two, unlike
      the top-level logistics fields, must match when a run resumes.
    head_steps: a draft head's unrolled steps per row: the first reads the target's
      features, each later one the head's own output, as drafting does past a round's
      first depth (`distill.draft_logits`); the loss averages them.
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
  head_steps: int = 1

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
    for name in ("prompt_len", "sample_tokens", "eval_prompts", "eval_tokens", "head_steps"):
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
    model: a name accepted by `spectr_jax.models.get_model_config`, or "head": a draft
      head of the distillation target (`spectr_jax.models.head`; docs/MODELS.md).
    model_overrides: `ModelConfig` fields that replace the named values (a head's:
      `HeadConfig.of`'s, e.g. num_layers).
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
    if self.model == HEAD and not self.distill.enabled:
      raise ValueError("a head trains against its target: set distill.target_workdir")
    if self.model == HEAD and "on_policy" in self.distill.shares():
      raise ValueError(
        "a head drafts from its target's features, so on-policy rows would need speculative "
        "decoding to sample: give distill.data 'corpus' and/or 'target'"
      )
    if self.distill.enabled:
      self.distill.rows(self.batch_size)
      needed = self.distill.prompt_len + self.distill.sample_tokens + 1
      if set(self.distill.shares()) - {"corpus"} and needed > self.data.seq_len:
        raise ValueError(
          f"distill.prompt_len + sample_tokens + 1 = {needed} exceeds data.seq_len = "
          f"{self.data.seq_len} (sampled rows are at most as long as training rows)"
        )

  def model_config(self, target: ModelConfig | None = None) -> ModelConfig:
    """Returns the model's hyper-parameters.

    Args:
      target: a head's target model (None: read from `distill.target_workdir`'s run).

    Raises:
      FileNotFoundError: a head's target run has no config.json yet.
    """
    if self.model != HEAD:
      return get_model_config(self.model, self.data.vocab_size, **self.model_overrides)
    if target is None:
      path = resolve(self.distill.target_workdir)
      run = saved_train_config(path)
      if run is None:
        raise FileNotFoundError(
          f"a head's model is its target's, and {path} holds no run yet: train the target first"
        )
      target = run.model_config()
    return HeadConfig.of(target, **self.model_overrides)


def saved_train_config(workdir: str | pathlib.Path) -> TrainConfig | None:
  """The `TrainConfig` in `workdir`/config.json (None when there is none)."""
  path = pathlib.Path(workdir).expanduser().absolute() / "config.json"
  return TrainConfig.from_dict(json.loads(path.read_text())) if path.is_file() else None
