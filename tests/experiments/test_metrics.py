"""The latency models: a round's predicted time from a cost table, and its JSON file."""

import pytest

from spectr_jax import metrics


def _table(**kw):
  values = dict(
    device="cpu",
    jax_version="0.0",
    draft_params=10,
    target_params=100,
    dtype="float32",
    batch=4,
    draft_open_ms={1: 0.5, 4: 1.1},
    draft_step_ms={1: 0.2, 4: 0.8},
    target_ms={1: 1.0, 5: 2.0, 20: 5.0},
    verify_ms={"autoregressive:1:0": 0.1, "sd:1:4": 0.3, "kseq:4:4": 0.9, "kseq:2:4": 0.6},
    overhead_ms=0.2,
  )
  return metrics.CostTable(**{**values, **kw})


def test_round_is_the_sum_of_its_parts():
  table = _table()
  assert table.round_ms("autoregressive", 1, 0) == pytest.approx(1.0 + 0.1 + 0.2)
  # The opening call, L - 1 = 3 steps, a target call on K(L + 1) = 5 positions, the walk.
  assert table.round_ms("sd", 1, 4) == pytest.approx(0.5 + 3 * 0.2 + 2.0 + 0.3 + 0.2)
  assert table.round_ms("kseq", 4, 4) == pytest.approx(1.1 + 3 * 0.8 + 5.0 + 0.9 + 0.2)


def test_an_adaptive_round_costs_its_mean_draft_calls_and_positions():
  table = _table()
  # K = 4, L = 4, on average 2.5 draft calls and 10 target positions per round.
  target = 2.0 + (5.0 - 2.0) * 5 / 15
  expected = 1.1 + 1.5 * 0.8 + target + 0.9 + 0.2
  assert table.round_ms("kseq", 4, 4, draft_calls=2.5, positions=10) == pytest.approx(expected)
  assert table.round_ms("kseq", 4, 4, draft_calls=4, positions=20) == table.round_ms("kseq", 4, 4)
  fast = table.speedup(2.0, "kseq", 4, 4, draft_calls=2.5, positions=10)
  assert fast == pytest.approx(2.0 * 1.3 / expected) and fast > table.speedup(2.0, "kseq", 4, 4)


def test_unmeasured_counts_are_interpolated_linearly():
  table = _table()
  # K = 2: a third of the way from K = 1 to 4; 10 positions: 5/15 of the way from 5 to 20.
  draft = 0.5 + (1.1 - 0.5) / 3 + 3 * (0.2 + (0.8 - 0.2) / 3)
  target = 2.0 + (5.0 - 2.0) * 5 / 15
  assert table.round_ms("kseq", 2, 4) == pytest.approx(draft + target + 0.6 + 0.2)


def test_rounds_outside_the_table_are_not_covered():
  table = _table()
  assert table.covers("kseq", 4, 4)
  assert not table.covers("specinfer", 4, 4)  # no walk measured
  assert not table.covers("kseq", 8, 4)  # K and 40 positions beyond the measured ones
  with pytest.raises(KeyError, match="outside the measured"):
    table.round_ms("kseq", 8, 4)


def test_speedup_and_tokens_per_s():
  table = _table()
  ar, sd = table.round_ms("autoregressive", 1, 0), table.round_ms("sd", 1, 4)
  assert table.speedup(2.5, "sd", 1, 4) == pytest.approx(2.5 * ar / sd)
  assert table.speedup(1.0, "autoregressive", 1, 0) == pytest.approx(1.0)
  assert table.tokens_per_s(2.5, "sd", 1, 4) == pytest.approx(4 * 2.5 / (1e-3 * sd))


def test_json_round_trip(tmp_path):
  table = _table()
  path = tmp_path / "sub" / "costs.json"
  table.save(path)
  loaded = metrics.CostTable.load(path)
  assert loaded == table
  assert loaded.round_ms("kseq", 4, 4) == table.round_ms("kseq", 4, 4)
  assert "cpu" in loaded.describe() and "batch 4" in loaded.describe()


def test_memory_bound_model():
  assert metrics.predicted_speedup(3.0, 4, 0.25) == pytest.approx(1.5)
  assert metrics.predicted_speedup(1.0, 0, 0.25) == 1.0


@pytest.mark.slow
def test_bench_decode_measures_a_table_that_covers_its_configs(tmp_path):
  """scripts/bench_decode.py on test models: one cost table from the same run as the
  rows, covering every configuration, predicting the autoregressive round exactly (its
  overhead is measured on it), saved and loaded unchanged. No timing is asserted."""
  import jax
  import jax.numpy as jnp

  from spectr_jax.decode_spec import DecodeSpec
  from spectr_jax.models import ModelBundle, get_model_config, init_params
  from tests.decoding.test_profile_round import _script

  bench_decode = _script("bench_decode")
  v, b, width = 16, 2, 4
  configs = [get_model_config(name, v, max_len=32) for name in ("draft-test", "target-test")]
  draft, target = (ModelBundle(c, init_params(c, jax.random.key(i))) for i, c in enumerate(configs))
  prompts, lengths = jnp.ones((b, width), jnp.int32), jnp.full((b,), width)
  specs = bench_decode.parse_specs("autoregressive, kseq:2:3", max_new_tokens=16)
  assert specs == [
    DecodeSpec("autoregressive", max_new_tokens=16),
    DecodeSpec("kseq", 2, 3, max_new_tokens=16),
  ]
  grid = [bench_decode.cost_key(s) for s in specs]
  # 16 tokens and 3 repeats: enough rounds for the timer to resolve one (bench_decode
  # stops with an error where the run of every round is not slower than the one-round run).
  rows, costs = bench_decode.bench(draft, target, prompts, lengths, specs, repeats=3)
  assert sorted(costs.draft_open_ms) == [2] and sorted(costs.draft_step_ms) == [2]
  assert sorted(costs.target_ms) == [1, 8] and costs.batch == b
  assert all(costs.covers(*c) for c in grid)
  assert rows[0]["predicted_over_round"] == pytest.approx(1.0)
  assert [r["predicted_ms"] for r in rows] == [costs.round_ms(*c) for c in grid]
  costs.save(tmp_path / "costs.json")
  assert metrics.CostTable.load(tmp_path / "costs.json") == costs
  assert [r["config"] for r in rows] == ["autoregressive", "kseq:2:3"]
  assert bench_decode.format_table(rows).count("\n") == 3
  assert "overhead_ms" in bench_decode.format_costs(costs)
