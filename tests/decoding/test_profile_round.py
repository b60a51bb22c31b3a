"""scripts/profile_round.py: the engine's operations are attributed to the round's phases."""

import importlib.util
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

from spectr_jax import engine, timing
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params

_SCRIPTS = pathlib.Path(__file__).parents[2] / "scripts"


def _script(name):
  """The module of scripts/<name>.py (which imports bench_decode beside it)."""
  sys.path.insert(0, str(_SCRIPTS))
  try:
    spec = importlib.util.spec_from_file_location(name, _SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(_SCRIPTS))
  return module


@pytest.fixture(scope="module")
def profile_round():
  return _script("profile_round")


@pytest.mark.slow
def test_every_phase_of_a_round_gets_its_operations_and_time(profile_round):
  v, b, width, n = 64, 2, 4, 12
  configs = [get_model_config(name, v, max_len=32) for name in ("draft-test", "target-test")]
  draft, target = (ModelBundle(c, init_params(c, jax.random.key(i))) for i, c in enumerate(configs))
  spec = DecodeSpec.parse("kseq:2:3", max_new_tokens=n)
  prompts, lengths = jnp.ones((b, width), jnp.int32), jnp.full((b,), width)
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=lengths)
  text = engine.lower(jax.random.key(0), spec, **kw).compile().as_text()
  phases = profile_round.op_phases(text)
  assert set(profile_round.PHASES) <= set(phases.values())
  assert "" in phases.values()  # the prefill, outside the loop of rounds

  def run():
    return engine.generate(jax.random.key(0), spec, **kw)

  split, thunks = profile_round.phase_split(run, text, repeats=1)
  assert thunks > 0
  for phase in ("draft", "score", "verify", "commit"):
    assert split.get(phase, 0.0) > 0, (phase, split)
  assert split["score"] > split["stats"]


@pytest.mark.slow
def test_busy_and_span_of_a_loop(profile_round):
  """A jitted loop's operations are found in the trace: at least the matmul and the
  elementwise fusion of each of its 8 steps per call, with positive summed and spanned
  times."""
  fn = jax.jit(lambda x: jax.lax.fori_loop(0, 8, lambda _, y: jnp.sin(y @ y.T) + 1.0, x))
  ops, busy, span = profile_round.busy_and_span(fn, (jnp.ones((64, 64)),), repeats=2)
  assert ops >= 16 and busy > 0 and span > 0


@pytest.mark.slow
def test_bench_tree_prints_tails_beside_dedup():
  """scripts/bench_tree.py (also run by bench_device.py): both kinds of round (tails and
  dedup) on the same prompts and keys give the same block efficiency, dedup scores no more
  positions, and every timer of the table is filled."""
  bench_tree = _script("bench_tree")
  v, b, width = 8, 3, 4
  configs = [get_model_config(name, v, max_len=32) for name in ("draft-test", "target-test")]
  draft, target = (ModelBundle(c, init_params(c, jax.random.key(i))) for i, c in enumerate(configs))
  prompts = (jnp.ones((b, width), jnp.int32), jnp.full((b,), width))
  specs = bench_tree.parse_configs("kseq:3:2", max_new_tokens=6)
  (row,) = bench_tree.compare(draft, target, prompts, prompts, specs, repeats=1)
  assert row["config"] == "kseq:3:2"
  assert row["be_dedup"] == pytest.approx(row["be_tails"], abs=0.2)  # same draws, float32 aside
  assert row["pos_tails"] == 9 and 3 <= row["pos_dedup"] <= 9
  assert row["nodes"] <= row["pos_dedup"]
  assert all(row[k] > 0 for k in ("target_tails", "target_dedup", "round_tails", "round_dedup"))
  assert bench_tree.format_rows([row]).count("\n") == 2


def test_node_budgets_group_paths_and_static_trees():
  bench_tree = _script("bench_tree")
  assert bench_tree.node_cap(8, 4, None) == 32  # i.i.d. paths: up to K L distinct nodes
  assert bench_tree.node_cap(8, 4, (4, 2, 1, 1)) == 4 + 8 + 8 + 8
  assert bench_tree.parse_configs("rrs:8:4:proportional") == [
    DecodeSpec("rrs", 8, 4, branching="proportional")
  ]
  assert bench_tree.node_cap(8, 4, "proportional") == 32
  assert bench_tree.node_cap(8, 4, "") == 32
  # Branching as DecodeSpec writes it, or with dashes (the script's older form).
  configs = bench_tree.parse_configs("kseq:8:4,rrs:8:4:4x2x1x1,kseq:4:4,rrs/wor:8:4:2-2-2-1")
  assert configs[3] == DecodeSpec("rrs", 8, 4, branching=(2, 2, 2, 1))
  groups = bench_tree.by_budget(configs, [32, 16])
  assert {b: [(s.label(), cap) for s, cap in g] for b, g in groups.items()} == {
    16: [("kseq:4:4", 16)],
    32: [("kseq:8:4", 32), ("rrs:8:4:4x2x1x1", 28), ("rrs:8:4:2x2x2x1", 22)],
  }
  with pytest.raises(ValueError, match="above every budget"):
    bench_tree.by_budget(configs, [16])


@pytest.mark.slow
def test_bench_tree_node_budget_table():
  """--budgets: two configs of one budget decoded as trees on the same prompts, the
  second compared with the first (the first with itself: exactly 0)."""
  bench_tree = _script("bench_tree")
  v, b, width = 8, 3, 4
  configs = [get_model_config(name, v, max_len=32) for name in ("draft-test", "target-test")]
  draft, target = (ModelBundle(c, init_params(c, jax.random.key(i))) for i, c in enumerate(configs))
  prompts = (jnp.ones((b, width), jnp.int32), jnp.full((b,), width))
  configs = bench_tree.parse_configs("kseq:2:2,rrs:2:2", max_new_tokens=4)
  rows = bench_tree.budget_rows(draft, target, prompts, configs, [4])
  assert [(r["budget"], r["config"], r["cap"]) for r in rows] == [
    (4, "kseq:2:2", 4),
    (4, "rrs:2:2", 4),
  ]
  assert rows[0]["vs_first"] == "+0.000 [+0.000, +0.000]"
  assert all(1 < r["nodes"] <= r["cap"] + 1 and r["be"] >= 1 for r in rows)  # + the root
  assert bench_tree.format_rows(rows, bench_tree.BUDGET_COLS).count("\n") == 3


@pytest.mark.slow
def test_the_device_check_measures_every_row_beside_its_roofline(tmp_path):
  """scripts/bench_roofline.py --small (the device check's CPU smoke test): every row
  of one batch size is written, each model call and the walk a positive time, each round
  a positive time or a mark that timer noise left it unresolved (then no ratio, share or
  projection), the resolved rounds a walk share and, at batch 1, a projected speedup."""
  bench_roofline = _script("bench_roofline")
  out = tmp_path / "roofline.json"
  argv = ["bench_roofline.py", "--small", "--batches", "1", "--configs", "kseq:2:2"]
  argv += ["--max_new_tokens", "16", "--repeats", "3", "--block_efficiency", "kseq:2:2=2.0"]
  bench_roofline.FLAGS([*argv, "--json", str(out)])  # its own flags (absl), parsed
  bench_roofline.main(argv[:1])
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["row"] for r in rows] == [
    "autoregressive step",
    "draft step, K = 2",
    "target call, 6 positions",
    "walk kseq:2:2",
    "kseq:2:2 round, tails",
    "kseq:2:2 round, dedup",
  ]
  # Single model calls and the walk are timed directly: always resolved.
  assert all(r["ms"] > 0 for r in rows[1:4])
  assert all(r["ratio"] > 0 for r in rows if "roofline_ms" in r and r["ms"] is not None)
  # A round is a difference of two runs: positive, or marked not resolved (under this
  # machine's load and --repeats 1 it may be), never a negative time.
  rounds = [r for r in rows if "round" in r["row"] or r["row"] == "autoregressive step"]
  assert all(r["ms"] is None or r["ms"] > 0 for r in rounds)
  for r in rounds[1:]:
    assert r["ms"] is None or 0 < r["share"] < 1
    if rows[0]["ms"] is None or r["ms"] is None:
      assert r["projected"] is None
    else:
      assert r["projected"] > 0


def test_a_round_time_is_positive_or_not_resolved():
  """timing.seconds_per_round: the difference of the two runs per round, None (not
  resolved) where timer noise leaves it zero or negative; never a negative time."""
  assert timing.seconds_per_round(1.0, 0.5, 5) == pytest.approx(0.1)
  assert timing.seconds_per_round(1.0, 0.5, 0) == pytest.approx(0.5)
  assert timing.seconds_per_round(0.5, 0.5, 5) is None
  assert timing.seconds_per_round(0.4, 0.5, 5) is None


@pytest.mark.slow
def test_bench_adaptive_compares_adaptive_with_static_rounds_on_the_same_prompts(capsys):
  """scripts/bench_adaptive.py --small: every configuration's row, and each adaptive one
  (a draft length, a tree budget) against a static one with a paired interval around
  each ratio."""
  bench_adaptive = _script("bench_adaptive")
  bench_adaptive.FLAGS(["bench_adaptive.py", "--small"])
  bench_adaptive.main(["bench_adaptive.py"])
  out = capsys.readouterr().out
  for config in ("kseq K=3 L=2", "kseq K=3 L=2 adaptive 0.3", "rrs K=3 L=1", "rrs K=3 L=2",
                 "rrs K=3 L=2 budget 3"):  # fmt: skip
    assert f"| {config} |" in out
  for adaptive, static in (("kseq K=3 L=2 adaptive 0.3", "kseq K=3 L=2"),
                           ("rrs K=3 L=2 budget 3", "rrs K=3 L=2")):  # fmt: skip
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {adaptive} | {static} (")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    for cell in cells[2:7]:  # tokens / round, / position, / node; nodes, draft positions
      ratio, lower, upper = map(
        float, cell.replace("[", "").replace("]", "").replace(",", "").split()
      )
      assert lower <= ratio <= upper
