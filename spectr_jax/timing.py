"""Wall-clock timing of jitted functions for the benchmarks (their tables: `tables.markdown`)."""

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


def interleaved_medians(timers: dict[str, tuple[Callable, tuple]], repeats: int = 5) -> dict:
  """Median wall time of every timer `name -> (fn, args)` (results blocked on), after one
  warm-up call each, run round-robin: every repeat times each timer once, so a change of
  the machine's load moves all of them alike and their ratios stay meaningful."""
  for fn, args in timers.values():
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in timers}
  for _ in range(repeats):
    for name, (fn, args) in timers.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(ts) for name, ts in times.items()}


def seconds_per_round(full_s: float, one_s: float, rounds: int) -> float | None:
  """(a run of every round - a run stopped after the first) / the rounds between them: the
  seconds of one round with the prefill and the per-call cost cancelled. None where the
  difference is not positive: the timer's noise is larger than those rounds (too few new
  tokens or repeats for this device and load), so the round is not resolved."""
  difference = full_s - one_s
  return difference / max(rounds, 1) if difference > 0 else None
