"""Trains, resumes or (when finished) just loads one model.

  python -m experiments.train --config configs/target.py[:runlocal] --workdir DIR

Without --workdir the run goes to $SPECTR_WORKDIR/<config file stem>.
"""

import pathlib

from absl import app, flags
from ml_collections import config_flags

from spectr_jax import runs, train
from spectr_jax.cli import parse_flags
from spectr_jax.data import default_workdir
from spectr_jax.train_config import TrainConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Run directory (checkpoints, config, tokenizer).")
_WAIT = flags.DEFINE_bool("wait", False, "Wait for another run holding the output folder.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  stem = pathlib.Path(flags.FLAGS["config"].config_filename.split(":")[0]).stem
  workdir = _WORKDIR.value or default_workdir() / stem
  runs.quiet_orbax_logging()
  train.train_or_load(TrainConfig.from_dict(_CONFIG.value.to_dict()), workdir, wait=_WAIT.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=parse_flags)
