"""Gemma 2 9B verified against Gemma 2 2B drafts on a TPU v5e-8 (8 chips, one host).

The paper's K x L grid (`configs/lm1b_spectr.py`) over the open-weight pair `pair=gemma2`
(`configs/pretrained.py`: local checkpoint directories, default models/gemma-2-2b and
models/gemma-2-9b; ARG items draft_dir=DIR,target_dir=DIR move them) in bfloat16, on the
8 chips of one v5e-8 host (16 GiB each): parameters and caches split over all 8 chips
("model" = 8, by the rules of spectr_jax.sharding: 9B / 8 = 2.3 GB of weights per chip;
the draft's 4 key/value heads stay whole on each chip, by rule). Every chip decodes every
row, so the batch is what the 256k-vocabulary probability arrays leave room for
(docs/SHARDING.md: the memory plan).

  scripts/launch_tpu_pod.sh --tpu=my-v5e-8 --zone=ZONE --mesh-model=8 -- \\
    .venv/bin/python -m experiments.sweep --config configs/pod_gemma2_9b_v5e8.py
  python scripts/memory_plan.py --config configs/pod_gemma2_9b_v5e8.py --devices=8
"""

import ml_collections

from configs import lm1b_spectr


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The sweep config (ARG: the items of `configs/lm1b_spectr.py`, pair=gemma2 preset)."""
  c = lm1b_spectr.get_config(",".join(filter(None, ["pair=gemma2", arg])))
  c.name = "pod_gemma2_9b_v5e8"  # Results in $SPECTR_WORKDIR/experiments/<name>.
  c.pair.dtype = "bfloat16"  # Parameters and caches in bf16 (the checkpoints are float32).
  c.mesh_model = 8  # All 8 chips hold one copy of the pair (weights over "model").
  c.device_memory = "tpu-v5e"  # 16 GiB per chip: the sweep checks its plan against it.
  c.batch_size = 16  # Rows per engine call (each chip holds all of them: data = 1).
  return c
