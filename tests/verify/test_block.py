"""Block verification ("block", "gbv") and the block-level LP bound ("gbv_tp":
tests/verify/test_gbv_tp.py).

Exactness is checked twice: exactly, by enumerating every K-tuple of draft paths and the
verifier's own plan (`block_bound.block_law`, no sampling), and statistically, by
sampling `block.block_verify` end to end and completing each output with exact target
draws (as tests/verify/test_verify.py does for `methods.verify_drafts`), chi-square at
the suite's level.
Broken variants (no residual correction; the wrong draft law) must be rejected.
"""

import importlib.util
import itertools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, block, block_bound, methods, optimal, sampling
from spectr_jax.testing import sequences
from tests import stats

N = 100_000
N_GBV = 30_000  # gbv runs optimal_plan per depth (sequential passes under vmap): fewer draws
TOY_P, TOY_Q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])


def _tree(seed, vocab, draft_len, conc=0.7):
  return sequences.random_tree(np.random.default_rng(seed), vocab, draft_len, concentration=conc)


def _sd_value(p_tab, q_tab, draft_len):
  """Exact E[tokens] of token-level "sd": 1 + sum over prefixes x^i of
  p(x^i) prod_{j <= i} min(1, q(x_j | x^{j-1}) / p(x_j | x^{j-1}))."""
  vocab = p_tab.shape[-1]
  value = 1.0
  for length in range(1, draft_len + 1):
    for prefix in itertools.product(range(vocab), repeat=length):
      prob, accept, code = 1.0, 1.0, 0
      for t, x in enumerate(prefix):
        prob *= p_tab[t, code, x]
        accept *= min(1.0, q_tab[t, code, x] / p_tab[t, code, x])
        code = code * vocab + x
      value += prob * accept
  return value


def test_sd_value_matches_closed_form():
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  assert _sd_value(p_tab, q_tab, 2) == pytest.approx(19 / 9)


def test_toy_example_block_is_20_over_9():
  """Sun et al.'s example: token verification 19/9, block verification 20/9 (optimal)."""
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  assert block_bound.block_value(p_tab, q_tab, 1, 2) == pytest.approx(20 / 9, abs=1e-6)
  assert block_bound.block_bound(p_tab, q_tab, 1, 2) == pytest.approx(20 / 9, abs=1e-9)
  assert _sd_value(p_tab, q_tab, 2) == pytest.approx(19 / 9)


@pytest.mark.parametrize("vocab, draft_len", [(2, 1), (2, 3), (3, 2), (4, 2)])
def test_block_never_below_sd(vocab, draft_len):
  for seed in range(6):
    p_tab, q_tab = _tree(100 + seed, vocab, draft_len, conc=(0.3, 1.0, 3.0)[seed % 3])
    block_value = block_bound.block_value(p_tab, q_tab, 1, draft_len)
    assert block_value >= _sd_value(p_tab, q_tab, draft_len) - 1e-5


@pytest.mark.parametrize(
  "num_drafts, vocab, draft_len", [(1, 3, 2), (1, 2, 3), (2, 3, 2), (3, 2, 2)]
)
def test_exact_output_law_by_enumeration(num_drafts, vocab, draft_len):
  """Sum over every K-tuple of paths of the plan's exact output law = the target law."""
  p_tab, q_tab = _tree(7, vocab, draft_len)
  law, num_law = block_bound.block_law(p_tab, q_tab, num_drafts, draft_len)
  np.testing.assert_allclose(law, sequences.target_law(q_tab, draft_len), atol=2e-6)
  value = block_bound.block_value(p_tab, q_tab, num_drafts, draft_len)
  assert num_law @ np.arange(draft_len + 2) == pytest.approx(value, abs=1e-5)


@pytest.mark.parametrize(
  "num_drafts, vocab, draft_len", [(1, 3, 2), (2, 2, 2), (3, 2, 2), (2, 3, 1)]
)
def test_bound_is_block_for_one_draft_and_above_gbv(num_drafts, vocab, draft_len):
  p_tab, q_tab = _tree(11, vocab, draft_len, conc=1.0)
  bound = block_bound.block_bound(p_tab, q_tab, num_drafts, draft_len)
  value = block_bound.block_value(p_tab, q_tab, num_drafts, draft_len)
  assert 1.0 <= bound <= draft_len + 1 + 1e-9
  if num_drafts == 1:
    assert value == pytest.approx(bound, abs=1e-5)  # Sun et al.: block verification is optimal
  else:
    assert value <= bound + 1e-5


@pytest.mark.parametrize("k", [3])
def test_selection_law(k):
  """The selection's exact law (summed over all k-tuples) and its sampled law are r."""
  rng = np.random.default_rng(k)
  p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
  plan = optimal.optimal_plan(jnp.float32(p), jnp.float32(q), k)
  r = np.asarray(plan.r_V, np.float64)
  levels, slot = np.asarray(plan.levels_Vs1, np.float64), np.asarray(plan.slot_V)
  exact = np.zeros(5)
  for x in itertools.product(range(5), repeat=k):
    for z, prob in block_bound.selection_probs(x, levels, slot).items():
      exact[z] += np.prod(p[list(x)]) * prob
  np.testing.assert_allclose(exact, r, atol=1e-6)

  @jax.jit
  @jax.vmap
  def sample(key):
    draft_key, level_key, pick_key = jax.random.split(key, 3)
    x_K = jax.vmap(sampling.categorical, (0, None))(jax.random.split(draft_key, k), p)
    index = optimal.select(
      jax.random.uniform(level_key), jax.random.uniform(pick_key), x_K, jnp.ones(k, bool), plan
    )
    return x_K[index]

  z = np.asarray(sample(jax.random.split(jax.random.key(k), N_GBV)))
  stats.assert_law(np.bincount(z, minlength=5), r / r.sum(), f"selection k={k}")


# End to end: sampled blocks completed with exact target draws.


def _sample_blocks(key, p_tab, q_tab, num_drafts, draft_len, verify_fn, n=N):
  return sequences.sample_blocks(key, p_tab, q_tab, num_drafts, draft_len, verify_fn, n)


def _fresh(key, drafts, p, q):
  """The verifier traced afresh, so that monkeypatched helpers take effect."""
  tokens_L1, num, _ = block.verify_paths(key, drafts, p, q)
  return tokens_L1, num


@pytest.mark.parametrize(
  "method, num_drafts, vocab, draft_len, n",
  [
    ("block", 1, 3, 2, N),
    pytest.param("gbv", 3, 3, 2, N_GBV, marks=pytest.mark.slow),
    pytest.param("gbv", 2, 2, 3, N, marks=pytest.mark.slow),
  ],
)
def test_sampled_sequence_law_and_tokens_per_round(method, num_drafts, vocab, draft_len, n):
  p_tab, q_tab = _tree(3, vocab, draft_len)

  def verify_fn(key, d, p, q):
    return block.block_verify(key, d, p, q, method=method)

  codes, nums = _sample_blocks(
    jax.random.key(5), p_tab, q_tab, num_drafts, draft_len, verify_fn, n=n
  )
  law = sequences.target_law(q_tab, draft_len)
  stats.assert_law(np.bincount(codes, minlength=law.size), law, f"{method} K={num_drafts}")
  assert nums.min() >= 1 and nums.max() <= draft_len + 1
  expected = block_bound.block_value(p_tab, q_tab, num_drafts, draft_len)
  stats.assert_mean(nums, expected, f"{method} K={num_drafts} tokens per round")


def test_rejects_block_without_residual_correction(monkeypatch):
  """Drawing the correction from q(. | X^tau) instead of the block residual is wrong."""
  monkeypatch.setattr(acceptance, "residual", lambda target_V, mass_V: target_V)
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  codes, _ = _sample_blocks(jax.random.key(5), p_tab, q_tab, 1, 2, _fresh)
  law = sequences.target_law(q_tab, 2)
  stats.assert_rejects(np.bincount(codes, minlength=law.size), law, "block residual = q")


@pytest.mark.slow
def test_rejects_gbv_verified_against_p(monkeypatch):
  """GBV must verify the selected path against the selection law r, not against p."""
  select_fn = optimal.select_draft

  def against_p(u_level, u_pick, x_K, alive_K, p_V, q_V, **kw):
    return select_fn(u_level, u_pick, x_K, alive_K, p_V, q_V, **kw)[0], p_V

  monkeypatch.setattr(optimal, "select_draft", against_p)
  p_tab, q_tab = _tree(3, 3, 2)
  codes, _ = _sample_blocks(jax.random.key(5), p_tab, q_tab, 3, 2, _fresh, n=N_GBV)
  law = sequences.target_law(q_tab, 2)
  stats.assert_rejects(np.bincount(codes, minlength=law.size), law, "gbv against p")


def test_every_block_method_with_one_draft_is_block_and_vmaps():
  p_tab, q_tab = _tree(5, 3, 2)
  drafts = jnp.asarray([[0, 2]], jnp.int32)
  p = jnp.float32(np.stack([p_tab[0, 0], p_tab[1, 0]]))[None]
  q = jnp.float32(np.stack([q_tab[0, 0], q_tab[1, 0], q_tab[2, 2]]))[None]
  keys = jax.random.split(jax.random.key(0), 64)
  functions = {m: methods.get(m).function() for m in methods.names(level="block")}
  runs = {  # the registry's verify functions (Traversal Verification's is not in block.py)
    m: jax.jit(jax.vmap(lambda k, f=f: f(k, drafts, p, q)[:2]))(keys) for m, f in functions.items()
  }
  for name, run in runs.items():  # every block-level method is "block" at K = 1
    for a, b in zip(runs["block"], run, strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  tokens, nums = runs["block"]
  assert tokens.shape == (64, 3) and nums.shape == (64,)
  assert np.all((np.asarray(nums) >= 1) & (np.asarray(nums) <= 3))


def test_identical_models_accept_everything():
  """With p = q every weight is 1: L tokens of the greedy path, then the bonus."""
  drafts = jnp.asarray([[0, 1, 2], [0, 1, 3], [1, 1, 1]], jnp.int32)
  tokens, num, plan = block.block_verify(
    jax.random.key(0),
    drafts,
    jnp.full((3, 3, 4), 0.25),
    jnp.full((3, 4, 4), 0.25),
    return_plan=True,
  )
  assert int(num) == 4
  np.testing.assert_array_equal(np.asarray(plan.weight_L1), 1.0)
  assert int(plan.survivors_L1[0]) == 3 and int(plan.survivors_L1[3]) == 0
  np.testing.assert_array_equal(np.asarray(tokens[:3]), np.asarray(plan.path_L))


@pytest.mark.parametrize(
  "method, num_drafts, message",
  [
    ("beam", 1, "not a block-level method"),
    ("block", 2, "single draft"),
    ("kseq", 2, "not a block"),
  ],
)
def test_bad_input(method, num_drafts, message):
  drafts = jnp.zeros((num_drafts, 2), jnp.int32)
  with pytest.raises(ValueError, match=message):
    block.block_verify(
      jax.random.key(0),
      drafts,
      jnp.full((num_drafts, 2, 2), 0.5),
      jnp.full((num_drafts, 3, 2), 0.5),
      method=method,
    )


@pytest.mark.slow
def test_table_core_on_a_few_cases():
  """scripts/block_table.py's core: every method at most its scheme's bound; K = 1 block =
  bound, rrs = sd; SPEC's p = q rows for gbv_tp (2, 1.75, 1.625 at L = 1, K = 1..3)."""
  path = pathlib.Path(__file__).parents[2] / "scripts" / "block_table.py"
  spec = importlib.util.spec_from_file_location("block_table", path)
  table = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(table)
  assert {"block", "gbv", "gbv_tp", "rrs"} <= set(table.COLUMNS)
  chosen = table.cases(12, 0)
  picked = chosen[:2] + chosen[10:13] + chosen[15:23]
  rows = [{**table.case_values(p, q, k, n), "K": k} for _, _, n, k, p, q in picked]
  for row in rows:
    assert all(row[c] <= table.bound_of(row, c) + 1e-5 for c in table.COLUMNS)
    if row["K"] == 1:
      assert row["block"] == pytest.approx(row["bound K=1"], abs=1e-5)
      assert row["block"] >= row["sd"] - 1e-6
      assert row["rrs"] == pytest.approx(row["sd"], abs=1e-9)  # one draft: rejection
  assert rows[0]["block"] == pytest.approx(20 / 9, abs=1e-6)
  assert rows[0]["sd"] == pytest.approx(19 / 9, abs=1e-6)
  np.testing.assert_allclose([r["gbv_tp"] for r in rows[2:5]], [2.0, 1.75, 1.625], atol=1e-9)
