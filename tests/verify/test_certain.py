"""The field's mode of tree drafting: the "topk" scheme (child j of every node the draft's
j-th most likely token) verified by "certain" (Y ~ q, on to the child equal to Y).

- The children are the top tokens at V = 32000 with float32 ties and zeros, every
  branching: the order of a stable sort, never a token of probability 0.
- "certain" reads no draft law; pairs that would not be exact are refused at config time.
- A rule that accepts each child with probability q(x), the residual forgotten, fails
  `testing.check_verifier` (the registered method's own evidence runs in
  tests/workbench/test_harness.py, as every method's).
- Through the engine (slow): the target's law by enumeration on tails with adaptive
  draft length and on dedup rounds with a node budget; rrs handed the same top-k drafts
  (as if they were sampled) is rejected.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import DecodeSpec, drafting, methods, verify
from spectr_jax.methods import Verdict
from spectr_jax.sampling import categorical
from spectr_jax.testing import harness
from tests import engine_pair, stats
from tests.engine_pair import codes, exact_law, generate, residual_share

_VOCAB = 32_000


def _llm_logits(seed: int):
  """Logits over 32k tokens with float32 ties (values on a grid of step 1/8, so hundreds
  of tokens share each, and 6 scattered tokens tied at the top) and a tail of tokens of
  probability 0 (-inf)."""
  rng = np.random.default_rng(seed)
  logits = np.round(rng.normal(0.0, 2.0, _VOCAB) * 8) / 8
  logits[rng.choice(_VOCAB, 6, replace=False)] = logits.max() + 1
  logits[rng.random(_VOCAB) < 0.3] = -np.inf
  return jnp.asarray(logits, jnp.float32)


def _reference_top(p_V, k):
  """The k most likely tokens with mass, ties to the lower index (a stable sort)."""
  p_V = np.asarray(p_V)
  order = np.argsort(-p_V, kind="stable")[:k]
  return [int(x) for x in order if p_V[x] > 0]


def _draft_topk(base_V, branching, num_drafts, draft_len):
  """The topk tree of one row drafted by `drafting.draft_paths` on a stub draft whose law
  after token x is the base law rolled by x (so each node has a law of its own)."""

  def extend(params, tokens_BxKxT, cache, num_new_B=None, logits_at_B=None, tails_empty=False):
    del params, num_new_B, tails_empty
    last = tokens_BxKxT if logits_at_B is None else tokens_BxKxT[..., -1]
    logits = jnp.take(base_V, (jnp.arange(_VOCAB) - last[..., None]) % _VOCAB)
    return logits, cache

  depths = drafting.topk_depths(num_drafts, draft_len, branching)
  probs = functools.partial(jax.nn.softmax, axis=-1)

  @jax.jit
  def run(key_B):
    pending = jnp.asarray([[5, 7]], jnp.int32)
    out = drafting.draft_paths(depths, extend, None, None, pending, jnp.asarray([2]), key_B,
                               probs, num_drafts=num_drafts, draft_len=draft_len)  # fmt: skip
    return out.tokens_BxKxL[0], out.p_BxKxLxV[0]

  return run(jax.random.split(jax.random.key(0), 1))


@pytest.mark.parametrize("branching", [None, (2, 2), (1, 4)])
def test_topk_children_are_the_top_tokens_at_an_llm_vocabulary(branching):
  """Every node's children are its law's top tokens in order (float32 ties to the lower
  index; a node of one child takes the most likely token); the paths list the tree depth
  first; no token of probability 0 is drafted."""
  k, length = 4, 2
  tokens_KxL, p_KxLxV = _draft_topk(_llm_logits(0), branching, k, length)
  tokens_KxL, p_KxLxV = np.asarray(tokens_KxL), np.asarray(p_KxLxV)
  shape = branching or drafting.default_branching(k, length)
  assert len(np.unique(p_KxLxV[:, 0, :].round(6), axis=0)) == 1  # the root's law, shared
  assert np.all(np.take_along_axis(p_KxLxV, tokens_KxL[..., None], -1) > 0)
  for t, children in enumerate(shape):
    size = int(np.prod(shape[t + 1 :]))  # paths per child
    for node in range(0, k, size * children):
      want = _reference_top(p_KxLxV[node, t], children)
      got = [int(tokens_KxL[node + j * size, t]) for j in range(children)]
      assert got == want, (branching, t, node)
  # The ties are real: the root law's top tokens share one float32 value.
  root = p_KxLxV[0, 0]
  assert np.sum(root == root.max()) >= 4, np.sum(root == root.max())


def test_children_beyond_the_support_copy_the_first_childs_subtree():
  """Two tokens with mass, K = 3: path 2 copies path 0; only tokens with mass."""
  base = jnp.full((_VOCAB,), -jnp.inf).at[jnp.asarray([10, 20])].set(jnp.asarray([1.0, 1.0]))
  tokens_KxL, _ = _draft_topk(base, None, 3, 2)
  tokens_KxL = np.asarray(tokens_KxL)
  assert tokens_KxL[0, 0] != tokens_KxL[1, 0]
  np.testing.assert_array_equal(tokens_KxL[2], tokens_KxL[0])


def test_certain_reads_no_draft_law_and_moves_to_the_matching_child():
  k, length, vocab = 3, 3, 5
  drafts_KxL = jnp.asarray([[0, 1, 2], [1, 1, 1], [2, 3, 4]], jnp.int32)
  q_KxL1xV = jnp.broadcast_to(jax.nn.one_hot(1, vocab), (k, length + 1, vocab))
  walk = jax.jit(functools.partial(verify.walk, verifier=methods.get("certain")))
  outs = []
  for seed in range(2):
    p_KxLxV = jax.random.dirichlet(jax.random.key(seed), jnp.ones(vocab), (k, length))
    tokens, num, stats_ = walk(jax.random.key(7), drafts_KxL, p_KxLxV, q_KxL1xV, jnp.float32(0))
    outs.append((np.asarray(tokens), int(num)))
  assert outs[0][1] == outs[1][1] and np.array_equal(outs[0][0], outs[1][0])
  # q is certain of token 1: the walk follows path 1 (1, 1, 1) and draws the bonus.
  assert outs[0][1] == length + 1 and np.all(outs[0][0] == 1)
  assert np.asarray(stats_.accepted_L1)[:length].all()


def test_pairs_that_are_not_exact_are_refused():
  assert methods.exact_for("topk") == ("certain",)
  assert DecodeSpec("certain", 3, 2).scheme.name == "topk"
  # Rejection verifiers read p as the law the drafts were sampled from: top-k drafts are
  # not; "certain" is declared for the law its closed form (acceptance, bound) is of.
  for method, scheme in (("rrs", "topk"), ("traversal", "topk"), ("kseq", "topk"),
                         ("certain", "iid"), ("certain", "wor")):  # fmt: skip
    with pytest.raises(ValueError, match="is not exact for drafting scheme"):
      DecodeSpec(method, 3, 2, drafting=scheme)
  DecodeSpec("certain", 4, 2, branching=(2, 2))  # a tree scheme: any branching


def forgotten_residual(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Broken: each child accepted with probability q(x) in turn (the draft is certain:
  p = 1), and after the rejections Y ~ q again, not from q without the children."""
  del p_V
  accept_key, y_key = jax.random.split(key)
  accept_K = valid_K & (jax.random.uniform(accept_key, drafts_K.shape) < q_V[drafts_K])
  y = categorical(y_key, q_V)
  token = jnp.where(jnp.any(accept_K), drafts_K[jnp.argmax(accept_K)], y)
  return Verdict(token.astype(jnp.int32), jnp.any(accept_K))


def test_a_rule_that_forgets_the_residual_fails_the_check():
  report = harness.check_verifier(
    forgotten_residual, level="token", laws=("topk",), name="forgotten residual",
    cases=harness.CASES[:1], quick=True, boundary=False, large_vocab=None,
  )  # fmt: skip
  assert not report.passed
  assert any("above the LP bound" in r.why for r in report.failures), report.markdown()


@pytest.fixture(scope="module")
def models():
  return engine_pair.models()


# Tails (K distinct first tokens) with adaptive draft length (its cut bites at 0.7), and
# dedup rounds (the tree scored once per distinct prefix) with a node budget (that bites
# at 2 per row). Static and proportional shapes run the same depth loop (their children
# above; rrs's law on them: tests/decoding/test_engine_law.py).
LAW_CASES = [
  pytest.param(dict(adaptive=0.7), id="tails-adaptive"),
  pytest.param(dict(dedup=True, node_budget=2.0), id="dedup-budget"),
]


@pytest.mark.slow
@pytest.mark.parametrize("settings", LAW_CASES)
def test_topk_trees_verified_by_certain_keep_the_output_law(models, settings):
  draft, target = models
  out = generate(draft, target, "certain", 3, 2, 4, key=17, **settings)
  law = exact_law(target, 4)
  what = f"certain topk {settings}"
  pvalue = stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  print(f"{what}: p = {pvalue:.3g}")
  assert residual_share(out, 2) >= 0.2
  assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5


@pytest.mark.slow
def test_topk_drafts_verified_as_if_sampled_are_rejected(models, monkeypatch):
  """The same top-k trees handed to rrs, which reads p as the law the children were
  drawn from (what verifying a top-k tree by rejection sampling does): rejected."""
  monkeypatch.setattr(methods, "DRAFTING", dict(methods.DRAFTING))
  as_sampled = methods.Drafting(
    name="topk_as_wor", depths=drafting.topk_depths, bound=methods.DRAFTING["wor"].bound,
    summary="broken: top-k trees declared as drawn without replacement", law="wor",
    branches=True,
  )  # fmt: skip
  methods.register_drafting(as_sampled)
  draft, target = models
  # Fewer rows than the law tests: the break is large (its power is asserted).
  out = generate(draft, target, "rrs", 3, 2, 4, key=17, batch=2000, drafting=as_sampled.name)
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  pvalue = stats.assert_rejects(counts, law, "rrs on top-k drafts", min_power=0.99)
  print(f"rrs on top-k drafts: p = {pvalue:.3g}, power {stats.rejection_power(counts, law):.3f}")
