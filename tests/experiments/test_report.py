"""Aggregation: the bootstrap interval, the table rows, the written report and its plots."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import lm1b_spectr
from spectr_jax import experiment, methods, metrics, report, results
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.sweep_config import Prompts, SweepConfig
from tests.experiments.test_results import valid_record

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bootstrap_ratio_estimate_and_width():
  rng = np.random.default_rng(0)
  num = rng.normal(10.0, 2.0, (1, 400))
  estimate, lower, upper = report.bootstrap_ratio(num, np.ones_like(num))
  assert estimate == pytest.approx(num.mean())
  # One seed: the interval of a mean, about +-1.96 sigma / sqrt(n).
  half_width = 1.96 * num.std() / np.sqrt(num.size)
  assert (upper - lower) / 2 == pytest.approx(half_width, rel=0.15)
  assert lower < estimate < upper
  # Seeds that disagree widen the interval beyond what the prompts alone give.
  shifted = num + np.array([[0.0], [2.0], [4.0]])
  _, lo3, hi3 = report.bootstrap_ratio(shifted, np.ones_like(shifted))
  assert hi3 - lo3 > 3 * (upper - lower)
  assert report.bootstrap_ratio(np.full((3, 5), 2.0), np.ones((3, 5)))[1:] == (2.0, 2.0)


def test_paired_ratio_pairs_prompts():
  rng = np.random.default_rng(1)
  # Prompts differ a lot in difficulty; the method gains 3% on every prompt.
  rounds_b = rng.integers(10, 40, (3, 200)).astype(float)
  emitted = np.full_like(rounds_b, 64.0)
  rounds_a = rounds_b / 1.03
  ratio, lower, upper = report.paired_ratio(emitted, rounds_a, emitted, rounds_b)
  assert ratio == pytest.approx(1.03)
  assert lower == pytest.approx(1.03) and upper == pytest.approx(1.03)
  # Unpaired intervals of the two block efficiencies overlap; the paired one excludes 1.
  _, _, upper_b = report.bootstrap_ratio(emitted, rounds_b)
  _, lower_a, _ = report.bootstrap_ratio(emitted, rounds_a)
  assert lower_a < upper_b
  noisy_a = rounds_a * rng.uniform(0.97, 1.03, rounds_a.shape)
  ratio, lower, upper = report.paired_ratio(emitted, noisy_a, emitted, rounds_b)
  assert 1.0 < lower < ratio < upper
  # No gain: the interval covers 1.
  _, lower, upper = report.paired_ratio(
    emitted, rounds_b * rng.uniform(0.95, 1.05, rounds_b.shape), emitted, rounds_b
  )
  assert lower < 1.0 < upper
  with pytest.raises(ValueError, match="same seeds"):
    report.paired_ratio(emitted, rounds_a, emitted[:2], rounds_b[:2])


def test_paired_gains_match_cells():
  records = _records()
  for seed in (0, 1):
    records.append(_record("block", 1, 4, seed, [16, 16], [4, 8], 2.0))
  (row,) = report.paired_gains(records)
  assert (row["method"], row["baseline"], row["K"], row["L"]) == ("block", "sd", 1, 4)
  assert row["ratio"] == pytest.approx((64 / 24) / (64 / 32))
  assert row["samples"] == "2 x 2"


def test_tree_shapes_are_labelled_and_compared_with_their_baselines(tmp_path, monkeypatch):
  """Rows of rrs cells with a drafted tree shape and with tree scoring are named apart and
  plotted as lines of their own; paired gains compare them with the baselines' cells of
  the same settings."""
  records = []
  for seed in (0, 1):
    records.append(_record("kseq", 4, 4, seed, [16, 16], [8, 8], 2.0, rho="star"))
    records.append(_record("rrs", 4, 4, seed, [16, 16], [4, 4], 2.0, branching="proportional"))
    records.append(_record("rrs", 4, 4, seed, [16, 16], [8, 4], 2.0, dedup=True))
  rrs = methods.get("rrs").label
  labels = {r["label"]: r for r in report.summarize(records)}
  assert {f"{rrs} (proportional)", f"{rrs} (dedup)"} < set(labels)
  assert labels[f"{rrs} (proportional)"]["branching"] == "proportional"
  gains = {r["method"]: r for r in report.paired_gains(records) if r["baseline"] == "kseq"}
  assert gains["rrs (proportional)"]["ratio"] == pytest.approx(2.0)
  assert "rrs (dedup)" not in gains  # its baseline would be kseq's tree cells: none here
  assert report.variant({"branching": "proportional", "tree": True}) == " (proportional, dedup)"
  assert report.variant({"tree": False}) == ""
  from matplotlib.axes import Axes

  drawn, real = [], Axes.errorbar

  def errorbar(ax, *args, **kw):
    drawn.append(kw["label"])
    return real(ax, *args, **kw)

  monkeypatch.setattr(Axes, "errorbar", errorbar)
  report.plot_block_efficiency(list(labels.values()), tmp_path / "be.png")
  assert {f"{rrs} (proportional) L=4", f"{rrs} (dedup) L=4"} <= set(drawn)  # a line each


def test_every_method_has_its_own_colour_and_inexact_rows_are_hollow(tmp_path, monkeypatch):
  """K-SEQ and RRS (once drawn alike) get their own colours, as does every multi-draft
  method; a row that is not exact is drawn hollow on its line."""
  from matplotlib.axes import Axes

  colours, hollow, real_bar, real_plot = {}, [], Axes.errorbar, Axes.plot

  def errorbar(ax, *args, **kw):
    colours[kw["label"]] = tuple(kw["color"])
    return real_bar(ax, *args, **kw)

  def plot(ax, *args, **kw):
    if kw.get("mfc") == "white":
      hollow.append(tuple(args[:2]))
    return real_plot(ax, *args, **kw)

  monkeypatch.setattr(Axes, "errorbar", errorbar)
  monkeypatch.setattr(Axes, "plot", plot)
  records = []
  for seed in (0, 1):
    for method in methods.names(speculative=True):
      if methods.get(method).multi_draft:
        records.append(_record(method, 4, 4, seed, [16, 16], [8, 8], 2.0))
  rows = report.summarize(records)
  bad = next(r for r in rows if r["method"] == "specinfer")
  bad["exact"] = False
  report.plot_block_efficiency(rows, tmp_path / "be.png")
  multi = [m for m in methods.METHODS.values() if m.multi_draft]
  assert len(colours) == len(multi) and len(set(colours.values())) == len(multi)
  assert hollow == [(4, bad["block_efficiency"])]


def _record(method, k, draft_len, seed, emitted, rounds, seconds, rho=None, pair="p", **shape):
  spec = DecodeSpec(method, k, draft_len, rho=rho or "star", max_new_tokens=16, **shape)
  prompts = Prompts(len(emitted), 8, False)
  cell = experiment.Cell(method, k, draft_len, rho, seed, spec, prompts, pair)
  return valid_record(
    cell.key,
    draft_len,
    len(emitted),
    cell=cell.as_record(),
    emitted=emitted,
    rounds=rounds,
    reached=[sum(rounds)] + [0] * draft_len,
    hits=[sum(rounds) // 2] + [0] * draft_len,
    timed_tokens=sum(emitted),
    decode_seconds=seconds,
    draft_params=1,
    target_params=10,
  )


def _records():
  records = []
  for seed in (0, 1):
    records.append(_record("autoregressive", 1, 0, seed, [16, 16], [16, 16], 1.0))
    records.append(_record("sd", 1, 4, seed, [16, 16], [8, 8], 2.0))
    records.append(_record("kseq", 4, 4, seed, [16, 16], [4, 6], 4.0, rho="star"))
    records.append(_record("kseq", 4, 4, seed, [16, 16], [5, 5], 4.0, rho=1.5))
  return records


def test_summarize_rows():
  rows = report.summarize(_records()[::-1])
  assert [(r["method"], r["K"], r["L"], r["rho"]) for r in rows] == [
    ("autoregressive", 1, 0, None),
    ("sd", 1, 4, None),
    ("kseq", 4, 4, "star"),
    ("kseq", 4, 4, 1.5),
  ]
  ar, sd, star, fixed = rows
  assert ar["block_efficiency"] == 1.0 and ar["speedup"] == 1.0 and ar["hit_at_1"] is None
  assert sd["block_efficiency"] == 2.0 and sd["speedup"] == pytest.approx(0.5)
  assert star["block_efficiency"] == pytest.approx(64 / 20)
  assert star["lower"] <= star["block_efficiency"] <= star["upper"]
  assert star["predicted_speedup"] == pytest.approx(metrics.predicted_speedup(3.2, 4, 0.1))
  assert star["latency_model"] == metrics.MEMORY_BOUND
  assert star["hit_at_1"] == pytest.approx(0.5) and star["samples"] == "2 x 2"
  assert fixed["rho_name"] == "rho=1.5" and star["rho_name"] == "rho*"


def test_an_adaptive_cell_is_labelled_and_costed_by_its_own_rounds():
  record = _record("kseq", 4, 4, 0, [16, 16], [4, 4], 1.0, rho="star", adaptive=0.3)
  record.update(draft_calls=[10, 10], target_positions=[40, 40])  # 2.5 calls, 10 positions
  (row,) = report.summarize([record])
  assert row["label"].endswith("(adaptive 0.3)")
  # Memory-bound model: a round costs 1 + 2.5 draft calls x 0.1.
  assert row["predicted_speedup"] == pytest.approx(4.0 / (1 + 2.5 * 0.1))


def test_a_budget_cell_is_labelled_and_compared_with_the_autoregressive_baseline():
  base = _record("autoregressive", 1, 0, 0, [16, 16], [16, 16], 1.0)
  budget = _record("rrs", 4, 4, 0, [16, 16], [4, 4], 2.0, dedup=True, node_budget=8.0)
  rows = report.summarize([base, budget])
  assert rows[1]["label"].endswith("(dedup, node budget 8)")
  assert rows[1]["speedup"] == pytest.approx(0.5)


def test_the_recommendation_is_the_exact_row_of_highest_predicted_speedup():
  rows = report.summarize(_records())
  line = report.recommendation(rows, None)
  best = max((r for r in rows if r["exact"]), key=lambda r: r["predicted_speedup"])
  assert line.startswith(f"Recommended: {best['label']} K={best['K']} L={best['L']}")
  assert "memory-bound" in line and "3 exact configurations ranked" in line
  # The inexact fixed-rho row is never recommended, whatever its figures.
  for row in rows:
    row["predicted_speedup"] = 9.0 if row["exact"] is not True else 1.0
  assert "rho=1.5" not in report.recommendation(rows, None)
  assert report.recommendation([], None).startswith("Recommended: none")


def test_the_planner_ranks_by_predicted_tokens_per_second(tmp_path):
  from experiments import plan

  _write(tmp_path, _records())
  costs = metrics.CostTable(
    device="cpu", jax_version="0", draft_params=1, target_params=10, dtype="float32", batch=2,
    draft_open_ms={1: 0.5, 4: 1.0}, draft_step_ms={1: 0.2, 4: 0.5}, target_ms={1: 1.0, 20: 4.0},
    verify_ms={"autoregressive:1:0": 0.1, "sd:1:4": 0.2, "kseq:4:4": 0.5}, overhead_ms=0.1,
  )  # fmt: skip
  text = plan.plan([tmp_path], costs, batch=2)
  lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
  speeds = [float(line.split("|")[-3].replace(",", "")) for line in lines[1:]]
  assert speeds == sorted(speeds, reverse=True) and len(speeds) == 3
  assert "rho=1.5" not in text  # not exact: never planned
  assert text.splitlines()[-1].startswith("Recommended: ") and "batch 2 on cpu" in text
  with pytest.raises(ValueError, match="measured at batch 2, not 8"):
    plan.plan([tmp_path], costs, batch=8)


def _write(directory, records, runs=("p",)):
  directory.mkdir(parents=True, exist_ok=True)
  lines = "".join(json.dumps(r) + "\n" for r in records)
  (directory / results.RESULTS_FILE).write_text(lines)
  provenance = "".join(
    json.dumps({"run": i, "pair": {"fingerprint": p}}) + "\n" for i, p in enumerate(runs)
  )
  (directory / results.PROVENANCE_FILE).write_text(provenance)


def test_write_report_tables_and_plots(tmp_path):
  records = _records() + [_record("kseq", 2, 4, 0, [16, 16], [6, 6], 3.0, rho="star")]
  _write(tmp_path, records)
  rows = []
  for k in (2, 4):
    rows += [
      {"K": k, "strategy": "rho*", "acceptance": 0.8, "optimal": 0.9, "gap": 0.1, "invalid": 0.0},
      {
        "K": k,
        "strategy": "rho=1",
        "acceptance": 0.95,
        "optimal": 0.9,
        "gap": -0.05,
        "invalid": 0.5,
      },
      {"K": k, "strategy": "specinfer", "acceptance": 0.7, "optimal": 0.9, "gap": 0.2},
      {"K": k, "strategy": "optimal", "acceptance": 0.9, "optimal": 0.9, "gap": 0.0},
    ]
  result = {"key": "k", "positions": 10, "single": 0.6, "rows": rows}
  (tmp_path / results.ANALYSIS_FILE).write_text(json.dumps(result))
  markdown = report.write_report(tmp_path)
  out = tmp_path / report.REPORT_DIR
  assert (out / "table.md").read_text() == markdown
  assert "| kseq | 4 | 4 | rho* | 3.20 |" in markdown and "rho=1.5" in markdown
  assert "| 4 | rho=1 | 0.9500 | 0.9000 | -0.0500 |" in markdown
  with open(out / "table.csv") as f:
    assert len(list(csv.DictReader(f))) == 5
  for name in ("block_efficiency_vs_K.png", "acceptance_vs_K.png"):
    png = (out / name).read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) < 100_000


def _costs():
  """A cost table of the records' pair with the autoregressive, sd and K-SEQ 4 x 4 rounds
  (no K = 2)."""
  return metrics.CostTable(
    device="cpu", jax_version="0.0", draft_params=1, target_params=10, dtype="float32",
    batch=2, draft_open_ms={1: 0.5, 4: 1.0}, draft_step_ms={1: 0.25, 4: 0.5},
    target_ms={1: 1.0, 5: 2.0, 20: 4.0},
    verify_ms={"autoregressive:1:0": 0.1, "sd:1:4": 0.2, "kseq:4:4": 0.5}, overhead_ms=0.1,
  )  # fmt: skip


def test_the_predicted_column_names_its_latency_model(tmp_path):
  """With a cost table the predicted speedup is block efficiency x t_AR / t_round of its
  measured rounds ('-' for rounds it lacks and for trees), and the column, the rows and
  the note under the table say which model it is; without one, the memory-bound model."""
  costs = _costs()
  records = _records() + [
    _record("kseq", 2, 4, 0, [16, 16], [6, 6], 3.0, rho="star"),
    _record("kseq", 4, 4, 0, [16, 16], [6, 6], 3.0, rho="star", dedup=True),
  ]
  rows = {(r["method"], r["K"], r["rho"], r["dedup"]): r for r in report.summarize(records, costs)}
  star = rows[("kseq", 4, "star", False)]
  assert star["latency_model"] == metrics.MEASURED
  assert star["predicted_speedup"] == pytest.approx(costs.speedup(3.2, "kseq", 4, 4))
  assert star["predicted_speedup"] == pytest.approx(3.2 * 1.2 / (1.0 + 1.5 + 4.0 + 0.5 + 0.1))
  assert rows[("kseq", 2, "star", False)]["predicted_speedup"] is None
  assert rows[("kseq", 4, "star", True)]["predicted_speedup"] is None
  assert rows[("autoregressive", 1, None, False)]["predicted_speedup"] == pytest.approx(1.0)
  _write(tmp_path, records)
  measured = report.write_report(tmp_path, costs=costs)
  assert f"speedup (predicted: {metrics.MEASURED})" in measured
  assert metrics.MEMORY_BOUND not in measured and costs.describe() in measured
  with open(tmp_path / report.REPORT_DIR / "table.csv") as f:
    assert {r["latency_model"] for r in csv.DictReader(f)} == {metrics.MEASURED}
  memory_bound = report.write_report(tmp_path)
  assert f"speedup (predicted: {metrics.MEMORY_BOUND})" in memory_bound
  assert metrics.MEASURED not in memory_bound


def test_report_keeps_the_configs_cells_of_the_latest_pair(tmp_path):
  config = SweepConfig.from_dict(lm1b_spectr.get_config("test").to_dict())
  cells = experiment.expand(config, "new")
  records = [
    valid_record(c.key, c.draft_len, c.prompts.num_prompts, cell=c.as_record()) for c in cells
  ]
  old = [dict(r, key=r["key"] + "-old", cell=dict(r["cell"], pair="old")) for r in records]
  _write(tmp_path, old[:1] + records[:2] + old[1:], runs=("old", "new"))
  assert results.latest_pair_fingerprint(tmp_path) == "new"
  keys = [c.key for c in experiment.expand(config, results.latest_pair_fingerprint(tmp_path))]
  kept = report.records_for(tmp_path, keys)
  assert [r["key"] for r in kept] == [c.key for c in cells[:2]]
  assert len(report.records_for(tmp_path)) == len(old) + 2


def test_report_entry_point(tmp_path):
  _write(tmp_path, _records())
  run = subprocess.run(
    [sys.executable, "-m", "experiments.report", f"--results_dir={tmp_path}"],
    cwd=_REPO,
    capture_output=True,
    text=True,
    check=True,
  )
  assert "| sd | 1 | 4 | - | 2.00 |" in run.stdout
  assert metrics.MEMORY_BOUND in run.stdout
  _costs().save(tmp_path / "costs.json")
  run = subprocess.run(
    [sys.executable, "-m", "experiments.report", f"--results_dir={tmp_path}",
     f"--cost_table={tmp_path / 'costs.json'}"],
    cwd=_REPO, capture_output=True, text=True, check=True,
  )  # fmt: skip
  assert f"speedup (predicted: {metrics.MEASURED})" in run.stdout


def _counted(record, invalid, overshoot):
  """`record` with the per-position exactness counts of a sweep (issue 24)."""
  length = record["cell"]["draft_len"] + 1
  return dict(record, invalid=[invalid] + [0] * (length - 1), overshoot=[overshoot] * length)


def test_an_inexact_rho_is_ranked_apart_and_marked(tmp_path):
  """Issue 24: K-SEQ at rho = 1.5 with invalid positions led the ablation's table (its
  block efficiency above every exact method's) with nothing saying it is not exact."""
  records = []
  for record in _records():
    fixed = record["cell"]["rho"] == 1.5
    records.append(_counted(record, 3 if fixed else 0, 0.02 if fixed else 0.0))
  # The inexact row has the largest block efficiency of all.
  records = [dict(r, rounds=[2, 2]) if r["cell"]["rho"] == 1.5 else r for r in records]
  rows = report.summarize(records)
  assert [r["exact"] for r in rows] == [True, True, True, False]
  fixed = rows[-1]
  assert fixed["rho"] == 1.5 and fixed["block_efficiency"] == max(
    r["block_efficiency"] for r in rows
  )
  reached = sum(sum(r["reached"][:4]) for r in records if r["cell"]["rho"] == 1.5)
  assert fixed["invalid"] == pytest.approx(6 / reached)
  _write(tmp_path, records)
  markdown = report.write_report(tmp_path)
  exact_part, inexact_part = markdown.split("## Not exact")
  assert "rho=1.5" not in exact_part and "| kseq | 4 | 4 | rho* |" in exact_part
  assert "| kseq | 4 | 4 | rho=1.5 | 8.00 |" in inexact_part


def test_cells_that_decoded_nothing_are_left_out_and_named(tmp_path):
  """Issue 24: cells of 0 tokens (non-finite weights) made the report divide by zero."""
  records = _records()
  dead = [
    dict(r, emitted=[0, 0], rounds=[0, 0], timed_tokens=0)
    for r in records
    if r["cell"]["method"] in ("autoregressive", "sd")
  ]
  keep = [r for r in records if r["cell"]["method"] not in ("autoregressive", "sd")]
  _write(tmp_path, keep + dead)
  markdown = report.write_report(tmp_path)
  assert "## Cells left out" in markdown
  assert markdown.count("(key ") == len(dead)
  rows = report.summarize(keep + dead)
  assert {r["method"] for r in rows} == {"kseq"} and all(r["speedup"] is None for r in rows)
