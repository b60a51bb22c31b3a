"""Tails against token trees: what scoring each distinct draft prefix once saves.

For the embedded pair (or random-weight models of its sizes when it is missing), prints
one row per configuration (`config.DecodeSpec.parse`'s method[/drafting]:K:L[:branching],
named in the table by `DecodeSpec.label`) with its drafts (i.i.d., or for the methods of
the "wor" scheme, rrs and traversal, a static tree such as ":4x2x1x1", or with
":proportional" the tree shaped by the draft's probabilities: `DecodeSpec.branching`)
scored as K tails and as their deduplicated tree (`DecodeSpec.dedup`; "dedup" in the
table), all timed round-robin in one run:
  - block efficiency of both on the same held-out prompts and keys (a tree round is the
    same random object: tokens differ only where float32 rounding flips a decision), with
    the paired 95% interval of the per-prompt difference;
  - distinct prefixes per round and target positions computed per round (K(L + 1) for
    tails; the compiled tree size for dedup), and emitted tokens per target position;
  - draft positions computed per round (K(L + 1) for tails; for dedup the pending
    tokens once and a static tree's nodes once each: `spectr_jax.drafting`);
  - the draft's L steps, the target call and the engine's round
    (`bench_decode.part_timers`) in ms, tails and dedup, and their ratios.

With --budgets 16,32,64 it answers instead: at an equal node budget, which drafting scheme
and verifier emit the most tokens per round? Each config runs as a scored tree only (no
timing); its node cap (K L for i.i.d. paths, the sum over depths of the product of the
branching for a static tree) puts it in the smallest budget that holds it, and each row
gives its block efficiency with the paired 95% interval of its per-prompt difference to
the first config of its budget (same prompts and keys).

Usage: python scripts/bench_tree.py [--configs kseq:4:4,kseq:8:4,kseq:8:8,rrs:8:4:4x2x1x1]
         [--batch 4] [--prompts 100] [--max_new_tokens 64] [--budgets 16,32,64]
"""

import math
import os
import pathlib

import jax
import numpy as np
from absl import app, flags
from bench_decode import CALLS, bench_prompts, load_pair, parse_specs, part_timers

from spectr_jax import drafting, engine, tables
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.timing import interleaved_medians

# The script's own flags when run; private ones when imported (bench_decode.FLAGS).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_CONFIGS = flags.DEFINE_string(
  "configs", "kseq:4:4,kseq:8:4,kseq:8:8", "method[/drafting]:K:L[:branching],...",
  flag_values=FLAGS,
)  # fmt: skip
_BATCH = flags.DEFINE_integer("batch", 4, "Rows of the timed rounds.", flag_values=FLAGS)
_PROMPTS = flags.DEFINE_integer(
  "prompts", 100, "Prompts of the efficiency runs.", flag_values=FLAGS
)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 8, "Tokens per prompt.", flag_values=FLAGS)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  "max_new_tokens", 64, "Tokens generated per row.", flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per timer.", flag_values=FLAGS)
_BUDGETS = flags.DEFINE_string(
  "budgets", "", "E.g. 16,32,64: the node-budget table.", flag_values=FLAGS
)

COLS = [
  ("config", "config", "{}"),
  ("be_tails", "block eff. tails", "{:.3f}"),
  ("be_dedup", "block eff. dedup", "{:.3f}"),
  ("be_diff", "dedup - tails [95%]", "{}"),
  ("nodes", "distinct nodes / round", "{:.1f}"),
  ("pos_tails", "target positions / round, tails", "{:.0f}"),
  ("pos_dedup", "... dedup", "{:.1f}"),
  ("tpp_tails", "tokens / target position, tails", "{:.3f}"),
  ("tpp_dedup", "... dedup", "{:.3f}"),
  ("dpos_tails", "draft positions / round, tails", "{:.0f}"),
  ("dpos_dedup", "... dedup", "{:.1f}"),
  ("draft_tails", "draft ms, tails", "{:.2f}"),
  ("draft_dedup", "... dedup", "{:.2f}"),
  ("draft_ratio", "dedup / tails", "{:.2f}"),
  ("target_tails", "target call ms, tails", "{:.2f}"),
  ("target_dedup", "... dedup", "{:.2f}"),
  ("target_ratio", "dedup / tails", "{:.2f}"),
  ("round_tails", "round ms, tails", "{:.2f}"),
  ("round_dedup", "... dedup", "{:.2f}"),
  ("round_ratio", "dedup / tails", "{:.2f}"),
]


def parse_configs(text: str, **fields) -> list[DecodeSpec]:
  """ "method[/drafting]:K:L[:branching],..." -> their `DecodeSpec`s (`DecodeSpec.parse`;
  `fields` set the rest, e.g. max_new_tokens). A branching may also be written with
  dashes ("4-2-1-1", the form this script took before)."""
  items = []
  for item in text.split(","):
    parts = item.strip().split(":")
    if len(parts) == 4:
      parts[3] = parts[3].replace("-", "x")
    items.append(":".join(parts))
  return parse_specs(",".join(items), **fields)


def decode(draft, target, prompts, lengths, spec: DecodeSpec):
  """Per-prompt emitted tokens, rounds, distinct nodes, target and draft positions."""
  out = engine.generate(
    jax.random.key(0), spec, draft=draft, target=target, prompts=prompts, prompt_lengths=lengths
  )
  s = out.stats
  return {name: np.asarray(getattr(s, f"{name}_B"), np.float64) for name in
          ("emitted", "rounds", "nodes", "positions", "draft_positions")}  # fmt: skip


def paired_interval(a, b):
  """Mean of b - a per prompt and its 95% normal interval, as text."""
  d = b - a
  half = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
  return f"{d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}]"


def compare(draft, target, timed, many, specs, repeats):
  """One row per `DecodeSpec` of `specs` (`parse_configs`): its drafts scored as tails
  against dedup (see the module docstring); `timed` and `many` are (prompts_BxP,
  lengths_B) of the timed rounds and of the efficiency runs."""
  timers, rows = {}, []
  for i, spec in enumerate(specs):
    tails, dedup = (decode(draft, target, *many, spec.replace(dedup=d)) for d in (False, True))
    rows.append(
      dict(
        config=spec.replace(dedup=False).label(),
        method=spec.method,
        K=spec.num_drafts,
        L=spec.draft_len,
        be_tails=tails["emitted"].sum() / tails["rounds"].sum(),
        be_dedup=dedup["emitted"].sum() / dedup["rounds"].sum(),
        be_diff=paired_interval(
          tails["emitted"] / tails["rounds"], dedup["emitted"] / dedup["rounds"]
        ),
        nodes=dedup["nodes"].sum() / dedup["rounds"].sum(),
        pos_tails=tails["positions"].sum() / tails["rounds"].sum(),
        pos_dedup=dedup["positions"].sum() / dedup["rounds"].sum(),
        tpp_tails=tails["emitted"].sum() / tails["positions"].sum(),
        tpp_dedup=dedup["emitted"].sum() / dedup["positions"].sum(),
        dpos_tails=tails["draft_positions"].sum() / tails["rounds"].sum(),
        dpos_dedup=dedup["draft_positions"].sum() / dedup["rounds"].sum(),
      )
    )
    for use_dedup in (False, True):
      parts = part_timers(spec.replace(dedup=use_dedup), draft, target, *timed)
      timers[(i, use_dedup, "draft")] = parts["draft"]
      timers[(i, use_dedup, "target")] = parts["target"]
      timers[(i, use_dedup, "round")] = parts["round loop"]
    print(f"prepared tails and dedup {rows[-1]} ({i + 1}/{len(specs)})"[:120], flush=True)
  medians = interleaved_medians(timers, repeats)
  for i, row in enumerate(rows):
    for part in ("draft", "target", "round"):
      tails_ms, dedup_ms = (1e3 * medians[(i, t, part)] / CALLS for t in (False, True))
      row.update({f"{part}_tails": tails_ms, f"{part}_dedup": dedup_ms})
      row[f"{part}_ratio"] = dedup_ms / tails_ms
  return rows


BUDGET_COLS = [
  ("budget", "node budget", "{}"),
  ("config", "config", "{}"),
  ("cap", "draft node cap", "{}"),
  ("nodes", "scored prefixes / round (root too)", "{:.1f}"),
  ("be", "block eff.", "{:.3f}"),
  ("vs_first", "- first of budget [95%]", "{}"),
  ("tpp", "tokens / target position", "{:.3f}"),
]


def node_cap(k: int, length: int, branching) -> int:
  """The most draft nodes a round's tree can have: K L for i.i.d. paths and for the
  proportional tree; for a static tree, the sum over depths of the product of the
  branching up to that depth. (`DecodeSpec` fields; "" or None: no static tree.)"""
  if not branching or branching == drafting.PROPORTIONAL:
    return k * length
  return sum(math.prod(branching[: d + 1]) for d in range(length))


def by_budget(specs, budgets):
  """{budget: [(spec, node cap)]}: each `DecodeSpec` (`parse_configs`) in the smallest of
  `budgets` that holds its node cap, in the order given."""
  groups = {b: [] for b in sorted(budgets)}
  for spec in specs:
    cap = node_cap(spec.num_drafts, spec.draft_len, spec.branching)
    budget = next((b for b in groups if cap <= b), None)
    if budget is None:
      raise ValueError(f"{spec.label()} has {cap} nodes, above every budget {budgets}")
    groups[budget].append((spec, cap))
  return groups


def budget_rows(draft, target, many, specs, budgets):
  """One row per `DecodeSpec` decoded with dedup on `many` (prompts_BxP, lengths_B),
  grouped by `by_budget` (see the module docstring)."""
  rows = []
  for budget, group in by_budget(specs, budgets).items():
    first = None
    for spec, cap in group:
      s = decode(draft, target, *many, spec.replace(dedup=True))
      per_prompt = s["emitted"] / s["rounds"]
      first = per_prompt if first is None else first
      rows.append(
        dict(
          budget=budget,
          config=spec.replace(dedup=False).label(),
          method=spec.method,
          K=spec.num_drafts,
          L=spec.draft_len,
          cap=cap,
          nodes=s["nodes"].sum() / s["rounds"].sum(),
          be=s["emitted"].sum() / s["rounds"].sum(),
          vs_first=paired_interval(first, per_prompt),
          tpp=s["emitted"].sum() / s["positions"].sum(),
        )
      )
      print(f"decoded {rows[-1]['config']} ({budget} nodes)", flush=True)
  return rows


def format_rows(rows, cols=COLS) -> str:
  return tables.markdown(rows, cols)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  workdir = pathlib.Path(os.environ.get("SPECTR_WORKDIR", "~/.cache/spectr_jax")).expanduser()
  draft, target, heldout, what = load_pair(workdir)
  vocab = target.config.vocab_size
  timed = bench_prompts(heldout, _BATCH.value, _PROMPT_LEN.value, vocab)
  many = bench_prompts(heldout, _PROMPTS.value, _PROMPT_LEN.value, vocab)
  max_new_tokens = _MAX_NEW_TOKENS.value
  specs = parse_configs(_CONFIGS.value, max_new_tokens=max_new_tokens)
  if _BUDGETS.value:
    budgets = [int(b) for b in _BUDGETS.value.split(",")]
    rows = budget_rows(draft, target, many, specs, budgets)
    print(f"\n{what}: {_PROMPTS.value} prompts, {max_new_tokens} new tokens, dedup\n")
    print(format_rows(rows, BUDGET_COLS))
    return
  rows = compare(draft, target, timed, many, specs, _REPEATS.value)
  print(f"\n{what}: {_PROMPTS.value} prompts for the efficiencies, {_BATCH.value} rows timed, ")
  print(f"{jax.devices()[0].platform}, {_REPEATS.value} interleaved repeats\n")
  print(format_rows(rows))


if __name__ == "__main__":
  app.run(main)
