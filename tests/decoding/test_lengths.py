"""Length policies (`spectr_jax.lengths`): a new decode option is one policy and one spec
field. A test-only option, defined here and in no library file, runs through the engine:
each path verifies its first m positions (a length fixed before drafting, so the output
law stays the target's)."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import DecodeSpec, engine, lengths
from tests import engine_pair, stats
from tests.engine_pair import PROMPT, codes, exact_law


@dataclasses.dataclass(frozen=True)
class TruncatedSpec(DecodeSpec):
  """The option's one field: verify the first `truncate` positions of each path (0 = off)."""

  truncate: float = 0.0


@dataclasses.dataclass(frozen=True)
class Truncate(lengths.LengthPolicy):
  """The option's one policy."""

  field: ClassVar[str] = "truncate"

  def check(self, spec) -> None:
    if not 1 <= spec.truncate <= spec.draft_len:
      raise ValueError(f"truncate must lie in [1, L = {spec.draft_len}], got {spec.truncate}")

  def lengths(self, drafts_BxKxL, p_BxKxLxV, value, active_B):
    b, k, _ = drafts_BxKxL.shape
    return lengths.Lengths.ragged(jnp.full((b, k), value.astype(jnp.int32)))


@pytest.fixture
def option(monkeypatch):
  monkeypatch.setattr(lengths, "POLICIES", (*lengths.POLICIES, Truncate))
  engine.compiled_program.cache_clear()
  yield
  engine.compiled_program.cache_clear()


@pytest.fixture(scope="module")
def models():
  return engine_pair.models()


def _decode(models, batch, truncate, key=0, n=4):
  draft, target = models
  spec = TruncatedSpec("kseq", 3, 3, max_new_tokens=n, truncate=truncate)
  return engine.generate(
    jax.random.key(key), spec, draft=draft, target=target,
    prompts=jnp.tile(jnp.asarray([PROMPT], jnp.int32), (batch, 1)),
    prompt_lengths=jnp.full((batch,), len(PROMPT)),
  )  # fmt: skip


def test_a_new_option_is_one_policy_and_one_field(models, option):
  """The spec resolves to the policy and checks it; each round verifies the first m
  positions (rounds emit at most m + 1 tokens, the lengths histogram sits at m); m is
  traced: one program serves every m."""
  with pytest.raises(ValueError, match=r"truncate must lie in \[1, L = 3\]"):
    TruncatedSpec("kseq", 3, 3, truncate=5)
  for m in (1, 2):
    out = _decode(models, 64, m)
    s = out.stats
    assert np.all(np.asarray(s.tokens_per_round_BxL2)[:, m + 2 :] == 0), m
    lengths_BxL1 = np.asarray(s.lengths_BxL1)
    assert np.all(lengths_BxL1[:, m] == np.asarray(s.rounds_B)), m
  assert engine.compiled_program.cache_info().currsize == 1


@pytest.mark.slow
def test_the_new_option_keeps_the_output_law(models, option):
  """K-SEQ, K = 3, L = 3 verifying one position per round: the target's law over 4 tokens."""
  tokens = _decode(models, engine_pair.NUM_SAMPLES, 1, key=7).tokens_BxT
  law = exact_law(models[1], 4)
  counts = np.bincount(codes(tokens), minlength=law.size)
  stats.assert_law(counts, law, "truncate 1")
