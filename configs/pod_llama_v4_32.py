"""Llama 3.1 8B verified against Llama 3.2 1B drafts on a TPU v4-32 (16 chips, 4 hosts).

The paper's K x L grid (`configs/lm1b_spectr.py`) over the open-weight pair `pair=llama3`
(`configs/pretrained.py`: local checkpoint directories on every worker, default
models/Llama-3.2-1B and models/Llama-3.1-8B; ARG items draft_dir=DIR,target_dir=DIR move
them) in bfloat16, on the 16 chips (32 GiB each) of 4 workers: "model" = 4, the chips of
one worker (8 key/value heads and 32 query heads split 4 ways; model-parallel collectives
stay within a host), "data" = 4, one group per worker, each decoding a quarter of the rows.

  scripts/launch_tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b --mesh-model=4 -- \\
    .venv/bin/python -m experiments.sweep --config configs/pod_llama_v4_32.py
  python scripts/memory_plan.py --config configs/pod_llama_v4_32.py --devices=16
"""

import ml_collections

from configs import lm1b_spectr


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The sweep config (ARG: the items of `configs/lm1b_spectr.py`, pair=llama3 preset)."""
  c = lm1b_spectr.get_config(",".join(filter(None, ["pair=llama3", arg])))
  c.name = "pod_llama_v4_32"  # Results in $SPECTR_WORKDIR/experiments/<name>.
  c.pair.dtype = "bfloat16"  # Parameters and caches in bf16 (as stored).
  c.mesh_model = 4  # The 4 chips of a worker hold one copy of the pair.
  c.device_memory = "tpu-v4"  # 32 GiB per chip: the sweep checks its plan against it.
  c.batch_size = 256  # Rows per engine call: 64 per data group (4 groups).
  return c
