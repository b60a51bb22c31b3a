"""Language-model training with optax and resumable orbax checkpoints.

A run lives in one work directory:
  config.json         the `TrainConfig` of the run (JSON)
  tokenizer.model     the SentencePiece model the run was trained with
  checkpoints/<step>/ params, opt_state and meta (step, config, wall time) of each save

Training batch `i` is a pure function of `(config.seed, i)` and the step has no other
randomness, so a run resumed from any checkpoint ends with the parameters of an
uninterrupted run of the same config.
"""

import dataclasses
import functools
import json
import logging as pylogging
import pathlib
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spectr_jax.data import (
  BOS_ID,
  PAD_ID,
  DataConfig,
  Dataset,
  Tokenizer,
  TrainBatches,
  heldout_rows,
  load_dataset,
)
from spectr_jax.models import (
  ModelBundle,
  ModelConfig,
  Transformer,
  count_params,
  get_model_config,
  init_params,
)

# Fields that change logging, evaluation or storage but not the trained parameters; a
# resumed run may change them.
_LOGISTICS_FIELDS = (
  "eval_every",
  "eval_rows",
  "checkpoint_every",
  "keep_checkpoints",
  "log_every",
  "num_devices",
)
_INIT_STREAM = 0


class CheckpointError(ValueError):
  """A missing checkpoint, or one written by a different configuration."""


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
    keep_checkpoints: how many recent checkpoints to keep.
    log_every: steps between progress lines.
    num_devices: data-parallel devices (0 = all local devices); the batch is split.
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

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
    """Builds a config from a nested mapping (a `ConfigDict.to_dict()` or saved JSON)."""
    values = dict(values)
    data = DataConfig(**dict(values.pop("data", {})))
    overrides = dict(values.pop("model_overrides", {}))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
      raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
    return cls(data=data, model_overrides=overrides, **values)

  def to_dict(self) -> dict[str, Any]:
    """Returns a JSON-able nested dict; `from_dict` inverts it."""
    values = dataclasses.asdict(self)
    values["model_overrides"] = dict(self.model_overrides)
    return values

  def model_config(self) -> ModelConfig:
    """Returns the model's hyper-parameters."""
    return get_model_config(self.model, self.data.vocab_size, **self.model_overrides)


@struct.dataclass
class TrainState:
  """What a training step updates (and a checkpoint stores).

  Attributes:
    step: int32 scalar, the number of optimizer updates applied.
    params: the model parameters.
    opt_state: the optax state.
  """

  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  """Returns gradient clipping plus AdamW on a warm-up + cosine-decay schedule."""
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.learning_rate,
    warmup_steps=config.warmup_steps,
    decay_steps=max(config.num_steps, config.warmup_steps + 1),
    end_value=config.learning_rate * config.min_lr_ratio,
  )
  return optax.chain(
    optax.clip_by_global_norm(config.grad_clip_norm),
    optax.adamw(
      schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      weight_decay=config.weight_decay,
      mask=lambda params: jax.tree.map(lambda x: x.ndim > 1, params),
    ),
  )


def token_nll(
  params: Any, model: Transformer, tokens_BxT1: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Next-token negative log-likelihoods of packed rows.

  Args:
    params: model parameters.
    model: the module.
    tokens_BxT1: int32 rows [B, T + 1]; the model reads the first T tokens.

  Returns:
    nll_BxT (float32) and targets_BxT (the next tokens).
  """
  inputs_BxT, targets_BxT = tokens_BxT1[:, :-1], tokens_BxT1[:, 1:]
  logits_BxTxV = model.apply({"params": params}, inputs_BxT).astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT), targets_BxT


def _train_step(
  state: TrainState,
  tokens_BxT1: jax.Array,
  model: Transformer,
  optimizer: optax.GradientTransformation,
) -> tuple[TrainState, jax.Array]:
  """One AdamW update on the mean NLL of the non-PAD targets."""

  def loss_fn(params):
    nll_BxT, targets_BxT = token_nll(params, model, tokens_BxT1)
    mask_BxT = (targets_BxT != PAD_ID).astype(jnp.float32)
    return jnp.sum(nll_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


@functools.partial(jax.jit, static_argnums=2)
def _eval_step(params: Any, tokens_BxT1: jax.Array, model: Transformer) -> jax.Array:
  """Returns [sum of NLL, count] over targets that are neither PAD nor BOS."""
  nll_BxT, targets_BxT = token_nll(params, model, tokens_BxT1)
  mask_BxT = ((targets_BxT != PAD_ID) & (targets_BxT != BOS_ID)).astype(jnp.float32)
  return jnp.stack([jnp.sum(nll_BxT * mask_BxT), jnp.sum(mask_BxT)])


def heldout_loss(bundle: ModelBundle, rows_NxT1: np.ndarray, batch_size: int) -> float:
  """Mean next-token NLL (nats) of held-out rows, over tokens that are not PAD or BOS.

  Args:
    bundle: the model.
    rows_NxT1: int32 packed rows [N, T + 1].
    batch_size: rows per forward pass (the last batch is padded with PAD rows).

  Returns:
    The mean NLL; `exp` of it is the per-token perplexity.
  """
  total = np.zeros(2)
  for start in range(0, len(rows_NxT1), batch_size):
    batch = rows_NxT1[start : start + batch_size]
    pad = np.full((batch_size - len(batch), batch.shape[1]), PAD_ID, np.int32)
    total += np.asarray(_eval_step(bundle.params, np.concatenate([batch, pad]), bundle.model))
  return float(total[0] / max(total[1], 1.0))


def _workdir(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir).expanduser().absolute()


def _manager(workdir: pathlib.Path, config: TrainConfig | None = None) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
    max_to_keep=config.keep_checkpoints if config else None,
    enable_async_checkpointing=False,
    create=config is not None,
  )
  return ocp.CheckpointManager(
    workdir / "checkpoints", options=options, item_names=("params", "opt_state", "meta")
  )


def _comparable(config: TrainConfig) -> dict[str, Any]:
  """The config fields that decide the parameters (cache location and logistics dropped)."""
  values = config.to_dict()
  for name in _LOGISTICS_FIELDS:
    values.pop(name)
  values["data"].pop("cache_dir")
  return values


def load_config(workdir: str | pathlib.Path) -> TrainConfig:
  """Returns the `TrainConfig` saved in `workdir`; raises `CheckpointError` if absent."""
  path = _workdir(workdir) / "config.json"
  if not path.is_file():
    raise CheckpointError(f"no training run in {path.parent}: {path.name} is missing")
  return TrainConfig.from_dict(json.loads(path.read_text()))


def _check_config(config: TrainConfig, workdir: pathlib.Path) -> None:
  """Raises `CheckpointError` if `workdir` holds a run of a different config."""
  if not (workdir / "config.json").is_file():
    return
  saved, wanted = _comparable(load_config(workdir)), _comparable(config)
  if saved != wanted:
    diff = sorted(
      k for k in set(saved) | set(wanted) if saved.get(k, "<missing>") != wanted.get(k, "<missing>")
    )
    raise CheckpointError(
      f"{workdir} holds a run of a different config (fields {diff} differ); use another "
      "workdir or delete it"
    )


def load_tokenizer(workdir: str | pathlib.Path) -> Tokenizer:
  """Returns the tokenizer a run in `workdir` was trained with."""
  return Tokenizer.load(_workdir(workdir) / "tokenizer.model")


def latest_step(workdir: str | pathlib.Path) -> int | None:
  """Returns the step of the newest checkpoint in `workdir`, or None."""
  path = _workdir(workdir)
  if not (path / "checkpoints").is_dir():
    return None
  return _manager(path).latest_step()


def load_bundle(workdir: str | pathlib.Path, step: int | None = None) -> ModelBundle:
  """Loads the parameters of a finished run (or of checkpoint `step`).

  Args:
    workdir: the run's directory.
    step: which checkpoint; None means the final one (`num_steps`).

  Returns:
    The model config and parameters.
  """
  path = _workdir(workdir)
  config = load_config(path)
  want = config.num_steps if step is None else step
  latest = latest_step(path)
  manager = _manager(path)
  if latest is None or want not in manager.all_steps():
    raise CheckpointError(
      f"no checkpoint for step {want} in {path}/checkpoints (latest: {latest}, final: "
      f"{config.num_steps}); train it first (experiments/train.py) or resume it"
    )
  model_config = config.model_config()
  abstract = jax.eval_shape(functools.partial(init_params, model_config), jax.random.key(0))
  restored = manager.restore(
    want, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract))
  )
  return ModelBundle(config=model_config, params=restored["params"])


def _mesh(config: TrainConfig) -> Mesh:
  devices = jax.local_devices()
  count = config.num_devices or len(devices)
  if count > len(devices) or config.batch_size % count:
    raise ValueError(
      f"num_devices={count} needs <= {len(devices)} devices and to divide "
      f"batch_size={config.batch_size}"
    )
  return Mesh(np.array(devices[:count]), ("data",))


class _Progress:
  """Logs step, loss, tokens/s and ETA (rates over the interval since the last line)."""

  def __init__(self, first_step: int, last_step: int, tokens_per_step: int):
    self.last_step = last_step
    self.tokens_per_step = tokens_per_step
    self.mark = (time.perf_counter(), first_step)

  def update(self, step: int, loss: float, extra: str = "") -> None:
    now = time.perf_counter()
    rate = (step - self.mark[1]) / max(now - self.mark[0], 1e-9)
    self.mark = (now, step)
    logging.info(
      "step %d/%d loss %.4f %s tok/s eta %.0fs%s",
      step,
      self.last_step,
      loss,
      f"{rate * self.tokens_per_step:,.0f}",
      (self.last_step - step) / max(rate, 1e-9),
      extra,
    )


class _DropOrbaxInfo(pylogging.Filter):
  def filter(self, record: pylogging.LogRecord) -> bool:
    return record.levelno >= pylogging.WARNING or "orbax" not in record.pathname


def quiet_orbax_logging() -> None:
  """Hides orbax's INFO records from absl's handler (entry points call it once)."""
  logging.get_absl_handler().addFilter(_DropOrbaxInfo())


def train(
  config: TrainConfig, workdir: str | pathlib.Path, stop_at_step: int | None = None
) -> ModelBundle:
  """Trains (or resumes) a run up to `config.num_steps` and checkpoints it in `workdir`.

  Args:
    config: the run's configuration.
    workdir: the run's directory; a run of a different config there is an error.
    stop_at_step: stop (with a checkpoint) after this many steps, e.g. to test resuming.

  Returns:
    The model and its parameters at the last step run.
  """
  path = _workdir(workdir)
  _check_config(config, path)
  model_config = config.model_config()
  if config.data.seq_len > model_config.max_len:
    raise ValueError(f"seq_len {config.data.seq_len} exceeds max_len {model_config.max_len}")
  dataset = load_dataset(config.data)
  dataset.tokenizer.check_vocab(model_config.vocab_size)
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
  dataset.tokenizer.save(path / "tokenizer.model")

  mesh = _mesh(config)
  replicated = NamedSharding(mesh, PartitionSpec())
  batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
  model = Transformer(model_config)
  optimizer = make_optimizer(config)

  def init_state() -> TrainState:
    params = init_params(model_config, jax.random.fold_in(jax.random.key(config.seed), 0))
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
    )

  abstract = jax.eval_shape(init_state)
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), abstract
  )
  manager = _manager(path, config)
  start = manager.latest_step()
  meta = {"wall_time_s": 0.0}
  if start is None:
    state = jax.jit(init_state, out_shardings=replicated)()
    start = 0
  else:
    restored = manager.restore(
      start,
      args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract.params),
        opt_state=ocp.args.StandardRestore(abstract.opt_state),
        meta=ocp.args.JsonRestore(),
      ),
    )
    meta = restored["meta"]
    state = TrainState(
      step=jax.device_put(jnp.asarray(start, jnp.int32), replicated),
      params=restored["params"],
      opt_state=restored["opt_state"],
    )
    logging.info("resuming %s from step %d", path, start)
  end = config.num_steps if stop_at_step is None else min(stop_at_step, config.num_steps)

  batches = TrainBatches(dataset.train, config.data.seq_len, config.batch_size, config.seed)
  row_fill = float(np.mean(batches.rows[:, 1:] != PAD_ID))
  eval_rows = heldout_rows(dataset.heldout, config.data.seq_len, config.eval_rows)
  step_fn = jax.jit(
    _train_step,
    static_argnums=(2, 3),
    donate_argnums=0,
    in_shardings=(replicated, batch_sharding),
    out_shardings=(replicated, replicated),
  )
  logging.info(
    "training %s (%s, %d params) on %d tokens: steps %d..%d, %d tokens/step",
    path,
    config.model,
    count_params(state.params),
    dataset.train.num_tokens,
    start,
    end,
    config.batch_size * config.data.seq_len,
  )

  def save(step: int, state: TrainState, wall_time_s: float, eval_loss: float | None) -> None:
    meta = {
      "step": step,
      "config": config.to_dict(),
      "wall_time_s": wall_time_s,
      "positions_seen": step * config.batch_size * config.data.seq_len,
      "row_fill": row_fill,
      "heldout_loss": eval_loss,
    }
    manager.save(
      step,
      args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        opt_state=ocp.args.StandardSave(state.opt_state),
        meta=ocp.args.JsonSave(meta),
      ),
      force=True,
    )

  progress = _Progress(start, end, config.batch_size * config.data.seq_len)
  run_start = time.perf_counter()
  loss = jnp.zeros(())
  eval_loss = None
  for step in range(start, end):
    tokens = jax.device_put(batches(step), batch_sharding)
    state, loss = step_fn(state, tokens, model, optimizer)
    done = step + 1
    extra = ""
    if done % config.eval_every == 0 or done == end:
      eval_loss = heldout_loss(
        ModelBundle(model_config, state.params), eval_rows, config.batch_size
      )
      extra = f" heldout {eval_loss:.4f} (ppl {np.exp(eval_loss):.1f})"
    if done % config.log_every == 0 or done == end or extra:
      progress.update(done, float(loss), extra)
    if done % config.checkpoint_every == 0 or done == end:
      save(done, state, meta["wall_time_s"] + time.perf_counter() - run_start, eval_loss)
  manager.wait_until_finished()
  manager.close()
  return ModelBundle(config=model_config, params=state.params)


def train_or_load(config: TrainConfig, workdir: str | pathlib.Path) -> ModelBundle:
  """Loads the final checkpoint of `config` from `workdir`, training only when it is missing.

  Args:
    config: the run's configuration; a run of a different config in `workdir` is an error.
    workdir: the run's directory.

  Returns:
    The trained model.
  """
  path = _workdir(workdir)
  _check_config(config, path)
  if latest_step(path) == config.num_steps:
    return load_bundle(path)
  return train(config, path)


def checkpoint_meta(workdir: str | pathlib.Path, step: int | None = None) -> dict[str, Any]:
  """Returns the meta record of a checkpoint.

  Args:
    workdir: the run's directory.
    step: which checkpoint; None means the newest.

  Returns:
    step, config, wall_time_s (training time summed over resumes), positions_seen
    (batch_size * seq_len per step), row_fill (share of those that are not PAD) and
    heldout_loss (of the last evaluation).
  """
  path = _workdir(workdir)
  step = latest_step(path) if step is None else step
  if step is None:
    raise CheckpointError(f"no checkpoint in {path}/checkpoints")
  restored = _manager(path).restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
  return dict(restored["meta"])


def dataset_for(workdir: str | pathlib.Path) -> Dataset:
  """Returns the dataset (from its cache) that the run in `workdir` was trained on."""
  return load_dataset(load_config(workdir).data)
