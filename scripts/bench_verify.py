"""Micro-benchmark of the verifiers against the target's output layer for one round.

For each vocabulary size V, number of drafts K and draft length L, prints the median
wall time (jitted, after a warm-up call) of:
  - one position of `kseq` (rho*) and `specinfer` with K drafts,
  - one `verify_block` walk over K x L drafts for each method (sd, kseq, specinfer,
    optimal), in the worst case for its length (p = q, so every position is accepted and
    the walk runs all L + 1 steps),
  - the target's output layer for the same round: a K(L+1) x 1024 by 1024 x V matmul,
and the block walk's time as a fraction of that matmul: the verifier's share of a round.

Usage: python scripts/bench_verify.py [--vocab_sizes 1000,32000,256000] [--repeats 20]
"""

import argparse

import jax
import jax.numpy as jnp

from spectr_jax import sampling, verify
from spectr_jax.timing import markdown_table, median_seconds

WIDTH = 1024


def median_ms(fn, *args, repeats: int) -> float:
  return 1e3 * median_seconds(fn, *args, repeats=repeats)


def _inputs(key, vocab, num_drafts, draft_len):
  logits_key, draft_key = jax.random.split(key)
  probs_V = jax.nn.softmax(2.0 * jax.random.normal(logits_key, (vocab,)))
  p_KxLxV = jnp.broadcast_to(probs_V, (num_drafts, draft_len, vocab))
  q_KxL1xV = jnp.broadcast_to(probs_V, (num_drafts, draft_len + 1, vocab))
  draft_keys = jax.random.split(draft_key, num_drafts * draft_len)
  drafts = jax.vmap(sampling.categorical, (0, None))(draft_keys, probs_V)
  drafts_KxL = drafts.reshape(num_drafts, draft_len)
  return drafts_KxL, p_KxLxV, q_KxL1xV


def bench_row(vocab: int, num_drafts: int, draft_len: int, repeats: int) -> dict:
  key = jax.random.key(0)
  drafts_KxL, p_KxLxV, q_KxL1xV = _inputs(key, vocab, num_drafts, draft_len)
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
  methods = ("kseq", "specinfer", "optimal")
  methods = ("sd",) + methods if num_drafts == 1 else methods
  for method in methods:
    fn = jax.jit(lambda k, d, p, q, m=method: verify.verify_block(k, d, p, q, method=m))
    row[f"block_{method}"] = median_ms(fn, key, drafts_KxL, p_KxLxV, q_KxL1xV, repeats=repeats)
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
    ("block_specinfer", "block specinfer ms", "{:.3f}"),
    ("block_optimal", "block optimal ms", "{:.3f}"),
    ("matmul", "out-layer ms", "{:.3f}"),
    ("share", "kseq block / out-layer", "{:.2f}"),
  ]
  return markdown_table(rows, cols)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--vocab_sizes", default="1000,32000,256000")
  parser.add_argument("--num_drafts", default="1,4,8")
  parser.add_argument("--draft_lens", default="4,8")
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args()
  ints = lambda text: [int(x) for x in text.split(",")]
  print(f"backend: {jax.default_backend()}, devices: {jax.devices()[0].device_kind}")
  rows = []
  for vocab in ints(args.vocab_sizes):
    for num_drafts in ints(args.num_drafts):
      for draft_len in ints(args.draft_lens):
        repeats = max(3, args.repeats // 4) if vocab > 100_000 else args.repeats
        rows.append(bench_row(vocab, num_drafts, draft_len, repeats))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
  print()
  print(format_table(rows))


if __name__ == "__main__":
  main()
