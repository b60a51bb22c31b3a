"""Language-model training with optax: the loss, the step and the resumable loop.

A run trains on the next-token loss of the corpus or, with `TrainConfig.distill` on,
distills the model against a frozen target (`spectr_jax.distill`: the divergence, the
data sources and the held-out alignment metrics). A draft head (`TrainConfig.model`
"head") trains its own layers only: the target's embedding and output layer it reads
are frozen (`models.head.SHARED`), and its checkpoints hold the copies it was trained
with, so a head loads on its own.

Training batch `i` is a pure function of `(config.seed, i)` (and, for sampled
distillation rows, of the parameters at step `i`) and the step has no other randomness,
so a run resumed from any checkpoint ends with the parameters of an uninterrupted run of
the same config. Where a run is stored (its work directory and checkpoints) is
`spectr_jax.runs`'s job.
"""

import functools
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spectr_jax import distill, locks, runs, sharding
from spectr_jax.data import BOS_ID, PAD_ID, Dataset, TrainBatches, heldout_rows, load_dataset
from spectr_jax.models import ModelBundle, Transformer, count_params, init_params, param_axes
from spectr_jax.models.head import SHARED, share_target
from spectr_jax.train_config import HEAD, TrainConfig


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


def decayed(config: TrainConfig) -> Any:
  """Which parameters weight decay applies to: the matrices (two or more axes beside the
  layer stack's), not the norm scales, biases or vectors; a pytree of bools."""
  return jax.tree.map(
    lambda names: len([n for n in names if n != "layers"]) > 1,
    param_axes(config.model_config()),
    is_leaf=lambda x: isinstance(x, tuple),
  )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  """Returns gradient clipping plus AdamW on a warm-up + cosine-decay schedule (a head's
  shared arrays frozen: their updates are zero)."""
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.learning_rate,
    warmup_steps=config.warmup_steps,
    decay_steps=max(config.num_steps, config.warmup_steps + 1),
    end_value=config.learning_rate * config.min_lr_ratio,
  )
  adamw = optax.chain(
    optax.clip_by_global_norm(config.grad_clip_norm),
    optax.adamw(
      schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      weight_decay=config.weight_decay,
      mask=decayed(config),
    ),
  )
  if config.model != HEAD:
    return adamw
  shared = {
    name: jax.tree.map(lambda _, n=name: n in SHARED, tree, is_leaf=lambda x: isinstance(x, tuple))
    for name, tree in param_axes(config.model_config()).items()
  }
  return optax.chain(adamw, optax.masked(optax.set_to_zero(), shared))


def token_nll(
  params: Any, model: Transformer, tokens_BxT1: jax.Array, target: ModelBundle | None = None
) -> tuple[jax.Array, jax.Array]:
  """Next-token negative log-likelihoods of packed rows.

  Args:
    params: model parameters.
    model: the module.
    tokens_BxT1: int32 rows [B, T + 1]; the model reads the first T tokens.
    target: a head's target, whose features of the same rows the head reads.

  Returns:
    nll_BxT (float32) and targets_BxT (the next tokens).
  """
  inputs_BxT, targets_BxT = tokens_BxT1[:, :-1], tokens_BxT1[:, 1:]
  target_params, features_BxTxD = None, None
  if target is not None:
    target_params = target.params
    _, features_BxTxD = target.model.apply(
      {"params": target_params}, inputs_BxT, return_features=True
    )
  logits_BxTxV = distill.draft_logits(model, params, inputs_BxT, target_params, features_BxTxD)[0]
  logits_BxTxV = logits_BxTxV.astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT), targets_BxT


def _lm_loss(params: Any, target_params: None, rows: dict[str, jax.Array], model: Transformer):
  """The mean NLL of the non-PAD targets of the corpus rows (no target model)."""
  del target_params
  nll_BxT, targets_BxT = token_nll(params, model, rows["corpus"])
  mask_BxT = (targets_BxT != PAD_ID).astype(jnp.float32)
  return jnp.sum(nll_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def _train_step(
  state: TrainState,
  rows: dict[str, jax.Array],
  target_params: Any,
  loss_fn,
  optimizer: optax.GradientTransformation,
) -> tuple[TrainState, jax.Array]:
  """One AdamW update on `loss_fn(params, target_params, rows)` (`_lm_loss` or
  `distill.distill_loss`)."""
  loss, grads = jax.value_and_grad(loss_fn)(state.params, target_params, rows)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


@functools.partial(jax.jit, static_argnums=2)
def _eval_step(params: Any, tokens_BxT1: jax.Array, model: Transformer, target) -> jax.Array:
  """Returns [sum of NLL, count] over targets that are neither PAD nor BOS."""
  nll_BxT, targets_BxT = token_nll(params, model, tokens_BxT1, target)
  mask_BxT = ((targets_BxT != PAD_ID) & (targets_BxT != BOS_ID)).astype(jnp.float32)
  return jnp.stack([jnp.sum(nll_BxT * mask_BxT), jnp.sum(mask_BxT)])


def heldout_loss(
  bundle: ModelBundle, rows_ExT1: np.ndarray, batch_size: int, target: ModelBundle | None = None
) -> float:
  """Mean next-token NLL (nats) of held-out rows, over tokens that are not PAD or BOS.

  Args:
    bundle: the model.
    target: a head's target (the head reads its features).
    rows_ExT1: int32 packed rows [E, T + 1].
    batch_size: rows per forward pass (the last batch is padded with PAD rows).

  Returns:
    The mean NLL; `exp` of it is the per-token perplexity.
  """
  total = np.zeros(2)
  for start in range(0, len(rows_ExT1), batch_size):
    batch = rows_ExT1[start : start + batch_size]
    pad = np.full((batch_size - len(batch), batch.shape[1]), PAD_ID, np.int32)
    rows_BxT1 = np.concatenate([batch, pad])
    total += np.asarray(_eval_step(bundle.params, rows_BxT1, bundle.model, target))
  return float(total[0] / max(total[1], 1.0))


def _mesh(config: TrainConfig) -> Mesh:
  """The run's ("data", "model") mesh: `num_devices` x `mesh_model` of all processes' devices."""
  devices = jax.devices()
  data = config.num_devices or len(devices) // config.mesh_model
  if data * config.mesh_model > len(devices) or config.batch_size % data:
    raise ValueError(
      f"num_devices={data} x mesh_model={config.mesh_model} needs <= {len(devices)} devices "
      f"and num_devices to divide batch_size={config.batch_size}"
    )
  rows = config.distill.rows(config.batch_size) if config.distill.enabled else {}
  if any(n % data for n in rows.values()):
    raise ValueError(f"num_devices={data} must divide the rows of every distill source: {rows}")
  return sharding.make_mesh(data, config.mesh_model, devices[: data * config.mesh_model])


def param_rules(config: TrainConfig) -> dict[str, str | None]:
  """The logical-axis rules of the run's parameters: `sharding.FSDP_RULES` with
  `config.fsdp`, else `sharding.RULES`."""
  return dict(sharding.FSDP_RULES if config.fsdp else sharding.RULES)


def state_shardings(
  config: TrainConfig, optimizer: optax.GradientTransformation, mesh: Mesh
) -> TrainState:
  """The sharding of every leaf of the run's `TrainState` on `mesh`.

  Parameters follow `param_rules(config)`; every copy of the parameter tree in the optimizer
  state (AdamW's moments) is sharded like the parameters; the step and the other
  optimizer leaves (counts) are replicated.
  """
  abstract = jax.eval_shape(lambda: _init_state(config, optimizer))
  replicated = NamedSharding(mesh, PartitionSpec())
  axes = param_axes(config.model_config())
  params = sharding.param_shardings(abstract.params, mesh, param_rules(config), axes=axes)
  opt_state = optax.tree_map_params(
    optimizer,
    lambda _, target: target,
    abstract.opt_state,
    params,
    transform_non_params=lambda _: replicated,
  )
  return TrainState(step=replicated, params=params, opt_state=opt_state)


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


def _fresh_params(config: TrainConfig) -> Any:
  return init_params(config.model_config(), jax.random.fold_in(jax.random.key(config.seed), 0))


def _init_state(
  config: TrainConfig, optimizer: optax.GradientTransformation, params: Any = None
) -> TrainState:
  """Step 0: fresh parameters (or the given ones) and a fresh optimizer state."""
  if params is None:
    params = _fresh_params(config)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def _start_state(
  config: TrainConfig, manager, optimizer, shardings: TrainState, target: ModelBundle | None
) -> tuple[TrainState, int, dict[str, Any]]:
  """The state to train from: the newest checkpoint's, or a fresh one (from
  `distill.init_workdir` when set; a head's reading the target's shared arrays), with
  its step and meta ({} when fresh).

  The state lands on `shardings`, whatever mesh the checkpoint was saved from.
  """
  abstract = jax.eval_shape(lambda: _init_state(config, optimizer))
  abstract = jax.tree.map(
    lambda x, target: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target),
    abstract,
    shardings,
  )
  restored = runs.restore_latest(
    manager, abstract.params, abstract.opt_state, config.model_config()
  )
  if restored is None:
    params = distill.initial_params(config)
    if config.model == HEAD:
      fresh = _fresh_params(config) if params is None else params
      params = share_target(fresh, target.params)
    if params is not None:
      params = sharding.put(params, shardings.params)
    state = jax.jit(lambda p: _init_state(config, optimizer, p), out_shardings=shardings)(params)
    return state, 0, {}
  start, params, opt_state, meta = restored
  step = sharding.put(np.int32(start), shardings.step)
  return TrainState(step=step, params=params, opt_state=opt_state), start, meta


def _load_data(config: TrainConfig, path: pathlib.Path) -> Dataset:
  """Checks the config against the model and `path`, loads the data, writes the run files."""
  runs.check_config(config, path)
  model_config = config.model_config()
  if config.data.seq_len > model_config.max_len:
    raise ValueError(f"seq_len {config.data.seq_len} exceeds max_len {model_config.max_len}")
  dataset = load_dataset(config.data)
  dataset.tokenizer.check_vocab(model_config.vocab_size)
  runs.write_run_files(path, config, dataset.tokenizer)
  return dataset


def train(
  config: TrainConfig,
  workdir: str | pathlib.Path,
  stop_at_step: int | None = None,
  wait: bool = False,
) -> ModelBundle:
  """Trains (or resumes) a run up to `config.num_steps` and checkpoints it in `workdir`.

  The run holds `workdir`'s lock (`locks.exclusive`, from process 0): a second run on it
  is a `locks.FolderLockedError` naming the holder, or waits for it with `wait`.

  Args:
    config: the run's configuration.
    workdir: the run's directory; a run of a different config there is an error.
    stop_at_step: stop (with a checkpoint) after this many steps, e.g. to test resuming.
    wait: wait for another run holding `workdir` instead of raising.

  Returns:
    The model and its parameters at the last step run.
  """
  path = runs.workdir_path(workdir)
  with locks.exclusive(path, "training run", wait, holder=jax.process_index() == 0):
    return _train(config, path, stop_at_step)


def _train(config: TrainConfig, path: pathlib.Path, stop_at_step: int | None) -> ModelBundle:
  dataset = _load_data(config, path)
  model_config = config.model_config()
  mesh = _mesh(config)
  replicated = NamedSharding(mesh, PartitionSpec())
  batch_sharding = NamedSharding(mesh, PartitionSpec(sharding.RULES["batch"]))
  model = ModelBundle(model_config, None).model
  optimizer = make_optimizer(config)
  shardings = state_shardings(config, optimizer, mesh)
  manager = runs.checkpoint_manager(path, config)
  target, target_id = None, None
  loss_fn = functools.partial(_lm_loss, model=model)
  tokens_per_step = config.batch_size * config.data.seq_len
  if config.distill.enabled:
    target = distill.load_target(config, dataset)
    target = ModelBundle(target.config, sharding.put(target.params, replicated))
    target_id = distill.fingerprint(target)
    loss_fn = functools.partial(
      distill.distill_loss, draft=model, target=target.model, config=config.distill
    )
    tokens_per_step = distill.positions_per_step(config)
  state, start, meta = _start_state(config, manager, optimizer, shardings, target)
  wall_time_s = meta.get("wall_time_s", 0.0)
  if start:
    logging.info("resuming %s from step %d", path, start)
    if meta.get("distill_target") != target_id:
      raise runs.CheckpointError(
        f"{path} was distilled against another target (parameters {meta.get('distill_target')}"
        f", now {target_id}); use another workdir or delete it"
      )
  end = config.num_steps if stop_at_step is None else min(stop_at_step, config.num_steps)
  batches = TrainBatches(dataset.train, config.data.seq_len, config.batch_size, config.seed)
  row_fill = float(np.mean(batches.rows[:, 1:] != PAD_ID))
  eval_rows = heldout_rows(dataset.heldout, config.data.seq_len, config.eval_rows)
  step_fn = jax.jit(
    _train_step,
    static_argnums=(3, 4),
    donate_argnums=0,
    in_shardings=(shardings, batch_sharding, replicated),
    out_shardings=(shardings, replicated),
  )
  if jax.process_index() == 0:
    description = sharding.describe(
      state.params, mesh, param_rules(config), axes=param_axes(model_config)
    )
    logging.info("sharding:\n%s", description)
  logging.info(
    "training %s (%s, %d params) on %d tokens: steps %d..%d, %d tokens/step",
    path,
    config.model,
    count_params(state.params),
    dataset.train.num_tokens,
    start,
    end,
    tokens_per_step,
  )
  progress = _Progress(start, end, tokens_per_step)
  run_start = time.perf_counter()
  eval_loss, aligned = None, {}
  for step in range(start, end):
    rows = {"corpus": batches(step)}
    if target is not None:
      current = ModelBundle(model_config, state.params)
      rows = distill.step_rows(config, step, rows["corpus"], current, target)
    rows = sharding.put(rows, batch_sharding)
    state, loss = step_fn(
      state, rows, None if target is None else target.params, loss_fn, optimizer
    )
    done = step + 1
    extra = ""
    if done % config.eval_every == 0 or done == end:
      bundle = ModelBundle(model_config, state.params)
      head_target = target if config.model == HEAD else None
      eval_loss = heldout_loss(bundle, eval_rows, config.batch_size, head_target)
      extra = f" heldout {eval_loss:.4f} (ppl {np.exp(eval_loss):.1f})"
      if target is not None:
        aligned = distill.alignment(bundle, target, dataset.heldout, config.distill, config.seed)
        extra += f" acceptance {aligned['acceptance']:.4f} alpha*8 {aligned['alpha_k8']:.4f}"
    if done % config.log_every == 0 or done == end or extra:
      progress.update(done, float(loss), extra)
    if done % config.checkpoint_every == 0 or done == end:
      meta = {
        "step": done,
        "config": config.to_dict(),
        "wall_time_s": wall_time_s + time.perf_counter() - run_start,
        "positions_seen": done * tokens_per_step,
        "row_fill": row_fill,
        "heldout_loss": eval_loss,
      }
      if target is not None:
        meta.update(
          distill_target=target_id,
          heldout_acceptance=aligned.get("acceptance"),
          heldout_alpha_k8=aligned.get("alpha_k8"),
        )
      runs.save_checkpoint(manager, done, state.params, state.opt_state, meta)
  manager.wait_until_finished()
  manager.close()
  return ModelBundle(config=model_config, params=state.params)


def train_or_load(
  config: TrainConfig, workdir: str | pathlib.Path, wait: bool = False
) -> ModelBundle:
  """Loads the final checkpoint of `config` from `workdir`, training only when it is missing.

  Args:
    config: the run's configuration; a run of a different config in `workdir` is an error.
    workdir: the run's directory (locked while training, see `train`).
    wait: wait for another run holding `workdir` instead of raising.

  Returns:
    The trained model.
  """
  try:
    if runs.is_finished(config, workdir):
      return runs.load_bundle(workdir)
  except runs.DamagedCheckpointError as error:
    logging.warning("%s; training again from the newest complete checkpoint", error)
  return train(config, workdir, wait=wait)
