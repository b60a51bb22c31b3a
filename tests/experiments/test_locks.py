"""Exclusive folders: a second sweep, training run or rho ablation on a held folder stops
at once naming the holder (or waits); two sweeps started together run each cell once."""

import dataclasses
import errno
import json
import os
import platform
import subprocess
import sys

import pytest

from configs import rho_ablation as rho_ablation_config
from configs import target as target_config
from spectr_jax import analysis, experiment, locks, results, train
from spectr_jax.sweep_config import RhoAblationConfig
from spectr_jax.train_config import TrainConfig
from tests.experiments.test_experiment import sweep_config

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HOLD = """
import sys, time
from spectr_jax import locks
with locks.exclusive(sys.argv[1], "holder"):
  print("held", flush=True)
  time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
  """Another process holding the lock of tmp_path / "results" (killed after the test)."""
  folder = tmp_path / "results"
  process = subprocess.Popen(
    [sys.executable, "-c", _HOLD, str(folder), "--marker"],
    cwd=_REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  assert process.stdout.readline().strip() == "held"
  yield folder, process.pid
  process.kill()
  process.wait()


def _assert_names_holder(error, pid):
  message = str(error.value)
  assert f"PID {pid}" in message and platform.node() in message and "--marker" in message


def test_sweep_on_a_held_folder_stops_at_once_naming_the_holder(holder, tmp_path):
  folder, pid = holder
  config = sweep_config(tmp_path)
  with pytest.raises(locks.FolderLockedError) as error:
    experiment.run_sweep(config, pair=None)  # before loading (no pair exists here)
  _assert_names_holder(error, pid)
  assert not (folder / results.PROVENANCE_FILE).exists()


def test_training_on_a_held_workdir_stops_at_once(holder, tmp_path):
  folder, pid = holder
  config = TrainConfig.from_dict(target_config.get_config("test").to_dict())
  with pytest.raises(locks.FolderLockedError, match="in use by another training run") as error:
    train.train(config, folder)
  _assert_names_holder(error, pid)
  assert not (folder / "checkpoints").exists() and not (folder / "config.json").exists()


def test_rho_ablation_on_a_held_folder_stops_at_once(holder, tmp_path):
  folder, pid = holder
  config = RhoAblationConfig.from_dict(rho_ablation_config.get_config("test").to_dict())
  sweep = dataclasses.replace(config.sweep, results_dir=str(folder))
  with pytest.raises(locks.FolderLockedError, match="rho ablation") as error:
    analysis.run_rho_ablation(dataclasses.replace(config, sweep=sweep))
  _assert_names_holder(error, pid)


_HOLD_BRIEFLY = """
import pathlib, sys, time
from spectr_jax import locks
with locks.exclusive(sys.argv[1], "training run"):
  print("held", flush=True)
  time.sleep(3)
  (pathlib.Path(sys.argv[1]) / "released").touch()
"""


def test_a_waiting_sweep_also_waits_for_the_pair_training(tmp_path, monkeypatch):
  """--wait holds for every lock a run takes: a sweep waits for the target's training
  folder (held by another process for 3 s) instead of stopping at it."""
  workdir = tmp_path / "target"
  command = [sys.executable, "-c", _HOLD_BRIEFLY, str(workdir)]
  process = subprocess.Popen(command, cwd=_REPO, stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "held"
  config = sweep_config(tmp_path)
  pair = dataclasses.replace(config.pair, target_workdir=str(workdir), train_missing=True)

  class Trained(Exception):
    """Raised where the training would start, after its lock is taken."""

  def reached(config, path, stop_at_step):
    assert (path / "released").exists(), "trained while the other process held the folder"
    raise Trained

  monkeypatch.setattr(train, "_train", reached)
  try:
    with pytest.raises(Trained):
      experiment.run_sweep(dataclasses.replace(config, pair=pair), wait=True)
  finally:
    process.kill()
    process.wait()


def test_lock_is_reentrant_released_and_skipped_off_process_zero(tmp_path):
  with locks.exclusive(tmp_path, "sweep"):
    with locks.exclusive(tmp_path, "rho ablation"):  # nested in one process: no deadlock
      info = json.loads((tmp_path / locks.LOCK_FILE).read_text())
      assert info["pid"] == os.getpid() and info["host"] == platform.node()
  with locks.exclusive(tmp_path, "sweep"):  # released on exit
    pass
  with locks.exclusive(tmp_path / "other", holder=False):
    assert not (tmp_path / "other").exists()


def test_unlockable_folder_warns(caplog):
  with locks.exclusive("gs://bucket/sweep"):
    pass
  assert "one writer per folder" in caplog.text


def test_a_folder_that_cannot_be_used_is_named_with_what_to_do(tmp_path, monkeypatch):
  """A results folder that is a file, on a read-only or a full filesystem: an OSError of
  the same errno whose message names the folder and what to do (bare Errno 17 / 30 / 28
  before)."""
  afile = tmp_path / "results"
  afile.write_text("not a folder")
  with pytest.raises(FileExistsError, match=r"results is a file, not a folder.*move the file"):
    with locks.exclusive(afile, "sweep"):
      pass
  real_open, real_pwrite = os.open, os.pwrite

  def read_only(path, *args):
    if str(path).endswith(locks.LOCK_FILE):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    return real_open(path, *args)

  def full(fd, data, offset):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  for name, fake, pattern in (
    ("open", read_only, r"cannot be written \(Read-only file system\).*make it writable"),
    ("pwrite", full, r"is on a full disk.*free some space"),
  ):
    monkeypatch.setattr(os, name, fake)
    with pytest.raises(OSError, match=rf"{tmp_path / name} {pattern}"):
      with locks.exclusive(tmp_path / name, "sweep"):
        pass
    monkeypatch.setattr(os, name, real_open if name == "open" else real_pwrite)


_SWEEP = """
import pathlib, sys
from spectr_jax import experiment
from tests.experiments.test_experiment import random_pair, sweep_config
config = sweep_config(pathlib.Path(sys.argv[1]), methods=("autoregressive", "sd"), seeds=(0,))
experiment.run_sweep(config, random_pair(), wait=sys.argv[2] == "wait")
print("finished", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wait", "exit"])
def test_two_sweeps_started_together_run_each_cell_once(tmp_path, mode):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  runs = [
    subprocess.Popen(
      [sys.executable, "-c", _SWEEP, str(tmp_path), mode],
      cwd=_REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for _ in range(2)
  ]
  outputs = [run.communicate(timeout=240) for run in runs]
  codes = sorted(run.returncode for run in runs)
  if mode == "wait":
    assert codes == [0, 0], outputs
  else:
    assert codes[0] == 0 and (
      codes[1] == 0 or "FolderLockedError" in "".join(o[1] for o in outputs)
    )
    if codes[1]:
      assert "in use by another sweep: PID" in "".join(o[1] for o in outputs)
  lines = (tmp_path / "results" / results.RESULTS_FILE).read_text().splitlines()
  keys = [json.loads(line)["key"] for line in lines]
  assert len(keys) == len(set(keys)) == 2  # "autoregressive" and "sd" L = 2, one seed
  assert len(results.read_jsonl(tmp_path / "results" / results.PROVENANCE_FILE)) == 1
