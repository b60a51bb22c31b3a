"""Wall-clock timing of jitted functions for the benchmarks, and their markdown tables."""

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


def markdown_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
  """A markdown table of `rows`, one column per (key, title, format spec) of `cols` ("-"
  where a row has no such key)."""
  lines = ["| " + " | ".join(title for _, title, _ in cols) + " |"]
  lines.append("|" + "---|" * len(cols))
  for row in rows:
    cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in cols]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
