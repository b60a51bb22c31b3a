"""Adaptive speculation against static configurations: same prompts, same keys, paired.

Decodes the same held-out prompts of the embedded pair (its checkpoints in --workdir;
random-weight models of the same sizes when they are missing, where acceptance means
nothing). Row b of every configuration uses the same prompt and key (fold_in(key, b)),
in batches of --batch rows, so each prompt is a paired unit. Two sections:
  - adaptive draft length: K-SEQ at K drafts, static draft lengths (--lens) and adaptive
    rounds (`DecodeSpec(adaptive=threshold)`, --thresholds) drafting up to the longest L;
  - the batch's tree budget: recursive rejection without replacement on dedup rounds,
    static trees of K' = 2..K paths of L = --budget_len tokens and of K paths of L' < L
    tokens, against the K x L tree with the batch sharing --budgets drafted nodes per row
    (`DecodeSpec(node_budget=...)`).
Per configuration: tokens per round (block efficiency), tokens per target position (the
positions the engine computed: a batch's round drafts and scores up to its longest length,
or its largest tree's compiled size), tokens per scored node (distinct prefixes), scored
nodes, draft and target positions per round, and tokens per second projected with a
measured cost table (--cost_table, written by `scripts/bench_decode.py` at the same batch
size with kseq:K:L for every L here; tails only: B x tokens / sum of the predicted rounds,
each round costed at the draft calls and target positions it made,
`metrics.CostTable.round_ms`). Then each adaptive configuration against static ones (the
same L or K; the nearest in target positions or scored nodes, i.e. equal compute; with costs,
the best projected one): ratios of sums with a paired percentile bootstrap over prompts
(`report.paired_ratio`). Figures: docs/ADAPTIVE.md.

Usage: python scripts/bench_adaptive.py [--workdir W] [--num_drafts 4] [--lens 1,2,4,8]
         [--thresholds 0.1,0.3] [--budgets 4,8] [--budget_len 4] [--prompts 64]
         [--batch 4] [--max_new_tokens 64] [--cost_table PATH] [--small]
"""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import data, engine, metrics, pairs, report, tables
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params
from spectr_jax.pair_config import PairConfig

FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_WORKDIR = flags.DEFINE_string(
  "workdir", str(data.default_workdir()), "Where the pair is.", flag_values=FLAGS
)
_NUM_DRAFTS = flags.DEFINE_integer("num_drafts", 4, "K.", flag_values=FLAGS)
_LENS = flags.DEFINE_list("lens", ["1", "2", "3", "4", "6", "8"], "Static L.", flag_values=FLAGS)
_THRESHOLDS = flags.DEFINE_list(
  "thresholds", ["0.05", "0.1", "0.2", "0.3", "0.5"], "Adaptive thresholds.", flag_values=FLAGS
)
_BUDGETS = flags.DEFINE_list(
  "budgets", ["4", "6", "8", "10"], "Nodes per row shared by the batch.", flag_values=FLAGS
)
_BUDGET_LEN = flags.DEFINE_integer("budget_len", 4, "L of the tree budget runs.", flag_values=FLAGS)
_PROMPTS = flags.DEFINE_integer("prompts", 64, "Held-out prompts.", flag_values=FLAGS)
_BATCH = flags.DEFINE_integer("batch", 4, "Rows per call.", flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per row.", flag_values=FLAGS)
_COST_TABLE = flags.DEFINE_string(
  "cost_table", "", "A cost table (bench_decode.py) for the projection.", flag_values=FLAGS
)
_SMALL = flags.DEFINE_bool(
  "small", False, "A seconds-long smoke run (tiny models, K 3, L 2, one threshold, one budget, "
  "static trees of K = 3).",
  flag_values=FLAGS,
)  # fmt: skip


def load_pair(workdir: pathlib.Path, small: bool):
  """(draft, target, held-out text or None, what it is)."""
  if not small:
    try:
      pair = pairs.load_pair(PairConfig("trained", str(workdir / "draft"), str(workdir / "target")))
      return pair.draft, pair.target, pair.heldout, "embedded pair"
    except (FileNotFoundError, ValueError) as error:
      print(f"no trained pair ({error}); using random-weight models of the same sizes")
  names = ("draft-test", "target-test") if small else ("draft-tiny", "target-small")
  bundles = []
  for seed, name in enumerate(names, 1):
    config = get_model_config(name, 256 if small else 4096)
    bundles.append(ModelBundle(config, init_params(config, jax.random.key(seed))))
  return *bundles, None, "random weights"


def prompts_for(heldout, num, prompt_len, vocab):
  """`num` held-out prompts, or random token ids when there is no held-out text."""
  if heldout is not None:
    prompts = data.make_prompts(heldout, num, prompt_len, seed=0)
    return np.asarray(prompts.tokens_BxP), np.asarray(prompts.lengths_B)
  tokens = np.random.default_rng(0).integers(3, vocab, (num, prompt_len))
  return tokens.astype(np.int32), np.full((num,), prompt_len, np.int32)


def decode(spec, draft, target, tokens, lengths, batch):
  """Per-row counts of every batch: emitted, rounds, draft calls, draft and target
  positions, scored nodes (each summed over the row's rounds)."""
  fields = ("emitted_B", "rounds_B", "draft_calls_B", "draft_positions_B", "positions_B",
            "nodes_B")  # fmt: skip
  rows = {f: [] for f in fields}
  for start in range(0, len(tokens), batch):
    ids = np.arange(start, min(start + batch, len(tokens)))
    out = engine.generate(
      jax.random.key(0), spec, draft=draft, target=target, prompts=jnp.asarray(tokens[ids]),
      prompt_lengths=jnp.asarray(lengths[ids]), prompt_ids=jnp.asarray(ids),
    )  # fmt: skip
    for f in fields:
      rows[f].append(np.asarray(getattr(out.stats, f))[: len(ids)])
  return {f.removesuffix("_B"): np.concatenate(v).astype(float) for f, v in rows.items()}


def round_seconds(costs: metrics.CostTable | None, spec: DecodeSpec, counts) -> np.ndarray | None:
  """Per row: the predicted time of its rounds (each round of the row's mean draft calls
  and target positions), or None where the table lacks the configuration."""
  if costs is None or not costs.covers(spec.method, spec.num_drafts, spec.draft_len):
    return None
  rounds = np.maximum(counts["rounds"], 1)
  return np.array(
    [
      1e-3
      * n
      * costs.round_ms(
        spec.method, spec.num_drafts, spec.draft_len, draft_calls=c / n, positions=p / n
      )  # fmt: skip
      for n, c, p in zip(rounds, counts["draft_calls"], counts["positions"], strict=True)
    ]
  )


def label(spec: DecodeSpec) -> str:
  text = f"{spec.method} K={spec.num_drafts} L={spec.draft_len}"
  text += f" adaptive {spec.adaptive:g}" if spec.adaptive else ""
  return text + (f" budget {spec.node_budget:g}" if spec.node_budget else "")


COLUMNS = [
  ("config", "config", "{}"),
  ("tokens_per_round", "tokens / round", "{:.3f}"),
  ("tokens_per_position", "tokens / target position", "{:.4f}"),
  ("tokens_per_node", "tokens / scored node", "{:.4f}"),
  ("nodes", "scored nodes / round", "{:.2f}"),
  ("draft_positions", "draft positions / round", "{:.2f}"),
  ("target_positions", "target positions / round", "{:.2f}"),
  ("tokens_per_s", "projected tokens/s", "{:,.0f}"),
]
# (row key, numerator, denominator) of the paired ratios.
RATIOS = (
  ("tokens_per_round", "emitted", "rounds"),
  ("tokens_per_position", "emitted", "positions"),
  ("tokens_per_node", "emitted", "nodes"),
  ("nodes", "nodes", "rounds"),
  ("draft_positions", "draft_positions", "rounds"),
)


def measure(specs, draft, target, tokens, lengths, batch, costs):
  """[(spec, counts, seconds or None, row)] of every spec, in order."""
  runs = []
  for spec in specs:
    counts = decode(spec, draft, target, tokens, lengths, batch)
    seconds = round_seconds(costs, spec, counts)
    rounds = counts["rounds"].sum()
    row = {"config": label(spec), "target_positions": counts["positions"].sum() / rounds}
    row |= {key: counts[num].sum() / counts[den].sum() for key, num, den in RATIOS}
    # Each round serves B rows: the batch's time is the rows' predicted times over B.
    row["tokens_per_s"] = (
      None if seconds is None else batch * counts["emitted"].sum() / seconds.sum()
    )
    runs.append((spec, counts, seconds, row))
    print(f"  {label(spec)}: done", flush=True)
  return runs


def paired(runs, against) -> str:
  """Each adaptive run (a spec with adaptive or node_budget) against the static runs
  `against(run, static runs)` names ({reason: run}): ratios with paired intervals."""
  static = [r for r in runs if not (r[0].adaptive or r[0].node_budget)]
  entries = []
  for spec, counts, seconds, row in runs:
    if not (spec.adaptive or spec.node_budget):
      continue
    names: dict[str, list[str]] = {}  # one entry per static configuration, its reasons
    bases = {}
    for name, base in against((spec, counts, seconds, row), static).items():
      names.setdefault(base[3]["config"], []).append(name)
      bases[base[3]["config"]] = base
    for config, (_, base_counts, base_s, _) in bases.items():
      entry = {"config": row["config"], "against": f"{config} ({', '.join(names[config])})"}
      for key, num, den in RATIOS:
        entry[key] = paired_text(counts[num], counts[den], base_counts[num], base_counts[den])
      entry["tokens_per_s"] = (
        None if seconds is None or base_s is None
        else paired_text(counts["emitted"], seconds, base_counts["emitted"], base_s)
      )  # fmt: skip
      entries.append(entry)
  columns = [("config", "adaptive", "{}"), ("against", "static", "{}")]
  columns += [(key, title, "{}") for key, title, _ in COLUMNS[1:] if key in entries[0]]
  return tables.markdown(entries, columns)


def main(argv):
  del argv
  small = _SMALL.value
  k = 3 if small else _NUM_DRAFTS.value
  lens = [2] if small else sorted(int(x) for x in _LENS.value)
  thresholds = [0.3] if small else [float(x) for x in _THRESHOLDS.value]
  budgets = [3.0] if small else [float(x) for x in _BUDGETS.value]
  num, max_new, batch = (4, 6, 2) if small else (_PROMPTS.value, _MAX_NEW.value, _BATCH.value)
  draft, target, heldout, what = load_pair(pathlib.Path(_WORKDIR.value), small)
  costs = metrics.CostTable.load(_COST_TABLE.value) if _COST_TABLE.value else None
  if costs is not None and costs.batch != batch:
    raise app.UsageError(f"the cost table was measured at batch {costs.batch}, not {batch}")
  tokens, lengths = prompts_for(heldout, num, 8, target.config.vocab_size)
  spec = functools.partial(DecodeSpec, num_drafts=k, max_new_tokens=max_new)
  print(f"{what}, {num} prompts x {max_new} tokens, batch {batch}, same prompts and keys\n")
  footer = (
    f"Projected with the cost table of {costs.describe()}." if costs is not None
    else "(no --cost_table: no projected tokens/s; scripts/bench_decode.py writes one)"
  )  # fmt: skip

  print(f"## Adaptive draft length (K-SEQ, K = {k})\n")
  runs = measure(
    [spec(method="kseq", draft_len=n) for n in lens]
    + [spec(method="kseq", draft_len=max(lens), adaptive=t) for t in thresholds],
    draft, target, tokens, lengths, batch, costs,
  )  # fmt: skip
  print(tables.markdown([r[3] for r in runs], COLUMNS), footer, sep="\n")

  def lengths_against(run, static):
    out = {
      "same L": static[-1],
      "equal compute": min(
        static, key=lambda r: abs(r[3]["target_positions"] - run[3]["target_positions"])
      ),
    }
    if all(r[3]["tokens_per_s"] for r in static):
      out["best"] = max(static, key=lambda r: r[3]["tokens_per_s"])
    return out

  print(f"\nPaired over {num} prompts (ratios of sums, 95% intervals):\n")
  print(paired(runs, lengths_against))

  n = 2 if small else _BUDGET_LEN.value
  fewest = k if small else 2  # the fewest paths of a static tree here
  print(f"\n## Tree budget shared by the batch (rrs, dedup rounds, K = {k}, L = {n})\n")
  runs = measure(
    [spec(method="rrs", num_drafts=j, draft_len=n, dedup=True) for j in range(fewest, k + 1)]
    + [spec(method="rrs", draft_len=m, dedup=True) for m in range(1, n)]
    + [spec(method="rrs", draft_len=n, dedup=True, node_budget=b) for b in budgets],
    draft, target, tokens, lengths, batch, None,
  )  # fmt: skip
  print(tables.markdown([r[3] for r in runs], COLUMNS))

  def budget_against(run, static):
    return {
      "same tree": static[k - fewest],
      "equal nodes": min(static, key=lambda r: abs(r[3]["nodes"] - run[3]["nodes"])),
    }

  print(f"\nPaired over {num} prompts (ratios of sums, 95% intervals):\n")
  print(paired(runs, budget_against))


def paired_text(num_a, den_a, num_b, den_b) -> str:
  """'ratio [lower, upper]' of (sum num_a / sum den_a) / (sum num_b / sum den_b)."""
  ratio, lower, upper = report.paired_ratio(
    *(np.asarray(x)[None] for x in (num_a, den_a, num_b, den_b))
  )
  return f"{ratio:.3f} [{lower:.3f}, {upper:.3f}]"


if __name__ == "__main__":
  app.run(main)
