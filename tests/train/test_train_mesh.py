"""Training on a ("data", "model") mesh: shardings by the rules, resuming on another mesh.

The runs are 6 steps of the test target config (d_model 64, 4 heads, 2 KV heads, MLP
128, V = 512) on the 8 fake CPU devices of `tests/conftest.py`.
"""

import shutil

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from configs import target as target_config
from spectr_jax import runs, sharding, train
from spectr_jax.models import init_params, param_axes
from tests.training import small_config

# Largest differences measured from the (4, 2) run (the same math, with sums split
# differently over devices), after these 6 steps: parameters 2.4e-7 for (4, 2) resumed on
# (8, 1), for (1, 1) and for (4, 2) with FSDP; held-out losses equal (after 20 steps:
# parameters 2.4e-7 to 3.4e-7, losses 2.6e-7). Allowed: 1e-5, 40x the parameters'.
PARAM_ATOL = 1e-5
LOSS_ATOL = 1e-5

_WEIGHTS = ("w_qkv", "w_o", "w_gate_up", "w_down", "embedding")


def _config(cache_dir, data, model, **changes):
  return small_config(
    target_config,
    cache_dir,
    num_devices=data,
    mesh_model=model,
    num_steps=6,
    checkpoint_every=3,
    eval_every=100,
    **changes,
  )


def _mesh(data, model):
  return sharding.make_mesh(data, model, jax.devices()[: data * model])


def _max_diff(a, b) -> float:
  pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


def _shard_fraction(leaf_sharding, shape) -> float:
  """The share of an array of `shape` that one device holds."""
  return np.prod(leaf_sharding.shard_shape(shape)) / np.prod(shape)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="module")
def run_4x2(tmp_path_factory, cache_dir):
  """A finished 10-step run on the (data 4, model 2) mesh: (config, workdir, bundle)."""
  config = _config(cache_dir, 4, 2)
  workdir = tmp_path_factory.mktemp("run_4x2")
  return config, workdir, train.train(config, workdir)


@pytest.fixture(scope="module")
def partial_4x2(tmp_path_factory, cache_dir):
  """The same run on (4, 2) stopped at step 5: (workdir, bundle)."""
  workdir = tmp_path_factory.mktemp("partial_4x2")
  return workdir, train.train(_config(cache_dir, 4, 2), workdir, stop_at_step=3)


def _expected_shardings(config, mesh):
  return train.state_shardings(config, train.make_optimizer(config), mesh)


@pytest.mark.parametrize("fsdp", [False, True])
def test_state_shardings_follow_the_rules(cache_dir, fsdp):
  config = _config(cache_dir, 4, 2, fsdp=fsdp)
  shardings = _expected_shardings(config, _mesh(4, 2))
  params = jax.eval_shape(lambda: init_params(config.model_config(), jax.random.key(0)))
  names = set()
  leaves = jax.tree_util.tree_leaves_with_path(params)
  for (path, x), leaf_sharding in zip(leaves, jax.tree.leaves(shardings.params), strict=True):
    name = str(path[-1].key)
    names.add(name)
    fraction = _shard_fraction(leaf_sharding, x.shape)
    if name in _WEIGHTS:  # split over "model" (2), and over "data" (4) too with FSDP
      assert fraction == (1 / 8 if fsdp else 1 / 2), path
    else:  # norm scales: D = 64 long, replicated, split over "data" with FSDP
      assert name == "scale" and fraction == (1 / 4 if fsdp else 1), path
  assert names == {*_WEIGHTS, "scale"}
  for moment in ("mu", "nu"):  # AdamW's moments are sharded like the parameters
    assert optax.tree_utils.tree_get(shardings.opt_state, moment) == shardings.params
  counts = optax.tree_utils.tree_get_all_with_path(shardings.opt_state, "count")
  assert counts and all(s.is_fully_replicated for _, s in counts)
  assert shardings.step.is_fully_replicated


def _assert_on(tree, shardings):
  """Every array of `tree` is laid out as the matching sharding says."""
  for x, target in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True):
    assert x.sharding.is_equivalent_to(target, x.ndim), (x.sharding, target)


@pytest.mark.slow
def test_a_4x2_run_holds_its_state_on_the_rules_shardings(run_4x2):
  config, workdir, bundle = run_4x2
  optimizer = train.make_optimizer(config)
  expected = train.state_shardings(config, optimizer, _mesh(4, 2))
  _assert_on(bundle.params, expected.params)
  # The optimizer state as the run saved it: orbax restores onto the saved shardings when
  # the target names none.
  abstract = jax.eval_shape(optimizer.init, bundle.params)
  args = ocp.args.Composite(opt_state=ocp.args.StandardRestore(abstract))
  saved = runs.checkpoint_manager(workdir).restore(config.num_steps, args=args)["opt_state"]
  _assert_on(saved, expected.opt_state)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8, 1), (2, 4)])
def test_a_4x2_checkpoint_restores_bit_identical_on_another_mesh(
  partial_4x2, cache_dir, tmp_path, mesh
):
  saved_dir, saved = partial_4x2
  workdir = tmp_path / "run"
  shutil.copytree(saved_dir, workdir)
  config = _config(cache_dir, *mesh)
  restored = train.train(config, workdir, stop_at_step=3)
  assert runs.latest_step(workdir) == 3
  _assert_on(restored.params, _expected_shardings(config, _mesh(*mesh)).params)
  loaded = runs.load_bundle(workdir, step=3)  # onto one device, whatever mesh saved it
  assert all(len(x.devices()) == 1 for x in jax.tree.leaves(loaded.params))
  on_mesh = runs.load_bundle(workdir, step=3, mesh=_mesh(*mesh))  # by the decoding rules
  axes = param_axes(on_mesh.config)
  _assert_on(on_mesh.params, sharding.param_shardings(on_mesh.params, _mesh(*mesh), axes=axes))
  for params in (restored.params, loaded.params, on_mesh.params):
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(saved.params), strict=True):
      assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_a_run_resumed_on_8x1_matches_the_uninterrupted_4x2_run(
  run_4x2, partial_4x2, cache_dir, tmp_path
):
  config, workdir, reference = run_4x2
  shutil.copytree(partial_4x2[0], tmp_path / "run")
  resumed = train.train(_config(cache_dir, 8, 1), tmp_path / "run")
  assert runs.latest_step(tmp_path / "run") == config.num_steps
  assert _max_diff(resumed.params, reference.params) < PARAM_ATOL
  losses = [runs.checkpoint_meta(d)["heldout_loss"] for d in (tmp_path / "run", workdir)]
  assert losses[0] == pytest.approx(losses[1], abs=LOSS_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("mesh, fsdp", [((1, 1), False), ((4, 2), True)])
def test_runs_on_other_meshes_match_the_4x2_run(run_4x2, cache_dir, tmp_path, mesh, fsdp):
  _, workdir, reference = run_4x2
  config = _config(cache_dir, *mesh, fsdp=fsdp)
  bundle = train.train(config, tmp_path)
  _assert_on(bundle.params, _expected_shardings(config, _mesh(*mesh)).params)
  assert _max_diff(bundle.params, reference.params) < PARAM_ATOL
  losses = [runs.checkpoint_meta(d)["heldout_loss"] for d in (tmp_path, workdir)]
  assert losses[0] == pytest.approx(losses[1], abs=LOSS_ATOL)
