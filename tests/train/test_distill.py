"""Tests of distillation: the divergences, the step, exact resume, the alignment metrics."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import distill as distill_config
from configs import target as target_config
from spectr_jax import analysis, distill, runs, train
from spectr_jax.data import TokenizedSplit, make_prompts
from spectr_jax.models import ModelBundle, get_model_config, init_params
from spectr_jax.train_config import DistillConfig, TrainConfig

_VOCAB = 64


def _random_probs(key, shape, sharpness=3.0):
  return jax.nn.softmax(sharpness * jax.random.normal(key, shape), axis=-1)


def _closed_form(p, q, name, skew):
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  kl = lambda a, b: np.sum(a * np.log(a / b), axis=-1)  # noqa: E731
  if name == "forward_kl":
    return kl(q, p)
  if name == "reverse_kl":
    return kl(p, q)
  if name == "tv":
    return 0.5 * np.sum(np.abs(p - q), axis=-1)
  m = skew * q + (1 - skew) * p
  return skew * kl(q, m) + (1 - skew) * kl(p, m)


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "tv", "jsd"])
@pytest.mark.parametrize("skew", [0.5, 0.1])
def test_divergences_equal_their_closed_forms(name, skew):
  kp, kq = jax.random.split(jax.random.key(0))
  p, q = _random_probs(kp, (5, 7, _VOCAB)), _random_probs(kq, (5, 7, _VOCAB))
  got = distill.divergence(p, q, name, skew)
  assert got.shape == (5, 7)
  np.testing.assert_allclose(got, _closed_form(p, q, name, skew), rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(distill.divergence(p, p, name, skew), 0.0, atol=2e-6)


def test_kl_of_truncated_distributions_is_finite():
  q = jnp.array([[0.5, 0.5, 0.0, 0.0]])
  p = jnp.array([[0.25, 0.25, 0.25, 0.25]])
  np.testing.assert_allclose(distill.divergence(p, q, "forward_kl"), np.log(2.0), rtol=1e-6)
  assert np.isfinite(distill.divergence(p, q, "reverse_kl")).all()


def _models():
  draft = get_model_config("draft-test", _VOCAB)
  target = get_model_config("target-test", _VOCAB)
  return (
    ModelBundle(draft, init_params(draft, jax.random.key(1))),
    ModelBundle(target, init_params(target, jax.random.key(2))),
  )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["forward_kl", "tv"])
def test_a_distillation_step_lowers_the_divergence(name):
  draft, target = _models()
  config = TrainConfig(model="draft-test", batch_size=8, num_steps=20, warmup_steps=1)
  config = dataclasses.replace(config, learning_rate=1e-2)
  dconf = DistillConfig(target_workdir="t", divergence=name, temperature=0.8)
  loss_fn = functools.partial(
    distill.distill_loss, draft=draft.model, target=target.model, config=dconf
  )
  optimizer = train.make_optimizer(config)
  state = train._init_state(config, optimizer, draft.params)
  rows = {"corpus": jax.random.randint(jax.random.key(3), (8, 17), 4, _VOCAB, jnp.int32)}
  step = jax.jit(train._train_step, static_argnums=(3, 4))
  before = float(loss_fn(state.params, target.params, rows))
  for _ in range(8):
    state, _ = step(state, rows, target.params, loss_fn, optimizer)
  after = float(loss_fn(state.params, target.params, rows))
  assert after < 0.9 * before, (before, after)


def _heldout(num=12, length=10):
  ids = np.random.default_rng(0).integers(4, _VOCAB, size=(num, length))
  return TokenizedSplit.from_ids([list(x) for x in ids])


@pytest.mark.slow
def test_a_copy_of_the_draft_as_target_gives_zero_loss_and_acceptance_one():
  draft, _ = _models()
  copy = ModelBundle(draft.config, jax.tree.map(jnp.array, draft.params))
  rows = {"corpus": jax.random.randint(jax.random.key(3), (4, 17), 4, _VOCAB, jnp.int32)}
  config = DistillConfig(target_workdir="t", prompt_len=4, eval_prompts=6, eval_tokens=8)
  names = ("forward_kl", "reverse_kl", "tv", "jsd")

  @jax.jit
  def losses(params, target_params):
    return jnp.stack([
      distill.distill_loss(
        params, target_params, rows, draft.model, copy.model,
        dataclasses.replace(config, divergence=name),
      )
      for name in names
    ])  # fmt: skip

  np.testing.assert_allclose(losses(draft.params, copy.params), 0.0, atol=1e-5)
  aligned = distill.alignment(draft, copy, _heldout(), config, seed=0, batch_size=8)
  assert aligned["acceptance"] == pytest.approx(1.0, abs=1e-5)
  assert aligned["alpha_k8"] == pytest.approx(1.0, abs=1e-5)
  assert aligned["positions"] == 6 * 8


def test_alignment_follows_the_trajectories_of_the_analysis():
  draft, target = _models()
  config = DistillConfig(target_workdir="t", prompt_len=4, eval_prompts=6, eval_tokens=8)
  heldout = _heldout()
  aligned = distill.alignment(draft, target, heldout, config, seed=5, batch_size=8)
  prompts = make_prompts(heldout, 6, 4, 5)
  traj = analysis.collect_trajectories(draft, target, prompts, 8, jax.random.key(5))
  p, q = (np.asarray(x).reshape(-1, _VOCAB) for x in (traj.p_BxTxV, traj.q_BxTxV))
  assert aligned["acceptance"] == pytest.approx(float(np.mean(np.minimum(p, q).sum(-1))), 1e-5)
  assert aligned["alpha_k8"] < 1.0 and aligned["alpha_k8"] > aligned["acceptance"]


@pytest.mark.parametrize("arg", [None, "runlocal", "test", "divergence=jsd,data=corpus:1+target:3"])
def test_configs_convert(arg):
  config = TrainConfig.from_dict(distill_config.get_config(arg).to_dict())
  assert TrainConfig.from_dict(config.to_dict()) == config
  assert config.distill.enabled
  assert config.model_config().vocab_size == config.data.vocab_size


def test_old_configs_without_distill_still_load():
  values = TrainConfig.from_dict(target_config.get_config("test").to_dict()).to_dict()
  del values["distill"]
  assert not TrainConfig.from_dict(values).distill.enabled


def test_rows_of_a_mix():
  config = DistillConfig(target_workdir="t", data="corpus:1,on_policy:3")
  assert config.rows(32) == {"corpus": 8, "on_policy": 24}
  assert DistillConfig(target_workdir="t", data="target").rows(5) == {"target": 5}


@pytest.mark.parametrize(
  "changes,match",
  [
    (dict(divergence="kl"), "unknown distill.divergence"),
    (dict(data="corpus,web"), "expected a source"),
    (dict(data="corpus:x"), "is not a number"),
    (dict(data="corpus:-1"), "weights must be positive"),
    (dict(data="corpus,corpus"), "each source once"),
    (dict(skew=1.0), "skew must lie in"),
    (dict(temperature=0.0), "temperature must be finite and > 0"),
    (dict(top_p=0.0), "top_p must lie in"),
    (dict(eval_tokens=0), "eval_tokens must be an integer"),
    (dict(target_workdir="", data="on_policy"), "need a distill.target_workdir"),
  ],
)
def test_bad_distill_configs(changes, match):
  with pytest.raises(ValueError, match=match):
    DistillConfig(**dict(dict(target_workdir="t"), **changes))


def test_bad_train_configs_with_distillation():
  values = distill_config.get_config("test").to_dict()
  with pytest.raises(ValueError, match=r"unknown TrainConfig.distill fields \['divergenc'\]"):
    TrainConfig.from_dict(dict(values, distill=dict(values["distill"], divergenc="tv")))
  with pytest.raises(ValueError, match="gives a source no row"):
    TrainConfig.from_dict(dict(values, distill=dict(values["distill"], data="corpus:1,target:99")))
  with pytest.raises(ValueError, match="exceeds data.seq_len"):
    distill = dict(values["distill"], data="target", sample_tokens=40)
    TrainConfig.from_dict(dict(values, distill=distill))


# The tests below train (a 2-step target, then 4-step distillations with every data
# source): slow.


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
  """A 2-step test target and draft in workdirs, and the distillation config over them."""
  cache = str(tmp_path_factory.mktemp("data_cache"))
  runs_dir = tmp_path_factory.mktemp("runs")
  configs = {}
  for role, module in (("target", target_config), ("draft", distill_config)):
    config = TrainConfig.from_dict(module.get_config("test").to_dict())
    config = dataclasses.replace(
      config, data=dataclasses.replace(config.data, cache_dir=cache), num_steps=2
    )
    configs[role] = config
  target_cfg = dataclasses.replace(configs["target"], eval_rows=4)
  train.train(target_cfg, runs_dir / "target")
  distill_cfg = dataclasses.replace(
    configs["draft"],
    num_steps=4,
    eval_every=100,
    checkpoint_every=2,
    distill=dataclasses.replace(
      configs["draft"].distill,
      target_workdir=str(runs_dir / "target"),
      init_workdir="",
      data="corpus:1,target:1,on_policy:2",
      divergence="jsd",
    ),
  )
  return distill_cfg, runs_dir


@pytest.mark.slow
def test_resumed_distillation_equals_uninterrupted(tiny_pair, tmp_path):
  config, runs_dir = tiny_pair
  reference = train.train(config, tmp_path / "whole")
  partial = train.train(config, tmp_path / "resumed", stop_at_step=2)
  assert runs.latest_step(tmp_path / "resumed") == 2
  assert not np.array_equal(
    jax.tree.leaves(partial.params)[0], jax.tree.leaves(reference.params)[0]
  )
  resumed = train.train(config, tmp_path / "resumed")
  for x, y in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(reference.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  meta = runs.checkpoint_meta(tmp_path / "resumed")
  assert (
    0 < meta["heldout_acceptance"] < 1 and meta["heldout_alpha_k8"] > meta["heldout_acceptance"]
  )
  assert meta["distill_target"] == distill.fingerprint(runs.load_bundle(runs_dir / "target"))


@pytest.mark.slow
def test_init_workdir_must_hold_this_model(tiny_pair, tmp_path):
  config, runs_dir = tiny_pair
  distill_cfg = dataclasses.replace(config.distill, init_workdir=str(runs_dir / "target"))
  with pytest.raises(runs.CheckpointError, match="not this run's"):
    train.train(dataclasses.replace(config, distill=distill_cfg), tmp_path / "run")


@pytest.mark.slow
def test_distillation_needs_its_target(tiny_pair, tmp_path):
  config, _ = tiny_pair
  missing = dataclasses.replace(
    config, distill=dataclasses.replace(config.distill, target_workdir=str(tmp_path / "none"))
  )
  with pytest.raises(runs.CheckpointError, match="config.json is missing"):
    train.train(missing, tmp_path / "run")


@pytest.mark.slow
def test_embedded_pair_trains_target_plain_draft_then_the_distilled_draft(tmp_path, monkeypatch):
  from configs import draft as draft_config
  from spectr_jax import pairs
  from spectr_jax.pair_config import PairConfig

  monkeypatch.setenv("SPECTR_WORKDIR", str(tmp_path))
  distilled = TrainConfig.from_dict(distill_config.get_config("test").to_dict())
  config = PairConfig(
    "embedded",
    "draft-distill-test",
    "target-test",
    draft=distilled,
    target=TrainConfig.from_dict(target_config.get_config("test").to_dict()),
    draft_base=TrainConfig.from_dict(draft_config.get_config("test").to_dict()),
  )
  with pytest.raises(pairs.MissingPairError, match="configs/target.py"):
    pairs.load_pair(config)
  pair = pairs.load_pair(dataclasses.replace(config, train_missing=True))
  assert runs.is_finished(config.draft_base, tmp_path / "draft-test")  # The warm start.
  assert runs.load_config(tmp_path / "draft-distill-test").distill.enabled
  assert pair.description["draft_workdir"] == str(tmp_path / "draft-distill-test")
  with pytest.raises(ValueError, match="draft_base needs"):
    dataclasses.replace(config, draft=config.draft_base)
