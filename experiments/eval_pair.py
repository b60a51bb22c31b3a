"""Evaluates a trained draft/target pair: `python -m experiments.eval_pair
--config configs/eval_pair.py`; prints the figures and writes them as JSON."""

import json

from absl import app
from ml_collections import config_flags

from spectr_jax import evaluate, runs
from spectr_jax.cli import parse_flags
from spectr_jax.data import default_workdir
from spectr_jax.evaluate import EvalConfig

_CONFIG = config_flags.DEFINE_config_file("config", "configs/eval_pair.py", "Evaluation config.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  c = _CONFIG.value
  draft_workdir = c.draft_workdir or default_workdir() / "draft"
  target_workdir = c.target_workdir or default_workdir() / "target"
  io_fields = ("draft_workdir", "target_workdir", "output")
  config = EvalConfig.from_dict({k: v for k, v in c.to_dict().items() if k not in io_fields})
  output = c.output or f"{target_workdir}/pair_eval.json"
  runs.quiet_orbax_logging()
  results = evaluate.evaluate_workdirs(draft_workdir, target_workdir, config, output)
  print(json.dumps({k: v for k, v in results.items() if not isinstance(v, list | dict)}, indent=2))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
