"""The planner: which exact configuration decodes fastest on a device, for a pair and a
batch size.

  python -m experiments.plan --results_dir DIR [--results_dir DIR2 ...] \
      --cost_table PATH --batch 4 [--top 10]

Reads the sweeps' records in DIR... (the pair's measured block efficiencies, adaptive
cells' mean draft calls and target positions per round) and the round costs that
scripts/bench_decode.py measured on the device at that batch size (`metrics.CostTable`),
ranks every exact configuration (method, K, L, rho, drafting scheme, tree shape, adaptive
or not) by its predicted tokens per second (B x block efficiency / predicted round) and
prints the ranking with what the sweep measured beside it, then the recommendation line
the sweep report carries (`report.recommendation`). Without --cost_table the memory-bound
model ranks them (a speedup, no tokens per second). A cost table measured at another
batch size is refused: the rounds' costs depend on it.
"""

import pathlib

from absl import app, flags

from spectr_jax import metrics, report
from spectr_jax.cli import parse_flags

_RESULTS_DIRS = flags.DEFINE_multi_string("results_dir", [], "A sweep's results directory.")
_COST_TABLE = flags.DEFINE_string("cost_table", "", "Measured round costs (bench_decode.py).")
_BATCH = flags.DEFINE_integer("batch", None, "Rows per call the plan is for.")
_TOP = flags.DEFINE_integer("top", 10, "Configurations printed.")

COLUMNS = [
  ("label", "method", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("rho_name", "rho", "{}"),
  ("block_efficiency", "block efficiency", "{:.2f}"),
  ("predicted_speedup", "predicted speedup", "{:.2f}x"),
  ("predicted_tokens_per_s", "predicted tokens/s", "{:,.0f}"),
  ("tokens_per_s", "measured tokens/s (sweep)", "{:,.0f}"),
]


def plan(results_dirs, costs: metrics.CostTable | None, batch: int | None, top: int = 10) -> str:
  """The ranking (markdown) and the recommendation line.

  Raises:
    ValueError: no results, or a cost table measured at another batch size.
  """
  if costs is not None and batch is not None and costs.batch != batch:
    raise ValueError(
      f"the cost table was measured at batch {costs.batch}, not {batch}: measure it at "
      f"this batch (python scripts/bench_decode.py --batch {batch} --cost_table PATH)"
    )
  records = [r for d in results_dirs for r in report.records_for(pathlib.Path(d))]
  rows = [r for r in report.summarize(records, costs) if r["exact"] is True]
  rows = [r for r in rows if r["predicted_speedup"] is not None]
  if not rows:
    raise ValueError(f"no exact configuration with a predicted speedup in {results_dirs}")
  rows.sort(key=lambda r: -r["predicted_speedup"])
  for row in rows:
    row["predicted_tokens_per_s"] = None
    if costs is not None:
      ar_s = 1e-3 * costs.round_ms("autoregressive", 1, 0)
      row["predicted_tokens_per_s"] = row["predicted_speedup"] * costs.batch / ar_s
  title = f"## Plan ({report.latency_model(costs)}" + (
    f": {costs.describe()})" if costs is not None else ")"
  )
  return "\n".join(
    [title, "", report.markdown_table(rows[:top], COLUMNS), "", report.recommendation(rows, costs)]
  )


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _RESULTS_DIRS.value:
    raise app.UsageError("give --results_dir (one or more)")
  costs = metrics.CostTable.load(_COST_TABLE.value) if _COST_TABLE.value else None
  try:
    print(plan(_RESULTS_DIRS.value, costs, _BATCH.value, _TOP.value))
  except ValueError as error:
    raise app.UsageError(str(error)) from None


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
