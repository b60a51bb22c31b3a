"""Runs a decoding sweep, resuming from its results file.

  python -m experiments.sweep --config configs/lm1b_spectr.py[:runlocal]

The pair must exist (scripts/train_pair.sh) unless --config.pair.train_missing=True.
Results: $SPECTR_WORKDIR/experiments/<config name>/results.jsonl (one line per cell);
tables and plots: `python -m experiments.report` with the same --config.
"""

from absl import app, flags
from ml_collections import config_flags

from spectr_jax import cli, experiment, runs, sharding, sweep_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.")
_WAIT = flags.DEFINE_bool("wait", False, "Wait for another run holding the output folder.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  sharding.maybe_initialize_distributed()
  runs.quiet_orbax_logging()
  config = _CONFIG.value.to_dict()
  experiment.run_sweep(
    sweep_config.SweepConfig.from_dict(config), provenance_config=config, wait=_WAIT.value
  )


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=cli.parse_flags)
