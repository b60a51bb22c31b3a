"""Decoding sweeps: cells, resumable JSONL results, provenance and progress.

A sweep is the grid methods x K x L x rho x seeds over one draft/target pair and one
prompt setting. A cell decodes `num_prompts` held-out prompts (drawn by its seed) with
`engine.generate` and, when it has finished, appends one JSON line to
`<results_dir>/results.jsonl`, keyed by a hash of everything that defines it (the cell's
fields and a fingerprint of both models' parameters and the held-out text). A rerun
skips the cells already there: a killed sweep resumes where it stopped and runs no cell
twice. Each run also appends its provenance (config, package versions, devices, git
revision) to `<results_dir>/provenance.jsonl`.

Timing: a cell's first batch is a warm-up (it compiles the decoder the first time a
shape is seen) whose output is kept; the other batches are timed (the first one again
when there is only one), so `decode_seconds` and `timed_tokens` measure decoding alone.
"""

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from spectr_jax import engine, sharding, train
from spectr_jax.data import EOS_ID, TokenizedSplit, default_workdir, make_prompts
from spectr_jax.models import ModelBundle, count_params

RESULTS_FILE = "results.jsonl"
PROVENANCE_FILE = "provenance.jsonl"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml_collections")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """A sweep (see `configs/lm1b_spectr.py` for the meaning of every field)."""

  name: str
  results_dir: str
  draft: train.TrainConfig
  target: train.TrainConfig
  draft_workdir: str
  target_workdir: str
  methods: tuple[str, ...]
  num_drafts: tuple[int, ...]
  draft_lens: tuple[int, ...]
  rhos: tuple[str | float, ...]
  seeds: tuple[int, ...]
  temperature: float
  top_k: int
  top_p: float
  num_prompts: int
  prompt_len: int
  max_new_tokens: int
  stop_at_eos: bool
  batch_size: int
  shard: bool
  compilation_cache: str

  def __post_init__(self):
    unknown = set(self.methods) - set(engine.METHODS)
    if unknown:
      raise ValueError(f"unknown methods {sorted(unknown)}; this build has {engine.METHODS}")
    for rho in self.rhos:
      if not (rho in ("star", "k") or (not isinstance(rho, str) and rho >= 1)):
        raise ValueError(f"rho must be 'star', 'k' or a number >= 1, got {rho!r}")
    if self.batch_size < 1 or self.num_prompts < 1:
      raise ValueError("batch_size and num_prompts must be >= 1")

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "SweepConfig":
    """Builds the config from a nested mapping (a `ConfigDict.to_dict()`)."""
    values = dict(values)
    for role in ("draft", "target"):
      values[role] = train.TrainConfig.from_dict(values[role])
    for name in ("methods", "num_drafts", "draft_lens", "rhos", "seeds"):
      values[name] = tuple(values[name])
    return cls(**values)

  def resolve(self, path: str) -> pathlib.Path:
    """`path` itself when absolute, else relative to $SPECTR_WORKDIR."""
    return default_workdir() / pathlib.Path(path).expanduser()

  @property
  def results_path(self) -> pathlib.Path:
    """The directory of results.jsonl ($SPECTR_WORKDIR/experiments/<name> by default)."""
    return self.resolve(self.results_dir or f"experiments/{self.name}")


@dataclasses.dataclass(frozen=True)
class Pair:
  """A draft/target pair with the held-out text that prompts are drawn from.

  Attributes:
    draft, target: the models.
    heldout: held-out sentences (prompts are their starts).
    fingerprint: hash of both models' parameters and the held-out text; part of every
      cell key, so results of other models are never mistaken for these.
    description: JSON-able facts about the pair (workdirs, sizes) for the provenance.
  """

  draft: ModelBundle
  target: ModelBundle
  heldout: TokenizedSplit
  fingerprint: str
  description: dict[str, Any]

  @property
  def cost_ratio(self) -> float:
    """Draft parameters / target parameters (the latency model's draft step cost)."""
    return self.description["draft_params"] / self.description["target_params"]


def make_pair(
  draft: ModelBundle, target: ModelBundle, heldout: TokenizedSplit, **description: Any
) -> Pair:
  """Builds a `Pair`, fingerprinting the parameters and the held-out text."""
  digest = hashlib.sha256()
  for leaf in (*jax.tree.leaves((draft.params, target.params)), heldout.tokens, heldout.offsets):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  description = dict(
    description, draft_params=count_params(draft.params), target_params=count_params(target.params)
  )
  return Pair(draft, target, heldout, digest.hexdigest()[:16], description)


def load_pair(config: SweepConfig) -> Pair:
  """Loads the sweep's pair, training each model first when its final checkpoint is missing."""
  draft_dir, target_dir = (
    config.resolve(config.draft_workdir),
    config.resolve(config.target_workdir),
  )
  draft = train.train_or_load(config.draft, draft_dir)
  target = train.train_or_load(config.target, target_dir)
  if train.load_tokenizer(draft_dir).model_proto != train.load_tokenizer(target_dir).model_proto:
    raise ValueError(f"{draft_dir} and {target_dir} use different tokenizers")
  heldout = train.dataset_for(target_dir).heldout
  return make_pair(
    draft,
    target,
    heldout,
    draft_workdir=str(draft_dir),
    target_workdir=str(target_dir),
    draft_model=config.draft.model,
    target_model=config.target.model,
    data_source=config.target.data.source,
  )


def replicate(pair: Pair, mesh: jax.sharding.Mesh) -> Pair:
  """The pair with both models' parameters replicated over `mesh` (restored checkpoints
  sit on one device, which a computation over the whole mesh cannot take)."""
  replicated = NamedSharding(mesh, PartitionSpec())
  draft, target = (
    ModelBundle(m.config, jax.device_put(m.params, replicated)) for m in (pair.draft, pair.target)
  )
  return dataclasses.replace(pair, draft=draft, target=target)


@dataclasses.dataclass(frozen=True)
class Cell:
  """Everything that defines one cell's result (its key hashes all of it).

  rho is None for methods without a split factor; K = 1, L = 0 for "autoregressive".
  top_k = 0 and top_p = 1 mean no truncation. pair is `Pair.fingerprint`.
  """

  method: str
  num_drafts: int
  draft_len: int
  rho: str | float | None
  seed: int
  temperature: float
  top_k: int
  top_p: float
  num_prompts: int
  prompt_len: int
  max_new_tokens: int
  stop_at_eos: bool
  pair: str

  @property
  def key(self) -> str:
    """A hash of all fields: the identity of the cell's result."""
    text = json.dumps(dataclasses.asdict(self), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  @property
  def label(self) -> str:
    """A short human-readable name, e.g. "kseq K=4 L=4 rho=star seed=0"."""
    rho = "" if self.rho is None else f" rho={self.rho}"
    return f"{self.method} K={self.num_drafts} L={self.draft_len}{rho} seed={self.seed}"


def expand(config: SweepConfig, pair: str) -> list[Cell]:
  """The sweep's cells, grouped so that cells sharing a compiled decoder run in a row.

  "autoregressive" gets one cell per seed, "sd" one per L (K = 1), the multi-draft
  methods one per L and K >= 2 (at K = 1 they are "sd"), and "kseq" one per rho; a fixed
  rho above K is skipped (it is clipped to K, i.e. the "k" strategy).

  Args:
    config: the sweep.
    pair: the pair's fingerprint.

  Returns:
    The cells in run order.
  """
  common = dict(
    temperature=float(config.temperature),
    top_k=int(config.top_k),
    top_p=float(config.top_p),
    num_prompts=config.num_prompts,
    prompt_len=config.prompt_len,
    max_new_tokens=config.max_new_tokens,
    stop_at_eos=config.stop_at_eos,
    pair=pair,
  )
  grid = []
  for method in config.methods:
    if method == "autoregressive":
      grid.append((method, 1, 0, None))
      continue
    for draft_len in config.draft_lens:
      if method == "sd":
        grid.append((method, 1, draft_len, None))
        continue
      for k in (k for k in config.num_drafts if k >= 2):
        if method != "kseq":
          grid.append((method, k, draft_len, None))
          continue
        for rho in config.rhos:
          if isinstance(rho, str) or rho <= k:
            grid.append((method, k, draft_len, rho if isinstance(rho, str) else float(rho)))
  cells = [
    Cell(method, k, draft_len, rho, seed, **common)
    for method, k, draft_len, rho in grid
    for seed in config.seeds
  ]
  if len({c.key for c in cells}) != len(cells):
    raise ValueError("the sweep lists a cell twice (repeated values in the config?)")
  return cells


def load_results(results_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """Reads results.jsonl into {key: record}.

  A trailing partial line (a run killed while writing) is cut off the file, so the next
  append starts on a fresh line; a repeated key keeps its first record.
  """
  path = pathlib.Path(results_dir) / RESULTS_FILE
  if not path.exists():
    return {}
  text = path.read_bytes()
  if text and not text.endswith(b"\n"):
    end = text.rfind(b"\n") + 1
    logging.warning("dropping a partial last line of %s (%d bytes)", path, len(text) - end)
    with path.open("r+b") as f:
      f.truncate(end)
    text = text[:end]
  records = {}
  for line in text.decode().splitlines():
    if line.strip():
      record = json.loads(line)
      records.setdefault(record["key"], record)
  return records


def _append(path: pathlib.Path, record: dict[str, Any]) -> None:
  with path.open("a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def _git(*args: str) -> str:
  root = pathlib.Path(__file__).resolve().parents[1]
  command = ["git", *args]
  return subprocess.run(
    command, cwd=root, capture_output=True, text=True, check=True, timeout=10
  ).stdout.strip()


def _git_revision() -> str:
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
    "git_revision": _git_revision(),
    "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "host": platform.node(),
  }


def _stats_record(stats_list: Sequence[engine.DecodeStats], rows: Sequence[int]) -> dict:
  """Per-prompt counts (for the bootstrap) and per-position totals of a cell's batches."""
  stats = jax.tree.map(
    lambda *xs: np.concatenate([np.asarray(x)[:n] for x, n in zip(xs, rows, strict=True)]),
    *stats_list,
  )
  return {
    "emitted": stats.emitted_B.tolist(),
    "rounds": stats.rounds_B.tolist(),
    "draft_calls": stats.draft_calls_B.tolist(),
    "tokens_per_round": stats.tokens_per_round_BxL2.sum(0).tolist(),
    "reached": stats.reached_BxL1.sum(0).tolist(),
    "hits": stats.hits_BxL1.sum(0).tolist(),
    "accepted": stats.accepted_BxL1.sum(0).tolist(),
    "survivors": stats.survivors_BxL1.sum(0).tolist(),
    "nonfinite": int(stats.nonfinite_B.sum()),
    "block_efficiency": float(stats.emitted_B.sum() / max(stats.rounds_B.sum(), 1)),
  }


def run_cell(
  cell: Cell, pair: Pair, batch_size: int, mesh: jax.sharding.Mesh | None = None
) -> dict[str, Any]:
  """Decodes a cell's prompts and returns its record (without key and run id).

  Args:
    cell: the cell; its seed draws the prompts and keys the randomness (row b of the
      prompt set uses fold_in(key(seed), b), so batching does not change the output).
    pair: the models and held-out text.
    batch_size: prompts per `engine.generate` call (the last batch is padded).
    mesh: optional data mesh that splits each batch over devices.

  Returns:
    The record: per-prompt emitted tokens and rounds, per-position totals, block
    efficiency, and the timing of the warm-up and of the timed batches.
  """
  prompts = make_prompts(pair.heldout, cell.num_prompts, cell.prompt_len, cell.seed)
  starts = range(0, cell.num_prompts, batch_size)

  def decode(start):
    index = np.arange(start, start + batch_size) % cell.num_prompts
    out = engine.generate(
      jax.random.key(cell.seed),
      draft=None if cell.method == "autoregressive" else pair.draft,
      target=pair.target,
      prompts=prompts.tokens_BxT[index],
      prompt_lengths=prompts.lengths_B[index],
      method=cell.method,
      num_drafts=cell.num_drafts,
      draft_len=cell.draft_len,
      max_new_tokens=cell.max_new_tokens,
      temperature=cell.temperature,
      top_k=cell.top_k or None,
      top_p=None if cell.top_p >= 1 else cell.top_p,
      eos_id=EOS_ID if cell.stop_at_eos else None,
      rho="star" if cell.rho is None else cell.rho,
      prompt_ids=jnp.asarray(index, jnp.int32),
      mesh=mesh,
    )
    return jax.block_until_ready(out)

  start_time = time.perf_counter()
  outputs = [decode(0)]
  warmup_seconds = time.perf_counter() - start_time
  timed_starts = list(starts[1:]) or [0]
  start_time = time.perf_counter()
  timed = [decode(start) for start in timed_starts]
  decode_seconds = time.perf_counter() - start_time
  if len(starts) > 1:
    outputs += timed
  rows = [min(batch_size, cell.num_prompts - s) for s in starts]
  timed_rows = [min(batch_size, cell.num_prompts - s) for s in timed_starts]
  timed_tokens = sum(
    int(np.asarray(o.lengths_B)[:n].sum()) for o, n in zip(timed, timed_rows, strict=True)
  )
  return {
    **_stats_record([o.stats for o in outputs], rows),
    "warmup_seconds": warmup_seconds,
    "decode_seconds": decode_seconds,
    "timed_tokens": timed_tokens,
    "timed_prompts": sum(timed_rows),
    "batch_size": batch_size,
  }


class _Progress:
  """Logs each finished cell with the count done and an ETA from this run's pace."""

  def __init__(self, total: int, done: int):
    self.total, self.done, self.run_done = total, done, 0
    self.start = time.perf_counter()

  def update(self, cell: Cell, record: dict[str, Any]) -> None:
    self.done += 1
    self.run_done += 1
    elapsed = time.perf_counter() - self.start
    eta = elapsed / self.run_done * (self.total - self.done)
    logging.info(
      "[%d/%d] %s: block efficiency %.3f, decode %.1f s (warm-up %.1f s); ETA %s",
      self.done,
      self.total,
      cell.label,
      record["block_efficiency"],
      record["decode_seconds"],
      record["warmup_seconds"],
      datetime.timedelta(seconds=round(eta)),
    )


def run_sweep(
  config: SweepConfig, pair: Pair | None = None, provenance_config: Any = None
) -> list[dict[str, Any]]:
  """Runs the cells of `config` that results.jsonl does not hold yet.

  Only process 0 writes files; every process decodes (its devices hold part of each
  batch when `config.shard`).

  Args:
    config: the sweep.
    pair: the models (default: `load_pair(config)`, training them when missing).
    provenance_config: what to record as the run's config (default: `config`).

  Returns:
    The records of the sweep's cells in `expand` order (on processes other than 0, only
    those run here).
  """
  if config.compilation_cache:
    sharding.enable_compilation_cache(config.resolve(config.compilation_cache))
  pair = pair or load_pair(config)
  cells = expand(config, pair.fingerprint)
  results_dir = config.results_path
  writer = jax.process_index() == 0
  if writer:
    results_dir.mkdir(parents=True, exist_ok=True)
  done = load_results(results_dir)
  finished = np.array([cell.key in done for cell in cells])
  if jax.process_count() > 1:
    finished = multihost_utils.broadcast_one_to_all(finished)
  todo = [cell for cell, skip in zip(cells, finished, strict=True) if not skip]
  logging.info(
    "%s: %d cells, %d already in %s, %d to run",
    config.name,
    len(cells),
    len(cells) - len(todo),
    results_dir,
    len(todo),
  )
  run_id = uuid.uuid4().hex[:12]
  if todo and writer:
    described = dataclasses.asdict(config) if provenance_config is None else provenance_config
    record = provenance(described)
    record.update(run=run_id, pair=dict(pair.description, fingerprint=pair.fingerprint))
    _append(results_dir / PROVENANCE_FILE, record)
  mesh = None
  if config.shard:
    mesh = sharding.data_mesh()
    pair = replicate(pair, mesh)
  progress = _Progress(len(cells), len(cells) - len(todo))
  for cell in todo:
    record = {"key": cell.key, "cell": dataclasses.asdict(cell)}
    record.update(run_cell(cell, pair, config.batch_size, mesh))
    record.update(
      run=run_id,
      device_kind=jax.devices()[0].device_kind,
      num_devices=1 if mesh is None else mesh.size,
      draft_params=pair.description["draft_params"],
      target_params=pair.description["target_params"],
    )
    if writer:
      _append(results_dir / RESULTS_FILE, record)
    done[cell.key] = record
    progress.update(cell, record)
  return [done[cell.key] for cell in cells if cell.key in done]
