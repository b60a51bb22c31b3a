"""Meshes, multi-host initialisation and the persistent compilation cache."""

import os
import pathlib

import jax
import numpy as np
from jax.sharding import Mesh

DATA_AXIS = "data"


def maybe_initialize_distributed() -> None:
  """Calls `jax.distributed.initialize()` when this process is one of several.

  Multi-process runs are recognised by the variables that launchers set: a TPU pod's
  `TPU_WORKER_HOSTNAMES` listing several workers, or an explicit coordinator
  (`JAX_COORDINATOR_ADDRESS` with `JAX_NUM_PROCESSES` > 1). Single-host runs do nothing.
  """
  workers = [w for w in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if w]
  coordinated = int(os.environ.get("JAX_NUM_PROCESSES", "1")) > 1
  if len(workers) > 1 or coordinated:
    jax.distributed.initialize()


def data_mesh(num_devices: int | None = None) -> Mesh:
  """A 1-D mesh over the first `num_devices` devices (all, across hosts, by default).

  Decoding splits prompts over its "data" axis and replicates the parameters.
  """
  devices = jax.devices()
  count = len(devices) if num_devices is None else num_devices
  if not 1 <= count <= len(devices):
    raise ValueError(f"num_devices must lie in [1, {len(devices)}], got {count}")
  return Mesh(np.asarray(devices[:count]), (DATA_AXIS,))


def enable_compilation_cache(directory: str | pathlib.Path) -> None:
  """Persists compiled programs under `directory`, so a rerun skips compilation."""
  path = pathlib.Path(directory).expanduser()
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
