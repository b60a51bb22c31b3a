"""Wall-clock timing of jitted functions for the benchmarks."""

import statistics
import time
from collections.abc import Callable

import jax


def median_seconds(fn: Callable, *args, repeats: int = 5) -> float:
  """Median wall time of `fn(*args)` (results blocked on), after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)
