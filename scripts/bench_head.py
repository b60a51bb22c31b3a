"""A draft head against a separate draft of equal cost, and sampled trees against the
deterministic trees the serving engines draft (issue 50).

Decodes the same held-out prompts of the embedded pair's target with three drafts, each
row with the same prompt and key (fold_in(key, b)), so each prompt is a paired unit:
  - the head (`configs/head.py`, $SPECTR_WORKDIR/head): one block reading the target's
    last-layer features, with the target's embedding as its output layer;
  - its separate draft of equal cost (`configs/head.py:separate`, head-separate): one
    block of the target's width, reading tokens only, trained with the same recipe;
  - optionally the main job's distilled draft (--reference, about half the cost).
Each draft's parameters per draft token and its FLOPs per draft token (XLA's cost
analysis of one drafting step on one tail) are printed first.

Section 1, the K x L grid: for every method, block efficiency (tokens per round) of the
head and of the separate draft, their ratio with a paired 95% bootstrap interval over
prompts (`report.paired_ratio`), tokens per target position, and the speedup projected by
the memory-bound model (`metrics.predicted_speedup`, parameter ratio).

Section 2, at equal nodes per round, all with the head: the field's mode, the draft's
top-k tree verified as if each draft were certain ("certain/topk"), against sampled
trees and paths verified exactly (--sampled), each with its ratio to the field's mode.

Usage: python scripts/bench_head.py [--workdir W] [--methods sd,kseq,...] [--drafts 2,4]
         [--lens 2,4] [--field_trees 2:2,4:4] [--prompts 64] [--batch 8]
         [--max_new_tokens 48] [--reference draft-distill-runlocal] [--small]
"""

import pathlib

import jax
import jax.numpy as jnp
from absl import app, flags
from bench_adaptive import decode, paired_text, prompts_for

from spectr_jax import data, methods, metrics, pairs, tables
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, count_params, get_model_config, init_params
from spectr_jax.models.head import HeadConfig, share_target
from spectr_jax.pair_config import PairConfig

FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_WORKDIR = flags.DEFINE_string(
  "workdir", str(data.default_workdir()), "Where the runs are.", flag_values=FLAGS
)
_HEADS = flags.DEFINE_list("heads", ["head"], "The heads' runs.", flag_values=FLAGS)
_SEPARATE = flags.DEFINE_string(
  "separate", "head-separate", "The separate draft of equal cost.", flag_values=FLAGS
)
_REFERENCE = flags.DEFINE_string(
  "reference", "", "Another draft's run, e.g. draft-distill-runlocal.", flag_values=FLAGS
)
_METHODS = flags.DEFINE_list(
  "methods", ["sd", "kseq", "optimal", "rrs", "traversal", "gbv"], "Methods.", flag_values=FLAGS
)
_DRAFTS = flags.DEFINE_list(
  "drafts", ["2", "4"], "K of the multi-draft methods.", flag_values=FLAGS
)
_LENS = flags.DEFINE_list("lens", ["2", "4"], "L.", flag_values=FLAGS)
_FIELD_TREES = flags.DEFINE_list(
  "field_trees", ["2:2", "4:4"], "K:L of the equal-node trees.", flag_values=FLAGS
)
_SAMPLED = flags.DEFINE_list(
  "sampled", ["rrs/wor", "traversal/wor", "kseq", "optimal"],
  "Exact verifiers on sampled drafts for section 2 (method[/drafting]).", flag_values=FLAGS,
)  # fmt: skip
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.", flag_values=FLAGS)
_PROMPTS = flags.DEFINE_integer("prompts", 64, "Held-out prompts.", flag_values=FLAGS)
_BATCH = flags.DEFINE_integer("batch", 8, "Rows per call.", flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Tokens per row.", flag_values=FLAGS)
_SMALL = flags.DEFINE_bool(
  "small", False, "A smoke run on random-weight test models (no trained runs).", flag_values=FLAGS
)


def load_drafts(workdir: pathlib.Path, small: bool):
  """(target, {name: draft}, held-out text or None): the trained runs, or random-weight
  test models (a head and a separate draft) for a smoke run."""
  if small:
    target_config = get_model_config("target-test", 256)
    target = ModelBundle(target_config, init_params(target_config, jax.random.key(1)))
    head_config = HeadConfig.of(target_config)
    head = share_target(init_params(head_config, jax.random.key(2)), target.params)
    separate_config = get_model_config("draft-test", 256)
    separate = init_params(separate_config, jax.random.key(3))
    drafts = {"head": ModelBundle(head_config, head)}
    drafts["separate"] = ModelBundle(separate_config, separate)
    return target, drafts, None
  names = [*_HEADS.value, _SEPARATE.value] + ([_REFERENCE.value] if _REFERENCE.value else [])
  drafts, target, heldout = {}, None, None
  for run in names:
    pair = pairs.load_pair(PairConfig("trained", str(workdir / run), str(workdir / "target")))
    drafts[run], target, heldout = pair.draft, pair.target, pair.heldout
  return target, drafts, heldout


def draft_flops(draft: ModelBundle, max_len: int) -> float:
  """FLOPs of one drafting step on one tail (one token; XLA's cost analysis of the
  compiled `Decoder.extend` on a cache of `max_len` positions)."""
  model = draft.decoder
  cache = model.init_cache(1, 1, 2, cache_len=max_len)
  tokens = jnp.zeros((1, 1, 1), jnp.int32)
  compiled = jax.jit(model.extend).lower(draft.params, tokens, cache).compile()
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  return float(analysis["flops"])


def specs_of(names, drafts, lens, max_new, temperature):
  """The grid's `DecodeSpec`s: single-draft methods at K = 1, others at every K."""
  return [
    DecodeSpec(
      method=name, num_drafts=k, draft_len=n, max_new_tokens=max_new, temperature=temperature
    )  # fmt: skip
    for name in names
    for k in methods.get(name).grid_drafts(drafts)
    for n in lens
  ]


def label(spec: DecodeSpec) -> str:
  """E.g. "rrs/wor K=4 L=4": the method, its drafting scheme, K and L."""
  drafting = spec.drafting or methods.get(spec.method).drafting
  return f"{spec.method}/{drafting} K={spec.num_drafts} L={spec.draft_len}"


def rates(counts, ratio, spec):
  """Block efficiency, tokens per target position, projected speedup."""
  be = counts["emitted"].sum() / counts["rounds"].sum()
  return {
    "be": be,
    "tpp": counts["emitted"].sum() / counts["positions"].sum(),
    "speedup": metrics.predicted_speedup(be, spec.draft_len, ratio),
    "nodes": counts["nodes"].sum() / counts["rounds"].sum(),
  }


def grid_columns(names, heads, separate):
  """The grid table's columns: per draft its tokens per round, tokens per target position
  and projected speedup; per head its paired ratio to the separate draft."""
  columns = [("config", "config", "{}")]
  for key, title, form in (("be", "tokens / round", "{:.3f}"),
                           ("tpp", "tokens / target position", "{:.4f}"),
                           ("speedup", "projected speedup", "{:.2f}")):  # fmt: skip
    columns += [(f"{key}_{n}", f"{title}, {n}", form) for n in names]
  return columns + [(f"ratio_{h}", f"{h} / {separate} [95%]", "{}") for h in heads]


FIELD_COLUMNS = [
  ("config", "config", "{}"),
  ("nodes", "scored nodes / round", "{:.2f}"),
  ("be", "tokens / round", "{:.3f}"),
  ("tpp", "tokens / target position", "{:.4f}"),
  ("speedup", "projected speedup", "{:.2f}"),
  ("ratio", "tokens / round vs the field's mode [95%]", "{}"),
]


def main(argv):
  del argv
  small = _SMALL.value
  target, drafts, heldout = load_drafts(pathlib.Path(_WORKDIR.value), small)
  heads = ["head"] if small else _HEADS.value
  separate = "separate" if small else _SEPARATE.value
  num, max_new, batch = (4, 6, 2) if small else (_PROMPTS.value, _MAX_NEW.value, _BATCH.value)
  tokens, lengths = prompts_for(heldout, num, 8, target.config.vocab_size)
  target_n = count_params(target.params)
  ratios = {name: count_params(d.params) / target_n for name, d in drafts.items()}
  print(
    f"{num} prompts x {max_new} tokens, batch {batch}, temperature {_TEMPERATURE.value:g}, "
    "same prompts and keys per draft\n"
  )
  rows = [
    {
      "draft": name,
      "params": count_params(d.params),
      "flops": draft_flops(d, target.config.max_len),
      "ratio": ratios[name],
    }
    for name, d in drafts.items()
  ]
  print(
    tables.markdown(
      rows,
      [
        ("draft", "draft", "{}"),
        ("params", "parameters per draft token", "{:,}"),
        ("flops", "FLOPs per draft token (one step, one tail)", "{:,.0f}"),
        ("ratio", "parameters / target's", "{:.3f}"),
      ],
    ),
    "",
    sep="\n",
  )

  temperature = _TEMPERATURE.value
  grid = specs_of(_METHODS.value, [int(k) for k in _DRAFTS.value], [int(n) for n in _LENS.value],
                  max_new, temperature)  # fmt: skip
  if grid:
    print(f"## The K x L grid: heads against the separate draft (target {target_n:,})\n")
    table = []
    for spec in grid:
      counts = {name: decode(spec, d, target, tokens, lengths, batch) for name, d in drafts.items()}
      row = {"config": label(spec)}
      for name, c in counts.items():
        row |= {f"{key}_{name}": v for key, v in rates(c, ratios[name], spec).items()}
      base = counts[separate]
      for head in heads:
        row[f"ratio_{head}"] = paired_text(
          counts[head]["emitted"], counts[head]["rounds"], base["emitted"], base["rounds"]
        )
      table.append(row)
      print(f"  {row['config']}: done", flush=True)
    print(tables.markdown(table, grid_columns(list(drafts), heads, separate)), "", sep="\n")

  print(f"## Equal nodes per round, {heads[-1]} drafting: the field's mode and sampled drafts\n")
  field = []
  for tree in _FIELD_TREES.value:
    k, n = (int(x) for x in tree.split(":"))
    base = DecodeSpec(method="certain", drafting="topk", num_drafts=k, draft_len=n,
                      max_new_tokens=max_new, temperature=temperature)  # fmt: skip
    head = drafts[heads[-1]]
    base_counts = decode(base, head, target, tokens, lengths, batch)
    field.append({"config": label(base), **rates(base_counts, ratios[heads[-1]], base)})
    for text in _SAMPLED.value:
      method, _, drafting = text.partition("/")
      spec = base.replace(method=method, drafting=drafting)
      counts = decode(spec, head, target, tokens, lengths, batch)
      entry = {"config": label(spec), **rates(counts, ratios[heads[-1]], spec)}
      entry["ratio"] = paired_text(
        counts["emitted"], counts["rounds"], base_counts["emitted"], base_counts["rounds"]
      )
      field.append(entry)
    print(f"  {tree}: done", flush=True)
  print(tables.markdown(field, FIELD_COLUMNS))
  print(
    "\nProjected speedup: memory-bound model, block efficiency / (1 + L x draft/target "
    "parameters) (`metrics.predicted_speedup`); a head's parameters count the target's "
    "output layer it reads."
  )


if __name__ == "__main__":
  app.run(main)
