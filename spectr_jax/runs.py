"""Storage of training runs (work directories, orbax checkpoints) and run provenance.

A run lives in one work directory:
  config.json         the `TrainConfig` of the run (JSON)
  tokenizer.model     the SentencePiece model the run was trained with
  checkpoints/<step>/ params, opt_state and meta (step, config, wall time) of each save,
                      and checksums.json: the SHA-256 of every file of those items, written
                      by process 0 once the save is complete and checked before a restore
"""

import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging as pylogging
import pathlib
import platform
import subprocess
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from spectr_jax import results, sharding
from spectr_jax.data import Dataset, Tokenizer, load_dataset
from spectr_jax.models import ModelBundle, ModelConfig, init_params, layout, param_axes
from spectr_jax.train_config import TrainConfig, saved_train_config

# Fields that change logging, evaluation, storage or the device layout but not the trained
# parameters (beyond the rounding of sums split over devices); a resumed run may change them.
LOGISTICS_FIELDS = (
  "eval_every",
  "eval_rows",
  "checkpoint_every",
  "keep_checkpoints",
  "log_every",
  "num_devices",
  "mesh_model",
  "fsdp",
)
CHECKSUMS_FILE = "checksums.json"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections")


class CheckpointError(ValueError):
  """A missing checkpoint, or one written by a different configuration."""


class DamagedCheckpointError(CheckpointError):
  """A checkpoint whose files cannot be restored (truncated data, missing metadata) or
  differ from their checksums (bit rot)."""


def workdir_path(workdir: str | pathlib.Path) -> pathlib.Path:
  """The absolute path of a work directory (`~` expanded)."""
  return pathlib.Path(workdir).expanduser().absolute()


def checkpoint_manager(
  workdir: str | pathlib.Path, config: TrainConfig | None = None
) -> ocp.CheckpointManager:
  """The orbax manager of a run's checkpoints (params, opt_state, meta).

  Args:
    workdir: the run's directory.
    config: the run being trained (it sets how many checkpoints are kept and lets the
      manager create the directory); None to read only.
  """
  options = ocp.CheckpointManagerOptions(
    # At least two, so a damaged newest checkpoint leaves one to fall back to.
    max_to_keep=max(config.keep_checkpoints, 2) if config else None,
    enable_async_checkpointing=False,
    create=config is not None,
  )
  return ocp.CheckpointManager(
    workdir_path(workdir) / "checkpoints",
    options=options,
    item_names=("params", "opt_state", "meta"),
  )


def _comparable(config: TrainConfig) -> dict[str, Any]:
  """The config fields that decide the parameters (cache location and logistics dropped)."""
  values = config.to_dict()
  for name in LOGISTICS_FIELDS:
    values.pop(name)
  values["data"].pop("cache_dir")
  return values


def load_config(workdir: str | pathlib.Path) -> TrainConfig:
  """Returns the `TrainConfig` saved in `workdir`; raises `CheckpointError` if absent."""
  config = saved_train_config(workdir)
  if config is None:
    raise CheckpointError(f"no training run in {workdir_path(workdir)}: config.json is missing")
  return config


def check_config(config: TrainConfig, workdir: str | pathlib.Path) -> None:
  """Raises `CheckpointError` if `workdir` holds a run of a different config."""
  path = workdir_path(workdir)
  if not (path / "config.json").is_file():
    return
  saved, wanted = _comparable(load_config(path)), _comparable(config)
  if saved != wanted:
    diff = sorted(
      k for k in set(saved) | set(wanted) if saved.get(k, "<missing>") != wanted.get(k, "<missing>")
    )
    raise CheckpointError(
      f"{path} holds a run of a different config (fields {diff} differ); use another "
      "workdir or delete it"
    )


def write_run_files(workdir: str | pathlib.Path, config: TrainConfig, tokenizer: Tokenizer) -> None:
  """Creates `workdir` and writes the run's config.json and tokenizer.model.

  In a multi-process run only process 0 writes (the others return), and each file is
  written aside and renamed: processes writing one file at once could otherwise fail
  (the loser's rename of the shared temporary file finds it gone) or let a process
  checking the config (`check_config`) read a half-written config.json.
  """
  if jax.process_index() != 0:
    return
  path = workdir_path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  results.write_whole(path / "config.json", json.dumps(config.to_dict(), indent=2))
  tokenizer.save(path / "tokenizer.model")  # written aside and renamed


def load_tokenizer(workdir: str | pathlib.Path) -> Tokenizer:
  """Returns the tokenizer a run in `workdir` was trained with."""
  return Tokenizer.load(workdir_path(workdir) / "tokenizer.model")


def latest_step(workdir: str | pathlib.Path) -> int | None:
  """Returns the step of the newest checkpoint in `workdir`, or None."""
  path = workdir_path(workdir)
  if not (path / "checkpoints").is_dir():
    return None
  return checkpoint_manager(path).latest_step()


def is_finished(config: TrainConfig, workdir: str | pathlib.Path) -> bool:
  """Whether `workdir` holds the final checkpoint of `config` (a different config raises)."""
  check_config(config, workdir)
  return latest_step(workdir) == config.num_steps


def load_bundle(
  workdir: str | pathlib.Path,
  step: int | None = None,
  mesh: jax.sharding.Mesh | None = None,
  for_decoding: bool = False,
) -> ModelBundle:
  """Loads the parameters of a finished run (or of checkpoint `step`).

  The parameters land on `mesh` by `sharding.RULES`, or without one on this process's
  first device, whatever mesh saved them. A run saved in the per-layer layout (before
  the layer stack, `models.layout`) is restored on one device and stacked.

  Args:
    workdir: the run's directory.
    step: which checkpoint; None means the final one (`num_steps`).
    mesh: where to place the parameters (each device reads only its shards).
    for_decoding: restore every float parameter in the model's compute dtype rather
      than float32, the layers as a decode holds them (`ModelBundle.for_decoding`).

  Returns:
    The model config and parameters.
  """
  path = workdir_path(workdir)
  config = load_config(path)
  want = config.num_steps if step is None else step
  latest = latest_step(path)
  manager = checkpoint_manager(path)
  if latest is None or want not in manager.all_steps():
    raise CheckpointError(
      f"no checkpoint for step {want} in {path}/checkpoints (latest: {latest}, final: "
      f"{config.num_steps}); train it first (experiments/train.py) or resume it"
    )
  model_config = config.model_config()
  abstract = jax.eval_shape(functools.partial(init_params, model_config), jax.random.key(0))
  if for_decoding:  # the compute dtype as restored; the layers split after (if unrolled)
    abstract = layout.for_decoding(abstract, model_config, scan_layers=True)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    placements = jax.tree.map(lambda _: device, abstract)
  else:
    placements = sharding.param_shardings(abstract, mesh, axes=param_axes(model_config))
  abstract = jax.tree.map(
    lambda x, where: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), abstract, placements
  )
  per_layer = _saved_per_layer(manager, want)
  if per_layer:
    abstract = _per_layer_abstract(abstract, model_config)
  args = ocp.args.Composite(params=ocp.args.StandardRestore(abstract))
  params = _restore(manager, want, args)["params"]
  if per_layer:
    params = jax.device_put(_stacked(params, model_config), placements)
  bundle = ModelBundle(config=model_config, params=params)
  return bundle.placed(mesh) if for_decoding else bundle


def _saved_per_layer(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether checkpoint `step` holds its parameters in the per-layer layout (metadata that
  cannot be read counts as no: the restore then names the damage, `_verify`)."""
  directory = pathlib.Path(manager.directory) / str(step) / "params"
  try:
    saved = ocp.StandardCheckpointer().metadata(directory).item_metadata
  except (OSError, ValueError):
    return False
  return saved is not None and layout.is_per_layer(saved)


def _is_params(tree: Any) -> bool:
  return isinstance(tree, dict) and ("layers" in tree or layout.is_per_layer(tree))


def _per_layer_abstract(abstract: Any, config: ModelConfig) -> Any:
  """`abstract` (parameters, or an optimizer state holding parameter-shaped trees) with
  every parameter tree in the per-layer layout, on this process's first device."""
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def unstack(tree):
    if not _is_params(tree):
      return tree
    return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
      layout.unstack_layers(tree, config),
    )

  return jax.tree.map(unstack, abstract, is_leaf=_is_params)


def _stacked(restored: Any, config: ModelConfig) -> Any:
  """`restored` with every per-layer parameter tree in the decoder's layout."""
  stack = lambda tree: layout.stack_layers(tree, config) if _is_params(tree) else tree  # noqa: E731
  return jax.tree.map(stack, restored, is_leaf=_is_params)


def _file_digest(path: pathlib.Path) -> str:
  with path.open("rb") as file:
    return hashlib.file_digest(file, "sha256").hexdigest()


def _item_files(step_dir: pathlib.Path, item: str) -> list[pathlib.Path]:
  return sorted(f for f in (step_dir / item).rglob("*") if f.is_file())


def save_checkpoint(
  manager: ocp.CheckpointManager, step: int, params: Any, opt_state: Any, meta: dict[str, Any]
) -> None:
  """Saves params, optimizer state and the JSON meta record as checkpoint `step`.

  Once orbax has finished (every process's shards on disk), process 0 writes the step's
  checksums.json: the SHA-256 of every file of the three items, which `_restore` checks.
  """
  items = {
    "params": ocp.args.StandardSave(params),
    "opt_state": ocp.args.StandardSave(opt_state),
    "meta": ocp.args.JsonSave(meta),
  }
  manager.save(step, args=ocp.args.Composite(**items), force=True)
  manager.wait_until_finished()
  if jax.process_index() != 0:
    return
  step_dir = pathlib.Path(manager.directory) / str(step)
  digests = {
    str(f.relative_to(step_dir)): _file_digest(f)
    for item in items
    for f in _item_files(step_dir, item)
  }
  record = {"algorithm": "sha256", "files": digests}
  results.write_whole(step_dir / CHECKSUMS_FILE, json.dumps(record, indent=0))


def _damaged(manager: ocp.CheckpointManager, step: int, why: str) -> DamagedCheckpointError:
  return DamagedCheckpointError(
    f"checkpoint step {step} in {manager.directory} is damaged ({why}); rerun the training "
    "command to redo it from the newest complete checkpoint"
  )


def _verify(manager: ocp.CheckpointManager, step: int, items: list[str]) -> None:
  """Checks the files of `items` of checkpoint `step` against its checksums.json.

  A checkpoint without one (saved before checksums were written, or by a run killed
  between orbax's save and the checksums) is restored unverified, with a warning.

  Raises:
    DamagedCheckpointError: a file is missing or its SHA-256 differs (named).
  """
  step_dir = pathlib.Path(manager.directory) / str(step)
  try:
    digests = json.loads((step_dir / CHECKSUMS_FILE).read_bytes())["files"]
  except FileNotFoundError:
    logging.warning(
      "checkpoint step %d in %s has no %s (saved before checksums were written, or by a "
      "run killed right after the save): restoring it unverified",
      step,
      manager.directory,
      CHECKSUMS_FILE,
    )
    return
  except (ValueError, KeyError, TypeError) as error:
    raise _damaged(manager, step, f"{CHECKSUMS_FILE} is not readable: {error}") from None
  if not isinstance(digests, dict) or not all(
    isinstance(name, str) and isinstance(digest, str) for name, digest in digests.items()
  ):
    what = f'its "files" is a {type(digests).__name__}, not a map of file names to SHA-256'
    raise _damaged(manager, step, f"{CHECKSUMS_FILE} is not readable: {what}")
  for name, digest in digests.items():
    if name.split("/")[0] not in items:
      continue
    path = step_dir / name
    if not path.is_file():
      raise _damaged(manager, step, f"{name} is missing")
    if _file_digest(path) != digest:
      raise _damaged(manager, step, f"{name} differs from its SHA-256 at save")


def _restore(manager: ocp.CheckpointManager, step: int, args: ocp.args.Composite) -> Any:
  """Checks the files of the items `args` restores against the step's checksums
  (`_verify`), then `manager.restore`s them; any failure is a `DamagedCheckpointError`."""
  _verify(manager, step, list(args.keys()))
  try:
    return manager.restore(step, args=args)
  except Exception as error:  # orbax and TensorStore raise many types for damaged files
    raise _damaged(manager, step, f"{type(error).__name__}: {str(error)[:300]}") from error


def restore_latest(
  manager: ocp.CheckpointManager,
  abstract_params: Any,
  abstract_opt_state: Any,
  model_config: ModelConfig,
) -> tuple[int, Any, Any, dict[str, Any]] | None:
  """Restores the newest complete checkpoint: (step, params, opt_state, meta).

  The arrays land on the shardings of the abstract values, whatever mesh saved them (a run
  saved on a (4, 2) mesh resumes on (8, 1) or (2, 4)). A run saved in the per-layer
  layout (`models.layout`; its optimizer's moments too) is restored on one device,
  stacked and placed.

  A damaged checkpoint is skipped with a warning naming it, and the previous step is
  tried; once a complete one is found, the damaged newer ones are moved aside (to
  `<workdir>/damaged-<step>-<time>`, by process 0) so that training can save those steps again.
  Only the run's writer (the holder of the workdir's lock) calls this.

  Returns:
    None when there is no checkpoint.

  Raises:
    DamagedCheckpointError: there are checkpoints but none is complete.
  """

  def args(per_layer: bool):
    params, opt_state = abstract_params, abstract_opt_state
    if per_layer:
      params = _per_layer_abstract(params, model_config)
      opt_state = _per_layer_abstract(opt_state, model_config)
    return ocp.args.Composite(
      params=ocp.args.StandardRestore(params),
      opt_state=ocp.args.StandardRestore(opt_state),
      meta=ocp.args.JsonRestore(),
    )

  steps = sorted(manager.all_steps(), reverse=True)
  directory = pathlib.Path(manager.directory)
  for number, step in enumerate(steps):
    try:
      per_layer = _saved_per_layer(manager, step)
      restored = _restore(manager, step, args(per_layer))
    except DamagedCheckpointError as error:
      logging.warning("%s; trying the previous step", error)
      continue
    if per_layer:
      placements = jax.tree.map(lambda x: x.sharding, (abstract_params, abstract_opt_state))
      state = _stacked((restored["params"], restored["opt_state"]), model_config)
      params, opt_state = jax.device_put(state, placements)
      restored = {**restored, "params": params, "opt_state": opt_state}
    if number and jax.process_index() == 0:
      for damaged in steps[:number]:
        stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
        aside = directory.parent / f"damaged-{damaged}-{stamp}"
        logging.warning("moving damaged checkpoint %s to %s", directory / str(damaged), aside)
        (directory / str(damaged)).rename(aside)
    manager.reload()
    return step, restored["params"], restored["opt_state"], restored["meta"]
  if steps:
    raise DamagedCheckpointError(
      f"no complete checkpoint in {directory}: steps {steps} are all damaged (see the "
      "warnings); move them aside to train from the start"
    )
  return None


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
  path = workdir_path(workdir)
  step = latest_step(path) if step is None else step
  if step is None:
    raise CheckpointError(f"no checkpoint in {path}/checkpoints")
  args = ocp.args.Composite(meta=ocp.args.JsonRestore())
  return dict(_restore(checkpoint_manager(path), step, args)["meta"])


def dataset_for(workdir: str | pathlib.Path) -> Dataset:
  """Returns the dataset (from its cache) that the run in `workdir` was trained on."""
  return load_dataset(load_config(workdir).data)


class _DropOrbaxInfo(pylogging.Filter):
  def filter(self, record: pylogging.LogRecord) -> bool:
    return record.levelno >= pylogging.WARNING or "orbax" not in record.pathname


def quiet_orbax_logging() -> None:
  """Hides orbax's INFO records from absl's handler (entry points call it once)."""
  logging.get_absl_handler().addFilter(_DropOrbaxInfo())


def _git(*args: str) -> str:
  root = pathlib.Path(__file__).resolve().parents[1]
  command = ["git", *args]
  return subprocess.run(
    command, cwd=root, capture_output=True, text=True, check=True, timeout=10
  ).stdout.strip()


def git_revision() -> str:
  """HEAD's hash, with "+dirty" when tracked files differ from it; "unknown" outside git."""
  try:
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return _git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def provenance(config: Any) -> dict[str, Any]:
  """What produced a run: config, versions, devices, git revision, time and host.

  Args:
    config: a JSON-able description of the run (e.g. the config as a dict).
  """
  versions = {"python": platform.python_version()}
  for package in _PACKAGES:
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  devices = jax.devices()
  return {
    "config": config,
    "versions": versions,
    "backend": jax.default_backend(),
    "device_kind": devices[0].device_kind,
    "num_devices": len(devices),
    "num_processes": jax.process_count(),
    "git_revision": git_revision(),
    "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "host": platform.node(),
  }
