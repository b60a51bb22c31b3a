"""The output law of every method through the engine (K-draft rounds, two draft lengths,
tails and token trees) against the target's law by enumeration (tests/engine_pair.py)."""

import numpy as np
import pytest

from spectr_jax import engine, tree
from spectr_jax.models.protocol import TransformerDecoder
from tests import engine_pair, stats
from tests.engine_pair import WRONG_PATH_ROWS, codes, exact_law, generate, residual_share

# 10k-row decodes compile at the suite's quick level: at this size that costs less in all
# than XLA's optimised build (three of them: 42 s against 59 s of CPU); the 60k-row test
# below runs mostly its program and gets the optimised build (`execution_bound`).


@pytest.fixture(scope="module")
def models():
  return engine_pair.models()


_slow = pytest.mark.slow
# The engine's law is in the slow tier (CI): the fast tier checks the engine by its greedy,
# tree-q and counting tests (tests/decoding/test_engine.py) and the verifiers' laws in
# tests/verify/test_verify.py and by `testing.check_verifier`
# (tests/workbench/test_harness.py: every
# registered method, enumerated). The engine hands every method the same (key, drafts, p,
# q) through `verify.walk`, so its law is checked once per path a method can take through
# the engine: autoregressive; a token-level walk with one draft (sd) and K drafts (kseq,
# with a split factor), of the i.i.d. law and without replacement (rrs); a block-level
# verifier of each law (gbv; traversal). Each at L = 2 (rounds that stop at either
# position, bonus draws, rollback); L = 1 once, for its own cache path (one pending
# token). K-SEQ at K = 3, L = 2 on i.i.d. tails runs in the toy scheme's test below (the
# i.i.d. scheme under keys of its own), RRS on tails in the static (2, 2) tree's test, on
# dedup rounds in two more and with a shared tree budget (tests/decoding/test_node_budget.py).
# The other methods (specinfer, optimal, block, gbv_tp) take one of these paths; each has
# its enumerated law in the harness and its sampled block law in its own tests
# (tests/verify/test_verify.py, test_block.py, test_gbv_tp.py).
CASES = [
  pytest.param("autoregressive", 1, 0, marks=_slow),
  pytest.param("sd", 1, 2, marks=_slow),
  pytest.param("kseq", 3, 1, marks=_slow),
  pytest.param("gbv", 3, 2, marks=_slow),
  pytest.param("traversal", 3, 2, marks=_slow),
]


@pytest.mark.parametrize("method, num_drafts, draft_len", CASES)
def test_engine_output_law_is_target_law(models, method, num_drafts, draft_len):
  draft, target = models
  n = 4 if draft_len == 2 else 3
  out = generate(draft, target, method, num_drafts, draft_len, n)
  assert np.all(np.asarray(out.lengths_B) == n)
  law = exact_law(target, n)
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, method)
  if draft_len:
    assert residual_share(out, draft_len) >= 0.2
    assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5  # several rounds: rollback


@pytest.mark.slow
@pytest.mark.parametrize("method, temperature, top_k", [("kseq", 1.0, None), ("rrs", 0.6, 3)])
def test_dedup_rounds_keep_the_output_law(models, method, temperature, top_k):
  """The engine with tree scoring (K = 3, L = 2): the (transformed) target's law, several
  rounds; drafts without replacement (rrs) with temperature and top-k on both models.
  (Every method's dedup rounds emit its tails' tokens, bit for bit:
  tests/decoding/test_engine.py.)"""
  draft, target = models
  kw = dict(key=9, dedup=True, temperature=temperature, top_k=top_k or 0)
  out = generate(draft, target, method, 3, 2, 4, **kw)
  law = exact_law(target, 4, temperature, top_k)
  what = f"{method} dedup T={temperature} top_k={top_k}"
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  assert residual_share(out, 2) >= 0.2
  assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5


@pytest.mark.slow
@pytest.mark.parametrize(
  "method, branching, dedup",
  [
    ("rrs", (2, 2), False),
    ("rrs", "proportional", True),
    ("traversal", "proportional", True),
  ],
)
def test_tree_drafts_keep_the_output_law(models, method, branching, dedup):
  """Issue 27: RRS and Traversal Verification on drafted trees (children without
  replacement at every node; K = 4, L = 2) through the engine: the static branching
  (2, 2) as tails, and the "proportional" tree (shaped by the draft's probabilities: at
  most 9 nodes) scored as a tree; the target's law, several rounds. (A static tree scored
  as a tree, 7 nodes per round, emits its tails' tokens: tests/decoding/test_engine.py.)"""
  draft, target = models
  out = generate(draft, target, method, 4, 2, 4, key=11, dedup=dedup, branching=branching)
  law = exact_law(target, 4)
  what = f"{method} tree {branching} dedup={dedup}"
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  assert residual_share(out, 2) >= 0.2
  rounds_B = np.asarray(out.stats.rounds_B)
  assert float(np.mean(rounds_B)) > 1.5
  most = 12 if not dedup else 7 if branching == (2, 2) else 9
  assert np.all(np.asarray(out.stats.nodes_B) <= most * rounds_B)


@pytest.mark.slow
@pytest.mark.execution_bound
def test_dedup_rounds_reject_a_commit_of_the_wrong_path(models, monkeypatch):
  """A dedup round that commits path 0's nodes whatever path survived must be caught."""
  real = TransformerDecoder.commit_nodes

  def first_path(self, cache, slots_BxW, num_B):
    del slots_BxW
    return real(self, cache, first_path.slots, num_B)

  real_tree = tree.from_paths

  def remember(last_B, drafts_BxKxL, length_BxK=None):
    t = real_tree(last_B, drafts_BxKxL, length_BxK)
    first_path.slots = t.path_node_BxKxL1[:, 0]
    return t

  draft, target = models
  engine.compiled_program.cache_clear()
  monkeypatch.setattr(TransformerDecoder, "commit_nodes", first_path)
  monkeypatch.setattr(tree, "from_paths", remember)
  try:
    # More rows than the law tests: the variant differs only after a round whose survivor
    # is not path 0.
    out = generate(draft, target, "kseq", 3, 2, 4, key=9, dedup=True, batch=WRONG_PATH_ROWS)
  finally:
    engine.compiled_program.cache_clear()
  law = exact_law(target, 4)
  stats.assert_rejects(
    np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "tree commit", min_power=0.99
  )


@pytest.mark.slow
def test_a_new_drafting_scheme_keeps_the_output_law(models):
  """K-SEQ on the drafts of a scheme added in one module (tests/toy_drafting.py, of the
  i.i.d. law): the target's law, several rounds."""
  from tests import toy_drafting

  draft, target = models
  out = generate(draft, target, "kseq", 3, 2, 4, key=5, drafting=toy_drafting.SCHEME.name)
  law = exact_law(target, 4)
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "kseq toy_iid")
  assert residual_share(out, 2) >= 0.2
  assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5  # several rounds: rollback


TOY_TOP = [
  ("rrs", {}),
  ("rrs", dict(adaptive=0.7)),
  ("rrs", dict(dedup=True, node_budget=2.0)),
  ("traversal", {}),
  ("traversal", dict(dedup=True, node_budget=2.0)),
]


@pytest.mark.slow
@pytest.mark.parametrize("method, settings", TOY_TOP)
def test_a_scheme_of_a_new_law_keeps_the_output_law(models, method, settings):
  """A scheme of a law the registry lacks, added in one module (tests/toy_topk.py: trees
  without replacement from the draft's top 2 tokens), through every verifier exact for it,
  on tails, with adaptive draft length (whose cut bites at 0.7) and on dedup rounds with a
  node budget (that bites at 2 nodes per row): the target's law."""
  from tests import toy_topk

  draft, target = models
  out = generate(draft, target, method, 3, 2, 4, key=11, drafting=toy_topk.SCHEME.name, **settings)
  law = exact_law(target, 4)
  what = f"{method} {toy_topk.SCHEME.name} {settings}"
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  assert residual_share(out, 2) >= 0.2
  assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5


@pytest.mark.slow
def test_a_scheme_verified_against_the_wrong_law_is_rejected(models):
  """The same top-2 drafts handed to rrs with the draft's whole law (what verifying
  truncated drafts as if sampled from the draft does): rejected, with power."""
  from tests import toy_topk

  draft, target = models
  out = generate(draft, target, "rrs", 3, 2, 4, key=11, drafting=toy_topk.BROKEN.name)
  law = exact_law(target, 4)
  counts = np.bincount(codes(out.tokens_BxT), minlength=law.size)
  stats.assert_rejects(counts, law, "rrs on top-2 drafts, whole law", min_power=0.99)


# Tails, adaptive length, dedup trees and a node budget. (The adaptive case took 260 s
# under the suite's classic CPU emitters while `attention.write_tail` scattered.)
HEAD_CASES = [
  ("sd", 1, {}),
  ("kseq", 3, {}),
  ("kseq", 3, dict(adaptive=0.5)),
  ("rrs", 3, dict(dedup=True)),
  ("traversal", 3, dict(dedup=True, node_budget=2.0)),
]


@pytest.fixture(scope="module")
def head(models):
  """A draft head on the target (`spectr_jax.models.head`), random weights."""
  import jax

  from spectr_jax.models import ModelBundle, decoder
  from spectr_jax.models.head import HeadConfig, share_target

  _, target = models
  config = HeadConfig.of(target.config, 1)
  return ModelBundle(
    config, share_target(decoder(config).init_params(jax.random.key(3)), target.params)
  )


@pytest.mark.slow
@pytest.mark.execution_bound
@pytest.mark.parametrize("method, num_drafts, settings", HEAD_CASES)
def test_a_draft_head_keeps_the_output_law(models, head, method, num_drafts, settings):
  """Drafts from a head that reads the target's features (tails, adaptive length, dedup
  rounds, a node budget): the target's law, several rounds."""
  _, target = models
  out = generate(head, target, method, num_drafts, 2, 4, key=13, **settings)
  law = exact_law(target, 4)
  what = f"{method} head {settings}"
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  assert residual_share(out, 2) >= 0.1
  assert float(np.mean(np.asarray(out.stats.rounds_B))) > 1.5
