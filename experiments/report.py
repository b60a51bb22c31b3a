"""Prints and writes the tables and plots of a sweep's results.

  python -m experiments.report --config configs/lm1b_spectr.py[:runlocal]
  python -m experiments.report --config configs/rho_ablation.py[:runlocal]
  python -m experiments.report --results_dir DIR     # every record in DIR

Writes <results dir>/report/{table.md,table.csv,*.png}.
"""

from absl import app, flags
from ml_collections import config_flags

from spectr_jax import experiment, report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep or rho ablation config file.")
_RESULTS_DIR = flags.DEFINE_string("results_dir", "", "Results directory (default: the config's).")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if _CONFIG.value is None and not _RESULTS_DIR.value:
    raise app.UsageError("give --config or --results_dir")
  config = None
  if _CONFIG.value is not None:
    values = _CONFIG.value.to_dict()
    config = experiment.SweepConfig.from_dict(values.get("sweep", values))
  print(report.write_report(_RESULTS_DIR.value or config.results_path, config))


if __name__ == "__main__":
  app.run(main)
