"""Prints a sweep's device-memory plan and parameter sharding without loading weights.

  python scripts/memory_plan.py --config configs/pod_gemma2_9b_v5e8.py --devices=8
  python scripts/memory_plan.py --config configs/lm1b_spectr.py:pair=qwen2.5 \\
    --config.device_memory=a100-40gb
  python scripts/memory_plan.py --config configs/pod_gemma2_9b_v5e8.py --spec rrs/wor:8:4:4x2x1x1

The pair's model configs come from the training configs (embedded and trained pairs), or
for a pretrained pair from each checkpoint directory's config.json when it is there, else
from the published sizes of `configs.pretrained.PUBLISHED` (by the directory's name).
The mesh is (devices / mesh_model, mesh_model) over `--devices` devices (default:
mesh_model, one data group) with the sweep's `shard`; the plan is that of the sweep's
largest cell (`experiment.memory_plan`), named by its `DecodeSpec.label` (the sweep's
drafting scheme, branching and dedup included), or with `--spec` that of one decode in
`DecodeSpec.parse`'s short form method[/drafting]:K:L[:branching] (the sweep's batch,
prompt width and new tokens; the scheme is named, the arithmetic is the method's, K's and
L's: `spectr_jax.memory`). Exits with the `memory.check_fits` error when
the plan exceeds the device memory (the config's `device_memory`, or what this host's
first device reports).
"""

import dataclasses
import pathlib
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from configs import pretrained  # noqa: E402
from spectr_jax import cli, decode_spec, experiment, memory, sharding, sweep_config  # noqa: E402  # noqa: E402
from spectr_jax.models import param_axes  # noqa: E402

# The script's own flags when run; private ones when imported (tests/accelerators/test_memory.py).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config file.", flag_values=FLAGS)
_DEVICES = flags.DEFINE_integer(
  "devices", 0, "Devices of the mesh (0 = mesh_model).", flag_values=FLAGS
)
_SPEC = flags.DEFINE_string(
  "spec", "", "Plan this decode (method[/drafting]:K:L[:branching]) instead of the sweep's "
  "largest cell.", flag_values=FLAGS,
)  # fmt: skip


def cell_spec(
  config: sweep_config.SweepConfig, text: str = "", largest=None
) -> decode_spec.DecodeSpec:
  """The `DecodeSpec` planned: `text` (`DecodeSpec.parse`, the sweep's new tokens), else
  the sweep's cell of `largest`'s method, K and L (its drafting, branching, dedup)."""
  if text:
    return decode_spec.DecodeSpec.parse(text, max_new_tokens=config.decode.max_new_tokens)
  return config.cell_spec(largest.method, largest.num_drafts, largest.draft_len)


def plan_text(
  config: sweep_config.SweepConfig, devices: int = 0, spec: str = ""
) -> tuple[memory.MemoryPlan, str]:
  """The plan of the sweep's largest cell (or of `spec`) and a text of it and of both
  models' sharding.

  Args:
    config: the sweep.
    devices: the devices of the mesh (0 = mesh_model).
    spec: a decode in `DecodeSpec.parse`'s short form ("" = the sweep's largest cell).
  """
  model = config.mesh_model if config.shard else 1
  devices = (devices or model) if config.shard else 1
  if devices % model:
    raise ValueError(f"mesh_model = {model} does not divide {devices} devices")
  mesh = memory.abstract_mesh(devices // model, model)
  draft, target = pretrained.model_configs(config)
  if spec:
    plan = memory.plan(
      draft, target, mesh, spec=cell_spec(config, spec), batch_size=config.batch_size,
      prompt_width=config.prompts.prompt_len + 1,
    )  # fmt: skip
  else:
    plan = experiment.memory_plan(config, draft, target, mesh)
    plan = dataclasses.replace(plan, label=cell_spec(config, largest=plan).label())
  device_bytes = memory.device_bytes(config.device_memory)
  parts = [plan.table(device_bytes, config.device_memory)]
  for role, model_config in (("draft", draft), ("target", target)):
    shapes = memory.param_shapes(model_config)
    axes = param_axes(model_config)
    parts.append(f"sharding of the {role}:\n" + sharding.describe(shapes, mesh, axes=axes))
  return plan, "\n".join(parts)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  config = sweep_config.SweepConfig.from_dict(_CONFIG.value.to_dict())
  plan, text = plan_text(config, _DEVICES.value, _SPEC.value)
  print(text)
  device_bytes = memory.device_bytes(config.device_memory)
  if device_bytes:
    try:
      memory.check_fits(plan, device_bytes)
    except memory.DoesNotFitError as error:
      sys.exit(f"does not fit: {error}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=cli.parse_flags)
