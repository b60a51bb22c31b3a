"""Load time and peak host memory of `load_pretrained` on a random ~1B-parameter checkpoint.

Writes a random checkpoint with a published model's shapes (default Llama-3.2-1B, bf16,
4 shards) with spectr_jax/testing/hf_checkpoints.py, then loads it in a fresh subprocess per row (so
the writer's memory does not count) and prints, per requested dtype: the weights' bytes
on disk, the parameter bytes once loaded, the load time (until every array is ready), the
subprocess's resident memory after `import jax` and its peak (ru_maxrss) after the load.
On a CPU the "device" is host memory too, so the loaded parameters themselves count in the
peak: a loader that holds one tensor at a time peaks near baseline + parameter bytes.

Usage: python scripts/bench_load.py [--model Llama-3.2-1B] [--shards 4]
         [--dtypes bfloat16,float32] [--directory DIR (kept; default a temporary one)]
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import types

from absl import app, flags

_REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))  # configs/pretrained.py: the published sizes

from configs import pretrained  # noqa: E402
from spectr_jax import tables  # noqa: E402
from spectr_jax.testing import hf_checkpoints  # noqa: E402

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_enum(
    "model",
    "Llama-3.2-1B",
    sorted(pretrained.HUB_SHAPES),
    "The published shapes.",
    flag_values=FLAGS,
  ),  # fmt: skip
  flags.DEFINE_integer("shards", 4, "Checkpoint shards.", flag_values=FLAGS),
  flags.DEFINE_string("dtypes", "bfloat16,float32", "Load dtypes.", flag_values=FLAGS),
  flags.DEFINE_string(
    "directory",
    None,
    "Checkpoint directory (kept; default a temporary one).",
    flag_values=FLAGS,
  ),  # fmt: skip
]

_CHILD = """
import json, resource, sys, time
import jax
from spectr_jax.models import count_params, load_pretrained

def rss_mb():
  with open("/proc/self/status") as f:
    line = next(line for line in f if line.startswith("VmRSS:"))
  return int(line.split()[1]) / 1024

baseline = rss_mb()
start = time.perf_counter()
bundle = load_pretrained(sys.argv[1], dtype=sys.argv[2])
jax.block_until_ready(bundle.params)
seconds = time.perf_counter() - start
nbytes = sum(x.nbytes for x in jax.tree.leaves(bundle.params))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(dict(seconds=seconds, baseline_mb=baseline, peak_mb=peak,
                      params=count_params(bundle.params), param_mb=nbytes / 2**20)))
"""


def measure(directory: pathlib.Path, dtype: str) -> dict:
  """One load in a fresh interpreter; its JSON record."""
  out = subprocess.run(
    [sys.executable, "-c", _CHILD, str(directory), dtype],
    cwd=_REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(_REPO)},
    capture_output=True,
    text=True,
    check=True,
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def format_table(rows: list[dict]) -> str:
  cols = [
    ("dtype", "load dtype", "{}"),
    ("params", "parameters", "{:,d}"),
    ("disk_mb", "weights on disk MB", "{:.0f}"),
    ("param_mb", "loaded params MB", "{:.0f}"),
    ("seconds", "load s", "{:.1f}"),
    ("baseline_mb", "RSS after import MB", "{:.0f}"),
    ("peak_mb", "peak RSS MB", "{:.0f}"),
    ("over", "(peak - import) / params", "{:.2f}"),
  ]
  return tables.markdown(rows, cols)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  with tempfile.TemporaryDirectory() as scratch:
    directory = pathlib.Path(args.directory or scratch)
    if not (directory / "config.json").is_file():
      start = time.perf_counter()
      family, config = pretrained.hub_config(args.model)
      hf_checkpoints.write_checkpoint(
        directory,
        family,
        config,
        dtype="bfloat16",
        num_shards=args.shards,
        tokenizer=False,
        return_weights=False,
      )
      print(
        f"wrote {args.model} (bf16, {args.shards} shards) in {time.perf_counter() - start:.0f} s"
      )
    disk_mb = sum(p.stat().st_size for p in directory.glob("*.safetensors")) / 2**20
    rows = []
    for dtype in args.dtypes.split(","):
      row = {"dtype": dtype, "disk_mb": disk_mb, **measure(directory, dtype)}
      row["over"] = (row["peak_mb"] - row["baseline_mb"]) / row["param_mb"]
      rows.append(row)
  print(f"{args.model}, random weights, CPU")
  print(format_table(rows))


if __name__ == "__main__":
  app.run(main)
