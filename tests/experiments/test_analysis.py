"""(p, q) along trajectories and the rho ablation: agreement with the acceptance module."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import field_methods
from configs import rho_ablation as rho_ablation_config
from spectr_jax import acceptance, analysis, data, methods, results
from spectr_jax.sweep_config import RhoAblationConfig
from tests.experiments.test_experiment import random_pair


@pytest.fixture(scope="module")
def pair():
  return random_pair()


def _pairs(num, v, seed=0):
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.full(v, 0.5), num).astype(np.float32)
  q = rng.dirichlet(np.full(v, 0.5), num).astype(np.float32)
  # The SPEC examples: rho* = 1.5 > 1, yet rho = 1 is exact for the first; not for the second.
  p[0], q[0] = np.pad([0.5, 0.0, 0.5], (0, v - 3)), np.pad([1.0, 0.0, 0.0], (0, v - 3))
  p[1], q[1] = np.pad([0.6, 0.4], (0, v - 2)), np.pad([0.3, 0.7], (0, v - 2))
  return p, q


def test_position_metrics_agree_with_the_acceptance_module():
  p, q = _pairs(6, 5)
  rhos = ("star", "k", 1.0, 1.5)
  metrics = analysis.position_metrics(jnp.asarray(p), jnp.asarray(q), 2, rhos)
  for i in range(len(p)):
    for rho in rhos:
      exact = acceptance.kseq_acceptance(p[i], q[i], 2, rho)
      got = metrics[results.strategy_name(rho)]
      for field in ("hit", "p_accept", "deficit", "rho"):
        assert got[field][i] == pytest.approx(float(getattr(exact, field)), abs=1e-6)
    assert metrics["specinfer"]["hit"][i] == pytest.approx(
      float(acceptance.specinfer_acceptance(p[i], q[i], 2)), abs=1e-6
    )
    assert metrics["optimal"]["hit"][i] == pytest.approx(
      float(acceptance.optimal_acceptance(p[i], q[i], 2)), abs=1e-6
    )
    assert metrics["single"]["hit"][i] == pytest.approx(np.minimum(p[i], q[i]).sum(), abs=1e-6)
  assert metrics["optimal"]["hit"][1] == pytest.approx(0.94, abs=1e-6)
  # Drafts without replacement: RRS beside the bound of its own drafting scheme.
  wor_bound = acceptance.wor_bound_X(p, q, 2)
  np.testing.assert_allclose(metrics["optimal:wor"]["hit"], wor_bound, atol=1e-7)
  np.testing.assert_allclose(metrics["rrs"]["hit"], acceptance.rrs_acceptance_X(p, q, 2).hit)
  assert np.all(metrics["rrs"]["hit"] <= wor_bound + 1e-6)


def test_summary_separates_below_rho_star_from_invalid():
  p, q = _pairs(2, 3)
  metrics = analysis.position_metrics(jnp.asarray(p), jnp.asarray(q), 2, ("star", 1.0))
  rows = {r["strategy"]: r for r in analysis.summarize_metrics(metrics, 2, ("star", 1.0))}
  assert list(rows) == ["rho*", "rho=1", "specinfer", "optimal", "rrs", "certain"]
  assert rows["rrs"]["drafting"] == "wor" and rows["specinfer"]["drafting"] == "iid"
  # Top-k trees: "certain" reaches its law's bound (q's mass on the top-k tokens).
  assert rows["certain"]["drafting"] == "topk" and rows["certain"]["gap"] == 0.0
  assert rows["rrs"]["optimal"] == pytest.approx(float(np.mean(metrics["optimal:wor"]["hit"])))
  assert rows["specinfer"]["bound"] == "optimal alpha*"
  assert rows["rho=1"]["below_star"] == 1.0  # rho* = 1.5 at both positions ...
  assert rows["rho=1"]["invalid"] == 0.5  # ... but rho = 1 is exact at the first
  assert rows["rho*"]["invalid"] == 0.0 and rows["rho*"]["below_star"] == 0.0
  assert rows["optimal"]["gap"] == 0.0 and rows["rho*"]["gap"] >= 0.0
  assert rows["rho*"]["positions"] == 2 and "invalid" not in rows["specinfer"]


def test_a_named_scheme_puts_each_method_beside_its_own_laws_bound():
  """With a drafting scheme named (a toy i.i.d. scheme), the rows are the methods exact
  for its law, each beside that scheme's bound; RRS (exact for drafts without
  replacement only) has no row."""
  from tests import toy_drafting

  p, q = _pairs(2, 3)
  scheme = toy_drafting.SCHEME.name
  metrics = analysis.position_metrics(jnp.asarray(p), jnp.asarray(q), 2, ("star",), scheme)
  rows = analysis.summarize_metrics(metrics, 2, ("star",), scheme)
  assert [r["strategy"] for r in rows] == ["rho*", "specinfer", "optimal"]
  assert {r["drafting"] for r in rows} == {scheme}
  assert {r["bound"] for r in rows} == {toy_drafting.SCHEME.bound_label}
  np.testing.assert_allclose(metrics[f"optimal:{scheme}"]["hit"], metrics["optimal"]["hit"])


@pytest.mark.slow
def test_trajectories_hold_the_models_distributions(pair):
  prompts = data.make_prompts(pair.heldout, 3, 4, seed=0)
  traj = analysis.collect_trajectories(pair.draft, pair.target, prompts, 5, jax.random.key(0))
  tokens = np.asarray(traj.tokens_BxW)
  assert traj.p_BxTxV.shape == traj.q_BxTxV.shape == (3, 5, pair.target.config.vocab_size)
  np.testing.assert_allclose(np.asarray(traj.q_BxTxV).sum(-1), 1.0, atol=1e-5)
  for b in range(3):
    n = prompts.lengths_B[b]
    np.testing.assert_array_equal(tokens[b, :n], prompts.tokens_BxP[b, :n])
    # Before sample t (at position n + t), each model's law after the n + t tokens before it.
    for model, probs in ((pair.target, traj.q_BxTxV), (pair.draft, traj.p_BxTxV)):
      causal = analysis.next_token_probs(model, jnp.asarray(tokens[b : b + 1]), 1.0)[0]
      np.testing.assert_allclose(probs[b], causal[n - 1 : n + 4], atol=1e-5)


def test_trajectories_mark_positions_after_eos(pair):
  tokens = jnp.asarray([[2, 5, 6, data.EOS_ID, 7, 8, 0], [2, 5, 6, 7, 8, 9, 0]], jnp.int32)
  _, _, in_sentence = analysis.distributions(
    pair.draft, pair.target, tokens, jnp.asarray([2, 2]), 4, jnp.float32(1.0)
  )
  np.testing.assert_array_equal(in_sentence, [[1, 1, 0, 0], [1, 1, 1, 1]])


@pytest.mark.slow
def test_rho_ablation_runs_and_caches(pair, tmp_path, monkeypatch):
  config = RhoAblationConfig.from_dict(rho_ablation_config.get_config("test").to_dict())
  sweep = dataclasses.replace(
    config.sweep, results_dir=str(tmp_path), methods=("autoregressive",), shard=False
  )
  config = dataclasses.replace(config, sweep=sweep)
  records, result = analysis.run_rho_ablation(config, pair)
  assert len(records) == len(sweep.seeds)
  rows = result["rows"]
  assert [(r["K"], r["strategy"]) for r in rows] == [
    (k, s)
    for k in (2, 4)
    for s in ("rho*", "rho=K", "rho=1", "specinfer", "optimal", "rrs", "certain")
  ]
  assert result["positions"] == config.analysis.num_prompts * config.analysis.num_tokens
  for row in rows:
    assert 0.0 <= row["acceptance"] <= 1.0 + 1e-6
    if row.get("invalid", 0.0) == 0.0:
      assert row["gap"] >= -1e-6  # exact strategies stay below the bound
  assert json.loads((tmp_path / results.ANALYSIS_FILE).read_text()) == result

  monkeypatch.setattr(analysis, "rho_ablation", lambda *a: pytest.fail("not cached"))
  assert analysis.run_rho_ablation(config, pair)[1] == result


@pytest.mark.parametrize("arg", [None, "test"])
def test_field_methods_config_converts(arg):
  config = RhoAblationConfig.from_dict(field_methods.get_config(arg).to_dict())
  assert config.sweep.methods == field_methods.METHODS
  assert set(field_methods.METHODS) <= set(methods.names()) and config.sweep.rhos == ("star",)
  assert config.sweep.name.startswith("field_methods")
  if arg is None:  # The measurement of docs/BLOCK_VERIFICATION.md: 3 seeds x 100 prompts.
    assert (config.sweep.seeds, config.sweep.prompts.num_prompts) == ((0, 1, 2), 100)
    assert (config.sweep.num_drafts, config.sweep.draft_lens) == ((2, 4, 8), (4, 8))
    assert config.sweep.pair.draft_workdir == "draft-distill-runlocal"
