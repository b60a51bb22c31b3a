"""The method registry: every record resolves, the boundary uniforms, exactness flags.

- Every record references callables and is consistent; the table lists every record.
- Boundary uniforms (issue 24): with every uniform forced to 0.0 or to the largest float
  below 1 (and the sampler's random words to 0 and to 2^32 - 1), no verifier, at any K
  and L, emits a token the target gives probability 0 (one-hot targets, drafts on the
  forbidden tokens).
- A fixed rho below what a position needs is counted (its overshoot is the closed form's
  deficit); rho* and every other method never are.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import acceptance, drafting, methods, verify

_BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))


def test_every_record_holds_its_functions_and_records_are_consistent():
  for method in methods.METHODS.values():
    if method.speculative:
      assert callable(method.verify), method.name
      assert method.drafting in methods.DRAFTING
    if method.acceptance is not None:
      assert callable(method.acceptance), method.name
    if method.single is not None:
      single = methods.get(method.single)
      assert single.max_drafts == 1 and single.level in ("token", method.level)
    for baseline in method.compare_with:
      methods.get(baseline)
  for scheme in methods.DRAFTING.values():
    assert callable(scheme.depths) and callable(scheme.bound)
  table = methods.table()
  for name in [*methods.METHODS, *methods.DRAFTING]:
    assert f"| {name} |" in table, name


def test_a_record_named_by_string_still_works_with_a_warning():
  """The old form of a record's function, "module:function", is deprecated, not gone."""
  with pytest.warns(DeprecationWarning, match="give the function itself"):
    record = methods.Method(
      name="sd_string", level="token", verify="spectr_jax.verify:sd_verdict", summary="sd",
      max_drafts=1,
    )  # fmt: skip
  assert record.function() is verify.sd_verdict


def test_unknown_method_and_rho_are_named():
  with pytest.raises(ValueError, match="unknown method 'beam'"):
    methods.get("beam")
  for bad in ("best", 0.5, float("nan"), True, [2.0], None):
    with pytest.raises(ValueError, match="rho"):
      methods.check_rho(bad)
  assert methods.check_rho(2) == 2.0 and methods.check_rho("k") == "k"


def _cases(method: methods.Method):
  ks = [1] if method.max_drafts == 1 else [1, 2, 3]
  return [(k, length) for k in ks for length in (1, 2, 3)]


# Every method at L = 3 with K = 2 (K = 1 for single-draft methods) in the fast tier;
# every (K, L) of the methods with a split factor with --runslow (here at a fixed rho too).
# Every method's boundary rows at K = 1-3, L = 1 and 3 are also in its
# `testing.check_verifier` (tests/workbench/test_harness.py).
_ALL = [
  pytest.param(
    m.name,
    k,
    length,
    id=f"{m.name}-K{k}-L{length}",
    marks=() if (k, length) == (min(2, m.max_drafts or 2), 3) else pytest.mark.slow,
  )
  for m in methods.METHODS.values()
  if m.speculative
  for k, length in _cases(m)
  if m.takes_rho or (k, length) == (min(2, m.max_drafts or 2), 3)
]


@pytest.fixture
def forced_randomness(monkeypatch):
  """Forces `jax.random.uniform` to one value and `jax.random.bits` to one word: wraps a
  function f into a jitted `(uniform, word, *args) -> f(*args)` in which every uniform
  is `uniform` and every random word is `word`. Both are traced arguments, so one
  compile serves every forced value (the compiled programs are dropped before and
  after)."""
  forced = {}

  def fake_uniform(key, shape=(), dtype=jnp.float32, minval=0.0, maxval=1.0):
    del key, minval, maxval
    return jnp.full(shape, forced["uniform"], dtype)

  def fake_bits(key, shape=(), dtype=jnp.uint32):
    del key
    return jnp.full(shape, forced["word"], dtype)

  monkeypatch.setattr(jax.random, "uniform", fake_uniform)
  monkeypatch.setattr(jax.random, "bits", fake_bits)

  def wrap(fn):
    def run(uniform, word, *args):
      forced.update(uniform=uniform, word=word)
      return fn(*args)

    jitted = jax.jit(run)
    return lambda uniform, word, *args: jitted(jnp.float32(uniform), jnp.uint32(word), *args)

  jax.clear_caches()
  yield wrap
  jax.clear_caches()


def _one_hot_block(k: int, length: int, allowed: int, vocab: int = 3):
  """Drafts on forbidden tokens, p spread over the vocabulary, q one-hot on `allowed`."""
  forbidden = [t for t in range(vocab) if t != allowed]
  drafts_KxL = jnp.asarray(
    [[forbidden[(i + t) % len(forbidden)] for t in range(length)] for i in range(k)], jnp.int32
  )
  p_KxLxV = jnp.full((k, length, vocab), 1.0 / vocab)
  q_KxL1xV = jnp.broadcast_to(jax.nn.one_hot(allowed, vocab), (k, length + 1, vocab))
  return drafts_KxL, p_KxLxV, q_KxL1xV


@pytest.mark.parametrize("name, k, length", _ALL)
def test_boundary_uniforms_never_emit_a_forbidden_token(forced_randomness, name, k, length):
  walk = forced_randomness(functools.partial(verify.walk, method=name, rho_mode="fixed"))
  for uniform in (0.0, _BELOW_ONE):
    for word in (0, 2**32 - 1):
      for allowed in (0, 2):
        for rho in (1.0, float(k)):  # K-SEQ at rho = 1 too: the clipped residual is q here
          drafts, p, q = _one_hot_block(k, length, allowed)
          tokens, num, _ = walk(uniform, word, jax.random.key(0), drafts, p, q, jnp.float32(rho))
          emitted = np.asarray(tokens)[: int(num)]
          assert np.all(emitted == allowed), (uniform, word, allowed, rho, emitted)


@pytest.mark.parametrize("scheme", sorted(methods.DRAFTING))
def test_boundary_words_never_draft_a_zero_probability_token(forced_randomness, scheme):
  """Every drafting scheme samples only tokens of positive draft probability, also with
  the random words and uniforms forced to their extremes; without replacement, the valid
  first tokens are distinct and, past the support (2 tokens, K = 3), paths copy path 0."""
  vocab = 5
  logits_V = jnp.asarray([-jnp.inf, 0.0, -jnp.inf, 1.0, -jnp.inf])

  def extend(params, tokens_BxKxT, cache, num_new_B=None, logits_at_B=None, tails_empty=False):
    b, k, t = tokens_BxKxT.shape
    shape = (b, k, vocab) if logits_at_B is not None else (b, k, t, vocab)
    return jnp.broadcast_to(logits_V, shape), cache

  probs = functools.partial(jax.nn.softmax, axis=-1)
  depths = methods.DRAFTING[scheme].depths(3, 4, None)

  def draft(keys):
    pending = jnp.zeros((2, 2), jnp.int32)
    out = drafting.draft_paths(depths, extend, None, None, pending, jnp.ones((2,), jnp.int32),
                               keys, probs, num_drafts=3, draft_len=4)  # fmt: skip
    return out.tokens_BxKxL

  draft = forced_randomness(draft)
  for uniform, word in ((0.0, 0), (_BELOW_ONE, 2**32 - 1)):
    tokens_BxKxL = np.asarray(draft(uniform, word, jax.random.split(jax.random.key(0), 2)))
    assert set(np.unique(tokens_BxKxL)) <= {1, 3}, (uniform, word)
    if scheme == "wor":
      assert np.all(tokens_BxKxL[:, 0, 0] != tokens_BxKxL[:, 1, 0]), (uniform, word)
      np.testing.assert_array_equal(tokens_BxKxL[:, 2], tokens_BxKxL[:, 0])


_INVALID_RHO_PAIR = (
  jnp.asarray([0.6, 0.3, 0.1], jnp.float32),  # p
  jnp.asarray([0.2, 0.3, 0.5], jnp.float32),  # q: rho = 1 overshoots with k = 3
)


def test_overshoot_is_the_closed_form_deficit():
  p_V, q_V = _INVALID_RHO_PAIR
  drafts_K = jnp.asarray([0, 0, 1], jnp.int32)
  valid_K = jnp.ones((3,), bool)
  for rho in ("star", "k", 1.0, 1.5):
    mode, value = acceptance.split_rho(rho)
    verdict = verify.kseq_verdict(
      jax.random.key(0), drafts_K, p_V, q_V, valid_K, rho_mode=mode, rho_value=value
    )
    deficit = float(acceptance.kseq_acceptance(p_V, q_V, 3, rho).deficit)
    np.testing.assert_allclose(float(verdict.overshoot), deficit, atol=1e-7)
    assert (float(verdict.overshoot) > methods.OVERSHOOT_TOL) == (rho in (1.0, 1.5)), rho


# K-SEQ (the only method with a rho) and one block-level method in the fast tier.
@pytest.mark.parametrize(
  "name",
  [
    pytest.param(m, marks=() if m in ("kseq", "gbv") else pytest.mark.slow)
    for m in methods.names(speculative=True)
  ],
)
def test_the_walk_reports_overshoot_only_for_an_invalid_rho(name):
  k = 1 if methods.get(name).max_drafts == 1 else 3
  p_V, q_V = _INVALID_RHO_PAIR
  drafts_KxL = jnp.zeros((k, 2), jnp.int32)
  p_KxLxV = jnp.broadcast_to(p_V, (k, 2, 3))
  q_KxL1xV = jnp.broadcast_to(q_V, (k, 3, 3))
  for rho in ("star", 1.0):
    _, num, stats = methods.verify_drafts(
      jax.random.key(0), drafts_KxL, p_KxLxV, q_KxL1xV, method=name, rho=rho, return_stats=True
    )
    first = float(stats.overshoot_L1[0])
    invalid = methods.get(name).takes_rho and rho == 1.0 and k > 1
    assert (first > methods.OVERSHOOT_TOL) == invalid, (name, rho, first)
