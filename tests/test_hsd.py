"""HSD (Zhou et al., arXiv 2601.05724) as its authors released it: not exact
(spectr_jax/testing/hsd.py, docs/BLOCK_VERIFICATION.md "HSD").

Exactly, by enumerating every draft chain (`hsd.chain_law`, float64): the released rule's
output law differs from the target's on Sun et al.'s toy at L = 2 and on random trees,
and its tokens per round exceed the one-draft LP bound (reached by block verification),
which no exact rule can. The only reading of the code family that is exact (weights
capped at every depth, the full chain accepted with its weight) is block verification
itself. By sampling: the JAX `hsd.verify_chain` follows the enumerated law (so the
enumeration is of the code we run) and is rejected against the target's law.
"""

import functools

import numpy as np
import pytest

from spectr_jax import block_bound
from spectr_jax.testing import hsd, sequences
from tests import stats

TOY_P, TOY_Q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
RELEASED = ("prefix", "next", "joint")
BLOCK_READING = ("running", "none", "weight")


def _error(p_tab, q_tab, draft_len, variant=RELEASED):
  law, tokens = hsd.chain_law(p_tab, q_tab, draft_len, *variant)
  return np.abs(law - sequences.target_law(q_tab, draft_len)).sum(), tokens


def test_released_rule_is_exact_at_one_token():
  """L = 1: a single rejection step, the rule is speculative sampling."""
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 1)
  error, tokens = _error(p_tab, q_tab, 1)
  assert error < 1e-12
  assert tokens == pytest.approx(block_bound.block_value(p_tab, q_tab, 1, 1, method="block"))


def test_smallest_witness_sun_toy_two_tokens():
  """Sun et al.'s toy (p = (1/3, 2/3), q = (2/3, 1/3)), L = 2: the only rejected chain is
  11 (mass 1/3); at prefix 1 nothing is deficient (c q = p), so it walks back to the root
  and resamples token 0, continued by the target: P(00) = 1/9 + (1/3)(2/3) = 1/3 instead
  of 4/9, and 7/3 tokens per round above the bound 20/9."""
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  law, tokens = hsd.chain_law(p_tab, q_tab, 2)
  first_two = law.reshape(4, 2).sum(axis=1)
  np.testing.assert_allclose(first_two, [1 / 3, 1 / 3, 2 / 9, 1 / 9], atol=1e-12)
  np.testing.assert_allclose(
    sequences.target_law(q_tab, 2).reshape(4, 2).sum(1), [4 / 9, 2 / 9, 2 / 9, 1 / 9]
  )
  assert tokens == pytest.approx(7 / 3)
  assert block_bound.block_bound(p_tab, q_tab, 1, 2) == pytest.approx(20 / 9, abs=1e-9)
  assert _error(p_tab, q_tab, 2)[0] == pytest.approx(2 / 9)


@pytest.mark.parametrize(
  "variant",
  [RELEASED, ("running", "next", "joint"), ("prefix", "none", "joint"), ("none", "none", "joint")],
)
def test_released_readings_are_not_exact_and_beat_the_bound(variant):
  """Every reading that accepts the whole chain with min(1, rho_L) is off the target's law
  on random Dirichlet trees, and emits more tokens per round than the LP bound for one
  draft allows any exact verifier."""
  rng = np.random.default_rng(0)
  for vocab, draft_len in ((2, 2), (3, 2), (2, 3)):
    p_tab, q_tab = sequences.random_tree(rng, vocab, draft_len)
    error, tokens = _error(p_tab, q_tab, draft_len, variant)
    assert error > 1e-2, (vocab, draft_len)
    assert tokens > block_bound.block_bound(p_tab, q_tab, 1, draft_len) + 1e-3, (vocab, draft_len)


def test_weight_capped_reading_is_block_verification():
  """Capped weights at every depth (w_i = rho_i / max(1, rho_1..rho_i)) and the whole
  chain accepted with w_L: exact, and the tokens per round of "block" (Sun et al.)."""
  rng = np.random.default_rng(1)
  for kind in sequences.TREE_KINDS:
    for vocab, draft_len in ((2, 2), (3, 2), (2, 3)):
      p_tab, q_tab = sequences.random_tree(rng, vocab, draft_len, kind)
      error, tokens = _error(p_tab, q_tab, draft_len, BLOCK_READING)
      assert error < 1e-12, (kind, vocab, draft_len)
      block = block_bound.block_value(p_tab, q_tab, 1, draft_len, method="block")
      assert tokens == pytest.approx(block, abs=1e-12), (kind, vocab, draft_len)


def _sample(p_tab, q_tab, draft_len, variant, n=60_000, seed=0):
  import jax

  capping, override, final = variant
  fn = functools.partial(hsd.verify_chain, capping=capping, override=override, final=final)
  codes, nums = sequences.sample_blocks(
    jax.random.key(seed), p_tab, q_tab, 1, draft_len, lambda *a: fn(*a)[:2], n
  )
  vocab = p_tab.shape[-1]
  return np.bincount(codes, minlength=vocab ** (draft_len + 1)), nums


def test_verify_chain_follows_its_enumerated_law_and_is_rejected():
  """The JAX rule (jit + vmap inside `sample_blocks`) draws from `chain_law` (chi-square),
  and the target's law is rejected for it; its mean tokens per round match the
  enumeration."""
  p_tab, q_tab = sequences.constant_tree(TOY_P, TOY_Q, 2)
  counts, nums = _sample(p_tab, q_tab, 2, RELEASED)
  law, tokens = hsd.chain_law(p_tab, q_tab, 2)
  stats.assert_law(counts, law, "hsd (released) vs its enumerated law")
  stats.assert_rejects(counts, sequences.target_law(q_tab, 2), "hsd vs target", min_power=0.99)
  stats.assert_mean(nums, tokens, "hsd tokens per round")


def test_verify_chain_block_reading_is_exact_by_sampling():
  p_tab, q_tab = sequences.random_tree(np.random.default_rng(5), 3, 2, "sparse")
  counts, _ = _sample(p_tab, q_tab, 2, BLOCK_READING, seed=1)
  stats.assert_law(counts, sequences.target_law(q_tab, 2), "hsd (block reading) vs target")


def test_verify_chain_takes_one_chain():
  import jax
  import jax.numpy as jnp

  with pytest.raises(ValueError, match="one draft chain"):
    hsd.verify_chain(
      jax.random.key(0),
      jnp.zeros((2, 2), jnp.int32),
      jnp.ones((2, 2, 2)) / 2,
      jnp.ones((2, 3, 2)) / 2,
    )
  with pytest.raises(ValueError, match="unknown HSD variant"):
    hsd.chain_law(*sequences.constant_tree(TOY_P, TOY_Q, 1), 1, capping="other")
