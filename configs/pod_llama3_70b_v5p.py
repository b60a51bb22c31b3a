"""Llama 3.1 70B verified against Llama 3.1 8B drafts on a TPU v5p-16 (8 chips, 2 hosts).

The paper's K x L grid (`configs/lm1b_spectr.py`) over the open-weight pair
`pair=llama3-70b` (`configs/pretrained.py`: local checkpoint directories on every worker,
default models/Llama-3.1-8B and models/Llama-3.1-70B; ARG items draft_dir=DIR,
target_dir=DIR move them) in bfloat16: "model" = 4 (8 key/value heads and 64 query heads
split 4 ways: 35 GB of the target's weights per chip, of 95 GiB), "data" = 2.

Compile every cell for the slice before launching (no weights needed, docs/ACCELERATORS.md):

  python -m experiments.dry_run --config configs/pod_llama3_70b_v5p.py --target tpu:v5p:2x2x2
  scripts/launch_tpu_pod.sh --tpu=my-v5p-16 --zone=ZONE --mesh-model=4 -- \\
    .venv/bin/python -m experiments.sweep --config configs/pod_llama3_70b_v5p.py
"""

import ml_collections

from configs import lm1b_spectr


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The sweep config (ARG: the items of `configs/lm1b_spectr.py`, pair=llama3-70b preset)."""
  c = lm1b_spectr.get_config(",".join(filter(None, ["pair=llama3-70b", arg])))
  c.name = "pod_llama3_70b_v5p"  # Results in $SPECTR_WORKDIR/experiments/<name>.
  c.pair.dtype = "bfloat16"  # Parameters and caches in bf16 (as stored).
  c.mesh_model = 4  # 4 chips hold one copy of the pair.
  c.device_memory = "tpu-v5p"  # 95 GiB per chip: the sweep checks its plan against it.
  c.batch_size = 32  # Rows per engine call: 16 per data group (2 groups).
  return c
