"""The pod dry run: every program of a sweep compiled for an accelerator slice from this
host, before anything runs (no device, no weights: the models' shapes only).

  python -m experiments.dry_run --config configs/pod_llama3_70b_v5p.py --target tpu:v5p:2x2x2
  python -m experiments.dry_run --config configs/pod_gemma2_27b_v5p.py \\
    --target tpu:v5p:2x2x1 --spec kseq:4:4

Each distinct program of the sweep's cells (cells differing only in seed or a fixed rho
share one) is compiled for the target's chips on a ("data", "model") mesh of the config's
`mesh_model` (or --model) and printed with its per-chip memory against the chip's HBM and
against the memory plan, its temporaries, weight-sized copies, data-dependent control flow
and compile time (`spectr_jax.dryrun`; docs/ACCELERATORS.md). A program that does not fit
is refused with its bytes and a mesh that would fit; the run then exits with status 1.
A pretrained pair's shapes come from each checkpoint directory's config.json, or from
the published sizes of `configs.pretrained.PUBLISHED` by the directory's name.
"""

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from configs import pretrained
from spectr_jax import cli, decode_spec, dryrun, experiment, sweep_config, tables, targets

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.")
_TARGET = flags.DEFINE_string("target", None, "A compile-only target, e.g. tpu:v5p:2x2x2.")
_MODEL = flags.DEFINE_integer("model", 0, "Devices per 'model' group (0: the config's).")
_SPEC = flags.DEFINE_string("spec", "", "Only this decode: method[/drafting]:K:L[:branching].")
_JSON = flags.DEFINE_string("json", "", "Also write the rows to this JSON file.")

COLS = [("cells", "cells", "{}")] + dryrun.REPORT_COLS[1:] + [("verdict", "verdict", "{}")]


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if _TARGET.value.lower().startswith("gpu"):
    targets.use_cpu_host()
  config = sweep_config.SweepConfig.from_dict(_CONFIG.value.to_dict())
  draft, target = pretrained.model_configs(config)
  where = dryrun.build(_TARGET.value, _MODEL.value or config.mesh_model)
  if _SPEC.value:
    spec = decode_spec.DecodeSpec.parse(_SPEC.value, max_new_tokens=config.decode.max_new_tokens)
    cells = [(_SPEC.value, spec)]
  else:
    cells = [(c.label, experiment.cell_spec(c)) for c in experiment.expand(config, "")]
  print(
    f"{config.name} on {_TARGET.value}: mesh {dict(where.mesh.shape)}, batch "
    f"{config.batch_size}, {len(cells)} cells; target {target.family} "
    f"{target.num_layers} layers, draft {draft.family} {draft.num_layers} layers\n",
    flush=True,
  )
  print(tables.markdown([], COLS), flush=True)
  rows = []

  def progress(build: dryrun.CellBuild) -> None:
    base = dryrun.report_row(build.report) if build.report else {"program": "-"}
    row = dict(base, cells=len(build.cells), verdict=f"REFUSED: {build.refused}" if build.refused
               else "fits")  # fmt: skip
    rows.append(row | {"cell_labels": list(build.cells)})
    print(tables.markdown([row], COLS).splitlines()[-1], flush=True)

  builds = dryrun.dry_run(
    cells, draft, target, where, batch=config.batch_size,
    prompt_width=config.prompts.prompt_len + 1, progress=progress,
  )  # fmt: skip
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(rows, f, indent=1, default=str)
  refused = [b for b in builds if b.refused]
  print(f"\n{len(builds)} programs, {len(refused)} refused")
  if refused:
    sys.exit(1)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "target"])
  app.run(main, flags_parser=cli.parse_flags)
