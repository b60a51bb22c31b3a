"""Training a draft head against its frozen target: the config, the step, the checkpoints
and the pair that decodes with it (issue 50)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import head as head_config
from configs import lm1b_spectr
from configs import target as target_config
from spectr_jax import distill, engine, pairs, runs, train
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import HeadConfig, ModelBundle, decoder, get_model_config
from spectr_jax.models.head import SHARED, share_target
from spectr_jax.pair_config import PairConfig
from spectr_jax.sweep_config import SweepConfig
from spectr_jax.train_config import DistillConfig, TrainConfig
from tests.training import small_config


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
  """A 2-step test target in a workdir, and the head's test config against it."""
  cache = str(tmp_path_factory.mktemp("data_cache"))
  runs_dir = tmp_path_factory.mktemp("runs")
  train.train(small_config(target_config, cache, num_steps=2, eval_rows=4), runs_dir / "target")
  config = small_config(head_config, cache)
  distilled = dataclasses.replace(config.distill, target_workdir=str(runs_dir / "target"))
  return dataclasses.replace(config, distill=distilled), runs_dir


def test_head_configs_are_checked(tmp_path):
  with pytest.raises(ValueError, match="a head trains against its target"):
    TrainConfig(model="head")
  with pytest.raises(ValueError, match="on-policy rows"):
    TrainConfig(model="head", distill=DistillConfig(target_workdir="t", data="on_policy"))
  missing = TrainConfig(model="head", distill=DistillConfig(target_workdir=str(tmp_path)))
  with pytest.raises(FileNotFoundError, match="train the target first"):
    missing.model_config()
  target = get_model_config("target-test", 64)
  assert missing.model_config(target) == HeadConfig.of(target)
  with pytest.raises(ValueError, match="shares"):
    HeadConfig.of(target, d_model=32)


@pytest.mark.slow
def test_a_head_step_lowers_the_divergence_and_leaves_the_target_arrays(tiny_target):
  config, runs_dir = tiny_target
  target = runs.load_bundle(runs_dir / "target")
  model_config = config.model_config()
  assert model_config.d_model == target.config.d_model and model_config.num_layers == 1
  head = ModelBundle(model_config, None).model
  params = train._init_state(config, train.make_optimizer(config)).params
  params = dict(params, embed=target.params["embed"])
  rows = {"corpus": jax.random.randint(jax.random.key(3), (4, 17), 3, 64, jnp.int32)}
  loss = jax.jit(
    lambda p, tp: distill.distill_loss(p, tp, rows, head, target.model, config.distill)
  )
  state = train.TrainState(jnp.int32(0), params, train.make_optimizer(config).init(params))
  before = float(loss(params, target.params))
  for _ in range(3):
    state, _ = train._train_step(
      state, rows, target.params, lambda p, tp, r: loss(p, tp), train.make_optimizer(config)
    )
  assert float(loss(state.params, target.params)) < before
  for name in SHARED:
    if name in target.params:
      for x, y in zip(
        jax.tree.leaves(state.params[name]), jax.tree.leaves(target.params[name]), strict=True
      ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # Two unrolled steps: the second reads the first's output, not the target's features.
  tokens = rows["corpus"][:, :-1]
  _, features = target.model.apply({"params": target.params}, tokens, return_features=True)
  first, second = distill.draft_logits(head, params, tokens, target.params, features, steps=2)
  shared = share_target(params, target.params)
  _, own = decoder(model_config).logits(shared, tokens, features, True)
  np.testing.assert_allclose(second, decoder(model_config).logits(shared, tokens, own), atol=1e-5)
  assert not np.allclose(first, second, atol=1e-3)
  two_steps = dataclasses.replace(config.distill, head_steps=2)
  assert float(distill.distill_loss(params, target.params, rows, head, target.model, two_steps)) > 0
  changed = jax.tree.leaves(state.params["fc"])[0]
  assert not np.array_equal(np.asarray(changed), np.asarray(jax.tree.leaves(params["fc"])[0]))


@pytest.mark.slow
def test_a_head_trains_resumes_exactly_and_decodes_in_its_pair(tiny_target, tmp_path):
  config, runs_dir = tiny_target
  whole = train.train(config, tmp_path / "whole")
  train.train(config, tmp_path / "resumed", stop_at_step=3)
  resumed = train.train(config, tmp_path / "resumed")
  for x, y in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(whole.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  target = runs.load_bundle(runs_dir / "target")
  np.testing.assert_array_equal(
    whole.params["embed"]["embedding"], target.params["embed"]["embedding"]
  )
  meta = runs.checkpoint_meta(tmp_path / "whole")
  assert meta["distill_target"] == distill.fingerprint(target)
  assert 0 < meta["heldout_acceptance"] < 1 and np.isfinite(meta["heldout_loss"])
  loaded = runs.load_bundle(tmp_path / "whole")
  assert isinstance(loaded.config, HeadConfig)

  pair_config = PairConfig("trained", str(tmp_path / "whole"), str(runs_dir / "target"))
  pair = pairs.load_pair(pair_config)
  assert pair.draft.decoder.reads_features and pair.description["draft_model"] == "head"
  spec = DecodeSpec(method="kseq", num_drafts=2, draft_len=2, max_new_tokens=6)
  out = engine.generate(
    jax.random.key(0),
    spec,
    draft=pair.draft,
    target=pair.target,
    prompts=np.full((2, 3), 5, np.int32),
    prompt_lengths=np.array([3, 2]),
  )
  assert np.asarray(out.tokens_BxT).shape == (2, 6)

  other = tmp_path / "other-target"
  retrained = dataclasses.replace(runs.load_config(runs_dir / "target"), seed=1)
  train.train(retrained, other)
  with pytest.raises(ValueError, match="trained against a target"):
    pairs.load_pair(dataclasses.replace(pair_config, target_workdir=str(other)))


def test_the_sweep_config_decodes_with_the_head_or_its_separate_draft():
  for arg, model, workdir in (
    ("head", "head", "head"),
    ("head_separate", "draft-tiny", "head-separate"),
  ):
    config = SweepConfig.from_dict(lm1b_spectr.get_config(arg).to_dict())
    assert config.pair.draft.model == model and config.pair.draft_workdir == workdir
    assert config.name.endswith(workdir)
  separate = TrainConfig.from_dict(head_config.get_config("separate").to_dict()).model_config()
  head = TrainConfig.from_dict(head_config.get_config().to_dict())
  target = TrainConfig.from_dict(target_config.get_config().to_dict()).model_config()
  assert head.model_config(target).d_model == separate.d_model == target.d_model
