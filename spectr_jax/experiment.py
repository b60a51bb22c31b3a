"""Decoding sweeps: the grid of cells and the resumable runner.

A sweep is the grid methods x K x L x rho x seeds over one draft/target pair and one
decoding setting. A cell decodes `num_prompts` held-out prompts (drawn by its seed) with
`engine.generate` and, when it has finished, appends one JSON line to
`<results_dir>/results.jsonl` (see `spectr_jax.results`), keyed by a hash of everything
that defines it (the cell's fields and a fingerprint of both models' parameters and the
held-out text). A rerun skips the cells already there: a killed sweep resumes where it
stopped and runs no cell twice. Each run also appends its provenance (config, package
versions, devices, git revision) to `<results_dir>/provenance.jsonl`.

Timing: a cell's first batch is a warm-up (it compiles the decoder the first time a
shape is seen) whose output is kept; the other batches are timed (the first one again
when there is only one), so `decode_seconds` and `timed_tokens` measure decoding alone.
`load_average` is the host's 1-minute load average when they start (absent where the
system has none): times measured beside other work are slower.
"""

import dataclasses
import datetime
import hashlib
import json
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from spectr_jax import checks, engine, locks, memory, methods, pairs, results, runs, sharding
from spectr_jax.data import EOS_ID, make_prompts
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelConfig, param_axes
from spectr_jax.pair_config import resolve
from spectr_jax.sweep_config import Prompts, SweepConfig, cell_record, rhos_for


class InexactError(ValueError):
  """A cell whose output law is not the target's, in a sweep that refuses such cells."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """Everything that defines one cell's result (its key hashes all of it).

  rho is None for methods without a split factor; K = 1, L = 0 for "autoregressive".
  spec is the cell's `DecodeSpec` without stop tokens (`cell_spec` adds the pair's);
  pair is `pairs.Pair.fingerprint`.
  """

  method: str
  num_drafts: int
  draft_len: int
  rho: str | float | None
  seed: int
  spec: DecodeSpec
  prompts: Prompts
  pair: str

  def as_record(self) -> dict[str, Any]:
    """The flat dict stored as a record's "cell" (its settings inlined:
    `sweep_config.cell_record`)."""
    head = (self.method, self.num_drafts, self.draft_len, self.rho, self.seed)
    names = ("method", "num_drafts", "draft_len", "rho", "seed")
    return {
      **dict(zip(names, head, strict=True)),
      **cell_record(self.spec, self.prompts),
      "pair": self.pair,
    }

  @property
  def key(self) -> str:
    """A hash of all fields: the identity of the cell's result."""
    text = json.dumps(self.as_record(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  @property
  def label(self) -> str:
    """A short human-readable name, e.g. "kseq K=4 L=4 rho=star seed=0"."""
    rho = "" if self.rho is None else f" rho={self.rho}"
    return f"{self.method} K={self.num_drafts} L={self.draft_len}{rho} seed={self.seed}"


def expand(config: SweepConfig, pair: str) -> list[Cell]:
  """The sweep's cells, grouped so that cells sharing a compiled decoder run in a row.

  Each method of the registry (`spectr_jax.methods`) runs its K values of the grid
  (`Method.grid_drafts`: autoregressive decoding and single-draft methods at K = 1,
  multi-draft methods at their K >= 2, since at K = 1 they are their `single` method) for
  every L (autoregressive once), and methods with a split factor once per rho; a fixed
  rho above K is skipped (it is clipped to K, i.e. the "k" strategy). Each cell decodes
  the sweep's template with its method, K, L and rho (`SweepConfig.cell_spec`).

  Args:
    config: the sweep.
    pair: the pair's fingerprint.

  Returns:
    The cells in run order.
  """
  grid = []
  for method in map(methods.get, config.methods):
    lens = config.draft_lens if method.speculative else (0,)
    for draft_len in lens:
      for k in method.grid_drafts(config.num_drafts):
        rhos = (
          [methods.check_rho(r) for r in rhos_for(config.rhos, k)] if method.takes_rho else [None]
        )
        grid += [(method.name, k, draft_len, rho) for rho in rhos]

  # Each cell's spec from the template: settings a cell cannot use are left at their
  # defaults (`DecodeSpec` resets them), so a cell keeps one key across sweeps that differ
  # only in them.
  cells = [
    Cell(
      method,
      k,
      draft_len,
      rho,
      seed,
      config.cell_spec(method, k, draft_len, "star" if rho is None else rho, eos_ids=()),
      config.prompts,
      pair,
    )  # fmt: skip
    for method, k, draft_len, rho in grid
    for seed in config.seeds
  ]
  if len({c.key for c in cells}) != len(cells):
    raise ValueError("the sweep lists a cell twice (repeated values in the config?)")
  return cells


def cell_spec(cell: Cell, eos_ids: Sequence[int] = (EOS_ID,)) -> DecodeSpec:
  """The `DecodeSpec` a cell decodes (`eos_ids`: the pair's stop tokens)."""
  return cell.spec.replace(eos_ids=tuple(eos_ids) if cell.prompts.stop_at_eos else ())


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
    "target_positions": stats.positions_B.tolist(),
    "draft_positions": stats.draft_positions_B.tolist(),
    "lengths": stats.lengths_BxL1.sum(0).tolist(),
    "nodes": stats.nodes_B.tolist(),
    "tokens_per_round": stats.tokens_per_round_BxL2.sum(0).tolist(),
    "reached": stats.reached_BxL1.sum(0).tolist(),
    "hits": stats.hits_BxL1.sum(0).tolist(),
    "accepted": stats.accepted_BxL1.sum(0).tolist(),
    "survivors": stats.survivors_BxL1.sum(0).tolist(),
    "invalid": stats.invalid_BxL1.sum(0).tolist(),
    "overshoot": stats.overshoot_BxL1.sum(0).tolist(),
    "nonfinite": int(stats.nonfinite_B.sum()),
    "block_efficiency": float(stats.emitted_B.sum() / max(stats.rounds_B.sum(), 1)),
  }


def run_cell(
  cell: Cell, pair: pairs.Pair, batch_size: int, mesh: jax.sharding.Mesh | None = None
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
  settings = cell.prompts
  prompts = make_prompts(
    pair.heldout, settings.num_prompts, settings.prompt_len, cell.seed, pair.special
  )
  starts = range(0, settings.num_prompts, batch_size)
  spec = cell_spec(cell, pair.special.eos)

  def decode(start):
    index = np.arange(start, start + batch_size) % settings.num_prompts
    out = engine.generate(
      jax.random.key(cell.seed),
      spec,
      draft=pair.draft if spec.speculative else None,
      target=pair.target,
      prompts=prompts.tokens_BxP[index],
      prompt_lengths=prompts.lengths_B[index],
      prompt_ids=jnp.asarray(index, jnp.int32),
      mesh=mesh,
    )
    return jax.block_until_ready(out)

  def check_finite(out, start):
    stopped_B = np.asarray(out.stats.nonfinite_B)[: min(batch_size, settings.num_prompts - start)]
    if stopped_B.any():
      row = int(np.argmax(stopped_B))
      model = "draft" if int(np.asarray(out.stats.nonfinite_draft_B)[row]) else "target"
      raise checks.NonFiniteError(
        f"cell {cell.label}: the {model} model's logits are not finite at prompt "
        f"{start + row} of seed {cell.seed} ({int(stopped_B.sum())} of the batch's rows "
        "stopped); its parameters may be damaged: the cell is not saved"
      )
    return out

  start_time = time.perf_counter()
  outputs = [check_finite(decode(0), 0)]
  warmup_seconds = time.perf_counter() - start_time
  timed_starts = list(starts[1:]) or [0]
  load = {"load_average": os.getloadavg()[0]} if hasattr(os, "getloadavg") else {}
  start_time = time.perf_counter()
  timed = [decode(start) for start in timed_starts]
  decode_seconds = time.perf_counter() - start_time
  for out, start in zip(timed, timed_starts, strict=True):
    check_finite(out, start)
  if len(starts) > 1:
    outputs += timed
  rows = [min(batch_size, settings.num_prompts - s) for s in starts]
  timed_rows = [min(batch_size, settings.num_prompts - s) for s in timed_starts]
  timed_tokens = sum(
    int(np.asarray(o.lengths_B)[:n].sum()) for o, n in zip(timed, timed_rows, strict=True)
  )
  return {
    **_stats_record([o.stats for o in outputs], rows),
    "warmup_seconds": warmup_seconds,
    "decode_seconds": decode_seconds,
    **load,
    "timed_tokens": timed_tokens,
    "timed_prompts": sum(timed_rows),
    "batch_size": batch_size,
  }


def memory_plan(
  config: SweepConfig,
  draft: ModelConfig,
  target: ModelConfig,
  mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None,
  params: dict[str, Any] | None = None,
) -> memory.MemoryPlan:
  """The device memory of the sweep's largest cell (`memory.plan`), before compiling.

  Each method's largest cell (its largest K and L in the grid) is planned; the plan with
  the largest total is returned.

  Args:
    config: the sweep (its grid, batch size and decoding settings).
    draft, target: the pair's model configs.
    mesh: the sweep's mesh (None: one device, as with `shard = False`).
    params: {"draft": params, "target": params} of the loaded pair (default: shapes from
      the configs).
  """
  mesh = memory.abstract_mesh(1, 1) if mesh is None else mesh
  largest = {}
  for cell in expand(config, ""):
    k, length = largest.get(cell.method, (0, 0))
    largest[cell.method] = (max(k, cell.num_drafts), max(length, cell.draft_len))
  plans = [
    memory.plan(
      draft,
      target,
      mesh,
      batch_size=config.batch_size,
      method=method,
      num_drafts=k,
      draft_len=length,
      prompt_width=config.prompts.prompt_len + 1,
      max_new_tokens=config.decode.max_new_tokens,
      params=params,
    )
    for method, (k, length) in largest.items()
  ]
  return max(plans, key=lambda p: p.total)


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
  config: SweepConfig,
  pair: pairs.Pair | None = None,
  provenance_config: Any = None,
  wait: bool = False,
) -> list[dict[str, Any]]:
  """Runs the cells of `config` that results.jsonl does not hold yet.

  Only process 0 writes files; every process decodes (its devices hold part of each
  batch when `config.shard`). The run holds the results folder's lock
  (`locks.exclusive`, from process 0) from before the pair is loaded: a second sweep on
  it is a `locks.FolderLockedError` naming the holder, or waits for it with `wait`.

  Args:
    config: the sweep.
    pair: the models (default: `pairs.load_pair(config.pair)`, onto the sweep's mesh).
    provenance_config: what to record as the run's config (default: `config`).
    wait: wait for another run holding the results folder instead of raising.

  Returns:
    The records of the sweep's cells in `expand` order (on processes other than 0, only
    those run here).
  """
  writer = jax.process_index() == 0
  with locks.exclusive(config.results_path, "sweep", wait, holder=writer):
    return _run_sweep(config, pair, provenance_config, writer)


def _run_sweep(config, pair, provenance_config, writer):
  if config.compilation_cache:
    sharding.enable_compilation_cache(resolve(config.compilation_cache))
  mesh = sharding.make_mesh(model=config.mesh_model) if config.shard else None
  pair = pair or pairs.load_pair(config.pair, mesh)
  cells = expand(config, pair.fingerprint)
  results_dir = config.results_path
  done = results.load_results(results_dir)
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
    results.check_writable(results_dir)  # before any line: a cell that cannot be written
    described = dataclasses.asdict(config) if provenance_config is None else provenance_config
    record = runs.provenance(described)
    record.update(run=run_id, pair=dict(pair.description, fingerprint=pair.fingerprint))
    results.append_record(results_dir / results.PROVENANCE_FILE, record)
  params = {"draft": pair.draft.params, "target": pair.target.params}
  plan = memory_plan(config, pair.draft.config, pair.target.config, mesh, params)
  device_bytes = memory.device_bytes(config.device_memory)
  if writer:
    logging.info("%s", plan.table(device_bytes, config.device_memory))
  if device_bytes:
    memory.check_fits(plan, device_bytes)
  if mesh is not None:
    pair = pairs.shard(pair, mesh)
    if writer:
      axes = param_axes(pair.target.config, pair.target.params)
      logging.info(
        "sharding of the target:\n%s", sharding.describe(pair.target.params, mesh, axes=axes)
      )
  progress = _Progress(len(cells), len(cells) - len(todo))
  for cell in todo:
    record = {"key": cell.key, "cell": cell.as_record()}
    record.update(run_cell(cell, pair, config.batch_size, mesh))
    if config.refuse_inexact and sum(record["invalid"]):
      raise InexactError(
        f"cell {cell.label} is not exact: its verifier's accept branch overshot the target "
        f"at {sum(record['invalid'])} of {sum(record['reached'][: cell.draft_len])} verified "
        "positions (a fixed rho below what they need); refuse_inexact = True: not saved"
      )
    record.update(
      run=run_id,
      device_kind=jax.devices()[0].device_kind,
      num_devices=1 if mesh is None else mesh.size,
      draft_params=pair.description["draft_params"],
      target_params=pair.description["target_params"],
      draft_kind="head" if pair.draft.decoder.reads_features else "model",
    )
    if writer:
      results.append_record(results_dir / results.RESULTS_FILE, record)
    done[cell.key] = record
    progress.update(cell, record)
  return [done[cell.key] for cell in cells if cell.key in done]
