"""One process of the multi-process tests (started by `tests.multiprocess.launch`).

  python -m tests.multiprocess_worker CHECK [CHECK...] --out DIR [--kill-at-cell N]
    [--compilation-cache DIR] [--heartbeat-timeout SECONDS]

joins the JAX distributed run (`sharding.maybe_initialize_distributed`, with its default
heartbeat timeout unless given) and runs the
checks in order (with --compilation-cache, compiled programs persist there, so that a
later launch skips compiling them); each writes what it saw under DIR, per process, for
the test to compare:

  generate  `decode` on the meshes (8, 1) and (4, 2): DIR/generate-<process>.npz
  sweep     the tiny sweep `sweep_config(DIR)` split over all devices (shard=True), results
            in DIR/results; the keys of the cells this process ran, one a line, in
            DIR/sweep-<process>.txt. With --kill-at-cell N the last process SIGKILLs
            itself as its N-th cell (from 0) starts, once all processes are there.
  train     6 steps of `train_config` on the mesh (4, 2), in the workdir DIR/train shared
            by the processes (each with its own data cache, DIR/data-<process>); the
            final parameters, fetched from both processes, in DIR/train-0.npz (process 0).

A new check is a function of the parsed arguments added to `CHECKS`.
"""

import argparse
import os
import pathlib
import signal
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from configs import target as target_config
from spectr_jax import engine, experiment, sharding, train
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params
from spectr_jax.train_config import TrainConfig
from tests.experiments.test_experiment import random_pair, sweep_config
from tests.training import small_config

V = 16
MESHES = ((8, 1), (4, 2))  # (data, model) over 8 devices


def sweep(out: pathlib.Path, **changes):
  """The sweep of the tests: 3 cells (sd, L = 2, seeds 0, 1 and 2: one compiled decoder),
  results in out/results, each batch split over all devices."""
  return sweep_config(out, **{"methods": ("sd",), "seeds": (0, 1, 2), "shard": True, **changes})


def decode(mesh: jax.sharding.Mesh | None) -> dict[str, np.ndarray]:
  """K-SEQ (K = 2, L = 3) on random-weight test models: 16 random prompts, 12 new tokens.

  Returns:
    tokens_BxT, lengths_B and emitted_B as numpy arrays (the same on every process).
  """
  models = []
  for seed, name in enumerate(("draft-test", "target-test")):
    config = get_model_config(name, V, max_len=48)
    models.append(ModelBundle(config, init_params(config, jax.random.key(seed))))
  rng = np.random.default_rng(0)
  lengths_B = rng.integers(1, 7, 16)
  prompts_BxP = rng.integers(1, V, (16, 6))
  out = engine.generate(
    jax.random.key(3),
    DecodeSpec(method="kseq", num_drafts=2, draft_len=3, max_new_tokens=12),
    draft=models[0],
    target=models[1],
    prompts=prompts_BxP,
    prompt_lengths=lengths_B,
    mesh=mesh,
  )
  return {
    "tokens_BxT": np.asarray(out.tokens_BxT),
    "lengths_B": np.asarray(out.lengths_B),
    "emitted_B": np.asarray(out.stats.emitted_B),
  }


def check_generate(args):
  """Decodes on each of `MESHES` (over the devices of all processes)."""
  arrays = {}
  for data, model in MESHES:
    for name, value in decode(sharding.make_mesh(data, model)).items():
      arrays[f"{data}x{model}/{name}"] = value
  np.savez(args.out / f"generate-{jax.process_index()}.npz", **arrays)


def check_sweep(args):
  """Runs `sweep(args.out)` on the pair of `random_pair`; logs the cells run here."""
  log = args.out / f"sweep-{jax.process_index()}.txt"
  run_cell = experiment.run_cell
  started = []

  def logged_run_cell(cell, *rest):
    if args.kill_at_cell == len(started):
      # Once every process is here, process 0 has recorded the cells before.
      multihost_utils.sync_global_devices(f"cell {len(started)}")
      if jax.process_index() == jax.process_count() - 1:
        print(f"killing process {jax.process_index()} at cell {len(started)}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    started.append(cell.key)
    record = run_cell(cell, *rest)
    with log.open("a") as f:
      f.write(cell.key + "\n")
    return record

  experiment.run_cell = logged_run_cell
  try:
    experiment.run_sweep(sweep(args.out), random_pair())
  finally:
    experiment.run_cell = run_cell


def train_config(cache_dir) -> TrainConfig:
  """6 steps of the test target config on the mesh (data 4, model 2), evaluated at the end."""
  return small_config(
    target_config,
    str(cache_dir),
    num_devices=4,
    mesh_model=2,
    num_steps=6,
    checkpoint_every=3,
    eval_every=100,
  )


def flat_params(params) -> dict[str, np.ndarray]:
  """The leaves of a parameter tree as numpy arrays, by their "/"-joined paths."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return {jax.tree_util.keystr(k, simple=True, separator="/"): np.asarray(x) for k, x in leaves}


def check_train(args):
  """Trains `train_config` over the processes; process 0 saves the final parameters.

  Each process caches the data on its own (DIR/data-<process>): `load_dataset` writes its
  cache without a lock, so two processes preparing one cache at once could race.
  """
  config = train_config(args.out / f"data-{jax.process_index()}")
  bundle = train.train(config, args.out / "train")
  params = flat_params(sharding.fetch(bundle.params))  # the arrays span both processes
  if jax.process_index() == 0:
    np.savez(args.out / "train-0.npz", **params)


CHECKS = {"generate": check_generate, "sweep": check_sweep, "train": check_train}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("checks", nargs="+", choices=sorted(CHECKS))
  parser.add_argument("--out", type=pathlib.Path, required=True)
  parser.add_argument("--kill-at-cell", type=int, default=None)
  parser.add_argument("--compilation-cache", type=pathlib.Path, default=None)
  parser.add_argument("--heartbeat-timeout", type=int, default=None)
  args = parser.parse_args()
  timeout = (
    {} if args.heartbeat_timeout is None else {"heartbeat_timeout_s": args.heartbeat_timeout}
  )
  sharding.maybe_initialize_distributed(**timeout)
  if args.compilation_cache:
    sharding.enable_compilation_cache(args.compilation_cache)
  print(f"process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices")
  for name in args.checks:
    start = time.perf_counter()
    CHECKS[name](args)
    print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
  main()
