"""Paper-style tables and plots of sweep results.

One row per (method, K, L, rho) over its seeds: block efficiency (emitted tokens per
target call, pooled over prompts and seeds) with a two-level bootstrap 95% interval
(seeds resampled, then prompts within each drawn seed), the hit rate at the first draft
position, measured decoding tokens/s and its ratio to autoregressive decoding of the same
sweep, and a predicted speedup: from the costs a benchmark measured on a device
(`metrics.CostTable`, given to `write_report`) or, without one, the memory-bound model of
an accelerator with the parameter ratio (`metrics.predicted_speedup`), the column titled
by the model it comes from. Written as
markdown and CSV, with PNG plots (matplotlib, Agg backend): block efficiency vs K for
each L, and, for a rho ablation, exact acceptance vs K for each strategy with the
optimal bound.
"""

import csv
import itertools
import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from spectr_jax import methods, metrics, results, tables  # noqa: E402

REPORT_DIR = "report"
_COLUMNS = (
  ("label", "method", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("rho_name", "rho", "{}"),
  ("block_efficiency", "block efficiency", "{:.2f}"),
  ("interval", "95% interval", "{}"),
  ("hit_at_1", "hit rate at t=1", "{:.3f}"),
  ("tokens_per_s", "tokens/s", "{:.0f}"),
  ("speedup", "speedup (measured)", "{:.2f}x"),
  ("predicted_speedup", "speedup (predicted: {model})", "{:.2f}x"),
  ("samples", "seeds x prompts", "{}"),
)
# Beside the columns above, for configurations that are not exact.
_INEXACT_COLUMNS = (
  ("invalid", "invalid positions", "{:.1%}"),
  ("overshoot", "mean overshoot", "{:.4f}"),
)


def _resample(shape_ZxE: tuple[int, int], resamples: int, seed: int):
  """Two-level bootstrap indices: seeds with replacement, then prompts within each seed."""
  s, n = shape_ZxE
  rng = np.random.default_rng(seed)
  seeds_IxZ = rng.integers(s, size=(resamples, s))
  return seeds_IxZ[..., None], rng.integers(n, size=(resamples, s, n))


def _interval(values_I: np.ndarray, level: float) -> tuple[float, float]:
  lower, upper = np.quantile(values_I, [(1 - level) / 2, (1 + level) / 2])
  return float(lower), float(upper)


def bootstrap_ratio(
  num_ZxE: np.ndarray,
  den_ZxE: np.ndarray,
  *,
  resamples: int = 2000,
  level: float = 0.95,
  seed: int = 0,
) -> tuple[float, float, float]:
  """sum(num) / sum(den) with a two-level percentile bootstrap interval.

  Each resample draws Z seeds with replacement, then E prompts with replacement within
  each drawn seed, and recomputes the ratio of sums.

  Args:
    num_ZxE, den_ZxE: per (seed, prompt) numerators and denominators (e.g. emitted
      tokens and target calls).
    resamples: bootstrap resamples.
    level: coverage of the interval.
    seed: seeds the resampling (the report is reproducible).

  Returns:
    (estimate, lower, upper).
  """
  num_ZxE, den_ZxE = np.asarray(num_ZxE, float), np.asarray(den_ZxE, float)
  index = _resample(num_ZxE.shape, resamples, seed)
  ratio_I = num_ZxE[index].sum(axis=(1, 2)) / np.maximum(den_ZxE[index].sum(axis=(1, 2)), 1e-12)
  return float(num_ZxE.sum() / max(den_ZxE.sum(), 1e-12)), *_interval(ratio_I, level)


def paired_ratio(
  num_a_ZxE, den_a_ZxE, num_b_ZxE, den_b_ZxE, *, resamples=2000, level=0.95, seed=0
) -> tuple[float, float, float]:
  """(sum num_a / sum den_a) / (sum num_b / sum den_b), e.g. BE(block) / BE(sd), with a
  paired two-level bootstrap: both methods are resampled with the same seeds and prompts.

  Returns:
    (estimate, lower, upper).
  """
  a = [np.asarray(x, float) for x in (num_a_ZxE, den_a_ZxE, num_b_ZxE, den_b_ZxE)]
  if len({x.shape for x in a}) != 1:
    raise ValueError(f"paired_ratio needs the same seeds x prompts, got {[x.shape for x in a]}")
  index = _resample(a[0].shape, resamples, seed)
  sums_4xI = np.stack([x[index].sum(axis=(1, 2)) for x in a])
  ratio_I = (sums_4xI[0] / sums_4xI[1]) / (sums_4xI[2] / sums_4xI[3])
  totals = [x.sum() for x in a]
  return float((totals[0] / totals[1]) / (totals[2] / totals[3])), *_interval(ratio_I, level)


# (method, baseline) pairs compared cell by cell by `paired_gains`: each method's
# `compare_with` in the registry (K = 1 cells of "gbv" do not exist: it is "block" there).
GAIN_PAIRS = tuple(
  (m.name, baseline) for m in methods.METHODS.values() for baseline in m.compare_with
)


def paired_gains(records: Sequence[dict[str, Any]], pairs=GAIN_PAIRS) -> list[dict[str, Any]]:
  """BE(method) / BE(baseline) for every (K, L, setting) that both methods ran on the same
  seeds (so the same prompts), with the paired bootstrap interval of `paired_ratio`.
  Only exact cells are compared (rho* or no split factor).

  Returns:
    Rows with method, baseline, K, L, ratio, lower, upper, interval, samples.
  """
  by_cell: dict[tuple, dict[int, dict[str, Any]]] = {}
  for record in records:
    cell = record["cell"]
    if cell["rho"] not in (None, "star"):
      continue
    # A method's cells with a tree shape (`branching`) are compared with its baselines'
    # cells of the same settings otherwise (the baselines draw no tree).
    setting = _group_key(cell, ("seed", "method", "rho", "branching"))
    key = (cell["method"], cell.get("branching", ""), setting)
    by_cell.setdefault(key, {})[cell["seed"]] = record
  rows = []
  for (method, _, setting), members in sorted(by_cell.items()):
    for name, baseline in pairs:
      other = by_cell.get((baseline, "", setting)) if method == name else None
      seeds = sorted(set(members) & set(other or {}))
      if not seeds:
        continue
      arrays = [
        np.array([group[z][field] for z in seeds])
        for group in (members, other)
        for field in ("emitted", "rounds")
      ]
      ratio, lower, upper = paired_ratio(*arrays)
      cell = members[seeds[0]]["cell"]
      rows.append(
        {
          "method": method + variant(cell),
          "baseline": baseline,
          "K": cell["num_drafts"],
          "L": cell["draft_len"],
          "ratio": ratio,
          "lower": lower,
          "upper": upper,
          "interval": f"[{lower:.3f}, {upper:.3f}]",
          "samples": f"{len(seeds)} x {arrays[0].shape[1]}",
        }
      )
  return sorted(rows, key=lambda r: (r["baseline"], r["method"], r["L"], r["K"]))


_GAIN_COLUMNS = (
  ("method", "method", "{}"),
  ("baseline", "over", "{}"),
  ("K", "K", "{}"),
  ("L", "L", "{}"),
  ("ratio", "BE ratio", "{:.3f}"),
  ("interval", "paired 95% interval", "{}"),
  ("samples", "seeds x prompts", "{}"),
)


def variant(cell: dict[str, Any]) -> str:
  """What a cell's label adds for a drafting scheme other than its method's default, its
  drafts' tree shape, dedup scoring, adaptive draft length and tree budget, e.g. " (wor,
  proportional, dedup)", " (adaptive 0.3)" or " (dedup, node budget 8)"; "" for static
  tails of the method's default drafts. (Records store `DecodeSettings.dedup` as
  "tree".)"""
  parts = [cell.get("drafting", ""), cell.get("branching", "")] + ["dedup"] * bool(cell.get("tree"))
  parts += [f"adaptive {cell['adaptive']:g}"] if cell.get("adaptive") else []
  parts += [f"node budget {cell['node_budget']:g}"] if cell.get("node_budget") else []
  parts = [p for p in parts if p]
  return f" ({', '.join(parts)})" if parts else ""


def _group_key(cell: dict[str, Any], drop: Iterable[str]) -> str:
  return json.dumps({k: v for k, v in cell.items() if k not in drop}, sort_keys=True)


# Single-draft methods first, then the multi-draft ones, each in registry order.
_ORDER = sorted(methods.METHODS, key=lambda name: methods.METHODS[name].multi_draft)


def _sort_key(row: dict[str, Any]):
  rho = row["rho"]
  rho_order = (0, 0.0) if rho in (None, "star") else (1, 0.0) if rho == "k" else (2, rho)
  method = _ORDER.index(row["method"]) if row["method"] in _ORDER else len(_ORDER)
  return (row["exact"] is not True, row["L"] > 0, row["L"], method, row["K"], rho_order)


def exactness(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Whether a cell group's output law was the target's, from its records' per-position
  counts: {"exact": True / False / None (records without the counts), "invalid": the
  share of verified positions (t < L) where the verifier's accept branch overshot q,
  "overshoot": the mean overshoot mass per verified position}."""
  cell = members[0]["cell"]
  if not cell["draft_len"]:
    return {"exact": True, "invalid": None, "overshoot": None}
  if any("invalid" not in r or "overshoot" not in r for r in members):
    takes_rho = cell["method"] in methods.METHODS and methods.get(cell["method"]).takes_rho
    unknown = takes_rho and cell["rho"] not in (None, "star", "k")
    return {"exact": None if unknown else True, "invalid": None, "overshoot": None}
  draft_len = cell["draft_len"]
  verified = sum(sum(r["reached"][:draft_len]) for r in members)
  invalid = sum(sum(r["invalid"][:draft_len]) for r in members)
  overshoot = sum(sum(r["overshoot"][:draft_len]) for r in members)
  return {
    "exact": invalid == 0,
    "invalid": invalid / verified if verified else 0.0,
    "overshoot": overshoot / verified if verified else 0.0,
  }


def unusable_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The records a table cannot use: cells that decoded no round (every row stopped at
  once, e.g. on non-finite logits; a sweep no longer saves such cells)."""
  return [r for r in records if sum(r["rounds"]) == 0]


def summarize(
  records: Sequence[dict[str, Any]], costs: metrics.CostTable | None = None
) -> list[dict[str, Any]]:
  """One row per cell group (all fields but the seed), sorted: exact configurations
  first (method-wise), then those that are not exact. A group with an unusable record
  (`unusable_records`) is left out.

  Args:
    records: results.jsonl records (see `experiment.run_cell`).
    costs: measured round costs for predicted_speedup (None: the memory-bound model).

  Returns:
    Rows with method, K, L, rho, block_efficiency and its interval (lower, upper,
    interval), hit_at_1, tokens_per_s, speedup (over the autoregressive group with the
    same decoding setting; None without one), predicted_speedup (None where `costs`
    has no round of its cell: `predicted`) and latency_model (`latency_model`), seeds,
    prompts, samples.
  """
  groups: dict[str, list[dict[str, Any]]] = {}
  for record in records:
    groups.setdefault(_group_key(record["cell"], ("seed",)), []).append(record)
  unusable = unusable_records(records)
  baselines = {}
  rows = []
  for members in groups.values():
    members = sorted(members, key=lambda r: r["cell"]["seed"])
    cell = members[0]["cell"]
    if any(r in unusable for r in members):
      continue
    emitted_ZxE = np.array([r["emitted"] for r in members])
    rounds_ZxE = np.array([r["rounds"] for r in members])
    estimate, lower, upper = bootstrap_ratio(emitted_ZxE, rounds_ZxE)
    reached = sum(r["reached"][0] for r in members)
    hits = sum(r["hits"][0] for r in members)
    tokens_per_s = sum(r["timed_tokens"] for r in members) / max(
      sum(r["decode_seconds"] for r in members), 1e-12
    )
    method = methods.METHODS.get(cell["method"])
    label = method.label if method else cell["method"]
    scored = [r["target_positions"] for r in members if "target_positions" in r]
    positions = sum(map(sum, scored)) if len(scored) == len(members) else None
    drafted = [r["draft_positions"] for r in members if "draft_positions" in r]
    draft_positions = sum(map(sum, drafted)) if len(drafted) == len(members) else None
    row = {
      "method": cell["method"],
      "label": label + variant(cell),
      "dedup": bool(cell.get("tree")),
      "branching": cell.get("branching", ""),
      "drafting": cell.get("drafting", ""),
      # Target positions per round, emitted tokens per target position and draft
      # positions per round (None for records from before they were stored).
      "positions_per_round": None if positions is None else positions / max(rounds_ZxE.sum(), 1),
      "tokens_per_position": None if positions is None else emitted_ZxE.sum() / max(positions, 1),
      "draft_positions_per_round": None
      if draft_positions is None
      else draft_positions / max(rounds_ZxE.sum(), 1),
      "K": cell["num_drafts"],
      "L": cell["draft_len"],
      "rho": cell["rho"],
      "rho_name": None if cell["rho"] is None else results.strategy_name(cell["rho"]),
      "block_efficiency": estimate,
      "lower": lower,
      "upper": upper,
      "interval": f"[{lower:.2f}, {upper:.2f}]",
      "hit_at_1": hits / reached if cell["draft_len"] and reached else None,
      "tokens_per_s": tokens_per_s,
      "predicted_speedup": predicted(members[0], estimate, costs),
      "latency_model": latency_model(costs),
      "seeds": len(members),
      "prompts": emitted_ZxE.shape[1],
      "samples": f"{len(members)} x {emitted_ZxE.shape[1]}",
      **exactness(members),
      # The autoregressive baseline ignores `tree`, `branching` and `drafting`
      # (`experiment.expand` stores it without).
      "_setting": _group_key(
        cell,
        (
          "seed",
          "method",
          "num_drafts",
          "draft_len",
          "rho",
          "tree",
          "branching",
          "drafting",
          "adaptive",
          "node_budget",
        ),  # fmt: skip
      ),
    }
    if cell["method"] == "autoregressive":
      baselines[row["_setting"]] = tokens_per_s
    rows.append(row)
  for row in rows:
    baseline = baselines.get(row.pop("_setting"))
    row["speedup"] = row["tokens_per_s"] / baseline if baseline else None
  return sorted(rows, key=_sort_key)


def latency_model(costs: metrics.CostTable | None) -> str:
  """The name of the model behind predicted_speedup."""
  return metrics.MEMORY_BOUND if costs is None else metrics.MEASURED


def predicted(
  record: dict[str, Any], block_efficiency: float, costs: metrics.CostTable | None
) -> float | None:
  """The predicted speedup of a record's cell: from `costs` for rounds on K tails of the
  scheme's default drafts that it measured (None otherwise: trees, drafted tree shapes
  and rounds it lacks), else the memory-bound model at the record's parameter ratio.
  An adaptive cell's rounds cost its recorded mean draft calls and target positions."""
  cell = record["cell"]
  k, n = cell["num_drafts"], cell["draft_len"]
  calls = {}
  if cell.get("adaptive"):
    rounds = max(sum(record["rounds"]), 1)
    calls = {
      "draft_calls": sum(record["draft_calls"]) / rounds,
      "positions": sum(record["target_positions"]) / rounds,
    }
  if costs is None:
    ratio = record["draft_params"] / max(record["target_params"], 1)
    return metrics.predicted_speedup(block_efficiency, calls.get("draft_calls", n), ratio)
  if cell.get("tree") or cell.get("branching") or not costs.covers(cell["method"], k, n):
    return None
  return costs.speedup(block_efficiency, cell["method"], k, n, **calls)


def recommendation(rows: Sequence[dict[str, Any]], costs: metrics.CostTable | None) -> str:
  """One line: the exact configuration of `summarize`'s rows with the highest predicted
  speedup (so the highest predicted tokens per second: one autoregressive round and
  batch for all), its predicted figures and what the sweep measured of it."""
  ranked = [r for r in rows if r["exact"] is True and r["predicted_speedup"] is not None]
  if not ranked:
    return "Recommended: none (no exact configuration has a predicted speedup)."
  best = max(ranked, key=lambda r: r["predicted_speedup"])
  rho = f" rho={best['rho_name']}" if best["rho_name"] else ""
  predicted = f"predicted speedup {best['predicted_speedup']:.2f}x ({latency_model(costs)}"
  if costs is not None:
    ar_s = 1e-3 * costs.round_ms("autoregressive", 1, 0)
    predicted += f", {best['predicted_speedup'] * costs.batch / ar_s:,.0f} tokens/s at "
    predicted += f"batch {costs.batch} on {costs.device}"
  measured = f"measured in the sweep: {best['tokens_per_s']:,.0f} tokens/s"
  if best["speedup"] is not None:
    measured += f", speedup {best['speedup']:.2f}x"
  return (
    f"Recommended: {best['label']} K={best['K']} L={best['L']}{rho}: {predicted}); "
    f"{measured} (of {len(ranked)} exact configurations ranked)."
  )


def decoding_columns(costs: metrics.CostTable | None = None) -> list:
  """The decoding table's columns, the predicted speedup's title naming its model."""
  return [(key, title.format(model=latency_model(costs)), fmt) for key, title, fmt in _COLUMNS]


def markdown_table(rows: Sequence[dict[str, Any]], columns=None) -> str:
  """A markdown table of `rows` (`tables.markdown`; the rho column only when some row has
  one); the decoding table's columns by default."""
  columns = decoding_columns() if columns is None else columns
  if all(row.get("rho_name") is None for row in rows):
    columns = [c for c in columns if c[0] != "rho_name"]
  return tables.markdown(rows, columns)


def write_csv(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> None:
  """Writes `rows` (all their fields, full precision) as CSV."""
  fields = list(dict.fromkeys(k for row in rows for k in row))
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)


def plot_block_efficiency(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> None:
  """Block efficiency vs K with the bootstrap intervals: one line per multi-draft method
  (its own colour, registry order), draft length L (line style) and shape (marker: circles
  for tails, squares for dedup rounds, triangles for drafted tree shapes), each line
  starting from its K = 1 method ("sd", or "block" for "gbv"); rows that are not exact
  are drawn hollow (never so at rho* or without a split factor)."""
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  lens = sorted({r["L"] for r in rows if r["L"] > 0})
  dashes = {n: ["-", "--", ":", "-."][i % 4] for i, n in enumerate(lens)}
  lines = [m for m in methods.METHODS.values() if m.multi_draft]
  colors = {m.name: plt.cm.tab10(i % 10) for i, m in enumerate(lines)}
  # Tails, dedup rounds and drafted tree shapes of one method are lines of their own.
  shapes = sorted({(r.get("branching", ""), bool(r.get("dedup"))) for r in rows})
  schemes = sorted({r.get("drafting", "") for r in rows})
  markers = {False: "o", True: "s"}
  for draft_len, method, (branching, dedup), scheme in itertools.product(
    lens, lines, shapes, schemes
  ):
    rows_at = [
      r
      for r in rows
      if r["L"] == draft_len and bool(r.get("dedup")) == dedup and r.get("drafting", "") == scheme
    ]
    single = [r for r in rows_at if r["method"] == method.single and not r.get("branching")]
    line = [
      r
      for r in rows_at
      if r["method"] == method.name
      and r.get("branching", "") == branching
      and r["rho"] in (None, "star")
    ]
    if not line:
      continue
    line = sorted(single + line, key=lambda r: r["K"])
    ks = [r["K"] for r in line]
    mean = np.array([r["block_efficiency"] for r in line])
    err = np.array([[m - r["lower"], r["upper"] - m] for m, r in zip(mean, line, strict=True)])
    shape = {"drafting": scheme, "branching": branching, "tree": dedup}  # as records hold it
    label = f"{method.label}{variant(shape)} L={draft_len}"
    color, marker = colors[method.name], "^" if branching else markers[dedup]
    ax.errorbar(ks, mean, yerr=err.T, fmt=dashes[draft_len], marker=marker, ms=4, capsize=3,
                label=label, color=color)  # fmt: skip
    for r in line:
      if r["exact"] is not True:
        ax.plot(r["K"], r["block_efficiency"], marker, ms=7, color=color, mfc="white")
  ax.axhline(1.0, color="gray", lw=0.8, label="autoregressive")
  ax.set_xscale("log", base=2)
  ax.set_xticks(
    sorted({r["K"] for r in rows}), labels=[str(k) for k in sorted({r["K"] for r in rows})]
  )
  ax.set_xlabel("drafts K (K = 1: single-draft speculative decoding; hollow: not exact)")
  ax.set_ylabel("block efficiency (tokens / target call)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def plot_acceptance(result: dict[str, Any], path: str | pathlib.Path) -> None:
  """Exact per-position acceptance vs K for each strategy, the optimal bound alpha* and
  the one-draft acceptance; strategies invalid at some positions are drawn hollow."""
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  names = list(dict.fromkeys(r["strategy"] for r in result["rows"]))
  for name in names:
    line = sorted((r for r in result["rows"] if r["strategy"] == name), key=lambda r: r["K"])
    ks = [1] + [r["K"] for r in line]  # At K = 1 every method is the one-draft acceptance.
    values = [result["single"]] + [r["acceptance"] for r in line]
    if name == "optimal":
      ax.plot(ks, values, "k-", lw=2.5, label="optimal bound alpha*", zorder=1)
      continue
    (handle,) = ax.plot(ks, values, "--" if name == "specinfer" else "-", lw=1, label=name)
    for r in line:
      hollow = r.get("invalid", 0.0) > 0
      ax.plot(r["K"], r["acceptance"], "o", ms=5, color=handle.get_color(),
              markerfacecolor="white" if hollow else handle.get_color())  # fmt: skip
  ax.plot([1], [result["single"]], "k*", ms=9, label="one draft")
  ax.set_xscale("log", base=2)
  ks = sorted({1, *(r["K"] for r in result["rows"])})
  ax.set_xticks(ks, labels=[str(k) for k in ks])
  ax.set_xlabel("drafts K")
  ax.set_ylabel("P(output hits a draft), mean over positions")
  ax.set_title("hollow: invalid at some positions (output law is not q)", fontsize=8)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


_ANALYSIS_COLUMNS = (
  ("K", "K", "{}"),
  ("strategy", "strategy", "{}"),
  ("acceptance", "acceptance", "{:.4f}"),
  ("optimal", "bound of its drafts", "{:.4f}"),
  ("gap", "gap", "{:+.4f}"),
  ("mean_rho", "mean rho", "{:.2f}"),
  ("below_star", "rho < rho*", "{:.1%}"),
  ("invalid", "invalid", "{:.1%}"),
  ("mean_deficit", "mean overshoot", "{:.4f}"),
  ("bound", "bound", "{}"),  # its drafting scheme's bound (alpha* for i.i.d. drafts)
)


def records_for(
  results_dir: str | pathlib.Path, keys: Sequence[str] | None = None
) -> list[dict[str, Any]]:
  """The records of results.jsonl with the given cell keys, in their order (all without)."""
  records = results.load_results(results_dir)
  if keys is None:
    return list(records.values())
  return [records[k] for k in keys if k in records]


def _draft_note(records: Sequence[dict[str, Any]]) -> str:
  """One line: which kind of draft the records decoded with, and its size."""
  kinds = {(r.get("draft_kind", "model"), r["draft_params"], r["target_params"]) for r in records}
  named = {"head": "a draft head reading the target's features", "model": "a separate model"}
  return (
    "Draft: "
    + "; ".join(f"{named[kind]}, {d:,} parameters (target {t:,})" for kind, d, t in sorted(kinds))
    + "."
  )


def _model_note(costs: metrics.CostTable | None, records: Sequence[dict[str, Any]]) -> str:
  """What the predicted speedup rests on, under the decoding table."""
  if costs is None:
    return (
      f"Predicted speedup: {metrics.MEMORY_BOUND} (a round costs 1 + L x draft/target "
      "parameters target steps; not measured, an accelerator's idealisation)."
    )
  pairs = {(r["draft_params"], r["target_params"]) for r in records}
  other = "" if pairs == {(costs.draft_params, costs.target_params)} else (
    f"; these results decoded another pair ({', '.join(f'{d:,} / {t:,}' for d, t in pairs)})"
  )  # fmt: skip
  return (
    f"Predicted speedup: {metrics.MEASURED} ({costs.describe()}{other}): block efficiency "
    "x t_AR / t_round, each round the sum of its measured parts ('-': a round the table "
    "lacks)."
  )


def write_report(
  results_dir: str | pathlib.Path,
  keys: Sequence[str] | None = None,
  costs: metrics.CostTable | None = None,
) -> str:
  """Writes table.md, table.csv and the plots to <results_dir>/report; returns the markdown.

  Args:
    results_dir: a sweep's results directory (results.jsonl, optional analysis.json).
    keys: when given, only the cells with these keys are reported (else every record
      there); `experiments/report.py` passes the keys of a config's grid.
    costs: measured round costs for the predicted speedup (`metrics.CostTable`, written
      by scripts/bench_decode.py); None: the memory-bound model, parameter ratio.

  Returns:
    The markdown: the decoding table and, for a rho ablation, the per-position table.
  """
  results_dir = pathlib.Path(results_dir)
  out = results_dir / REPORT_DIR
  out.mkdir(parents=True, exist_ok=True)
  records = records_for(results_dir, keys)
  rows = summarize(records, costs)
  if not rows:
    raise ValueError(f"no usable results in {results_dir}")
  write_csv(rows, out / "table.csv")
  left_out = unusable_records(records)
  if left_out:
    text_left = [
      "## Cells left out (they decoded no round; delete their lines from results.jsonl "
      "and rerun the sweep)",
      "",
      *(f"- {r['cell']['method']} K={r['cell']['num_drafts']} L={r['cell']['draft_len']} "
        f"rho={r['cell']['rho']} seed={r['cell']['seed']} (key {r['key']})" for r in left_out),
      "",
    ]  # fmt: skip
  exact = [r for r in rows if r["exact"] is True]
  inexact = [r for r in rows if r["exact"] is not True]
  table = decoding_columns(costs)
  text = [f"## Decoding ({results_dir.name})", "", _draft_note(records), ""]
  text += [markdown_table(exact, table), ""]
  text += [_model_note(costs, records), "", recommendation(rows, costs), ""]
  if inexact:
    text += [
      "## Not exact: the output law is NOT the target's (ranked apart)",
      "",
      "A fixed rho below what a position needs makes K-SEQ's accept branch overshoot the "
      "target there (the residual would be negative and is clipped): these block "
      "efficiencies are not comparable with the exact rows above. invalid positions: "
      "share of verified draft positions with an overshoot; mean overshoot: mass per "
      "verified position ('-': records without the counts, exactness unknown).",
      "",
      markdown_table(inexact, table[:5] + list(_INEXACT_COLUMNS) + table[5:]),
      "",
    ]
  gains = paired_gains(records)
  if gains:
    write_csv(gains, out / "gains.csv")
    text += [
      "## Paired gains (same seeds and prompts)",
      "",
      markdown_table(gains, _GAIN_COLUMNS),
      "",
    ]
  if len({r["K"] for r in rows if r["L"] > 0}) > 1:
    plot_block_efficiency(rows, out / "block_efficiency_vs_K.png")
    text += [f"Plot: {out / 'block_efficiency_vs_K.png'}", ""]
  ablation = results_dir / results.ANALYSIS_FILE
  if ablation.exists():
    result = results.read_analysis(ablation)
    write_csv(result["rows"], out / "acceptance.csv")
    plot_acceptance(result, out / "acceptance_vs_K.png")
    text += [
      f"## Exact acceptance per position ({result['positions']} positions along target "
      f"samples; one draft: {result['single']:.4f})",
      "",
      markdown_table(result["rows"], _ANALYSIS_COLUMNS),
      "",
      f"Plot: {out / 'acceptance_vs_K.png'}",
      "",
    ]
  if left_out:
    text += text_left
  markdown = "\n".join(text)
  (out / "table.md").write_text(markdown)
  return markdown
