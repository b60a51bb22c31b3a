"""How many distinct draft prefixes K i.i.d. draft paths have: what a token tree saves.

A SpecTr round scores K x (L + 1) target positions, one tail per draft, even where drafts
share prefixes. A token tree scores each distinct prefix once: the root (the pending
token) plus one position per distinct node (a prefix of length 1..L of some path). This
script samples K paths of L tokens from a draft at temperature 1 and counts the distinct
nodes, on the embedded pair's draft (held-out prompts) and on two synthetic bigram drafts
(V = 1024, logits scale * N(0, 1): "peaked" scale 4, "flat" scale 1).

Prints one markdown row per (draft, K, L): draft tokens K L, distinct nodes (mean and
10th-90th percentiles over rounds), target positions of tails K (L + 1) and of a tree
(distinct + 1), their ratio, and the compiled tree size (`tree.node_buckets`) a round
of one row scores.

Usage: PYTHONPATH=$PWD python scripts/tree_nodes.py [--draft_dir DIR] [--rounds 200]
  [--shapes 4:4,8:4,8:8] [--seed 0]
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import data, pairs, tables, tree
from spectr_jax.pair_config import PairConfig

# The script's own flags when run; private ones when imported.
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_FLAGS = [
  flags.DEFINE_string(
    "draft_dir", "draft-distill-runlocal", "Under $SPECTR_WORKDIR.", flag_values=FLAGS
  ),
  flags.DEFINE_string("target_dir", "target", "Under $SPECTR_WORKDIR.", flag_values=FLAGS),
  flags.DEFINE_integer("rounds", 200, "Prompts (rounds) per row.", flag_values=FLAGS),
  flags.DEFINE_string("shapes", "4:4,8:4,8:8", "K:L,...", flag_values=FLAGS),
  flags.DEFINE_integer("seed", 0, "Seed of the prompts and draws.", flag_values=FLAGS),
]
COLS = [
  ("draft", "draft", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("tokens", "draft tokens K L", "{}"),
  ("distinct", "distinct nodes [p10, p90]", "{}"),
  ("tails", "target positions, tails K (L + 1)", "{}"),
  ("nodes", "tree (nodes + 1)", "{:.1f}"),
  ("ratio", "tree / tails", "{:.2f}"),
  ("size", "compiled tree size", "{:.1f}"),
]


def tree_nodes(paths_RxKxL: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Nodes of each round's token tree (`tree.from_paths`: the root plus the distinct
  prefixes of length 1..L among its K paths) and the compiled tree size the engine
  would score for it alone (`tree.node_buckets`), each of shape [R]."""
  _, k, length = paths_RxKxL.shape
  paths = jnp.asarray(paths_RxKxL, jnp.int32)
  nodes = np.asarray(tree.from_paths(jnp.zeros(len(paths), jnp.int32), paths).num_nodes_B)
  sizes = np.asarray(tree.node_buckets(k, length))
  return nodes, sizes[np.searchsorted(sizes, nodes)]


def model_paths(draft, prompts, num_drafts: int, draft_len: int, key) -> np.ndarray:
  """K paths of L tokens per prompt from the draft (full causal forward per step)."""
  tokens_BxP, lengths_B = np.asarray(prompts.tokens_BxP), np.asarray(prompts.lengths_B)
  batch, width = tokens_BxP.shape
  seq = np.zeros((batch * num_drafts, width + draft_len), np.int32)
  seq[:, :width] = np.repeat(tokens_BxP, num_drafts, axis=0)
  ends = np.repeat(lengths_B, num_drafts)
  rows = np.arange(len(seq))
  forward = jax.jit(draft.decoder.logits)
  for t in range(draft_len):
    key, step = jax.random.split(key)
    logits = forward(draft.params, jnp.asarray(seq))[rows, ends + t - 1]
    token = np.asarray(jax.random.categorical(step, logits))
    seq[rows, ends + t] = token
  paths = seq[rows[:, None], ends[:, None] + np.arange(draft_len)]
  return paths.reshape(batch, num_drafts, draft_len)


def bigram_paths(scale: float, rounds: int, num_drafts: int, draft_len: int, seed: int):
  """K paths of L tokens per round from a random bigram draft with logits scale * N(0, 1)."""
  rng = np.random.default_rng(seed)
  vocab = 1024
  logits = scale * rng.standard_normal((vocab, vocab))
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  cdf = np.cumsum(probs / probs.sum(-1, keepdims=True), -1)
  last = np.repeat(rng.integers(vocab, size=rounds), num_drafts)
  paths = np.zeros((rounds * num_drafts, draft_len), np.int64)
  for t in range(draft_len):
    u = rng.random(len(last))
    last = np.minimum((cdf[last] < u[:, None]).sum(-1), vocab - 1)
    paths[:, t] = last
  return paths.reshape(rounds, num_drafts, draft_len)


def row(name: str, paths_RxKxL: np.ndarray) -> str:
  """The table line (`COLS`) of one draft's paths."""
  _, k, length = paths_RxKxL.shape
  nodes, sizes = tree_nodes(paths_RxKxL)
  distinct, tails = nodes - 1, k * (length + 1)
  p10, p90 = np.percentile(distinct, [10, 90])
  values = dict(
    draft=name, K=k, L=length, tokens=k * length, tails=tails, nodes=nodes.mean(),
    distinct=f"{distinct.mean():.1f} [{p10:.0f}, {p90:.0f}]",
    ratio=nodes.mean() / tails, size=sizes.mean(),
  )  # fmt: skip
  return tables.markdown([values], COLS).splitlines()[-1]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = types.SimpleNamespace(**{holder.name: holder.value for holder in _FLAGS})
  shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
  pair = pairs.load_pair(PairConfig("trained", args.draft_dir, args.target_dir))
  prompts = data.make_prompts(pair.heldout, args.rounds, 8, args.seed, pair.special)
  print(tables.markdown([], COLS))
  for k, length in shapes:
    key = jax.random.key(args.seed)
    print(row("embedded (distilled)", model_paths(pair.draft, prompts, k, length, key)))
    for name, scale in (("bigram peaked (4)", 4.0), ("bigram flat (1)", 1.0)):
      print(row(name, bigram_paths(scale, args.rounds, k, length, args.seed)), flush=True)


if __name__ == "__main__":
  app.run(main)
