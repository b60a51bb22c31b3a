"""Micro-benchmark of `sampling.categorical` against the float32 inverse CDF it replaced.

For each vocabulary size V, prints the median wall time (jitted, after a warm-up call) of
one draw from one weight vector and of 64 draws from 64 different rows (vmapped), for
  - old: one float32 uniform, inverse CDF over `jnp.cumsum` (the sampler before issue 10),
  - new: `sampling.categorical` (two levels of integer masses and 32-bit words),
and the ratio new / old.

Usage: python scripts/bench_sampling.py [--vocab_sizes 4096,32000,256000] [--rows 64]
"""

import types

import jax
import jax.numpy as jnp
from absl import app, flags

from spectr_jax import sampling, tables
from spectr_jax.timing import median_seconds

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_string("vocab_sizes", "4096,32000,256000", "Vocabulary sizes.", flag_values=FLAGS),
  flags.DEFINE_integer("rows", 64, "Rows of the vmapped draws.", flag_values=FLAGS),
  flags.DEFINE_integer("repeats", 50, "Timed repeats.", flag_values=FLAGS),
]


def old_categorical(key, weights_V):
  """The replaced sampler, kept here only as the benchmark's baseline."""
  weights_V = jnp.maximum(weights_V, 0.0)
  cdf_V = jnp.cumsum(weights_V)
  u = jax.random.uniform(key, dtype=cdf_V.dtype)
  index = jnp.searchsorted(cdf_V, u * cdf_V[-1], side="right")
  last_positive = weights_V.shape[-1] - 1 - jnp.argmax(weights_V[::-1] > 0)
  return jnp.minimum(index, last_positive).astype(jnp.int32)


def bench_row(vocab: int, rows: int, repeats: int) -> dict:
  logits_key, key = jax.random.split(jax.random.key(0))
  probs_BxV = jax.nn.softmax(4.0 * jax.random.normal(logits_key, (rows, vocab)), axis=-1)
  keys_B = jax.random.split(key, rows)
  row = {"V": vocab, "B": rows}
  for name, fn in (("old", old_categorical), ("new", sampling.categorical)):
    row[f"{name}_1"] = 1e3 * median_seconds(jax.jit(fn), key, probs_BxV[0], repeats=repeats)
    row[f"{name}_B"] = 1e3 * median_seconds(
      jax.jit(jax.vmap(fn)), keys_B, probs_BxV, repeats=repeats
    )
  row["ratio_1"] = row["new_1"] / row["old_1"]
  row["ratio_B"] = row["new_B"] / row["old_B"]
  return row


def format_table(rows: list[dict]) -> str:
  cols = [
    ("V", "V", "{:d}"),
    ("old_1", "old 1 draw ms", "{:.3f}"),
    ("new_1", "new 1 draw ms", "{:.3f}"),
    ("ratio_1", "new/old", "{:.2f}"),
    ("B", "rows", "{:d}"),
    ("old_B", "old vmapped ms", "{:.3f}"),
    ("new_B", "new vmapped ms", "{:.3f}"),
    ("ratio_B", "new/old (vmapped)", "{:.2f}"),
  ]
  return tables.markdown(rows, cols)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  print(f"backend: {jax.default_backend()}, devices: {jax.devices()[0].device_kind}")
  rows = [
    bench_row(int(v), args.rows, args.repeats) for v in args.vocab_sizes.split(",") if v.strip()
  ]
  print(format_table(rows))


if __name__ == "__main__":
  app.run(main)
