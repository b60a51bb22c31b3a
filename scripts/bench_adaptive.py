"""Adaptive draft length against static ones: same prompts, same keys, paired intervals.

Decodes the same held-out prompts of the embedded pair (its checkpoints in --workdir;
random-weight models of the same sizes when they are missing, where acceptance means
nothing) with K-SEQ at K drafts: static draft lengths (--lens) and adaptive rounds
(`DecodeSpec(adaptive=threshold)`, --thresholds) drafting up to the longest static L.
Row b of every configuration uses the same prompt and key (fold_in(key, b)), in batches
of --batch rows, so each prompt is a paired unit. Prints, per configuration:
  - tokens per round (block efficiency), tokens per target position, draft and target
    positions per round (as the engine computed them: a batch's round drafts and scores
    up to its longest length);
  - tokens per second projected with a measured cost table (--cost_table, written by
    `scripts/bench_decode.py` at the same batch size with kseq:K:L for every L here):
    B x tokens / sum of the predicted rounds, each round costed at the draft calls and
    target positions it made (`metrics.CostTable.round_ms`).
Then each adaptive configuration against the static one of the same L, the static one of
nearest target positions per round (equal compute) and, with a cost table, the best
static one (highest projected tokens/s): ratios of sums with a paired percentile
bootstrap over prompts (`report.paired_ratio`).

Usage: python scripts/bench_adaptive.py [--workdir W] [--num_drafts 4] [--lens 1,2,4,8]
         [--thresholds 0.1,0.3] [--prompts 64] [--batch 4] [--max_new_tokens 64]
         [--cost_table PATH] [--small]
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import data, engine, metrics, pairs, report, tables
from spectr_jax.config import DecodeSpec, PairConfig
from spectr_jax.models import ModelBundle, get_model_config, init_params

FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_WORKDIR = flags.DEFINE_string(
  "workdir", str(data.default_workdir()), "Where the pair is.", flag_values=FLAGS
)
_NUM_DRAFTS = flags.DEFINE_integer("num_drafts", 4, "K.", flag_values=FLAGS)
_LENS = flags.DEFINE_list("lens", ["1", "2", "3", "4", "6", "8"], "Static L.", flag_values=FLAGS)
_THRESHOLDS = flags.DEFINE_list(
  "thresholds", ["0.05", "0.1", "0.2", "0.3", "0.5"], "Adaptive thresholds.", flag_values=FLAGS
)
_PROMPTS = flags.DEFINE_integer("prompts", 64, "Held-out prompts.", flag_values=FLAGS)
_BATCH = flags.DEFINE_integer("batch", 4, "Rows per call.", flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens per row.", flag_values=FLAGS)
_COST_TABLE = flags.DEFINE_string(
  "cost_table", "", "A cost table (bench_decode.py) for the projection.", flag_values=FLAGS
)
_SMALL = flags.DEFINE_bool(
  "small", False, "A seconds-long smoke run (tiny models, L 1 and 2, one threshold).",
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
  positions (each summed over the row's rounds)."""
  fields = ("emitted_B", "rounds_B", "draft_calls_B", "draft_positions_B", "positions_B")
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
  return f"L={spec.draft_len}" + (f" adaptive {spec.adaptive:g}" if spec.adaptive else "")


def main(argv):
  del argv
  small = _SMALL.value
  k = _NUM_DRAFTS.value
  lens = [1, 2] if small else sorted(int(x) for x in _LENS.value)
  thresholds = [0.3] if small else [float(x) for x in _THRESHOLDS.value]
  num, max_new = (8, 8) if small else (_PROMPTS.value, _MAX_NEW.value)
  draft, target, heldout, what = load_pair(pathlib.Path(_WORKDIR.value), small)
  costs = metrics.CostTable.load(_COST_TABLE.value) if _COST_TABLE.value else None
  if costs is not None and costs.batch != _BATCH.value:
    raise app.UsageError(f"the cost table was measured at batch {costs.batch}, not {_BATCH.value}")
  tokens, lengths = prompts_for(heldout, num, 8, target.config.vocab_size)
  specs = [DecodeSpec(method="kseq", num_drafts=k, draft_len=n, max_new_tokens=max_new)
           for n in lens]  # fmt: skip
  specs += [DecodeSpec(method="kseq", num_drafts=k, draft_len=max(lens), max_new_tokens=max_new,
                       adaptive=t) for t in thresholds]  # fmt: skip
  print(f"{what}, K-SEQ K={k}, {num} prompts x {max_new} tokens, batch {_BATCH.value}")
  runs = []
  for spec in specs:
    counts = decode(spec, draft, target, tokens, lengths, _BATCH.value)
    seconds = round_seconds(costs, spec, counts)
    runs.append((spec, counts, seconds))
    print(f"  {label(spec)}: done", flush=True)
  rows = []
  for spec, c, seconds in runs:
    rounds = c["rounds"].sum()
    # Each round serves B rows: the batch's time is the rows' predicted times over B.
    per_s = None if seconds is None else _BATCH.value * c["emitted"].sum() / seconds.sum()
    rows.append({
      "config": label(spec),
      "tokens_per_round": c["emitted"].sum() / rounds,
      "tokens_per_position": c["emitted"].sum() / c["positions"].sum(),
      "draft_positions": c["draft_positions"].sum() / rounds,
      "target_positions": c["positions"].sum() / rounds,
      "tokens_per_s": per_s,
    })  # fmt: skip
  print(tables.markdown(rows, [
    ("config", "config", "{}"),
    ("tokens_per_round", "tokens / round", "{:.3f}"),
    ("tokens_per_position", "tokens / target position", "{:.4f}"),
    ("draft_positions", "draft positions / round", "{:.2f}"),
    ("target_positions", "target positions / round", "{:.2f}"),
    ("tokens_per_s", "projected tokens/s", "{:,.0f}"),
  ]))  # fmt: skip
  if costs is None:
    print("(no --cost_table: no projected tokens/s; scripts/bench_decode.py writes one)")
  else:
    print(f"Projected with the cost table of {costs.describe()}.")
  static = [r for r in zip(runs, rows, strict=True) if not r[0][0].adaptive]
  print(f"\nAdaptive against static (paired over {num} prompts; ratios of sums, 95% intervals):")
  paired = []
  for (spec, counts, seconds), row in zip(runs, rows, strict=True):
    if not spec.adaptive:
      continue
    against = {
      "same L": static[-1],
      "equal compute": min(
        static, key=lambda r: abs(r[1]["target_positions"] - row["target_positions"])
      ),
    }
    if costs is not None and all(r["tokens_per_s"] for _, r in static):
      against["best"] = max(static, key=lambda r: r[1]["tokens_per_s"])
    names: dict[str, list[str]] = {}  # one row per static configuration, its reasons
    for name, (run, _) in against.items():
      names.setdefault(label(run[0]), []).append(name)
    for base, base_counts, base_s in {label(r[0][0]): r[0] for r in against.values()}.values():
      entry = {"config": label(spec), "against": f"{label(base)} ({', '.join(names[label(base)])})"}
      for key, num_key, den_key in (
        ("tokens_per_round", "emitted", "rounds"),
        ("tokens_per_position", "emitted", "positions"),
        ("draft_positions", "draft_positions", "rounds"),
      ):
        entry[key] = _ratio(counts[num_key], counts[den_key], base_counts[num_key],
                            base_counts[den_key])  # fmt: skip
      entry["tokens_per_s"] = (
        None if seconds is None or base_s is None
        else _ratio(counts["emitted"], seconds, base_counts["emitted"], base_s)
      )  # fmt: skip
      paired.append(entry)
  print(tables.markdown(paired, [
    ("config", "adaptive", "{}"),
    ("against", "static", "{}"),
    ("tokens_per_round", "tokens / round", "{}"),
    ("tokens_per_position", "tokens / target position", "{}"),
    ("draft_positions", "draft positions / round", "{}"),
    ("tokens_per_s", "projected tokens/s", "{}"),
  ]))  # fmt: skip


def _ratio(num_a, den_a, num_b, den_b) -> str:
  """'ratio [lower, upper]' of (sum num_a / sum den_a) / (sum num_b / sum den_b)."""
  ratio, lower, upper = report.paired_ratio(
    *(np.asarray(x)[None] for x in (num_a, den_a, num_b, den_b))
  )
  return f"{ratio:.3f} [{lower:.3f}, {upper:.3f}]"


if __name__ == "__main__":
  app.run(main)
