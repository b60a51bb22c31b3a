"""Runs the rho ablation: a block-level decoding sweep and the per-position analysis.

  python -m experiments.rho_ablation --config configs/rho_ablation.py[:runlocal]

The pair must exist unless --config.sweep.pair.train_missing=True.
Results: $SPECTR_WORKDIR/experiments/<sweep name>/{results.jsonl,analysis.json}; tables
and plots: `python -m experiments.report --config configs/rho_ablation.py[:runlocal]`.
"""

from absl import app, flags
from ml_collections import config_flags

from spectr_jax import analysis, runs, sharding
from spectr_jax.cli import parse_flags
from spectr_jax.sweep_config import RhoAblationConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "Rho ablation config file.")
_WAIT = flags.DEFINE_bool("wait", False, "Wait for another run holding the output folder.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  sharding.maybe_initialize_distributed()
  runs.quiet_orbax_logging()
  config = _CONFIG.value.to_dict()
  analysis.run_rho_ablation(
    RhoAblationConfig.from_dict(config), provenance_config=config, wait=_WAIT.value
  )


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=parse_flags)
