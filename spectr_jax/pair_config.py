"""The pairs layer's schema: where a draft/target pair comes from (`PairConfig`)."""

import dataclasses
import pathlib

from spectr_jax.data.config import resolve
from spectr_jax.models import ModelConfig
from spectr_jax.schema import Schema
from spectr_jax.schema import integers as _integers
from spectr_jax.train_config import HEAD, TrainConfig, saved_train_config

__all__ = ["PAIR_KINDS", "PairConfig", "resolve"]

PAIR_KINDS = ("embedded", "trained", "pretrained")


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
    config.json where they exist, else from the training configs (none for pretrained;
    a draft head's from its target's)."""
    if self.kind == "pretrained":
      return []
    found = {}
    for role in ("target", "draft"):
      workdir = dict(zip(("draft", "target"), self.workdirs, strict=True))[role]
      train = saved_train_config(workdir) or getattr(self, role)
      if train is not None and (train.model != HEAD or "target" in found):
        found[role] = train.model_config(found.get("target"))
    return [found[role] for role in ("draft", "target") if role in found]
