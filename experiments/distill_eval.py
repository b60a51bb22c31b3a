"""Held-out alignment of drafts with a target, and what their training cost, as a table.

  python -m experiments.distill_eval --drafts DIR1,DIR2 [--target DIR] [--prompts 200]

For each draft run: the exact per-token acceptance sum_x min(p, q) and the K = 8
alpha* along target samples after held-out prompts (`distill.alignment`), the positions
its own training scored (`positions_seen`: the plain draft's run for a run started from
it is not included) and its training wall time.
"""

from absl import app, flags

from spectr_jax import distill, runs
from spectr_jax.pair_config import resolve
from spectr_jax.train_config import DistillConfig

_DRAFTS = flags.DEFINE_list("drafts", [], "Draft run directories (relative to $SPECTR_WORKDIR).")
_TARGET = flags.DEFINE_string("target", "target", "The target's run directory.")
_PROMPTS = flags.DEFINE_integer("prompts", 200, "Held-out prompts.")
_TOKENS = flags.DEFINE_integer("tokens", 64, "Target samples after each prompt.")
_SEED = flags.DEFINE_integer("seed", 1, "Selects the prompts and seeds the sampling.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  runs.quiet_orbax_logging()
  target = runs.load_bundle(resolve(_TARGET.value))
  heldout = runs.dataset_for(resolve(_TARGET.value)).heldout
  config = DistillConfig(eval_prompts=_PROMPTS.value, eval_tokens=_TOKENS.value)
  print("| draft | acceptance | alpha* K=8 | positions trained | train minutes |")
  print("|---|---|---|---|---|")
  for name in _DRAFTS.value:
    path = resolve(name)
    aligned = distill.alignment(runs.load_bundle(path), target, heldout, config, _SEED.value)
    meta = runs.checkpoint_meta(path)
    print(
      f"| {name} | {aligned['acceptance']:.4f} | {aligned['alpha_k8']:.4f} | "
      f"{meta['positions_seen']:,} | {meta['wall_time_s'] / 60:.1f} |"
    )


if __name__ == "__main__":
  flags.mark_flags_as_required(["drafts"])
  app.run(main)
