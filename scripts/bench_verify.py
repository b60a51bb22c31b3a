"""Micro-benchmark of the verifiers against the target's output layer for one round.

For each vocabulary size V, number of drafts K and draft length L, prints the median
wall time (jitted, after a warm-up call) of:
  - one position of `kseq` (rho*) and `specinfer` with K drafts,
  - one `methods.verify_drafts` walk over K x L drafts for each method (sd, kseq, specinfer,
    optimal); with `--pair equal` (default) p = q, so every position is accepted and the
    walk emits L + 1 tokens; with `--pair perturbed` the target's logits are 2 N(0, 1)
    per position and the draft's add N(0, 1) noise to them, so the walk stops early (the
    column "kseq tokens" is the mean number of tokens the kseq walk emits over 32 keys),
  - the target's output layer for the same round: a K(L+1) x 1024 by 1024 x V matmul,
and the block walk's time as a fraction of that matmul: the verifier's share of a round.

Usage: python scripts/bench_verify.py [--vocab_sizes 1000,32000,256000] [--repeats 20]
  [--pair equal|perturbed]
"""

import types

import jax
import jax.numpy as jnp
from absl import app, flags

from spectr_jax import methods, sampling, tables, verify
from spectr_jax.timing import median_seconds

WIDTH = 1024

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_string("vocab_sizes", "1000,32000,256000", "Vocabulary sizes.", flag_values=FLAGS),
  flags.DEFINE_string("num_drafts", "1,4,8", "Numbers of drafts K.", flag_values=FLAGS),
  flags.DEFINE_string("draft_lens", "4,8", "Draft lengths L.", flag_values=FLAGS),
  flags.DEFINE_integer("repeats", 20, "Timed repeats.", flag_values=FLAGS),
  flags.DEFINE_enum(
    "pair", "equal", ["equal", "perturbed"], "p = q, or perturbed logits.", flag_values=FLAGS
  ),
]


def median_ms(fn, *args, repeats: int) -> float:
  return 1e3 * median_seconds(fn, *args, repeats=repeats)


def _inputs(key, vocab, num_drafts, draft_len, pair):
  logits_key, noise_key, draft_key = jax.random.split(key, 3)
  if pair == "equal":
    logits_L1xV = jnp.broadcast_to(
      2.0 * jax.random.normal(logits_key, (vocab,)), (draft_len + 1, vocab)
    )
    draft_logits_LxV = logits_L1xV[:draft_len]
  else:
    logits_L1xV = 2.0 * jax.random.normal(logits_key, (draft_len + 1, vocab))
    draft_logits_LxV = logits_L1xV[:draft_len] + jax.random.normal(noise_key, (draft_len, vocab))
  q_L1xV = jax.nn.softmax(logits_L1xV)
  p_LxV = jax.nn.softmax(draft_logits_LxV)
  p_KxLxV = jnp.broadcast_to(p_LxV, (num_drafts, draft_len, vocab))
  q_KxL1xV = jnp.broadcast_to(q_L1xV, (num_drafts, draft_len + 1, vocab))
  draft_keys = jax.random.split(draft_key, (num_drafts, draft_len))
  drafts_KxL = jax.vmap(jax.vmap(sampling.categorical), (0, None))(draft_keys, p_LxV)
  return drafts_KxL, p_KxLxV, q_KxL1xV


def bench_row(vocab: int, num_drafts: int, draft_len: int, repeats: int, pair: str) -> dict:
  key = jax.random.key(0)
  drafts_KxL, p_KxLxV, q_KxL1xV = _inputs(key, vocab, num_drafts, draft_len, pair)
  p_V, q_V, drafts_K = p_KxLxV[0, 0], q_KxL1xV[0, 0], drafts_KxL[:, 0]
  row = {"V": vocab, "K": num_drafts, "L": draft_len}
  row["kseq"] = median_ms(
    jax.jit(lambda k, d, p, q: verify.kseq(k, d, p, q)), key, drafts_K, p_V, q_V, repeats=repeats
  )
  row["specinfer"] = median_ms(
    jax.jit(lambda k, d, p, q: verify.specinfer(k, d, p, q)),
    key,
    drafts_K,
    p_V,
    q_V,
    repeats=repeats,
  )
  names = ("kseq", "specinfer", "optimal")
  names = ("sd",) + names if num_drafts == 1 else names
  for method in names:
    fn = jax.jit(lambda k, d, p, q, m=method: methods.verify_drafts(k, d, p, q, method=m))
    row[f"block_{method}"] = median_ms(fn, key, drafts_KxL, p_KxLxV, q_KxL1xV, repeats=repeats)
  walk = jax.jit(jax.vmap(lambda k: methods.verify_drafts(k, drafts_KxL, p_KxLxV, q_KxL1xV)[1]))
  row["tokens"] = float(jnp.mean(walk(jax.random.split(key, 32))))
  x = jax.random.normal(key, (num_drafts * (draft_len + 1), WIDTH))
  w = jax.random.normal(key, (WIDTH, vocab)) / WIDTH**0.5
  row["matmul"] = median_ms(jax.jit(jnp.dot), x, w, repeats=repeats)
  row["share"] = row["block_kseq"] / row["matmul"]
  return row


def format_table(rows: list[dict]) -> str:
  cols = [
    ("V", "V", "{:d}"),
    ("K", "K", "{:d}"),
    ("L", "L", "{:d}"),
    ("kseq", "kseq/pos ms", "{:.3f}"),
    ("specinfer", "specinfer/pos ms", "{:.3f}"),
    ("block_sd", "block sd ms", "{:.3f}"),
    ("block_kseq", "block kseq ms", "{:.3f}"),
    ("tokens", "kseq tokens", "{:.2f}"),
    ("block_specinfer", "block specinfer ms", "{:.3f}"),
    ("block_optimal", "block optimal ms", "{:.3f}"),
    ("matmul", "out-layer ms", "{:.3f}"),
    ("share", "kseq block / out-layer", "{:.2f}"),
  ]
  return tables.markdown(rows, cols)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  ints = lambda text: [int(x) for x in text.split(",")]
  print(f"backend: {jax.default_backend()}, devices: {jax.devices()[0].device_kind}")
  print(f"pair: {args.pair}")
  rows = []
  for vocab in ints(args.vocab_sizes):
    for num_drafts in ints(args.num_drafts):
      for draft_len in ints(args.draft_lens):
        repeats = max(3, args.repeats // 4) if vocab > 100_000 else args.repeats
        rows.append(bench_row(vocab, num_drafts, draft_len, repeats, args.pair))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
  print()
  print(format_table(rows))


if __name__ == "__main__":
  app.run(main)
