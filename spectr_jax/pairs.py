"""The draft/target pair a sweep or an analysis decodes with, and where it comes from.

`load_pair` reads a pair described by a `config.PairConfig`; it trains nothing unless
the config asks for it (`train_missing=True`, which the main job passes). A missing
model is a `MissingPairError` naming the folders looked in and the command that trains
them. A "pretrained" pair is two Hugging Face checkpoint directories sharing one
tokenizer; both models' logits are restricted to the tokenizer's ids (embedding rows
past them are padding), and the probability mass that drops is reported.
"""

import dataclasses
import hashlib
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import distill, runs, sharding, train
from spectr_jax.data import (
  RESERVED,
  DataConfig,
  HFTokenizer,
  Prompts,
  SpecialIds,
  TokenizedSplit,
  make_prompts,
  read_source,
)
from spectr_jax.models import (
  ModelBundle,
  count_params,
  load_pretrained,
  unstack_layers,
)
from spectr_jax.pair_config import PairConfig, resolve
from spectr_jax.train_config import TrainConfig


class MissingPairError(FileNotFoundError):
  """A model of the pair is not where the config says (and was not to be trained)."""


@dataclasses.dataclass(frozen=True)
class Pair:
  """A draft/target pair with the held-out text that prompts are drawn from.

  Attributes:
    draft, target: the models.
    heldout: held-out sentences (prompts are their starts).
    fingerprint: hash of both models' parameters and the held-out text; part of every
      cell key, so results of other models are never mistaken for these.
    description: JSON-able facts about the pair (workdirs, sizes) for the provenance.
    special: the tokenizer's BOS, EOS and PAD ids that prompts and stops use.
  """

  draft: ModelBundle
  target: ModelBundle
  heldout: TokenizedSplit
  fingerprint: str
  description: dict[str, Any]
  special: SpecialIds = RESERVED


def make_pair(
  draft: ModelBundle,
  target: ModelBundle,
  heldout: TokenizedSplit,
  special: SpecialIds = RESERVED,
  **description: Any,
) -> Pair:
  """Builds a `Pair`, fingerprinting the parameters and the held-out text.

  The models are taken as a decode holds them (`ModelBundle.for_decoding`); the
  fingerprint reads their parameters in the per-layer layout (`models.layout`), so it
  names the weights, whatever layout holds them.
  """
  draft, target = draft.for_decoding(), target.for_decoding()
  digest = hashlib.sha256()
  per_layer = [
    unstack_layers(jax.tree.map(np.asarray, sharding.fetch(m.params)), m.config)
    for m in (draft, target)
  ]
  for leaf in (*jax.tree.leaves(per_layer), heldout.tokens, heldout.offsets):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  description = dict(
    description, draft_params=count_params(draft.params), target_params=count_params(target.params)
  )
  return Pair(draft, target, heldout, digest.hexdigest()[:16], description, special)


def _missing(
  role: str, config: TrainConfig | None, workdir: pathlib.Path, why: str
) -> MissingPairError:
  name = "distill" if config is not None and config.distill.enabled else "draft"
  name = "target" if role == "target" else name
  return MissingPairError(
    f"no trained {role} model in {workdir} ({why}). Train it with `python -m "
    f"experiments.train --config configs/{name}.py[:ARG] --workdir {workdir}` (ARG as in the "
    "sweep's config, e.g. runlocal) or `bash scripts/train_pair.sh`, or rerun with "
    "--config.pair.train_missing=True (--config.sweep.pair.train_missing=True for the rho "
    "ablation)"
  )


def _embedded_model(
  config: PairConfig, role: str, workdir: pathlib.Path, mesh: jax.sharding.Mesh | None = None
) -> ModelBundle:
  """The final checkpoint of `role`'s training config, trained first when asked to."""
  train_config = getattr(config, role)
  if runs.is_finished(train_config, workdir):
    return runs.load_bundle(workdir, mesh=mesh, for_decoding=True)
  if not config.train_missing:
    step = runs.latest_step(workdir)
    found = "no checkpoint" if step is None else f"the newest checkpoint is step {step}"
    why = f"{found}; the final one is step {train_config.num_steps}"
    raise _missing(role, train_config, workdir, why)
  return train.train(train_config, workdir)


def _embedded_pair(
  config: PairConfig, dirs: dict[str, pathlib.Path], mesh: jax.sharding.Mesh | None
) -> dict[str, ModelBundle]:
  """The target first, then the plain draft a distilled draft starts from, then the draft
  (a distillation needs both)."""
  target = _embedded_model(config, "target", dirs["target"], mesh)
  if config.draft_base is not None:
    _embedded_model(config, "draft_base", resolve(config.draft.distill.init_workdir))
  return {"draft": _embedded_model(config, "draft", dirs["draft"], mesh), "target": target}


def _trained_model(
  role: str, workdir: pathlib.Path, mesh: jax.sharding.Mesh | None = None
) -> ModelBundle:
  try:
    return runs.load_bundle(workdir, mesh=mesh, for_decoding=True)
  except runs.CheckpointError as error:
    raise _missing(role, None, workdir, str(error)) from error


def _check_head_target(head: pathlib.Path, target: pathlib.Path) -> None:
  """Raises ValueError unless the head in `head` was trained against the target in
  `target` (the fingerprint of its parameters that the head's checkpoint records)."""
  trained_with = runs.checkpoint_meta(head).get("distill_target")
  found = distill.fingerprint(runs.load_bundle(target))
  if trained_with != found:
    raise ValueError(
      f"the head in {head} was trained against a target with parameters {trained_with}, "
      f"not the pair's target in {target} ({found}): its features would not be the ones "
      "it learned to read (train the head again against this target)"
    )


def load_pair(config: PairConfig, mesh: jax.sharding.Mesh | None = None) -> Pair:
  """Loads the pair that `config` describes (see `config.PairConfig`), onto `mesh` by
  `sharding.RULES` when given (each tensor placed as it is read; see `shard`).

  Raises:
    MissingPairError: a model is missing and `config.train_missing` is False.
    ValueError: the two tokenizers differ (pretrained pairs: the first difference is
      named) or a checkpoint directory is malformed.
  """
  if config.kind == "pretrained":
    return _pretrained_pair(config, mesh)
  dirs = dict(zip(("draft", "target"), config.workdirs, strict=True))
  if config.kind == "embedded":
    models = _embedded_pair(config, dirs, mesh)
  else:
    models = {role: _trained_model(role, path, mesh) for role, path in dirs.items()}
  if (
    runs.load_tokenizer(dirs["draft"]).model_proto
    != runs.load_tokenizer(dirs["target"]).model_proto
  ):
    raise ValueError(f"{dirs['draft']} and {dirs['target']} use different tokenizers")
  if models["draft"].decoder.reads_features:
    _check_head_target(dirs["draft"], dirs["target"])
  target_run = runs.load_config(dirs["target"])
  return make_pair(
    models["draft"],
    models["target"],
    runs.dataset_for(dirs["target"]).heldout,
    draft_workdir=str(dirs["draft"]),
    target_workdir=str(dirs["target"]),
    draft_model=runs.load_config(dirs["draft"]).model,
    target_model=target_run.model,
    data_source=target_run.data.source,
  )


def load_model(
  directory: str | pathlib.Path, dtype: str | None = None, mesh: jax.sharding.Mesh | None = None
) -> ModelBundle:
  """One model from a directory, as a decode holds it (`ModelBundle.for_decoding`): a
  Hugging Face checkpoint (its config.json names a model_type; loaded in `dtype`, None =
  as stored) or a training run of this project (in its compute dtype), on `mesh` by
  `sharding.RULES` when given."""
  path = pathlib.Path(directory).expanduser()
  config = path / "config.json"
  if config.is_file() and "model_type" in json.loads(config.read_text()):
    return load_pretrained(path, dtype=dtype, mesh=mesh).placed(mesh)
  return runs.load_bundle(path, mesh=mesh, for_decoding=True)


def _dropped_mass(bundle: ModelBundle, prompts: Prompts) -> float:
  """Mean probability (temperature 1) that `bundle` puts past its `num_logits` ids, over
  the prompts' positions: what restricting it to the tokenizer's ids drops."""
  full = ModelBundle(dataclasses.replace(bundle.config, output_vocab_size=None), bundle.params)
  tokens_BxP = jnp.asarray(prompts.tokens_BxP)
  logits_BxPxV = jax.jit(full.decoder.logits)(full.params, tokens_BxP)
  cut_BxP = jnp.sum(jax.nn.softmax(logits_BxPxV, axis=-1)[..., bundle.config.num_logits :], -1)
  valid_BxP = jnp.arange(tokens_BxP.shape[1]) < jnp.asarray(prompts.lengths_B)[:, None]
  return float(jnp.sum(jnp.where(valid_BxP, cut_BxP, 0.0)) / jnp.sum(valid_BxP))


def restrict(bundle: ModelBundle, num_tokens: int) -> ModelBundle:
  """The model with its logits cut to the first `num_tokens` ids (the tokenizer's), so
  its distributions are renormalised over real tokens."""
  if num_tokens > bundle.config.vocab_size:
    raise ValueError(
      f"the tokenizer has {num_tokens} tokens, more than the model's "
      f"{bundle.config.vocab_size} embedding rows"
    )
  output = None if num_tokens == bundle.config.vocab_size else num_tokens
  return ModelBundle(dataclasses.replace(bundle.config, output_vocab_size=output), bundle.params)


def _pretrained_pair(config: PairConfig, mesh: jax.sharding.Mesh | None) -> Pair:
  """Two checkpoint directories with one tokenizer; held-out text from `config.text`."""
  dirs = dict(zip(("draft", "target"), config.workdirs, strict=True))
  tokenizers = {role: HFTokenizer.load(path) for role, path in dirs.items()}
  difference = tokenizers["draft"].first_difference(tokenizers["target"])
  if difference:
    raise ValueError(
      f"the draft ({dirs['draft']}) and the target ({dirs['target']}) use different "
      f"tokenizers: {difference}; speculative decoding needs one vocabulary"
    )
  tokenizer = tokenizers["target"]
  dtype = config.dtype or None
  max_len = config.max_len or None
  models = {
    role: restrict(
      load_pretrained(path, dtype=dtype, max_len=max_len, mesh=mesh), tokenizer.vocab_size
    )
    for role, path in dirs.items()
  }
  text = read_source(DataConfig(source=config.text, path=config.text_path))
  heldout = TokenizedSplit.from_ids(tokenizer.encode_batch(text.heldout))
  probe = make_prompts(heldout, min(8, len(heldout)), 16, seed=0, special=tokenizer.special)
  dropped = {f"{role}_dropped_mass": _dropped_mass(m, probe) for role, m in models.items()}
  return make_pair(
    models["draft"],
    models["target"],
    heldout,
    tokenizer.special,
    kind="pretrained",
    draft_workdir=str(dirs["draft"]),
    target_workdir=str(dirs["target"]),
    tokenizer_vocab=tokenizer.vocab_size,
    embedding_rows={role: m.config.vocab_size for role, m in models.items()},
    data_source=config.text,
    **dropped,
  )


def shard(pair: Pair, mesh: jax.sharding.Mesh) -> Pair:
  """The pair with both models' parameters placed on `mesh` as a decode there holds them
  (`ModelBundle.placed`: by `sharding.RULES`, on a TPU in its matmuls' layouts; restored
  checkpoints sit on one device, which a computation over the whole mesh cannot take)."""
  return dataclasses.replace(pair, draft=pair.draft.placed(mesh), target=pair.target.placed(mesh))
