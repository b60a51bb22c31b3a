"""spectr_jax.memory: the arithmetic against real sharded arrays, the fit check, and the
example pod configs' plans (scripts/memory_plan.py: published sizes, no weights)."""

import dataclasses
import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding

from configs import pod_gemma2_9b_v5e8, pod_llama_v4_32, pretrained
from spectr_jax import memory, methods, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import (
  config_from_hf,
  expected_num_params,
  get_model_config,
  init_cache,
  param_axes,
)
from spectr_jax.sweep_config import SweepConfig

_REPO = pathlib.Path(__file__).resolve().parents[2]
# target-test has 4 query and 2 key/value heads: split over model = 2, replicated over 8.
CONFIG = get_model_config("target-test", 1024, dtype="bfloat16")
DRAFT = get_model_config("draft-test", 1024, dtype="bfloat16")


@functools.cache
def _script():
  spec = importlib.util.spec_from_file_location("memory_plan", _REPO / "scripts/memory_plan.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("data,model", [(8, 1), (4, 2), (1, 8)])
def test_weights_and_cache_equal_the_real_shards(data, model):
  mesh = sharding.make_mesh(data, model)
  shapes = memory.param_shapes(CONFIG)  # `init_params`' shapes (jax.eval_shape), in bf16
  params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
  axes = param_axes(CONFIG)
  placed = sharding.shard_params(params, mesh, axes=axes)
  real = sum(sharding.per_device_bytes(x) for x in jax.tree.leaves(placed))
  assert memory.weight_bytes(shapes, mesh, axes) == real
  assert memory.weight_bytes(shapes, memory.abstract_mesh(data, model), axes) == real

  cache = init_cache(dataclasses.replace(CONFIG, max_len=40), 8, 3, 5)
  specs = sharding.cache_specs(cache, mesh)
  placed = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), cache, specs)
  real = sum(sharding.per_device_bytes(x) for x in jax.tree.leaves(placed))
  assert memory.cache_bytes(CONFIG, 8, 3, 4, 40, mesh) == real


def test_plan_pads_the_batch_and_drops_the_draft_cache_without_drafts():
  mesh = memory.abstract_mesh(4, 2)
  args = dict(batch_size=6, prompt_width=5, max_new_tokens=20)
  plan = memory.plan(DRAFT, CONFIG, mesh, method="gbv", num_drafts=3, draft_len=4, **args)
  assert plan.rows == 2 and plan.cache_len == 5 + 20 + 4 + 1
  assert plan.cache["target"] == memory.cache_bytes(CONFIG, 8, 3, 4, 30, mesh)
  row = memory.probability_bytes("gbv", 3, 4, 1024) + methods.PLAN_WORKSPACE_BYTES
  assert plan.probabilities == 2 * row
  assert plan.total == sum(plan.parts.values())
  assert "weights" in plan.table() and "KV cache" in plan.table()
  plain = memory.plan(
    DRAFT, CONFIG, mesh, method="autoregressive", num_drafts=1, draft_len=0, **args
  )
  assert set(plain.cache) == {"target"} and set(plain.weights) == {"draft", "target"}


def test_a_spec_plans_as_its_method_k_and_l_and_names_its_scheme():
  """plan(spec=): the arithmetic of its method, K, L and T (the drafting scheme, branching
  and dedup change nothing), its label in the plan and its table."""
  mesh = memory.abstract_mesh(2, 1)
  args = dict(batch_size=4, prompt_width=5)
  by_method = memory.plan(
    DRAFT, CONFIG, mesh, method="rrs", num_drafts=8, draft_len=4, max_new_tokens=20, **args
  )
  spec = DecodeSpec.parse("rrs/wor:8:4:4x2x1x1", max_new_tokens=20, dedup=True)
  by_spec = memory.plan(DRAFT, CONFIG, mesh, spec=spec, **args)
  assert by_spec == dataclasses.replace(by_method, label="rrs:8:4:4x2x1x1 dedup")
  assert "rrs:8:4:4x2x1x1 dedup" in by_spec.table() and "rrs K=8 L=4" in by_method.table()
  with pytest.raises(ValueError, match="not both"):
    memory.plan(DRAFT, CONFIG, mesh, spec=spec, method="rrs", **args)
  with pytest.raises(ValueError, match="give a spec"):
    memory.plan(DRAFT, CONFIG, mesh, method="rrs", num_drafts=8, **args)


def test_too_big_raises_the_clear_error():
  mesh = memory.abstract_mesh(1, 1)
  plan = memory.plan(
    DRAFT,
    CONFIG,
    mesh,
    batch_size=64,
    method="kseq",
    num_drafts=8,
    draft_len=8,
    prompt_width=8,
    max_new_tokens=32,
  )
  memory.check_fits(plan, plan.total)
  with pytest.raises(memory.DoesNotFitError, match=r"probabilities.*batch_size <= 32"):
    memory.check_fits(plan, sum(plan.weights.values()) + 32 * plan.per_row + 1)
  with pytest.raises(
    memory.DoesNotFitError, match=r"largest part is the probabilities.*mesh_model > 1"
  ):
    memory.check_fits(plan, plan.weights["target"] // 2)


def test_device_bytes_by_name_number_or_device():
  assert memory.device_bytes("tpu-v5e") == 16 * 2**30
  assert memory.device_bytes("H100") == 80 * 2**30
  assert memory.device_bytes("24") == 24 * 2**30
  assert memory.device_bytes("") is None  # CPUs report no memory limit
  with pytest.raises(ValueError, match="tpu-v4"):
    memory.device_bytes("tpu-v9")
  values = pod_gemma2_9b_v5e8.get_config().to_dict()
  with pytest.raises(ValueError, match="device memory"):
    SweepConfig.from_dict(dict(values, device_memory="-1"))


def test_published_sizes_match_the_hub_parameter_counts():
  assert set(pretrained.HUB_SHAPES) == set(pretrained.PUBLISHED)
  for name, hf in pretrained.PUBLISHED.items():
    assert expected_num_params(config_from_hf(hf)) == pretrained.HUB_SHAPES[name][2], name
  for draft, target, *_ in pretrained.PAIRS.values():
    assert {draft, target} <= set(pretrained.PUBLISHED) or draft == "draft"


@pytest.mark.parametrize(
  "module,devices",
  [pytest.param(pod_gemma2_9b_v5e8, 8, marks=pytest.mark.slow), (pod_llama_v4_32, 16)],
  ids=["gemma2", "llama"],
)
def test_example_pod_configs_fit_their_device(module, devices):
  config = SweepConfig.from_dict(module.get_config().to_dict())
  plan, text = _script().plan_text(config, devices)
  memory.check_fits(plan, memory.device_bytes(config.device_memory))
  assert plan.mesh == {"data": devices // config.mesh_model, "model": config.mesh_model}
  assert "sharding of the target" in text and "layers/w_qkv" in text
  assert plan.label and plan.label in text  # the largest cell, named by its DecodeSpec
  small, text = _script().plan_text(config, devices, "sd/wor:1:2")
  assert small.label == "sd/wor:1:2" and "sd/wor:1:2" in text
  assert (small.num_drafts, small.draft_len) == (1, 2) and small.total < plan.total
  if module is pod_gemma2_9b_v5e8:  # 9.24B bf16 parameters over 8 chips
    assert 2.2e9 < plan.weights["target"] < 2.4e9
    # GQA by rule: the 2B draft's 4 key/value heads stay whole over model = 8, the 9B's 8
    # split; Gemma's 256k vocabulary splits.
    mesh = memory.abstract_mesh(1, 8)
    axes = param_axes(CONFIG)["layers"]["w_qkv"]
    spec = lambda shape: sharding.logical_spec(axes, shape, mesh)  # noqa: E731
    assert spec((26, 2304, 4, 4, 256)) == jax.sharding.PartitionSpec()
    assert spec((42, 3584, 8, 4, 256))[2] == "model"
    assert sharding.logical_spec(("vocab", "embed"), (256000, 3584), mesh)[0] == "model"
