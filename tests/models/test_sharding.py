"""The (data, model) mesh and its rule table: shardings, per-device bytes, model-sharded
logits and decoding on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from spectr_jax import engine, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import (
  ModelBundle,
  get_model_config,
  init_params,
  param_axes,
)
from spectr_jax.models.families import llama

V = 64
MODEL_SHARDED = [(4, 2), (2, 4), (1, 8)]


def _mesh(data, model):
  return sharding.make_mesh(data, model, devices=jax.devices()[: data * model])


def _bundle(name, seed, **overrides):
  config = get_model_config(name, V, max_len=48, **overrides)
  return ModelBundle(config, init_params(config, jax.random.key(seed)))


@pytest.fixture(scope="module")
def pair():
  # The target has 4 query heads and 4 KV heads (both split over model = 2 or 4), the
  # draft a single KV head (replicated by rule on every mesh).
  return _bundle("draft-test", 1), _bundle("target-test", 2, num_kv_heads=4, mlp_dim=256)


def test_make_mesh_uses_every_device_and_checks_shapes():
  mesh = sharding.make_mesh(model=2)
  assert dict(mesh.shape) == {"data": 4, "model": 2}
  assert sharding.make_mesh().shape["data"] == 8
  with pytest.raises(ValueError, match="needs 6 devices, there are 8"):
    sharding.make_mesh(3, 2)
  with pytest.raises(ValueError, match="does not divide"):
    sharding.make_mesh(model=3)
  with pytest.raises(ValueError, match="positive int"):
    sharding.make_mesh(model=0)


def test_logical_spec_replicates_what_does_not_divide():
  mesh = _mesh(2, 4)
  spec = sharding.logical_spec
  assert spec(("embed", "kv_heads", "head_dim"), (64, 8, 16), mesh) == PartitionSpec(None, "model")
  assert spec(("embed", "kv_heads", "head_dim"), (64, 1, 16), mesh) == PartitionSpec()
  assert spec(("vocab", "embed"), (50_257, 64), mesh) == PartitionSpec()  # GPT-2
  assert spec(("vocab", "embed"), (256_000, 64), mesh) == PartitionSpec("model")  # Gemma
  # One mesh axis per array: FSDP's embed -> data beside batch -> data keeps the first.
  assert spec(("batch", "embed"), (8, 64), mesh, sharding.FSDP_RULES) == PartitionSpec("data")
  with pytest.raises(ValueError, match="do not match"):
    spec(("embed",), (4, 4), mesh)


@pytest.mark.parametrize(
  "family",
  [
    # Llama 3.1 8B's factors (GQA: 32 query heads over 8 KV heads, 128k vocabulary).
    dict(num_heads=32, num_kv_heads=8, head_dim=128, vocab=128_256, sharded_kv=True),
    # Gemma 2's head_dim 256 and 256k vocabulary, 16 heads over 8 KV heads.
    dict(num_heads=16, num_kv_heads=8, head_dim=256, vocab=256_000, sharded_kv=True),
    # Gemma 7B-style 4 KV heads on model = 8: replicated by rule.
    dict(num_heads=16, num_kv_heads=4, head_dim=256, vocab=256_000, sharded_kv=False),
    # GPT-2: 12 heads and 50,257 entries do not divide by 8: replicated by rule.
    dict(num_heads=12, num_kv_heads=12, head_dim=64, vocab=50_257, sharded_kv=False),
  ],
)
def test_rules_cover_open_weight_shapes(family):
  """Every parameter of a sequential, biased, untied model gets a spec by rule."""
  config = get_model_config(
    "target-test",
    family["vocab"],
    d_model=64,
    num_layers=1,
    num_heads=family["num_heads"],
    num_kv_heads=family["num_kv_heads"],
    head_dim=family["head_dim"],
    mlp_dim=256,
    family="llama",
    options=llama.LlamaOptions(qkv_bias=True, out_bias=True, mlp_bias=True),
    tied_embedding=False,
  )
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  specs = sharding.param_specs(shapes, sharding.make_mesh(1, 8), axes=param_axes(config))
  block = specs["layers"]  # every block parameter: a leading "layers" axis (replicated)
  heads = family["num_heads"] % 8 == 0
  assert block["w_o"] == (PartitionSpec(None, "model") if heads else PartitionSpec())
  mlp = PartitionSpec(None, None, None, "model")
  assert block["w_gate_up"] == mlp and block["w_down"] == PartitionSpec(None, "model")
  assert block["b_o"] == PartitionSpec() and block["norm"]["scale"] == PartitionSpec()
  # q, k and v are fused by key/value head: split where the key/value heads divide.
  kv = PartitionSpec(None, None, "model") if family["sharded_kv"] else PartitionSpec()
  assert block["w_qkv"] == kv and block["b_qkv"] == (PartitionSpec(None, "model") if kv else kv)
  vocab = PartitionSpec() if family["vocab"] % 8 else PartitionSpec("model")
  assert specs["embed"]["embedding"] == vocab and specs["out_embedding"] == vocab


def test_a_parameter_without_logical_axes_has_no_silent_rule(pair):
  """A parameter the axes do not name (another config's) is an error naming it (a layer
  that creates one without axes: tests/models/test_models.py)."""
  params = {**pair[0].params, "layers": {**pair[0].params["layers"], "w_new": np.zeros(2)}}
  with pytest.raises(KeyError, match="no logical axes for parameter layers/w_new"):
    sharding.param_specs(params, _mesh(1, 8), axes=param_axes(pair[0].config))


# The dimension each weight splits over "model" (Megatron): key/value heads (with their
# queries), heads, MLP width, vocabulary; block weights carry a leading layers axis.
MODEL_DIM = {"w_qkv": 2, "w_o": 1, "w_up": 2, "w_gate_up": 3, "w_down": 1, "embedding": 0}


@pytest.mark.parametrize("shape", [(8, 1), *MODEL_SHARDED])
def test_per_device_bytes_follow_the_rules(pair, shape):
  """Each device holds 1/model of every weight and cache whose heads, MLP width or
  vocabulary divide by the model axis, the whole of the rest (norms, the draft's single
  KV head; the draft's 2 heads on model = 8), checked from the arrays' shardings."""
  mesh = _mesh(*shape)
  model = shape[1]
  for bundle in pair:
    placed = sharding.shard_params(bundle.params, mesh, axes=param_axes(bundle.config))
    for path, x in jax.tree_util.tree_leaves_with_path(placed):
      dim = MODEL_DIM.get(path[-1].key)
      split = dim is not None and x.shape[dim] % model == 0
      full = x.size * x.dtype.itemsize
      assert sharding.per_device_bytes(x) == (full // model if split else full), path
  for bundle in pair:
    cache = bundle.decoder.init_cache(8, 3, 4)

    @jax.jit
    def build(cache=cache):
      return sharding.constrain_cache(cache)

    with jax.set_mesh(mesh):
      built = build()
    split = bundle.config.num_kv_heads % model == 0
    for name in ("prefix_k", "prefix_v", "tail_k", "tail_v"):
      x = getattr(built, name)
      full = x.size * x.dtype.itemsize
      assert sharding.per_device_bytes(x) == (full // model if split else full), name
  assert pair[1].config.num_kv_heads % 4 == 0 and pair[0].config.num_kv_heads == 1


def _logits(bundle, tokens_BxT, mesh=None):
  """The causal forward and a prefill + 2-tail extend of the same tokens (jitted)."""
  model = bundle.decoder
  b, t = tokens_BxT.shape
  params = bundle.params
  if mesh is not None:
    params = sharding.shard_params(params, mesh, axes=model.param_axes())

  @jax.jit
  def run(params, tokens_BxT):
    full = model.logits(params, tokens_BxT)
    cache = sharding.constrain_cache(model.init_cache(b, 2, 4))
    lengths_B = jnp.full((b,), t - 3)
    _, cache = model.prefill(params, tokens_BxT, lengths_B, cache)
    tails_BxKxT = jnp.stack([tokens_BxT[:, t - 3 :], tokens_BxT[:, :3]], axis=1)
    tail, _ = model.extend(params, tails_BxKxT, cache)
    return full, tail

  if mesh is None:
    return run(params, tokens_BxT)
  with jax.set_mesh(mesh):
    return run(params, tokens_BxT)


@pytest.mark.parametrize(
  "shape", [(4, 2), *(pytest.param(s, marks=pytest.mark.slow) for s in MODEL_SHARDED[1:])]
)
def test_model_sharded_logits_match_one_device(pair, shape):
  """Sharding over "model" changes only the order of reductions: teacher-forced
  logits (training forward and cached extend) within 1e-5 of one device."""
  tokens_BxT = jnp.asarray(np.random.default_rng(0).integers(0, V, (4, 9)), jnp.int32)
  for bundle in pair:
    want = _logits(bundle, tokens_BxT)
    got = _logits(bundle, tokens_BxT, _mesh(*shape))
    for w, g in zip(want, got, strict=True):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=0)


def _decode(pair, method, mesh, k=2, length=2, dedup=False, rows=12, only=None, **spec_kw):
  """A decode of `rows` random prompts (`only`: of those rows alone, same prompt ids)."""
  draft, target = pair
  rng = np.random.default_rng(5)
  prompts = rng.integers(0, V, (rows, 5)).astype(np.int32)
  lengths = rng.integers(1, 6, rows)
  ids = np.arange(rows) if only is None else np.asarray(only)
  k = 1 if method in ("sd", "block", "autoregressive") else k
  spec = DecodeSpec(
    method=method, num_drafts=k, draft_len=length, max_new_tokens=8, dedup=dedup, **spec_kw
  )
  return engine.generate(
    jax.random.key(4),
    spec,
    draft=draft,
    target=target,
    prompts=prompts[ids],
    prompt_lengths=lengths[ids],
    prompt_ids=ids,
    mesh=mesh,
  )


@pytest.mark.slow
def test_dedup_rounds_on_a_mesh_give_the_tokens_of_one_device(pair):
  """Issue 27: dedup rounds (the node count and its compiled size chosen per shard) on a
  data mesh give the tokens of one device bit for bit, and on a (2, 4) mesh (heads, MLP
  and vocabulary over "model") those of the tails where no last-bit difference flips a
  draw."""
  single = _decode(pair, "kseq", None, k=3, dedup=True)
  out = _decode(pair, "kseq", _mesh(8, 1), k=3, dedup=True)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxT), np.asarray(single.tokens_BxT))
  np.testing.assert_array_equal(np.asarray(out.stats.nodes_B), np.asarray(single.stats.nodes_B))
  sharded = _decode(pair, "kseq", _mesh(2, 4), k=3, dedup=True)
  tails = _decode(pair, "kseq", None, k=3)
  agree = float(np.mean(np.asarray(sharded.tokens_BxT) == np.asarray(tails.tokens_BxT)))
  assert agree >= 0.95, agree
  assert np.all(np.asarray(single.stats.nodes_B) <= np.asarray(tails.stats.nodes_B))


@pytest.mark.parametrize(
  "method, shapes",
  # All with --runslow: the fast tier checks meshes on the models' logits (here and in
  # tests/decoding/test_tree_forward.py), CI each method's decode.
  [
    pytest.param(m, ((8, 1),), marks=pytest.mark.slow)
    for m in ("kseq", "autoregressive", "rrs", "optimal", "gbv", "traversal")
  ],
)
def test_data_only_meshes_give_the_same_tokens(pair, method, shapes):
  """Data-only meshes: the tokens and statistics of no mesh, bit for bit (on (8, 1); a
  (1, 1) mesh runs the same shard_map program). Each
  row runs its own rounds, whatever the method: one of each kind (no drafts, K drafts
  (one draft is the same program at K = 1), drafts without replacement, the optimal
  plan's data-dependent loops, the block level on a path and on the tree)."""
  single = _decode(pair, method, None)
  for shape in shapes:
    out = _decode(pair, method, _mesh(*shape))
    np.testing.assert_array_equal(np.asarray(out.tokens_BxT), np.asarray(single.tokens_BxT))
    np.testing.assert_array_equal(np.asarray(out.stats.rounds_B), np.asarray(single.stats.rounds_B))


@pytest.mark.slow
def test_adaptive_rounds_on_a_data_mesh_give_the_tokens_of_one_device(pair):
  """Adaptive draft length: each row's lengths are its own, so a data mesh (each shard
  drafting up to its own rows' longest length) emits the tokens of one device; a tree
  budget is shared by the rows of a shard (no communication within a round), so the
  mesh emits what one device emits for each shard's rows decoded alone."""
  single = _decode(pair, "kseq", None, k=3, length=3, adaptive=0.4)
  out = _decode(pair, "kseq", _mesh(8, 1), k=3, length=3, adaptive=0.4)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxT), np.asarray(single.tokens_BxT))
  np.testing.assert_array_equal(
    np.asarray(out.stats.lengths_BxL1), np.asarray(single.stats.lengths_BxL1)
  )
  budget = dict(k=3, dedup=True, node_budget=3.0, rows=16)
  out = _decode(pair, "rrs", _mesh(8, 1), **budget)
  for shard in range(8):
    rows = [2 * shard, 2 * shard + 1]
    alone = _decode(pair, "rrs", None, only=rows, **budget)
    np.testing.assert_array_equal(
      np.asarray(out.tokens_BxT)[rows], np.asarray(alone.tokens_BxT), err_msg=f"shard {shard}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("shape", MODEL_SHARDED)
def test_model_sharded_decoding_agrees_with_one_device(pair, shape, capsys):
  """Model-sharded decoding: the same tokens as one device where the logits' last-bit
  differences flip no draw (reported; on this pair every token agrees)."""
  single = _decode(pair, "kseq", None)
  out = _decode(pair, "kseq", _mesh(*shape))
  agree = float(np.mean(np.asarray(out.tokens_BxT) == np.asarray(single.tokens_BxT)))
  with capsys.disabled():
    print(f"\nmesh {shape}: token agreement with one device {agree:.4f}")
  assert agree >= 0.95


def test_a_mesh_without_a_data_axis_is_refused(pair):
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("rows",))
  with pytest.raises(ValueError, match="needs a 'data' axis"):
    _decode(pair, "kseq", mesh)


def test_replicated_inputs_are_placed_once(pair):
  mesh = _mesh(4, 2)
  axes = param_axes(pair[1].config)
  placed = sharding.shard_params(pair[1].params, mesh, axes=axes)
  again = sharding.shard_params(placed, mesh, axes=axes)
  assert all(a is b for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(again), strict=True))
  rows = sharding.put(np.arange(8), NamedSharding(mesh, PartitionSpec("data")))
  assert sharding.per_device_bytes(rows) == 2 * rows.dtype.itemsize


def test_collective_counts_multiply_known_loops():
  """3 all-reduces per iteration of a data-dependent loop (one in its condition, two in a
  loop of known trip count 2), 1 outside it."""
  mesh = _mesh(4, 2)

  def body(x_A):
    x_A = jax.lax.psum(x_A, "model")

    def outer(carry):
      i, y_A = carry
      y_A = jax.lax.fori_loop(0, 2, lambda _, z: jax.lax.psum(z, "model") * 0.5, y_A)
      return i + 1, y_A

    def cond(carry):
      return jax.lax.psum(carry[1][0], "model") < 100.0

    return jax.lax.while_loop(cond, outer, (0, x_A))[1]

  fn = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("model"), out_specs=PartitionSpec())
  )
  x_A = jax.device_put(jnp.ones(8), NamedSharding(mesh, PartitionSpec("model")))
  counts = sharding.collective_counts(fn.lower(x_A).compile().as_text())
  assert counts["once"]["all-reduce"] == 1  # (the condition's last, failing test not counted)
  assert counts["per_iteration"]["all-reduce"] == 3
