"""Gemma 2 27B verified against Gemma 2 2B drafts on a TPU v5p-8 (4 chips, one host).

The paper's K x L grid (`configs/lm1b_spectr.py`) over the open-weight pair
`pair=gemma2-27b` (`configs/pretrained.py`: local checkpoint directories, default
models/gemma-2-2b and models/gemma-2-27b; ARG items draft_dir=DIR,target_dir=DIR move
them) in bfloat16 on the 4 chips of one host: "model" = 4 (16 key/value heads split 4
ways: 13.6 GB of the target's weights per chip, of 95 GiB). Its 256k vocabulary makes the
round's probability arrays large, hence the batch.

Compile every cell for the slice before launching (no weights needed, docs/ACCELERATORS.md):

  python -m experiments.dry_run --config configs/pod_gemma2_27b_v5p.py --target tpu:v5p:2x2x1
"""

import ml_collections

from configs import lm1b_spectr


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The sweep config (ARG: the items of `configs/lm1b_spectr.py`, pair=gemma2-27b preset)."""
  c = lm1b_spectr.get_config(",".join(filter(None, ["pair=gemma2-27b", arg])))
  c.name = "pod_gemma2_27b_v5p"  # Results in $SPECTR_WORKDIR/experiments/<name>.
  c.pair.dtype = "bfloat16"  # Parameters and caches in bf16 (the checkpoints are float32).
  c.mesh_model = 4  # The 4 chips of the host hold one copy of the pair.
  c.device_memory = "tpu-v5p"  # 95 GiB per chip: the sweep checks its plan against it.
  c.batch_size = 16  # Rows per engine call (data = 1: every chip holds all of them).
  return c
