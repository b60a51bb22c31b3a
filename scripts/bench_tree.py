"""Tails against token trees: what scoring each distinct draft prefix once saves.

For the embedded pair (or random-weight models of its sizes when it is missing), prints
one row per (method, K, L[, branching]) with its drafts (i.i.d., or for the methods of
the "wor" scheme, rrs and traversal, a static tree, or with ":proportional" the tree
shaped by the draft's probabilities:
`engine.generate(branching=...)`) scored as K tails and as their deduplicated tree
(`engine.generate(tree=True)`), all timed round-robin in one run:
  - block efficiency of both on the same held-out prompts and keys (a tree round is the
    same random object: tokens differ only where float32 rounding flips a decision), with
    the paired 95% interval of the per-prompt difference;
  - distinct prefixes per round and target positions computed per round (K(L + 1) for
    tails; the compiled tree size for trees), and emitted tokens per target position;
  - draft positions computed per round (K(L + 1) for tails; for trees the pending
    tokens once and a static tree's nodes once each: `spectr_jax.drafting`);
  - the draft's L steps, the target call and the engine's round
    (`bench_decode.part_timers`) in ms, tails and tree, and their ratios.

With --budgets 16,32,64 it answers instead: at an equal node budget, which drafting scheme
and verifier emit the most tokens per round? Each config runs as a scored tree only (no
timing); its node cap (K L for i.i.d. paths, the sum over depths of the product of the
branching for a static tree) puts it in the smallest budget that holds it, and each row
gives its block efficiency with the paired 95% interval of its per-prompt difference to
the first config of its budget (same prompts and keys).

Usage: python scripts/bench_tree.py [--configs kseq:4:4,kseq:8:4,kseq:8:8,rrs:8:4:4-2-1-1]
         [--batch 4] [--prompts 100] [--max_new_tokens 64] [--budgets 16,32,64]
"""

import argparse
import functools
import math
import os
import pathlib

import jax
import numpy as np
from bench_decode import CALLS, bench_prompts, load_pair, part_timers

from spectr_jax import drafting, engine
from spectr_jax.timing import interleaved_medians, markdown_table

COLS = [
  ("method", "method", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("branching", "branching", "{}"),
  ("be_tails", "block eff. tails", "{:.3f}"),
  ("be_tree", "block eff. tree", "{:.3f}"),
  ("be_diff", "tree - tails [95%]", "{}"),
  ("nodes", "distinct nodes / round", "{:.1f}"),
  ("pos_tails", "target positions / round, tails", "{:.0f}"),
  ("pos_tree", "... tree", "{:.1f}"),
  ("tpp_tails", "tokens / target position, tails", "{:.3f}"),
  ("tpp_tree", "... tree", "{:.3f}"),
  ("dpos_tails", "draft positions / round, tails", "{:.0f}"),
  ("dpos_tree", "... tree", "{:.1f}"),
  ("draft_tails", "draft ms, tails", "{:.2f}"),
  ("draft_tree", "... tree", "{:.2f}"),
  ("draft_ratio", "tree / tails", "{:.2f}"),
  ("target_tails", "target call ms, tails", "{:.2f}"),
  ("target_tree", "... tree", "{:.2f}"),
  ("target_ratio", "tree / tails", "{:.2f}"),
  ("round_tails", "round ms, tails", "{:.2f}"),
  ("round_tree", "... tree", "{:.2f}"),
  ("round_ratio", "tree / tails", "{:.2f}"),
]


def parse_configs(text: str) -> list[tuple[str, int, int, tuple[int, ...] | str | None]]:
  """ "method:K:L[:b1-b2-...|:proportional],..." -> [(method, K, L, branching or None)]."""
  configs = []
  for item in text.split(","):
    method, k, length, *branching = item.split(":")
    if not branching:
      shape = None
    elif branching[0] == drafting.PROPORTIONAL:
      shape = drafting.PROPORTIONAL
    else:
      shape = tuple(int(b) for b in branching[0].split("-"))
    configs.append((method, int(k), int(length), shape))
  return configs


def branching_label(branching) -> str:
  if branching is None:
    return "-"
  return branching if isinstance(branching, str) else "-".join(map(str, branching))


def decode(draft, target, prompts, lengths, method, k, length, branching, max_new_tokens, tree):
  """Per-prompt emitted tokens, rounds, distinct nodes, target and draft positions."""
  out = engine.generate(
    jax.random.key(0),
    draft=draft,
    target=target,
    prompts=prompts,
    prompt_lengths=lengths,
    method=method,
    num_drafts=k,
    draft_len=length,
    max_new_tokens=max_new_tokens,
    tree=tree,
    branching=branching,
  )
  s = out.stats
  return {name: np.asarray(getattr(s, f"{name}_B"), np.float64) for name in
          ("emitted", "rounds", "nodes", "positions", "draft_positions")}  # fmt: skip


def paired_interval(a, b):
  """Mean of b - a per prompt and its 95% normal interval, as text."""
  d = b - a
  half = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
  return f"{d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}]"


def compare(draft, target, timed, many, configs, max_new_tokens, repeats):
  """One row per (method, K, L, branching) of `configs` (`parse_configs`): tails against
  trees (see the module docstring); `timed` and `many` are (prompts_BxP, lengths_B) of the
  timed rounds and of the efficiency runs."""
  timers, rows = {}, []
  for i, (method, k, length, branching) in enumerate(configs):
    run = functools.partial(
      decode, draft, target, *many, method, k, length, branching, max_new_tokens
    )
    tails, trees = run(False), run(True)
    rows.append(
      dict(
        method=method,
        K=k,
        L=length,
        branching=branching_label(branching),
        be_tails=tails["emitted"].sum() / tails["rounds"].sum(),
        be_tree=trees["emitted"].sum() / trees["rounds"].sum(),
        be_diff=paired_interval(
          tails["emitted"] / tails["rounds"], trees["emitted"] / trees["rounds"]
        ),
        nodes=trees["nodes"].sum() / trees["rounds"].sum(),
        pos_tails=tails["positions"].sum() / tails["rounds"].sum(),
        pos_tree=trees["positions"].sum() / trees["rounds"].sum(),
        tpp_tails=tails["emitted"].sum() / tails["positions"].sum(),
        tpp_tree=trees["emitted"].sum() / trees["positions"].sum(),
        dpos_tails=tails["draft_positions"].sum() / tails["rounds"].sum(),
        dpos_tree=trees["draft_positions"].sum() / trees["rounds"].sum(),
      )
    )
    for use_tree in (False, True):
      spec = engine.DecodeSpec(
        method, k, length, max_new_tokens, None, False, "star", draft.config,
        target.config, tree=use_tree, branching=branching,
      )  # fmt: skip
      parts = part_timers(spec, draft, target, *timed)
      timers[(i, use_tree, "draft")] = parts["draft"]
      timers[(i, use_tree, "target")] = parts["target"]
      timers[(i, use_tree, "round")] = parts["round loop"]
    print(f"prepared tails and tree {rows[-1]} ({i + 1}/{len(configs)})"[:120], flush=True)
  medians = interleaved_medians(timers, repeats)
  for i, row in enumerate(rows):
    for part in ("draft", "target", "round"):
      tails_ms, tree_ms = (1e3 * medians[(i, t, part)] / CALLS for t in (False, True))
      row.update({f"{part}_tails": tails_ms, f"{part}_tree": tree_ms})
      row[f"{part}_ratio"] = tree_ms / tails_ms
  return rows


BUDGET_COLS = [
  ("budget", "node budget", "{}"),
  ("method", "method", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("branching", "branching", "{}"),
  ("cap", "draft node cap", "{}"),
  ("nodes", "scored prefixes / round (root too)", "{:.1f}"),
  ("be", "block eff.", "{:.3f}"),
  ("vs_first", "- first of budget [95%]", "{}"),
  ("tpp", "tokens / target position", "{:.3f}"),
]


def node_cap(k: int, length: int, branching) -> int:
  """The most draft nodes a round's tree can have: K L for i.i.d. paths and for the
  proportional tree; for a static tree, the sum over depths of the product of the
  branching up to that depth."""
  if branching is None or branching == drafting.PROPORTIONAL:
    return k * length
  return sum(math.prod(branching[: d + 1]) for d in range(length))


def by_budget(configs, budgets):
  """{budget: [(method, K, L, branching, node cap)]}: each config (`parse_configs`) in the
  smallest of `budgets` that holds its node cap, in the order given."""
  groups = {b: [] for b in sorted(budgets)}
  for method, k, length, branching in configs:
    cap = node_cap(k, length, branching)
    budget = next((b for b in groups if cap <= b), None)
    if budget is None:
      raise ValueError(f"{method}:{k}:{length} has {cap} nodes, above every budget {budgets}")
    groups[budget].append((method, k, length, branching, cap))
  return groups


def budget_rows(draft, target, many, configs, max_new_tokens, budgets):
  """One row per config decoded as scored trees on `many` (prompts_BxP, lengths_B),
  grouped by `by_budget` (see the module docstring)."""
  rows = []
  for budget, group in by_budget(configs, budgets).items():
    first = None
    for method, k, length, branching, cap in group:
      s = decode(draft, target, *many, method, k, length, branching, max_new_tokens, True)
      per_prompt = s["emitted"] / s["rounds"]
      first = per_prompt if first is None else first
      rows.append(
        dict(
          budget=budget,
          method=method,
          K=k,
          L=length,
          branching=branching_label(branching),
          cap=cap,
          nodes=s["nodes"].sum() / s["rounds"].sum(),
          be=s["emitted"].sum() / s["rounds"].sum(),
          vs_first=paired_interval(first, per_prompt),
          tpp=s["emitted"].sum() / s["positions"].sum(),
        )
      )
      print(f"decoded {method}:{k}:{length} {rows[-1]['branching']} ({budget} nodes)", flush=True)
  return rows


def format_rows(rows, cols=COLS) -> str:
  return markdown_table(rows, cols)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default="kseq:4:4,kseq:8:4,kseq:8:8")
  parser.add_argument("--batch", type=int, default=4, help="rows of the timed rounds")
  parser.add_argument("--prompts", type=int, default=100, help="prompts of the efficiency runs")
  parser.add_argument("--prompt_len", type=int, default=8)
  parser.add_argument("--max_new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--budgets", default="", help="e.g. 16,32,64: the node-budget table")
  args = parser.parse_args()
  workdir = pathlib.Path(os.environ.get("SPECTR_WORKDIR", "~/.cache/spectr_jax")).expanduser()
  draft, target, heldout, what = load_pair(workdir)
  vocab = target.config.vocab_size
  timed = bench_prompts(heldout, args.batch, args.prompt_len, vocab)
  many = bench_prompts(heldout, args.prompts, args.prompt_len, vocab)
  configs = parse_configs(args.configs)
  if args.budgets:
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = budget_rows(draft, target, many, configs, args.max_new_tokens, budgets)
    print(f"\n{what}: {args.prompts} prompts, {args.max_new_tokens} new tokens, trees\n")
    print(format_rows(rows, BUDGET_COLS))
    return
  rows = compare(draft, target, timed, many, configs, args.max_new_tokens, args.repeats)
  print(f"\n{what}: {args.prompts} prompts for the efficiencies, {args.batch} rows timed, ")
  print(f"{jax.devices()[0].platform}, {args.repeats} interleaved repeats\n")
  print(format_rows(rows))


if __name__ == "__main__":
  main()
