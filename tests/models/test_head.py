"""The draft head (`spectr_jax.models.head`): its incremental calls equal its forward, the
engine hands it the target's features of the right positions, and broken wirings (the
features of the wrong position, features never handed over) are caught."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import engine, plan, rounds, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, decoder
from spectr_jax.models.head import HeadConfig, HeadDecoder, share_target
from tests import engine_pair

TOL = 1e-4  # float32: a cached call against the whole forward


@pytest.fixture(scope="module")
def pair():
  _, target = engine_pair.models()
  config = HeadConfig.of(target.config, 1)
  params = share_target(decoder(config).init_params(jax.random.key(3)), target.params)
  return ModelBundle(config, params), target


def _features(target, tokens_BxT):
  """The target's last-layer output at every position (its whole forward)."""
  _, x_BxTxD = decoder(target.config)._apply(target.params, tokens_BxT, None, True)
  return x_BxTxD


def test_a_head_is_a_decoder_that_reads_the_targets_embedding(pair):
  head, target = pair
  model = decoder(head.config)
  assert isinstance(model, HeadDecoder) and model.reads_features
  assert not decoder(target.config).reads_features
  assert head.params["embed"] is target.params["embed"]
  assert head.config != target.config and head.config.num_layers == 1
  assert model.param_axes()["fc"] == ("features", "embed")


def test_prefill_opening_and_steps_equal_the_forward(pair):
  """Prefill, the opening call on a pending token (the target's feature before it) and a
  step (the head's own output before it) give the logits of the head's forward with
  those features."""
  head, target = pair
  model = decoder(head.config)
  tokens_1xT = jnp.asarray([[1, 2, 3, 0, 2, 1]], jnp.int32)
  f_1xTxD = _features(target, tokens_1xT)
  full_1xTxV, own_1xTxD = model.logits(head.params, tokens_1xT, f_1xTxD, True)
  n = 3
  cache = model.init_cache(1, 2, 4, 16)
  logits_1xnxV, cache = model.prefill(
    head.params, tokens_1xT[:, :n], jnp.asarray([n]), cache, f_1xTxD[:, :n]
  )
  np.testing.assert_allclose(logits_1xnxV[0], full_1xTxV[0, :n], atol=TOL)
  pending_1x2x2 = jnp.broadcast_to(tokens_1xT[:, None, n : n + 2], (1, 2, 2))
  opening_1x2xV, cache = model.extend(
    head.params, pending_1x2x2, cache, jnp.asarray([1]), jnp.asarray([0]), tails_empty=True
  )
  np.testing.assert_allclose(opening_1x2xV[0, 1], full_1xTxV[0, n], atol=TOL)
  step_1x2x1xV, cache = model.extend(head.params, pending_1x2x2[:, :, 1:], cache)
  mixed_1xTxD = f_1xTxD.at[:, n].set(own_1xTxD[:, n])  # the head's own output at n
  reference_1xTxV = model.logits(head.params, tokens_1xT, mixed_1xTxD)
  np.testing.assert_allclose(step_1x2x1xV[0, 0, 0], reference_1xTxV[0, n + 1], atol=TOL)
  with pytest.raises(ValueError, match="reads the target's features"):
    model.prefill(head.params, tokens_1xT, jnp.asarray([6]), model.init_cache(1, 1, 2, 16))


def _rounds(head, target, method, rounds_run=3, **settings):
  """Runs `rounds_run` rounds on 8 rows: the state and each row's text (prompt, then
  every emitted token; its last `num_pending_B` tokens are pending)."""
  spec = DecodeSpec(method, 3, 2, max_new_tokens=16, **settings)  # no row ends in 3 rounds
  decode_plan = plan.resolve(spec, head.config, target.config)
  traced = plan.traced(spec, decode_plan)
  prompts_BxP = jnp.tile(jnp.asarray([engine_pair.PROMPT], jnp.int32), (8, 1))
  lengths_B = jnp.full((8,), len(engine_pair.PROMPT))
  state = rounds.init_state(decode_plan, head.params, target.params, prompts_BxP, lengths_B)
  one = jax.jit(lambda key, state: rounds.run_round(
    decode_plan, head.params, target.params, key, state, traced))  # fmt: skip
  keys_B = jax.random.split(jax.random.key(7), 8)
  for _ in range(rounds_run):
    state = one(keys_B, state)
  texts = [
    np.concatenate([engine_pair.PROMPT, np.asarray(state.out_BxW[b, : int(state.num_out_B[b])])])
    for b in range(8)
  ]
  return state, texts


def _pending_error(head, target, method, rounds_run=3, **settings):
  """The largest gap between the features the head holds before each pending token and
  the target's forward of the emitted text there, after `rounds_run` rounds."""
  state, texts = _rounds(head, target, method, rounds_run, **settings)
  worst = 0.0
  for b, text in enumerate(texts):
    f_TxD = _features(target, jnp.asarray(text[None], jnp.int32))[0]
    num = int(state.num_pending_B[b])
    for j in range(num):
      position = len(text) - num + j  # the pending token's; it reads the feature before it
      held = np.asarray(state.draft_cache.pending_features[b, j])
      worst = max(worst, float(np.max(np.abs(held - f_TxD[position - 1]))))
  return worst


def _unrolled_rows(head, target, method, **settings):
  """Rows whose head cache does not hold exactly the committed text (all but the
  pending tokens): a cache not rolled back to the accepted drafts holds more."""
  state, texts = _rounds(head, target, method, **settings)
  held_B = np.asarray(state.draft_cache.prefix_len)
  committed_B = np.array([len(t) for t in texts]) - np.asarray(state.num_pending_B)
  return int(np.sum(held_B != committed_B))


@pytest.mark.parametrize(
  "method, settings", [("kseq", {}), ("kseq", dict(adaptive=0.5)), ("rrs", dict(dedup=True))]
)
def test_the_round_hands_the_head_the_targets_features_of_its_pending_tokens(
  pair, method, settings
):
  head, target = pair
  assert _pending_error(head, target, method, **settings) < TOL


def test_broken_feature_wirings_are_caught(pair, monkeypatch):
  """The features of the wrong position (each pending token given its own, not its
  predecessor's), and features never handed over (the prompt's kept): caught. Either
  keeps the output law exact (the verifier reads the p the drafts were drawn from) and
  costs acceptance, so it is this test, not a law test, that sees them."""
  head, target = pair
  receive = HeadDecoder.receive

  def shifted(self, cache, features_Bx2xD):
    return receive(self, cache, jnp.roll(features_Bx2xD, -1, axis=1))

  monkeypatch.setattr(HeadDecoder, "receive", shifted)
  assert _pending_error(head, target, "kseq") > 100 * TOL
  monkeypatch.setattr(HeadDecoder, "receive", lambda self, cache, features_Bx2xD: cache)
  assert _pending_error(head, target, "kseq") > 100 * TOL


def test_a_head_cache_not_rolled_back_is_caught(pair, monkeypatch):
  """After each round the head's cache holds the committed text and no more (for tails
  and dedup trees); a commit that keeps every drafted token of the chosen tail (no
  rollback to the accepted ones) is caught. Like a wrong feature, it keeps the output
  law (the verifier reads the drafts' p) and costs acceptance."""
  head, target = pair
  assert _unrolled_rows(head, target, "kseq") == 0
  assert _unrolled_rows(head, target, "rrs", dedup=True) == 0
  commit = HeadDecoder.commit

  def unrolled(self, cache, tail_B, num_B):
    return commit(self, cache, tail_B, jnp.max(cache.tail_len, axis=1))

  monkeypatch.setattr(HeadDecoder, "commit", unrolled)
  assert _unrolled_rows(head, target, "kseq") > 0


@pytest.mark.slow
@pytest.mark.numerics  # V = 32000: the optimised build
@pytest.mark.parametrize("method, settings", [("kseq", {}), ("rrs", dict(dedup=True))])
def test_a_head_decodes_the_target_law_at_an_llm_vocabulary(method, settings):
  """`check_engine` at V = 32k with a head on the random target: every emitted position,
  on tails and on dedup rounds."""
  from spectr_jax.testing import check_engine
  from spectr_jax.testing.engine_check import random_pair

  _, target = random_pair(32_000, 0)
  config = HeadConfig.of(target.config, 1)
  params = share_target(decoder(config).init_params(jax.random.key(5)), target.params)
  report = check_engine(method, pair=(ModelBundle(config, params), target), **settings)
  assert report.passed, report.markdown()


@pytest.mark.slow
def test_a_head_on_a_mesh_gives_the_tokens_of_one_device(pair):
  """A head's parameters and its two feature caches split like the target's: on a (2, 4)
  mesh (rows over "data"; heads, MLP and vocabulary over "model"), the tokens of one
  device (random-weight models: no last-bit difference flips a draw here)."""
  head, target = pair
  rng = np.random.default_rng(5)
  vocab = target.config.vocab_size
  prompts, lengths = rng.integers(0, vocab, (8, 5)).astype(np.int32), rng.integers(1, 6, 8)
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=8)

  def tokens(mesh):
    out = engine.generate(
      jax.random.key(4), spec, draft=head, target=target, prompts=prompts,
      prompt_lengths=lengths, prompt_ids=np.arange(8), mesh=mesh,
    )  # fmt: skip
    return np.asarray(out.tokens_BxT)

  np.testing.assert_array_equal(tokens(sharding.make_mesh(2, 4)), tokens(None))
