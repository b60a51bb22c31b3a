"""Tests of training, checkpoints, resuming and the pair evaluation."""

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import draft as draft_config
from configs import eval_pair as eval_pair_config
from configs import target as target_config
from spectr_jax import analysis, checks, data, evaluate, runs, train
from spectr_jax.evaluate import EvalConfig
from spectr_jax.models import ModelBundle, init_params, unstack_layers
from spectr_jax.train_config import TrainConfig
from tests.training import small_config

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="module")
def target_run(tmp_path_factory, cache_dir):
  """A finished 20-step run of the test target config."""
  config = small_config(target_config, cache_dir)
  workdir = tmp_path_factory.mktemp("target")
  return config, workdir, train.train(config, workdir)


@pytest.fixture(scope="module")
def draft_run(tmp_path_factory, cache_dir):
  config = small_config(draft_config, cache_dir)
  workdir = tmp_path_factory.mktemp("draft")
  return config, workdir, train.train(config, workdir)


def _assert_params_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("module", [draft_config, target_config])
@pytest.mark.parametrize("arg", [None, "runlocal", "test"])
def test_configs_convert(module, arg):
  config = TrainConfig.from_dict(module.get_config(arg).to_dict())
  assert TrainConfig.from_dict(config.to_dict()) == config
  model = config.model_config()
  assert model.vocab_size == config.data.vocab_size
  assert model.max_len >= config.data.seq_len


def test_config_argument_errors():
  with pytest.raises(ValueError, match="unknown config argument"):
    target_config.get_config("runlcal")
  with pytest.raises(ValueError, match="unknown TrainConfig fields"):
    TrainConfig.from_dict({"num_step": 3})


def test_training_lowers_the_heldout_loss(target_run):
  config, _, bundle = target_run
  dataset = data.load_dataset(config.data)
  rows = data.heldout_rows(dataset.heldout, config.data.seq_len, 64)
  initial = ModelBundle(
    config=bundle.config,
    params=init_params(bundle.config, jax.random.fold_in(jax.random.key(config.seed), 0)),
  )
  before = train.heldout_loss(initial, rows, 8)
  after = train.heldout_loss(bundle, rows, 8)
  assert after < before - 0.2


def test_checkpoint_restores_params_tokenizer_and_meta(target_run):
  config, workdir, bundle = target_run
  assert runs.latest_step(workdir) == config.num_steps
  loaded = runs.load_bundle(workdir)
  assert loaded.config == bundle.config
  _assert_params_equal(loaded.params, bundle.params)
  assert runs.load_config(workdir) == config
  meta = runs.checkpoint_meta(workdir)
  assert meta["step"] == config.num_steps
  assert meta["positions_seen"] == config.num_steps * config.batch_size * config.data.seq_len
  assert 0.5 < meta["row_fill"] < 1.0
  assert meta["wall_time_s"] > 0
  tokenizer = runs.load_tokenizer(workdir)
  assert tokenizer.model_proto == data.load_dataset(config.data).tokenizer.model_proto
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "20"]
  intermediate = runs.load_bundle(workdir, step=10)
  assert not np.array_equal(
    jax.tree.leaves(intermediate.params)[0], jax.tree.leaves(bundle.params)[0]
  )


def test_resumed_run_equals_uninterrupted_run(target_run, tmp_path):
  config, _, reference = target_run
  partial = train.train(config, tmp_path, stop_at_step=7)
  assert runs.latest_step(tmp_path) == 7
  assert not np.array_equal(
    jax.tree.leaves(partial.params)[0], jax.tree.leaves(reference.params)[0]
  )
  resumed = train.train(config, tmp_path)
  assert runs.latest_step(tmp_path) == config.num_steps
  _assert_params_equal(resumed.params, reference.params)


def _per_layer(tree, model_config):
  """Every parameter tree inside `tree` (params, the optimizer's moments) per layer."""
  is_params = lambda t: isinstance(t, dict) and "layers" in t  # noqa: E731
  unstack = lambda t: unstack_layers(t, model_config) if is_params(t) else t  # noqa: E731
  return jax.tree.map(unstack, tree, is_leaf=is_params)


def test_a_run_saved_per_layer_restores_and_resumes(target_run, tmp_path):
  """A checkpoint in the per-layer layout of runs saved before the layer stack
  (`models.layout`) loads for decoding and resumes to the uninterrupted result."""
  config, _, reference = target_run
  train.train(config, tmp_path, stop_at_step=7)
  model_config = config.model_config()
  manager = runs.checkpoint_manager(tmp_path, config)
  abstract = jax.eval_shape(lambda: train._init_state(config, train.make_optimizer(config)))
  step, params, opt_state, meta = runs.restore_latest(
    manager, abstract.params, abstract.opt_state, model_config
  )
  assert step == 7
  shutil.rmtree(tmp_path / "checkpoints" / "7")
  manager = runs.checkpoint_manager(tmp_path, config)
  old = _per_layer((params, opt_state), model_config)
  assert "block_0" in old[0] and "layers" not in old[0]
  runs.save_checkpoint(manager, 7, *old, meta)
  loaded = runs.load_bundle(tmp_path, step=7)
  _assert_params_equal(loaded.params, params)
  resumed = train.train(config, tmp_path)
  _assert_params_equal(resumed.params, reference.params)


def test_train_or_load_does_not_retrain(target_run, monkeypatch):
  config, workdir, bundle = target_run

  def fail(*args, **kwargs):
    raise AssertionError("train_or_load retrained a finished run")

  monkeypatch.setattr(train, "train", fail)
  monkeypatch.setattr(train, "load_dataset", fail)
  logistics = dataclasses.replace(config, log_every=1, eval_every=3)
  _assert_params_equal(train.train_or_load(logistics, workdir).params, bundle.params)


def test_checkpoint_errors(target_run, tmp_path):
  config, workdir, _ = target_run
  with pytest.raises(runs.CheckpointError, match="learning_rate"):
    train.train_or_load(dataclasses.replace(config, learning_rate=1.0), workdir)
  with pytest.raises(runs.CheckpointError, match="config.json is missing"):
    runs.load_bundle(tmp_path)
  with pytest.raises(runs.CheckpointError, match="no checkpoint for step 13"):
    runs.load_bundle(workdir, step=13)


def _damage(step_dir, how):
  """Truncates the params data files of a checkpoint, flips 4 KiB in the middle of its
  largest one (bit rot: the files still parse), or deletes its meta item."""
  if how == "no_meta":
    shutil.rmtree(step_dir / "meta")
    return
  blobs = list(step_dir.glob("params/**/d/*"))
  if how == "bit_rot":
    blob = max(blobs, key=lambda b: b.stat().st_size)
    data = bytearray(blob.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    blob.write_bytes(bytes(data))
    return
  for blob in blobs:
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])


@pytest.mark.parametrize("how", ["truncated", "no_meta", "bit_rot"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_step(
  target_run, tmp_path, how, caplog
):
  config, workdir, reference = target_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  _damage(run / "checkpoints" / "20", how)
  with pytest.raises(runs.DamagedCheckpointError, match=r"checkpoint step 20 in .* is damaged"):
    runs.checkpoint_meta(run) if how == "no_meta" else runs.load_bundle(run)
  if how == "bit_rot":  # named as such (it restored NaN and 1e38 parameters before)
    with pytest.raises(runs.DamagedCheckpointError, match=r"params/.* differs from its SHA-256"):
      runs.load_bundle(run)
    assert runs.checkpoint_meta(run)["step"] == 20  # the meta item is intact
  # Warns, resumes from step 10, redoes 20 (train_or_load: a final checkpoint that does not
  # load is trained again; its params are intact without meta, so train resumes there).
  resumed = (train.train if how == "no_meta" else train.train_or_load)(config, run)
  assert "checkpoint step 20" in caplog.text and "damaged" in caplog.text
  assert [p.name.split("-")[:2] for p in run.glob("damaged-*")] == [["damaged", "20"]]
  assert runs.latest_step(run) == 20
  _assert_params_equal(resumed.params, reference.params)
  _assert_params_equal(runs.load_bundle(run).params, reference.params)


def test_checkpoint_without_checksums_loads_with_a_warning(target_run, tmp_path, caplog):
  """A checkpoint saved before checksums were written (none in its folder) still loads."""
  config, workdir, reference = target_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  for step in ("10", "20"):
    (run / "checkpoints" / step / runs.CHECKSUMS_FILE).unlink()
  _assert_params_equal(runs.load_bundle(run).params, reference.params)
  assert "step 20" in caplog.text and f"no {runs.CHECKSUMS_FILE}" in caplog.text
  assert "unverified" in caplog.text
  _assert_params_equal(train.train_or_load(config, run).params, reference.params)


def test_checksums_of_the_wrong_shape_are_damage_and_training_falls_back(
  target_run, tmp_path, caplog
):
  """A checksums.json whose "files" is a list (not a map) names the step as damaged (it
  raised AttributeError), and training resumes from the previous step."""
  config, workdir, reference = target_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  checksums = run / "checkpoints" / "20" / runs.CHECKSUMS_FILE
  record = json.loads(checksums.read_text())
  checksums.write_text(json.dumps(dict(record, files=list(record["files"]))))
  with pytest.raises(runs.DamagedCheckpointError, match=r'step 20 .* "files" is a list'):
    runs.load_bundle(run)
  _assert_params_equal(train.train_or_load(config, run).params, reference.params)
  assert "checkpoint step 20" in caplog.text and runs.latest_step(run) == 20


def test_no_complete_checkpoint_fails_clearly(target_run, tmp_path):
  config, workdir, _ = target_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  for step in ("10", "20"):
    _damage(run / "checkpoints" / step, "truncated")
  with pytest.raises(runs.DamagedCheckpointError, match=r"no complete checkpoint .* \[20, 10\]"):
    train.train(config, run)
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20"]  # moved nothing


def test_full_disk_writing_the_run_files_names_the_file(target_run, tmp_path, monkeypatch):
  config, _, _ = target_run
  tokenizer = data.load_dataset(config.data).tokenizer

  def full(fd, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(OSError, match=r"could not write .*config.json: the disk is full") as error:
    runs.write_run_files(tmp_path, config, tokenizer)
  assert error.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())


def test_at_least_two_checkpoints_are_kept(cache_dir, tmp_path):
  config = small_config(target_config, cache_dir, keep_checkpoints=1)
  assert runs.checkpoint_manager(tmp_path, config)._options.max_to_keep == 2


def test_model_too_short_for_rows(cache_dir, tmp_path):
  config = small_config(target_config, cache_dir)
  config = dataclasses.replace(config, data=dataclasses.replace(config.data, seq_len=128))
  with pytest.raises(ValueError, match="exceeds max_len"):
    train.train(config, tmp_path)


def test_trajectories_keep_prompts_and_match_greedy_reference(target_run):
  config, _, bundle = target_run
  dataset = data.load_dataset(config.data)
  prompts = data.make_prompts(dataset.heldout, num_prompts=3, prompt_len=5, seed=0)
  lengths = prompts.lengths_B.copy()
  lengths[1] = 3
  tokens = prompts.tokens_BxP.copy()
  tokens[1, 3:] = data.PAD_ID
  prompts = data.Prompts(tokens, lengths, prompts.sentence_index_B)
  traj = analysis.collect_trajectories(bundle, bundle, prompts, 4, jax.random.key(0), 0.0)
  out = np.asarray(traj.tokens_BxW)
  forward = jax.jit(lambda tokens: bundle.model.apply({"params": bundle.params}, tokens))
  reference = np.full_like(out, data.PAD_ID)
  for b in range(3):
    reference[b, : lengths[b]] = tokens[b, : lengths[b]]
    for pos in range(lengths[b], lengths[b] + 4):
      reference[b, pos] = int(jnp.argmax(forward(reference[b : b + 1])[0, pos - 1]))
  np.testing.assert_array_equal(out, reference)


def test_acceptance_of_a_model_with_itself_is_one(target_run):
  config, _, bundle = target_run
  dataset = data.load_dataset(config.data)
  rows = data.heldout_rows(dataset.heldout, config.data.seq_len, 8)
  assert evaluate.teacher_forced_acceptance(bundle, bundle, rows, 8) == pytest.approx(1.0, abs=1e-5)


def test_evaluate_pair(draft_run, target_run, tmp_path):
  _, draft_dir, _ = draft_run
  _, target_dir, _ = target_run
  c = eval_pair_config.get_config("test")
  config = EvalConfig(**{f: c[f] for f in EvalConfig.__dataclass_fields__})
  output = tmp_path / "pair.json"
  results = evaluate.evaluate_workdirs(draft_dir, target_dir, config, output)
  assert output.is_file()
  for name in ("teacher_forced_acceptance", "sampled_acceptance"):
    assert 0.0 < results[name] < 1.0
  assert 1.0 < results["target_heldout_ppl"] < 600
  assert results["draft_params"] < results["target_params"]
  assert len(results["sampled_acceptance_by_position"]) == config.num_tokens


def test_evaluating_a_model_with_non_finite_weights_names_it(target_run):
  """Issue 24: a NaN model gave NaN figures without an error."""
  config, _, bundle = target_run
  dataset = data.load_dataset(config.data)
  broken = ModelBundle(bundle.config, jax.tree.map(lambda x: x * np.nan, bundle.params))
  c = eval_pair_config.get_config("test")
  eval_config = EvalConfig(**{f: c[f] for f in EvalConfig.__dataclass_fields__})
  with pytest.raises(checks.NonFiniteError, match="the draft model's held-out loss is nan"):
    evaluate.evaluate_pair(broken, bundle, dataset, config.data.seq_len, eval_config)


def test_iid_block_efficiency():
  assert evaluate.iid_block_efficiency(0.0, 4) == 1.0
  assert evaluate.iid_block_efficiency(1.0, 4) == 5.0
  assert evaluate.iid_block_efficiency(0.5, 1) == pytest.approx(1.5)


@pytest.mark.slow
def test_killed_subprocess_resumes_to_the_uninterrupted_result(cache_dir, tmp_path):
  """Kills `experiments.train` after its first checkpoint, resumes, compares parameters."""
  config = small_config(target_config, cache_dir, num_steps=60, checkpoint_every=5)
  reference = train.train(config, tmp_path / "reference")
  command = [
    sys.executable,
    "-m",
    "experiments.train",
    "--config",
    "configs/target.py:test",
    "--config.num_steps=60",
    "--config.checkpoint_every=5",
    f"--config.data.cache_dir={cache_dir}",
    f"--workdir={tmp_path / 'killed'}",
  ]
  process = subprocess.Popen(command, cwd=_REPO, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while time.time() < deadline and process.poll() is None:
    if (tmp_path / "killed" / "checkpoints" / "10").is_dir():
      break
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  stopped_at = runs.latest_step(tmp_path / "killed")
  assert stopped_at is not None and stopped_at < 60
  resumed = train.train(config, tmp_path / "killed")
  _assert_params_equal(resumed.params, reference.params)


@pytest.mark.slow
def test_data_parallel_training_matches_one_device(target_run, tmp_path):
  config, _, reference = target_run
  sharded = train.train(dataclasses.replace(config, num_devices=2), tmp_path)
  for x, y in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(reference.params), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4)
