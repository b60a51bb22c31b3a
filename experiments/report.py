"""Prints and writes the tables and plots of a sweep's results.

  python -m experiments.report --config configs/lm1b_spectr.py[:runlocal]
  python -m experiments.report --config configs/rho_ablation.py[:runlocal]
  python -m experiments.report --results_dir DIR     # every record in DIR

Writes <results dir>/report/{table.md,table.csv,*.png}. The predicted speedup comes from
the memory-bound model (parameter ratio) unless --cost_table names the costs that
scripts/bench_decode.py measured on a device (default there:
$SPECTR_WORKDIR/cost_table.json), e.g. `--cost_table ~/.cache/spectr_jax/cost_table.json`.
"""

from absl import app, flags
from ml_collections import config_flags

from spectr_jax import experiment, metrics, report, results
from spectr_jax.cli import parse_flags
from spectr_jax.sweep_config import SweepConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep or rho ablation config file.")
_RESULTS_DIR = flags.DEFINE_string("results_dir", "", "Results directory (default: the config's).")
_COST_TABLE = flags.DEFINE_string(
  "cost_table", "", "Measured round costs (scripts/bench_decode.py) for the predicted speedup."
)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if _CONFIG.value is None and not _RESULTS_DIR.value:
    raise app.UsageError("give --config or --results_dir")
  costs = metrics.CostTable.load(_COST_TABLE.value) if _COST_TABLE.value else None
  if _CONFIG.value is None:
    print(report.write_report(_RESULTS_DIR.value, costs=costs))
    return
  values = _CONFIG.value.to_dict()
  config = SweepConfig.from_dict(values.get("sweep", values))
  results_dir = _RESULTS_DIR.value or config.results_path
  # The config's cells for the pair of the latest run (every record without a run).
  fingerprint = results.latest_pair_fingerprint(results_dir)
  keys = None if fingerprint is None else [c.key for c in experiment.expand(config, fingerprint)]
  print(report.write_report(results_dir, keys, costs))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
