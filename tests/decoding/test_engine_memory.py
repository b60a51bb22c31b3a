"""The engine's compiled program: its peak memory against the formula of
docs/PERFORMANCE.md, and no full copy of a KV cache in a round (commits in place)."""

import re

import jax
import jax.numpy as jnp
import pytest

from spectr_jax import engine, memory, methods, optimal, plan
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params

V = 1024
# (method, B, K, L, new tokens, prompt width, tree): three sizes, three kinds of verifier,
# and a dedup round (its draft's distinct prefixes and target's node sizes under lax.switch).
SIZES = [
  ("sd", 2, 1, 4, 24, 8, False),
  ("kseq", 4, 4, 3, 40, 8, False),
  ("gbv", 3, 2, 5, 60, 16, False),
  ("kseq", 4, 4, 3, 40, 8, True),
]


def _compile(options, method, b, k, draft_len, n, width, tree):
  """The compiled engine program (with XLA's default CPU build: `options`, the fixture
  `xla_default_build`) and the (draft, target) configs with max_len = S."""
  s = width + n + draft_len + 1
  configs = [get_model_config(name, V, max_len=s) for name in ("draft-test", "target-test")]
  draft, target = (
    ModelBundle(c, init_params(c, jax.random.key(i))).for_decoding() for i, c in enumerate(configs)
  )
  spec = DecodeSpec(method=method, num_drafts=k, draft_len=draft_len, max_new_tokens=n, dedup=tree)
  traced = plan.traced(spec)
  spec = plan.resolve(spec, draft.config, target.config)
  args = (jax.random.key(0), jnp.arange(b), jnp.ones((b, width), jnp.int32), jnp.full((b,), width))
  lowered = engine.compiled_program(spec, None).lower(*args, draft.params, target.params, traced)
  return lowered.compile(options), configs


@pytest.fixture(scope="module", params=SIZES, ids=[s[0] + "-tree" * s[-1] for s in SIZES])
def program(request, xla_default_build):
  return request.param, *_compile(xla_default_build, *request.param)


def _plan_bytes(k):
  """The temporaries of one optimal-verifier plan at V (its O(M^2) level and rate work)."""
  p_V = jnp.full((V,), 1.0 / V)
  plan = jax.jit(lambda p, n: optimal.optimal_plan(p, p, n, max_k=k))
  compiled = plan.lower(p_V, jnp.int32(k)).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_peak_memory_per_row_matches_the_formula(program):
  (method, b, k, draft_len, n, width, _), compiled, configs = program
  s, one = width + n + draft_len + 1, memory.abstract_mesh(1, 1)
  # docs/PERFORMANCE.md (spectr_jax.memory): both caches (a prefix of S and K tails of
  # L + 1) plus two K(L + 1) x V and two K L x V float32 arrays; the block-level verifiers
  # hold four more K(L + 1) x V.
  formula = sum(memory.cache_bytes(c, 1, k, draft_len, s, one) for c in configs)
  formula += memory.probability_bytes(method, k, draft_len, V)
  if methods.get(method).workspace_bytes:  # plus one plan's workspace per row (plans run in turn)
    formula += _plan_bytes(k)
  measured = compiled.memory_analysis().temp_size_in_bytes / b
  assert 0.8 < measured / formula < 1.25, (measured, formula, measured / formula)


@pytest.mark.slow
def test_round_has_no_full_cache_copy(program):
  (_, b, _, draft_len, n, width, _), compiled, configs = program
  s = width + n + draft_len + 1
  text = compiled.as_text()
  # Prefixes only: the tails are written in place too, but the commit gathers each row's
  # kept tail (a small R-entry copy, the full tail array when K = 1).
  shapes = {(c.num_layers, b, s, c.num_kv_heads, c.head_dim) for c in configs}
  copies = []
  for line in text.splitlines():
    m = re.search(r"= [a-z0-9]+\[([\d,]+)\]\S* copy\(", line)
    if not m:
      continue
    shape = tuple(map(int, m.group(1).split(",")))
    if shape in shapes:
      copies.append(line.strip()[:160])
  assert not copies, copies
