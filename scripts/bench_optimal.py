"""Speed and acceptance of the OT-optimal verifier (spectr_jax/optimal/).

Speed: for each vocabulary size V and number of drafts K, the median wall time (jitted,
after a warm-up call) of one round of L positions of `optimal.optimal` (vmapped over the
positions, K drafts each) beside K-SEQ (rho*) for the same round and the target's output
layer for that round (a K(L+1) x 1024 by 1024 x V matmul). The three are timed
interleaved, so a busy machine slows them alike and the ratios stay meaningful.

Acceptance: sum min(r, q) of the verifier (with num_cuts = M) as a fraction of alpha*,
beside K-SEQ's, on LLM-like pairs (p, q = softmax of correlated Gaussian logits at
--scale; scale 1 gives near-flat pairs) and Dirichlet pairs.

Usage: python scripts/bench_optimal.py [--vocab_sizes 1000,32000] [--num_drafts 2,4,8]
  [--num_cuts 64] [--repeats 20] [--pairs 4] [--kinds llm,dirichlet] [--scale 3]
  [--skip_speed]
"""

import functools
import statistics
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import acceptance, optimal, tables, verify

WIDTH = 1024

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_string("vocab_sizes", "1000,32000", "Vocabulary sizes.", flag_values=FLAGS),
  flags.DEFINE_string("num_drafts", "2,4,8", "Numbers of drafts K.", flag_values=FLAGS),
  flags.DEFINE_string("num_cuts", "64", "The verifier's num_cuts M.", flag_values=FLAGS),
  flags.DEFINE_integer("draft_len", 8, "Positions L per round.", flag_values=FLAGS),
  flags.DEFINE_integer("repeats", 20, "Timed repeats.", flag_values=FLAGS),
  flags.DEFINE_integer("pairs", 4, "Pairs per acceptance row.", flag_values=FLAGS),
  flags.DEFINE_string("kinds", "llm,dirichlet", "Kinds of pairs.", flag_values=FLAGS),
  flags.DEFINE_float("scale", 3.0, "Logit scale of the LLM-like pairs.", flag_values=FLAGS),
  flags.DEFINE_bool("skip_speed", False, "Acceptance only.", flag_values=FLAGS),
]


def llm_like_pair(seed: int, vocab: int, scale: float = 3.0):
  """p, q = softmax of correlated Gaussian logits (correlation 0.8) at the given scale."""
  rng = np.random.default_rng(seed)
  z = rng.standard_normal(vocab)
  logits_q = 0.8 * z + 0.6 * rng.standard_normal(vocab)
  p_V = jax.nn.softmax(jnp.asarray(scale * z, jnp.float32))
  q_V = jax.nn.softmax(jnp.asarray(scale * logits_q, jnp.float32))
  return p_V, q_V


def dirichlet_pair(seed: int, vocab: int, conc: float = 1.0):
  rng = np.random.default_rng(seed)
  p, q = rng.dirichlet(np.full(vocab, conc)), rng.dirichlet(np.full(vocab, conc))
  return jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)


def _round_inputs(vocab: int, num_drafts: int, draft_len: int):
  pairs = [llm_like_pair(seed, vocab) for seed in range(draft_len)]
  p_LxV = jnp.stack([p for p, _ in pairs])
  q_LxV = jnp.stack([q for _, q in pairs])
  keys = jax.random.split(jax.random.key(0), draft_len)
  drafts_LxK = jax.vmap(
    lambda key, p: jax.random.categorical(key, jnp.log(p), shape=(num_drafts,))
  )(keys, p_LxV).astype(jnp.int32)
  return keys, drafts_LxK, p_LxV, q_LxV


def round_fns(vocab: int, num_drafts: int, draft_len: int, num_cuts: int):
  """Jitted (fn, args) for one round of the optimal verifier, of K-SEQ, and the matmul."""
  keys, drafts_LxK, p_LxV, q_LxV = _round_inputs(vocab, num_drafts, draft_len)
  opt = jax.jit(jax.vmap(lambda key, d, p, q: optimal.optimal(key, d, p, q, num_cuts=num_cuts)))
  kseq = jax.jit(jax.vmap(lambda key, d, p, q: verify.kseq(key, d, p, q)))
  key = jax.random.key(1)
  x = jax.random.normal(key, (num_drafts * (draft_len + 1), WIDTH))
  w = jax.random.normal(key, (WIDTH, vocab)) / WIDTH**0.5
  args = (keys, drafts_LxK, p_LxV, q_LxV)
  return {"optimal": (opt, args), "kseq": (kseq, args), "matmul": (jax.jit(jnp.dot), (x, w))}


def median_ms_interleaved(fns: dict, repeats: int) -> dict:
  """Median wall time in ms of each `fn(*args)`, timed in turn, after one warm-up call."""
  for fn, args in fns.values():
    jax.block_until_ready(fn(*args))
  times: dict = {name: [] for name in fns}
  for _ in range(repeats):
    for name, (fn, args) in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def time_optimal_round(
  vocab: int, num_drafts: int, draft_len: int = 8, num_cuts: int = 64, repeats: int = 20
) -> dict:
  """Median ms of one round (L positions) of `optimal`, of K-SEQ and of the matmul."""
  row = {"V": vocab, "K": num_drafts, "L": draft_len, "M": num_cuts}
  row.update(median_ms_interleaved(round_fns(vocab, num_drafts, draft_len, num_cuts), repeats))
  row["share"] = row["optimal"] / row["matmul"]
  return row


def acceptance_row(
  vocab: int,
  num_drafts: int,
  num_cuts: int,
  pairs: int,
  kind: str,
  scale: float = 3.0,
  max_k: int | None = None,
) -> dict:
  """Mean and worst acceptance / alpha* of the verifier and of K-SEQ over `pairs` pairs,
  and the worst alpha* - acceptance."""
  opt, kseq, gap = [], [], []
  for seed in range(pairs):
    if kind == "llm":
      p_V, q_V = llm_like_pair(100 + seed, vocab, scale)
    else:
      p_V, q_V = dirichlet_pair(100 + seed, vocab)
    bound = float(acceptance.optimal_acceptance(p_V, q_V, num_drafts))
    _, accept = optimal.selection_law(
      p_V, q_V, num_drafts, num_cuts=num_cuts, max_k=max_k or num_drafts
    )
    opt.append(float(accept) / bound)
    gap.append(bound - float(accept))
    kseq.append(float(acceptance.kseq_acceptance(p_V, q_V, num_drafts).hit) / bound)
  return {
    "V": vocab,
    "K": num_drafts,
    "M": num_cuts,
    "pairs": kind if kind != "llm" else f"llm s={scale:g}",
    "optimal/a* mean": float(np.mean(opt)),
    "optimal/a* min": float(np.min(opt)),
    "max a*-accept": float(np.max(gap)),
    "kseq/a* mean": float(np.mean(kseq)),
  }


def _cell(col: str, v) -> str:
  if isinstance(v, float):
    if col.startswith("max"):
      return f"{v:.1e}"
    return f"{v:.6f}" if "a*" in col else f"{v:.3f}"
  return str(v)


def format_rows(rows: list[dict]) -> str:
  if not rows:
    return ""
  return tables.markdown(rows, [(c, c, functools.partial(_cell, c)) for c in rows[0]])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  vocabs = [int(v) for v in args.vocab_sizes.split(",")]
  drafts = [int(k) for k in args.num_drafts.split(",")]
  cuts = [int(m) for m in args.num_cuts.split(",")]
  if not args.skip_speed:
    speed = [
      time_optimal_round(v, k, args.draft_len, m, args.repeats)
      for v in vocabs
      for k in drafts
      for m in cuts
    ]
    print("Speed: ms per round of L positions (median)\n" + format_rows(speed) + "\n")
  accept = [
    acceptance_row(v, k, m, args.pairs, kind, args.scale, max(drafts))
    for kind in args.kinds.split(",")
    for v in vocabs
    for k in drafts
    for m in cuts
  ]
  print("Acceptance as a fraction of alpha*\n" + format_rows(accept))


if __name__ == "__main__":
  app.run(main)
