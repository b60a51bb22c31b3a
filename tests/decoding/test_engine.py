"""The decoding engine: exactness against the enumerated target law under transforms,
rho settings, broken caches and a model-sharded mesh; greedy, EOS, tree scoring,
recompiles and bad input (the law of every method: tests/decoding/test_engine_law.py)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import engine, methods, plan, programs, rounds, sharding, tree
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, commit, get_model_config
from spectr_jax.models.protocol import TransformerDecoder
from tests import engine_pair, stats
from tests.engine_pair import V, codes, exact_law, generate, residual_share


@pytest.fixture(scope="module")
def models():
  return engine_pair.models()


_slow = pytest.mark.slow
# The 10k-row law tests compile at the suite's quick level (cheaper in all at this size
# than XLA's optimised build; tests/decoding/test_engine_law.py); the mesh law below keeps it.


@pytest.mark.slow
# A sharper and a flatter target, the second also top-k (the temperature is traced, top-k
# is part of the program), with K-SEQ's two other split factors: rho = K and a fixed one.
@pytest.mark.parametrize("temperature, top_k, rho", [(0.6, 0, "k"), (1.5, 2, 2.5)])
def test_engine_exact_for_transformed_target(models, temperature, top_k, rho):
  draft, target = models
  out = generate(draft, target, "kseq", 3, 2, 4, temperature=temperature, top_k=top_k, rho=rho)
  law = exact_law(target, 4, temperature, top_k or None)
  what = f"kseq T={temperature} top_k={top_k} rho={rho}"
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, what)
  assert int(np.sum(np.asarray(out.stats.invalid_BxL1))) == 0  # valid split factors


@pytest.mark.slow
def test_engine_rrs_with_fewer_tokens_than_drafts(models):
  """Top-k = 2 leaves the draft 2 tokens for K = 3 drafts without replacement: the third
  path copies the first, and the output law stays the (transformed) target's."""
  draft, target = models
  out = generate(draft, target, "rrs", 3, 2, 4, top_k=2)
  law = exact_law(target, 4, top_k=2)
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "rrs top_k=2")
  assert residual_share(out, 2) >= 0.1


@pytest.mark.slow
def test_engine_rejects_broken_rollback(models, monkeypatch):
  """An engine that keeps the rejected draft tokens in its caches must be caught."""

  def no_rollback(self, cache, tail_B, num_B):
    del self
    return commit(cache, tail_B, jnp.where(num_B > 0, cache.R, 0))

  draft, target = models
  engine.compiled_program.cache_clear()
  monkeypatch.setattr(TransformerDecoder, "commit", no_rollback)  # the decoders' commit
  try:
    out = generate(draft, target, "kseq", 3, 2, 4)
  finally:
    engine.compiled_program.cache_clear()
  law = exact_law(target, 4)
  stats.assert_rejects(
    np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "no rollback", min_power=0.99
  )


def _tree_and_tail_q(models, drafts_BxKxL, prompts_BxP, lengths_B):
  """The target's q of every path and position, scored as K tails and as their tree."""
  draft, target = models
  b, k, length = drafts_BxKxL.shape
  out = []
  for use_tree in (False, True):
    decode = DecodeSpec("kseq", k, length, max_new_tokens=4, dedup=use_tree)
    traced = plan.traced(decode)
    spec = plan.resolve(decode, draft.config, target.config)
    state = rounds.init_state(spec, draft.params, target.params, prompts_BxP, lengths_B)
    scored = jax.jit(functools.partial(rounds.score, spec, traced=traced))(
      target.params, state.target_cache, state.last_B, jnp.asarray(drafts_BxKxL)
    )
    assert not np.any(np.asarray(scored.nonfinite_B))
    out.append(np.asarray(scored.q_BxKxL1xV))
  return out


@pytest.mark.parametrize("shared", [False, True], ids=["random", "all-equal"])
def test_tree_scoring_gives_every_path_the_q_of_its_tail(models, shared, monkeypatch):
  """Issue 27: the target on the deduplicated tree gives every path, at every position,
  the q it gets as a tail (ragged prompts; two tokens, so paths share prefixes; all
  paths equal: the smallest compiled tree). A tree whose paths read another path's
  nodes is caught."""
  rng = np.random.default_rng(11)
  b, k, length = 5, 4, 3
  prompts = jnp.asarray(rng.integers(0, V, (b, 5)), jnp.int32)
  lengths = jnp.asarray([5, 1, 3, 2, 4], jnp.int32)
  drafts = rng.integers(0, 2, (b, k, length))
  if shared:
    drafts[:] = drafts[:, :1]
  tails, trees = _tree_and_tail_q(models, drafts, prompts, lengths)
  np.testing.assert_allclose(trees, tails, atol=2e-6, rtol=0)
  if shared:
    return
  real = tree.from_paths

  def first_path_only(last_B, drafts_BxKxL, length_BxK=None):
    t = real(last_B, drafts_BxKxL, length_BxK)
    first_BxKxL1 = jnp.broadcast_to(t.path_node_BxKxL1[:, :1], (b, k, length + 1))
    return t._replace(path_node_BxKxL1=first_BxKxL1)

  monkeypatch.setattr(tree, "from_paths", first_path_only)
  _, broken = _tree_and_tail_q(models, drafts, prompts, lengths)
  assert np.max(np.abs(broken - tails)) > 1e-2


_GREEDY_PROMPTS = np.asarray([[1, 2, 3, 0], [3, 3, 0, 0], [0, 1, 2, 3]], np.int32)
_GREEDY_LENGTHS = np.asarray([3, 2, 4])
_GREEDY_TOKENS = 9


@pytest.fixture(scope="module")
def greedy_target(models):
  """The reference: greedy argmax of the target's full causal forward, token by token
  (one compiled forward over a fixed width: what follows a position cannot change it)."""
  _, target = models
  forward = jax.jit(target.decoder.logits)
  out = []
  for prompt, length in zip(_GREEDY_PROMPTS, _GREEDY_LENGTHS, strict=True):
    seq = np.zeros((1, _GREEDY_PROMPTS.shape[1] + _GREEDY_TOKENS), np.int32)
    seq[0, :length] = prompt[:length]
    for t in range(length, length + _GREEDY_TOKENS):
      seq[0, t] = int(jnp.argmax(forward(target.params, jnp.asarray(seq))[0, t - 1]))
    out.append(seq[0, length : length + _GREEDY_TOKENS])
  return np.stack(out)


@pytest.mark.parametrize(
  "method, num_drafts, draft_len, use_tree",
  [
    ("kseq", 3, 3, False),
    ("kseq", 3, 3, True),
    pytest.param("sd", 1, 2, False, marks=_slow),
    pytest.param("block", 1, 3, False, marks=_slow),
    pytest.param("gbv", 3, 2, False, marks=_slow),
    pytest.param("rrs", 3, 2, False, marks=_slow),
    pytest.param("rrs", 3, 2, True, marks=_slow),
    pytest.param("gbv_tp", 3, 2, False, marks=_slow),
  ],
)
def test_greedy_equals_greedy_target_decoding(
  models, greedy_target, method, num_drafts, draft_len, use_tree
):
  draft, target = models
  kw = dict(draft=draft, target=target, prompts=jnp.asarray(_GREEDY_PROMPTS))
  kw.update(prompt_lengths=jnp.asarray(_GREEDY_LENGTHS))
  greedy = DecodeSpec(method="autoregressive", max_new_tokens=_GREEDY_TOKENS, temperature=0.0)
  ar = engine.generate(jax.random.key(0), greedy, **kw)
  spec = greedy.replace(method=method, num_drafts=num_drafts, draft_len=draft_len, dedup=use_tree)
  spec = engine.generate(jax.random.key(1), spec, **kw)
  np.testing.assert_array_equal(np.asarray(ar.tokens_BxT), greedy_target)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxT), greedy_target)


@pytest.mark.slow
def test_identical_models_accept_every_full_round(models):
  _, target = models
  out = generate(target, target, "sd", 1, 3, 12, batch=16)
  s = out.stats
  assert np.all(np.asarray(s.rounds_B) == 3)
  assert np.all(np.asarray(s.tokens_per_round_BxL2)[:, 4] == 3)
  assert float(s.block_efficiency) == pytest.approx(4.0)


# One method of each kind at K = 3 (or its largest K) and L = 2: a dedup round hands every
# verifier the q and drafts of its tails (the scoring does not depend on the method), so
# these cover the ways a verifier reads them: token level one draft, K drafts (K-SEQ at
# rho* and at a fixed rho), drafts without replacement (RRS, also on a drafted branching),
# the block level on one path (GBV) and on the tree (Traversal).
_DEDUP_CASES = [
  ("sd", 1, {}),
  ("kseq", 3, {}),
  ("kseq", 3, {"rho": 1.5}),
  ("rrs", 4, {"branching": (2, 2)}),
  ("rrs", 4, {"branching": "proportional"}),
  ("gbv", 3, {}),
  ("traversal", 3, {}),
]


@pytest.mark.slow
@pytest.mark.parametrize("method, num_drafts, kw", _DEDUP_CASES, ids=lambda c: str(c))
def test_dedup_rounds_give_every_method_the_tokens_of_its_tails(models, method, num_drafts, kw):
  """Issue 27, item 2: with the same keys, each kind of verifier emits the same tokens from
  a scored tree as from K tails (its q is the tails' within float32 rounding, so a row may
  differ only where a uniform lands within that rounding of a threshold), so each
  method's law on trees is its law on tails (tests/decoding/test_engine_law.py)."""
  draft, target = models
  out = [
    generate(draft, target, method, num_drafts, 2, 6, key=5, batch=512, dedup=t, **kw)
    for t in (False, True)
  ]
  tails, trees = (np.asarray(o.tokens_BxT) for o in out)
  same = np.mean(np.all(tails == trees, axis=1))
  assert same >= 0.99, same
  assert float(out[0].stats.block_efficiency) > 1.2  # drafts were accepted


@pytest.mark.slow
@pytest.mark.parametrize("method, kw", [("kseq", {}), ("rrs", {"branching": "proportional"})])
def test_dedup_rounds_on_ragged_prompts_with_top_p_and_eos_give_the_tails_tokens(
  models, method, kw
):
  """Issue 27, item 4: ragged prompts (lengths 1-5), top-p on both models and an EOS that
  stops some rows: the dedup rounds emit the tails' tokens for the same keys."""
  draft, target = models
  rng = np.random.default_rng(3)
  b = 256
  prompts = jnp.asarray(rng.integers(0, V, (b, 5)), jnp.int32)
  lengths = jnp.asarray(rng.integers(1, 6, b), jnp.int32)
  spec = DecodeSpec(method=method, num_drafts=4, draft_len=3, max_new_tokens=10, **kw)
  spec = spec.replace(temperature=0.8, top_p=0.85, eos_ids=(2,))
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=lengths)
  out = [engine.generate(jax.random.key(4), spec.replace(dedup=t), **kw) for t in (False, True)]
  (tails, n_tails), (trees, n_trees) = ((np.asarray(o.tokens_BxT), o.lengths_B) for o in out)
  assert np.mean(np.all(tails == trees, axis=1)) >= 0.99
  np.testing.assert_array_equal(n_tails, n_trees)
  assert 0 < np.mean(np.asarray(n_trees) < 10) < 1  # some rows stopped at EOS, some ran on


@pytest.mark.parametrize("use_tree", [False, pytest.param(True, marks=_slow)])
def test_eos_stops_rows(models, use_tree):
  """Rows stop at EOS, also where it is accepted inside a token tree (issue 27), whose
  rows then hold the tails' tokens (the same keys; q equal within float32 rounding)."""
  draft, target = models
  eos = 3  # The target's most likely token.
  out = generate(draft, target, "kseq", 2, 3, 12, batch=64, eos_ids=eos, dedup=use_tree)
  tokens, lengths = np.asarray(out.tokens_BxT), np.asarray(out.lengths_B)
  if use_tree:
    tails = generate(draft, target, "kseq", 2, 3, 12, batch=64, eos_ids=eos)
    same = np.all(tokens == np.asarray(tails.tokens_BxT), axis=1)
    assert np.mean(same) >= 0.95 and np.any(lengths < 12), np.mean(same)
  assert np.any(lengths < 12)
  for row, n in zip(tokens, lengths, strict=True):
    assert np.all(row[n:] == 0)
    assert np.sum(row[:n] == eos) == (1 if n < 12 else np.sum(row[:n] == eos))
    if n < 12:
      assert row[n - 1] == eos
  np.testing.assert_array_equal(np.asarray(out.stats.emitted_B), lengths)


@pytest.mark.slow
def test_eos_set_stops_at_any_of_its_ids(models):
  draft, target = models
  eos = (1, 3)
  out = generate(draft, target, "kseq", 2, 3, 12, batch=64, eos_ids=eos)
  tokens, lengths = np.asarray(out.tokens_BxT), np.asarray(out.lengths_B)
  last = {int(row[n - 1]) for row, n in zip(tokens, lengths, strict=True) if n < 12}
  assert last == set(eos)  # Both ids end rows, and nothing else does.
  for row, n in zip(tokens, lengths, strict=True):
    assert not np.isin(row[: n - 1], eos).any()


def test_nonfinite_logits_are_counted_not_sampled(models):
  """(The program of tests/decoding/test_engine.py::test_eos_stops_rows on tails: compiled once.)"""
  draft, target = models
  broken = ModelBundle(target.config, jax.tree.map(lambda x: x * jnp.nan, target.params))
  out = generate(draft, broken, "kseq", 2, 3, 12, batch=64, eos_ids=3)
  assert np.all(np.asarray(out.stats.nonfinite_B) == 1)
  assert np.all(np.asarray(out.stats.nonfinite_draft_B) == 0)
  assert np.all(np.asarray(out.lengths_B) == 0)
  broken = ModelBundle(draft.config, jax.tree.map(lambda x: x * jnp.nan, draft.params))
  out = generate(broken, target, "kseq", 2, 3, 12, batch=64, eos_ids=3)
  assert np.all(np.asarray(out.stats.nonfinite_draft_B) == 1)


def test_an_invalid_fixed_rho_is_counted_and_exact_rules_never(models):
  """Issue 24: K-SEQ with rho = 1 at K = 4 overshoots the target at positions where the
  draft is likelier than the target; the engine counts them (rho*, and rho = K fixed:
  none; both fixed values run one program)."""
  draft, target = models
  for rho, invalid in (("star", False), (4.0, False), (1.0, True)):
    out = generate(draft, target, "kseq", 4, 2, 6, batch=64, rho=rho)
    count = int(np.sum(np.asarray(out.stats.invalid_BxL1)))
    overshoot = float(np.sum(np.asarray(out.stats.overshoot_BxL1)))
    verified = int(np.sum(np.asarray(out.stats.reached_BxL1)[:, :2]))
    assert (count > 0) == invalid and count <= verified, (rho, count)
    # Exact rules overshoot by float32 rounding only (far below the tolerance).
    assert (overshoot > verified * methods.OVERSHOOT_TOL) == invalid, (rho, overshoot)


@pytest.mark.slow
def test_row_randomness_is_per_prompt(models):
  """A prompt's output does not depend on the batch it is decoded in."""
  draft, target = models
  prompts = jnp.asarray([[1, 2, 3], [2, 2, 0], [3, 1, 0], [0, 0, 1]], jnp.int32)
  lengths = jnp.asarray([3, 2, 2, 3])
  kw = dict(draft=draft, target=target)
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=7)
  full = engine.generate(jax.random.key(3), spec, prompts=prompts, prompt_lengths=lengths, **kw)
  part = engine.generate(
    jax.random.key(3),
    spec,
    prompts=prompts[2:],
    prompt_lengths=lengths[2:],
    prompt_ids=jnp.asarray([2, 3]),
    **kw,
  )
  np.testing.assert_array_equal(np.asarray(full.tokens_BxT[2:]), np.asarray(part.tokens_BxT))


@pytest.mark.slow
@pytest.mark.execution_bound
def test_engine_exact_on_model_sharded_mesh(models):
  """On a (2, 4) mesh (rows over data, heads, MLP and vocabulary over model) the output
  law is still the target's. The verifiers run the same code on the gathered
  probabilities as on one device, so K-SEQ stands for all of them here."""
  draft, target = models
  out = generate(draft, target, "kseq", 3, 2, 4, key=7, mesh=sharding.make_mesh(2, 4))
  law = exact_law(target, 4)
  stats.assert_law(np.bincount(codes(out.tokens_BxT), minlength=law.size), law, "kseq (2, 4)")


def test_branching_is_checked(models):
  """A branching only for a scheme that draws trees: L entries of product K, or
  "proportional"."""
  draft, target = models
  for branching in [(2, 2), "proportional"]:
    with pytest.raises(ValueError, match="draws no tree"):
      generate(draft, target, "kseq", 4, 2, 4, batch=2, branching=branching)
  for bad in [(2, 3), (4,), (2, 2, 1), (4, 0), "proportionl"]:
    with pytest.raises(ValueError, match="branching"):
      generate(draft, target, "rrs", 4, 2, 4, batch=2, branching=bad)


def test_second_call_does_not_recompile(models):
  draft, target = models
  prompts = jnp.asarray([[1, 2, 3], [2, 2, 0]], jnp.int32)
  kw = dict(draft=draft, target=target)
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=5, top_p=0.9)
  engine.generate(
    jax.random.key(0),
    spec.replace(rho=1.5),
    prompts=prompts,
    prompt_lengths=jnp.asarray([3, 2]),
    **kw,
  )
  compiled = engine.compiled_program(
    plan.resolve(spec.replace(rho=1.5), draft.config, target.config), None
  )
  before = compiled._cache_size()
  engine.generate(
    jax.random.key(1),
    spec.replace(rho=2.0, temperature=0.7, top_p=0.5),
    prompts=prompts[::-1],
    prompt_lengths=jnp.asarray([2, 3]),
    **kw,
  )
  assert compiled._cache_size() == before == 1


def test_a_token_limit_shares_the_program_and_cuts_the_same_tokens(models):
  """A traced token limit (`DecodeSpec.token_limit`): the first tokens of the full
  decode, from the same compiled program."""
  draft, target = models
  prompts = jnp.asarray([[1, 2, 3], [2, 2, 0]], jnp.int32)
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=jnp.asarray([3, 2]))
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=6)
  full = engine.generate(jax.random.key(3), spec, **kw)
  compiled = engine.compiled_program(plan.resolve(spec, draft.config, target.config), None)
  before = compiled._cache_size()
  cut = engine.generate(jax.random.key(3), spec.replace(token_limit=3), **kw)
  assert compiled._cache_size() == before == 1
  np.testing.assert_array_equal(cut.lengths_B, [3, 3])
  np.testing.assert_array_equal(cut.tokens_BxT[:, :3], full.tokens_BxT[:, :3])
  assert not np.any(np.asarray(cut.tokens_BxT[:, 3:]))


def test_scanned_and_unrolled_layers_emit_the_same_tokens(models):
  draft, target = models
  kw = dict(draft=draft, target=target)
  kw.update(prompts=jnp.asarray([[1, 2, 3], [2, 2, 0]]), prompt_lengths=jnp.asarray([3, 2]))
  spec = DecodeSpec(method="kseq", num_drafts=3, draft_len=2, max_new_tokens=6)
  outs = [
    engine.generate(jax.random.key(4), spec.replace(layer_stack=stack), **kw)
    for stack in ("scan", "unroll")
  ]
  np.testing.assert_array_equal(outs[0].tokens_BxT, outs[1].tokens_BxT)


@pytest.mark.parametrize(
  "method, num_drafts, draft_len, temperature",
  # Greedy and sampling compile apart: both for K-SEQ, the sampling program of the others.
  [
    ("autoregressive", 1, 0, 1.0),
    ("sd", 1, 3, 1.0),
    ("kseq", 3, 3, 0.0),
    ("kseq", 3, 3, 1.0),
    ("specinfer", 3, 3, 1.0),
    ("block", 1, 3, 1.0),
  ],
)
def test_the_loop_of_rounds_is_the_programs_only_data_dependent_one(
  models, method, num_drafts, draft_len, temperature
):
  """Issue 38: no host round trip inside a round on an accelerator. Compiled, the
  program's every other while has a trip count XLA knows and there is no conditional;
  the weights are cast before the program (no convert of a parameter-shaped tensor)."""
  draft, target = models
  bf16 = [ModelBundle(dataclasses.replace(m.config, dtype="bfloat16"), m.params) for m in models]
  spec = DecodeSpec(method=method, num_drafts=num_drafts, draft_len=draft_len, max_new_tokens=4)
  lowered = engine.lower(
    jax.random.key(0),
    spec.replace(temperature=temperature),
    draft=bf16[0],
    target=bf16[1],
    prompts=jnp.asarray([[1, 2, 3]]),
    prompt_lengths=jnp.asarray([3]),
  )
  module = programs.parse(lowered.compile().as_text())
  data_dependent = [c for c in programs.control_flow(module) if c.data_dependent]
  assert [(c.kind, c.op_name) for c in data_dependent] == [("while", "jit(_decode)/while")]
  shapes = {tuple(x.shape) for x in jax.tree.leaves((draft.params, target.params))}
  hlo = programs.parse(lowered.as_text(dialect="hlo"))
  assert programs.parameter_converts(hlo, shapes) == []
  # The check sees converts where there are some: float32 weights in a bf16 forward.
  forward = jax.jit(bf16[1].decoder.logits).lower(target.params, jnp.zeros((1, 3), jnp.int32))
  assert programs.parameter_converts(programs.parse(forward.as_text(dialect="hlo")), shapes)


def test_a_traced_temperature_is_refused(models):
  """Greedy decoding and sampling are separate programs: the temperature must be known."""
  draft, target = models
  kw = dict(draft=draft, target=target, prompts=jnp.asarray([[1, 2, 3]]))
  kw.update(prompt_lengths=jnp.asarray([3]))
  spec = dict(method="sd", draft_len=2, max_new_tokens=2)
  run = jax.jit(
    lambda t: engine.generate(jax.random.key(0), DecodeSpec(**spec, temperature=t), **kw).tokens_BxT
  )
  with pytest.raises(ValueError, match="temperature must be a number, not a traced value"):
    run(jnp.float32(0.5))


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(method="beam"), "unknown method"),
    (dict(token_limit=0), "token_limit must be an integer >= 1"),
    (dict(token_limit=5), r"token_limit must lie in \[1, max_new_tokens = 4\]"),
    (dict(layer_stack="yes"), "layer_stack must be one of"),
    (dict(drafting="wor", num_drafts=2), "method 'kseq' is not exact for drafting scheme 'wor'"),
    (dict(spec=dict(method="kseq")), "spec must be a spectr_jax.DecodeSpec"),
    (dict(num_drafts=0), "num_drafts must be"),
    (dict(draft_len=0), "draft_len must be"),
    (dict(max_new_tokens=0), "max_new_tokens must be"),
    (dict(temperature=-1.0), "temperature must be"),
    (dict(top_p=0.0), "top_p must"),
    (dict(top_p=1.5), "top_p must"),
    (dict(max_new_tokens=30), "exceeds the target's max_len"),
    (dict(prompt_lengths=jnp.asarray([0])), "prompt_lengths must"),
    (dict(method="sd", num_drafts=2), "single draft"),
    (dict(vocab_mismatch=True), "vocabularies differ"),
    # Issue 13: silent wrong tokens and cryptic errors before these checks.
    (dict(prompts=jnp.asarray([[1.0, 2.0, 5.7]])), "prompts must hold integers"),
    (dict(prompts=jnp.asarray([[1, -1, 3]])), r"prompts must hold token ids in \[0, "),
    (dict(prompts=jnp.asarray([[1, V, 3]])), r"prompts must hold token ids in \[0, "),
    (dict(eos_ids=V), r"every value of eos_ids must lie in \[0, "),
    (dict(eos_ids=-1), "every value of eos_ids must be an integer >= 0"),
    (dict(eos_ids=(3, V)), r"every value of eos_ids must lie in \[0, "),
    (dict(top_k=V + 1), "top_k = .* exceeds the vocabulary"),
    (dict(temperature=float("inf")), "temperature must be finite"),
    (dict(temperature=float("nan")), "temperature must be finite"),
    (dict(rho=3.0), r"rho must be .* in \[1, K = 2\]"),
    (dict(num_drafts=2.5), "num_drafts must be an integer"),
    (dict(draft_len=1.5), "draft_len must be an integer"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an integer"),
    (dict(prompt_ids=jnp.asarray([0, 1])), "prompt_ids has shape"),
    (dict(prompt_ids=jnp.asarray([0.5])), "prompt_ids must hold integers"),
    # Issue 24: silent casts and cryptic errors.
    (dict(prompt_lengths=np.asarray([2.7])), "prompt_lengths must hold integers"),
    (dict(prompt_ids=np.asarray([2**40])), r"prompt_ids must hold integers in \["),
    (dict(key=0), "key must be a PRNG key"),
    (dict(key=jax.random.split(jax.random.key(0), 2)), "key must be one PRNG key"),
    (dict(other_params=True), "draft's parameters do not match its config"),
    (
      dict(prompts=jnp.zeros((0, 3), jnp.int32), prompt_lengths=jnp.zeros((0,), jnp.int32)),
      "at least one row",
    ),  # fmt: skip
  ],
)
def test_bad_input(models, change, message):
  draft, target = models
  if change.pop("vocab_mismatch", False):
    config = get_model_config("draft-test", V + 1, max_len=24)
    draft = ModelBundle(config, draft.params)
  if change.pop("other_params", False):
    draft = ModelBundle(draft.config, target.params)
  key = change.pop("key", jax.random.key(0))
  kw = dict(draft=draft, target=target, prompts=jnp.asarray([[1, 2, 3]]))
  kw.update(prompt_lengths=jnp.asarray([3]))
  spec = dict(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=4)
  for name in set(change) & set(kw):
    kw[name] = change.pop(name)
  prompt_ids = change.pop("prompt_ids", None)
  with pytest.raises(ValueError, match=message):
    spec = change.pop("spec") if "spec" in change else DecodeSpec(**spec | change)
    engine.generate(key, spec, prompt_ids=prompt_ids, **kw)


def test_a_raw_prng_key_decodes_as_its_typed_key(models):
  """A legacy `jax.random.PRNGKey(0)` (raw uint32[2]) drafts K = 2 paths and emits what
  `jax.random.key(0)` does (it failed deep in drafting on a dimension mismatch)."""
  draft, target = models
  prompts = jnp.asarray([engine_pair.PROMPT] * 3, jnp.int32)
  kw = dict(draft=draft, target=target, prompts=prompts, prompt_lengths=jnp.full((3,), 3))
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=5)
  raw = engine.generate(jax.random.PRNGKey(0), spec, **kw)
  typed = engine.generate(jax.random.key(0), spec, **kw)
  np.testing.assert_array_equal(raw.tokens_BxT, typed.tokens_BxT)


def test_abstract_parameters_lower_and_are_not_run(models):
  """`engine.lower` takes parameters as `jax.ShapeDtypeStruct`s (and abstract prompts):
  the program is the one concrete arguments build; `generate` refuses them, naming
  `lower`; `lower_round` builds one round of it (the state donated, its caches updated in
  place)."""
  draft, target = models
  spec = DecodeSpec("kseq", 2, 2, max_new_tokens=6)
  prompts, lengths = jnp.ones((2, 3), jnp.int32), jnp.full((2,), 3, jnp.int32)
  shapes = functools.partial(jax.tree.map, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype))
  abstract = {
    "draft": draft.replace(params=shapes(draft.params)),
    "target": target.replace(params=shapes(target.params)),
  }
  rows = dict(prompts=shapes(prompts), prompt_lengths=shapes(lengths))
  key = jax.random.key(0)
  concrete = engine.lower(
    key, spec, draft=draft, target=target, prompts=prompts, prompt_lengths=lengths
  ).compile()
  compiled = engine.lower(key, spec, **abstract, **rows).compile()
  # The same program: the same arguments and buffers, the same instructions.
  stats = [p.memory_analysis() for p in (concrete, compiled)]
  assert stats[0].argument_size_in_bytes == stats[1].argument_size_in_bytes
  assert stats[0].temp_size_in_bytes == stats[1].temp_size_in_bytes
  count = programs.count_instructions
  assert count(programs.parse(compiled.as_text())) == count(programs.parse(concrete.as_text()))
  with pytest.raises(ValueError, match="engine.lower"):
    engine.generate(key, spec, **abstract, prompts=prompts, prompt_lengths=lengths)
  round_ = engine.lower_round(key, spec, **abstract, **rows).compile()
  flow = programs.control_flow(programs.parse(round_.as_text()))
  assert all(not c.data_dependent for c in flow)  # one round: no loop of rounds
  assert round_.memory_analysis().alias_size_in_bytes > 0  # the state updated in place
