"""Tests of token-tree scoring: `Decoder.extend_tree`, `commit_nodes` and `ancestor_mask`.

Every tree test compares against the plain causal forward (`Decoder.logits`) of each
root-to-node sequence (the prompt followed by the path from the node's root down to the
node), which is the definition of what a tree forward must compute: on the PaLM test
models and on every Hugging Face family (sliding windows that bite, soft-caps), with
ragged prompts, forests, padding nodes and node orders that are not topological. Broken
variants (no diagonal, positions by node index, ...) miss it by far more than the
tolerance.

W here is the width of the committed path's slot buffer.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spectr_jax import sharding
from spectr_jax.models import KVCache, ancestor_mask, commit_nodes, decoder, load_pretrained
from spectr_jax.testing import hf_checkpoints
from tests.models import test_models

ATOL = test_models.ATOL  # PaLM test models, as in tests/models/test_models.py
# Hugging Face families: relative to the largest logit, as tests/models/test_pretrained.py
RTOL = 1e-4
ROWS = 16  # rows of one reference forward (one compilation per model)
WIDTH = 24  # padded length of the reference sequences

_ancestor_mask = jax.jit(ancestor_mask)
_commit_nodes = jax.jit(commit_nodes)


class _Model:
  """A decoder with its parameters, its jitted calls and the reference forward."""

  def __init__(self, config, params):
    self.decoder = decoder(config)
    self.params = params
    self.forward = jax.jit(functools.partial(self.decoder.logits, params))
    self.prefill = jax.jit(functools.partial(self.decoder.prefill, params))
    self.extend_tree = jax.jit(functools.partial(self.decoder.extend_tree, params))
    self.extend = jax.jit(functools.partial(self.decoder.extend, params))

  def reference(self, seqs: list[list[int]]) -> np.ndarray:
    """Full-forward logits of each sequence, right-padded to WIDTH: len(seqs) x WIDTH x V."""
    out = []
    for start in range(0, len(seqs), ROWS):
      tokens = np.zeros((ROWS, WIDTH), np.int32)
      for i, seq in enumerate(seqs[start : start + ROWS]):
        tokens[i, : len(seq)] = seq
      out.append(np.asarray(self.forward(jnp.asarray(tokens)))[: len(seqs) - start])
    return np.concatenate(out)


@functools.cache
def _palm(num_kv_heads: int) -> _Model:
  config = test_models._config(num_kv_heads)  # S = 16
  return _Model(config, test_models._numpy_params(config))


@pytest.fixture(params=[1, 2], ids=["mqa", "gqa2"])
def palm(request) -> _Model:
  """Multi-query (1 key/value head) and grouped-query (2) attention."""
  return _palm(request.param)


# Trees.


def _tree(rng, num_real: int, n: int, *, shuffle: bool, roots: bool = True, chain: int = 1):
  """One row's tree: num_real real nodes then n - num_real padding nodes.

  Nodes 0..chain-1 are a chain from a root (a path of depth chain - 1, so sliding windows
  bite); every later real node hangs under one of the three nodes before it, or with
  `roots` sometimes under the prefix (a forest). Padding nodes are roots at a random
  depth that no node points at. With `shuffle` the nodes are permuted (parents then
  often follow their children).

  Returns:
    (parent_N, depth_N, real_N).
  """
  parent_N = np.full(n, -1, np.int32)
  depth_N = np.zeros(n, np.int32)
  for i in range(1, num_real):
    if i < chain or not (roots and rng.random() < 0.15):
      parent_N[i] = i - 1 if i < chain else rng.integers(max(0, i - 3), i)
      depth_N[i] = depth_N[parent_N[i]] + 1
  depth_N[num_real:] = rng.integers(0, 4, n - num_real)
  real_N = np.arange(n) < num_real
  if shuffle:
    perm_N = rng.permutation(n)  # new node i is old node perm_N[i]
    inv_N = np.argsort(perm_N)
    parent_N = np.where(parent_N[perm_N] >= 0, inv_N[parent_N[perm_N]], -1).astype(np.int32)
    depth_N, real_N = depth_N[perm_N], real_N[perm_N]
  return parent_N, depth_N, real_N


def _trees(seed: int, num_real: list[int], n: int, *, shuffle: bool, roots=True, chain=1):
  """Stacked trees of B rows (tokens_BxN, parent_BxN, depth_BxN, real_BxN)."""
  rng = np.random.default_rng(seed)
  rows = [_tree(rng, m, n, shuffle=shuffle, roots=roots, chain=chain) for m in num_real]
  parent_BxN, depth_BxN, real_BxN = (np.stack(x) for x in zip(*rows, strict=True))
  tokens_BxN = rng.integers(0, test_models.VOCAB, parent_BxN.shape).astype(np.int32)
  if shuffle:
    assert (parent_BxN > np.arange(n)).any()  # some parent follows its child
  return tokens_BxN, parent_BxN, depth_BxN, real_BxN


def _path(parent_N: np.ndarray, i: int) -> list[int]:
  """The nodes from node i's root down to node i."""
  nodes = []
  while i >= 0:
    nodes.append(int(i))
    i = parent_N[i]
  return nodes[::-1]


def _walk(parent_N: np.ndarray) -> np.ndarray:
  """Brute-force visibility: node i sees every node on its path."""
  n = len(parent_N)
  visible_NxN = np.zeros((n, n), bool)
  for i in range(n):
    visible_NxN[i, _path(parent_N, i)] = True
  return visible_NxN


def _node_seqs(prompts, tokens_BxN, parent_BxN, real_BxN):
  """The prompt + root-to-node sequence of every real node: (seqs, [(b, i)])."""
  seqs, where = [], []
  for b, prompt in enumerate(prompts):
    for i in np.flatnonzero(real_BxN[b]):
      seqs.append(list(prompt) + [int(tokens_BxN[b, j]) for j in _path(parent_BxN[b], i)])
      where.append((b, int(i)))
  return seqs, where


def _tree_error(model: _Model, logits_BxNxV, prompts, tokens_BxN, parent_BxN, real_BxN):
  """The largest |tree logit - causal logit| over the real nodes, and the largest logit."""
  seqs, where = _node_seqs(prompts, tokens_BxN, parent_BxN, real_BxN)
  ref = model.reference(seqs)
  want = np.stack([ref[r, len(seq) - 1] for r, seq in enumerate(seqs)])
  got = np.stack([np.asarray(logits_BxNxV[b, i]) for b, i in where])
  return np.abs(got - want).max(), np.abs(want).max()


def _prefill(model: _Model, prompts, tail_capacity: int, width: int) -> KVCache:
  """The cache (one tail of `tail_capacity` slots) after prefilling right-padded prompts."""
  tokens = np.zeros((len(prompts), width), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, : len(p)] = p
  cache = model.decoder.init_cache(len(prompts), 1, tail_capacity)
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  return model.prefill(jnp.asarray(tokens), lengths, cache)[1]


# The visibility mask.


def test_ancestor_mask_equals_a_python_walk():
  """Random forests (several depth-0 roots), shuffled node orders and the deepest case,
  a chain of N nodes (N - 1 edges, every doubling step needed), in both orders."""
  rng = np.random.default_rng(0)
  for n in (1, 2, 3, 4, 5, 8, 9, 16, 17):
    rows = [_tree(rng, n, n, shuffle=bool(b % 2))[0] for b in range(6)]
    rows.append(np.arange(-1, n - 1, dtype=np.int32))  # chain: node i under node i - 1
    rows.append(np.append(np.arange(1, n, dtype=np.int32), -1))  # chain, reversed order
    rows.append(np.full(n, -1, np.int32))  # n roots
    parent_BxN = np.stack(rows)
    visible_BxNxN = np.asarray(_ancestor_mask(jnp.asarray(parent_BxN)))
    assert visible_BxNxN.dtype == bool and visible_BxNxN.shape == (len(rows), n, n)
    for b, parent_N in enumerate(parent_BxN):
      np.testing.assert_array_equal(visible_BxNxN[b], _walk(parent_N), err_msg=f"{parent_N}")


# The tree forward against the causal forward.


@pytest.mark.parametrize("shuffle", [False, True], ids=["topological", "shuffled"])
def test_tree_logits_equal_the_causal_forward_of_each_path(palm, shuffle):
  """Ragged prompts and trees (forests, padding nodes); node slots past the tree keep
  their stale contents (never attended), nothing else in the cache moves."""
  prompts = test_models._prompts(200, [5, 2, 7])
  n, r = 12, 14
  tokens_BxN, parent_BxN, depth_BxN, real_BxN = _trees(1, [9, 12, 6], n, shuffle=shuffle)
  cache = _prefill(palm, prompts, r, width=7)
  rng = np.random.default_rng(2)
  stale = cache.replace(  # slots past N hold junk that must stay unseen and untouched
    tail_k=jnp.asarray(rng.normal(size=cache.tail_k.shape), cache.tail_k.dtype),
    tail_v=jnp.asarray(rng.normal(size=cache.tail_v.shape), cache.tail_v.dtype),
  )
  visible_BxNxN = _ancestor_mask(jnp.asarray(parent_BxN))
  logits_BxNxV, new = palm.extend_tree(
    jnp.asarray(tokens_BxN), jnp.asarray(depth_BxN), visible_BxNxN, stale
  )
  assert logits_BxNxV.shape == (3, n, test_models.VOCAB)
  error, _ = _tree_error(palm, logits_BxNxV, prompts, tokens_BxN, parent_BxN, real_BxN)
  assert error < ATOL, error
  for name in ("prefix_k", "prefix_v", "prefix_len", "tail_len"):
    np.testing.assert_array_equal(getattr(new, name), getattr(stale, name), err_msg=name)
  for name in ("tail_k", "tail_v"):
    np.testing.assert_array_equal(
      getattr(new, name)[:, :, :, n:], getattr(stale, name)[:, :, :, n:]
    )
    assert not np.allclose(getattr(new, name)[:, :, :, :n], getattr(stale, name)[:, :, :, :n])


def test_a_tree_needs_enough_node_slots():
  palm = _palm(1)
  cache = palm.decoder.init_cache(2, 1, 3)
  tokens_BxN = jnp.zeros((2, 4), jnp.int32)
  with pytest.raises(ValueError, match="a tree of 4 nodes does not fit the cache's R=3"):
    palm.decoder.extend_tree(palm.params, tokens_BxN, tokens_BxN, jnp.ones((2, 4, 4), bool), cache)


def _broken(variant: str, parent_BxN, depth_BxN, visible_BxNxN):
  """The (depth, visible) inputs of a broken tree forward."""
  n = parent_BxN.shape[1]
  eye_NxN = np.eye(n, dtype=bool)
  if variant == "no_diagonal":  # a node does not see its own key
    return depth_BxN, visible_BxNxN & ~eye_NxN
  if variant == "index_positions":  # position prefix_len + node index, not + depth
    return np.broadcast_to(np.arange(n), depth_BxN.shape), visible_BxNxN
  if variant == "parent_only":  # the parent, not every ancestor
    return depth_BxN, eye_NxN | (parent_BxN[:, :, None] == np.arange(n))
  assert variant == "index_causal"  # causal by node index: the node order taken as ancestry
  return depth_BxN, np.broadcast_to(np.tril(eye_NxN | ~eye_NxN), visible_BxNxN.shape)


@pytest.mark.parametrize(
  "variant", ["no_diagonal", "index_positions", "parent_only", "index_causal"]
)
def test_a_broken_tree_forward_misses_the_causal_forward(variant):
  """The equality check that the tree forward passes fails on each broken variant."""
  model = _palm(2)
  prompts = test_models._prompts(210, [4, 6])
  tokens_BxN, parent_BxN, depth_BxN, real_BxN = _trees(3, [10, 8], 10, shuffle=True)
  cache = _prefill(model, prompts, 10, width=7)
  visible_BxNxN = np.asarray(_ancestor_mask(jnp.asarray(parent_BxN)))
  checks = {
    "right": (depth_BxN, visible_BxNxN),
    variant: _broken(variant, parent_BxN, depth_BxN, visible_BxNxN),
  }
  errors = {}
  for name, (depth, visible) in checks.items():
    logits, _ = model.extend_tree(
      jnp.asarray(tokens_BxN), jnp.asarray(depth), jnp.asarray(visible), cache
    )
    errors[name] = _tree_error(model, logits, prompts, tokens_BxN, parent_BxN, real_BxN)[0]
  assert errors["right"] < ATOL and errors[variant] > 10 * ATOL, errors


# Committing a path.


def test_commit_nodes_of_a_path_then_extend_continues_the_committed_sequence(palm):
  """Row 0 keeps a whole root-to-leaf path, row 1 part of one (the rest of its window is
  written past the new length), row 2 fills S = 16 exactly (the rest is dropped)."""
  prompts = test_models._prompts(220, [4, 2, 13])
  n = 9
  tokens_BxN, parent_BxN, depth_BxN, _ = _trees(4, [9, 9, 9], n, shuffle=True, roots=False)
  cache = _prefill(palm, prompts, n, width=13)
  visible_BxNxN = _ancestor_mask(jnp.asarray(parent_BxN))
  _, cache = palm.extend_tree(jnp.asarray(tokens_BxN), jnp.asarray(depth_BxN), visible_BxNxN, cache)
  paths = [_path(parent_BxN[b], int(np.argmax(depth_BxN[b]))) for b in range(3)]
  w = max(len(p) for p in paths)
  assert all(len(p) >= 4 for p in paths) and any(p != sorted(p) for p in paths)
  slots_BxW = np.full((3, w), -1, np.int32)  # past the path: ignored
  for b, p in enumerate(paths):
    slots_BxW[b, : len(p)] = p
  num_B = np.array([len(paths[0]), 2, 3])
  cache = _commit_nodes(cache, jnp.asarray(slots_BxW), jnp.asarray(num_B))
  np.testing.assert_array_equal(cache.prefix_len, [4 + len(paths[0]), 4, 16])
  np.testing.assert_array_equal(cache.tail_len, np.zeros((3, 1)))
  nxt_BxKxT = test_models._tokens(230, (3, 1, 2))
  logits, _ = palm.extend(jnp.asarray(nxt_BxKxT), cache)
  kept = [
    list(p) + [int(tokens_BxN[b, j]) for j in paths[b][: num_B[b]]] for b, p in enumerate(prompts)
  ]
  ref = palm.reference([k + list(nxt_BxKxT[b, 0]) for b, k in enumerate(kept)])
  for b, k in enumerate(kept):
    np.testing.assert_allclose(logits[b, 0], ref[b, len(k) : len(k) + 2], atol=ATOL)


def test_commit_nodes_writes_only_the_window_and_never_past_capacity():
  """Slots of tail 0 in path order land at prefix_len + [0, W); the rest is untouched."""
  cache = test_models._random_cache(b=3, k=2, s=8, r=5, prefix_len=[0, 4, 7])
  slots_BxW = jnp.asarray([[4, 1, 2], [0, 3, 3], [2, 0, 1]])
  num_B = jnp.asarray([3, 2, 1])
  new = jax.jit(commit_nodes, donate_argnums=0)(jax.tree.map(jnp.copy, cache), slots_BxW, num_B)
  assert (new.B, new.K, new.S, new.R) == (3, 2, 8, 5)
  np.testing.assert_array_equal(new.prefix_len, [3, 6, 8])
  np.testing.assert_array_equal(new.tail_len, np.zeros((3, 2)))
  for b, start in enumerate([0, 4, 7]):
    end = min(start + 3, 8)
    for name in ("k", "v"):
      old_prefix = np.asarray(getattr(cache, f"prefix_{name}"))[:, b]
      new_prefix = np.asarray(getattr(new, f"prefix_{name}"))[:, b]
      nodes = np.asarray(getattr(cache, f"tail_{name}"))[:, b, 0, np.asarray(slots_BxW[b])]
      np.testing.assert_array_equal(new_prefix[:, :start], old_prefix[:, :start])
      np.testing.assert_array_equal(new_prefix[:, start:end], nodes[:, : end - start])
      np.testing.assert_array_equal(new_prefix[:, end:], old_prefix[:, end:])


# Every Hugging Face family.


def _round(model, params, prompts_BxP, lengths_B, tokens_BxN, depth_BxN, parent_BxN, slots_BxW,
           num_B, nxt_BxKxT, num_slots):  # fmt: skip
  """prefill, extend_tree, commit_nodes, extend: (tree logits, logits after the commit)."""
  cache = sharding.constrain_cache(model.init_cache(prompts_BxP.shape[0], 1, num_slots))
  _, cache = model.prefill(params, prompts_BxP, lengths_B, cache)
  visible_BxNxN = ancestor_mask(parent_BxN)
  tree_BxNxV, cache = model.extend_tree(params, tokens_BxN, depth_BxN, visible_BxNxN, cache)
  cache = model.commit_nodes(cache, slots_BxW, num_B)
  nxt_BxKxTxV, _ = model.extend(params, nxt_BxKxT, cache)
  return tree_BxNxV, nxt_BxKxTxV


def _round_inputs(seed: int, prompt_lengths: list[int], num_real: list[int], n: int, vocab: int):
  """Prompts, trees (shuffled forests with padding) and a root-to-deepest-node path per row."""
  rng = np.random.default_rng(seed)
  width = max(prompt_lengths)
  prompts_BxP = rng.integers(0, vocab, (len(prompt_lengths), width)).astype(np.int32)
  tokens_BxN, parent_BxN, depth_BxN, real_BxN = _trees(seed + 1, num_real, n, shuffle=True, chain=7)
  tokens_BxN = rng.integers(0, vocab, tokens_BxN.shape).astype(np.int32)
  deepest_B = np.argmax(np.where(real_BxN, depth_BxN, -1), axis=1)
  paths = [_path(parent_BxN[b], int(i)) for b, i in enumerate(deepest_B)]
  slots_BxW = np.zeros((len(paths), max(len(p) for p in paths)), np.int32)
  for b, p in enumerate(paths):
    slots_BxW[b, : len(p)] = p
  num_B = np.array([len(p) - b % 2 for b, p in enumerate(paths)])  # whole, shorter, ...
  nxt_BxKxT = rng.integers(0, vocab, (len(paths), 1, 2)).astype(np.int32)
  return dict(
    prompts_BxP=prompts_BxP,
    lengths_B=np.array(prompt_lengths),
    tokens_BxN=tokens_BxN,
    depth_BxN=depth_BxN,
    parent_BxN=parent_BxN,
    slots_BxW=slots_BxW,
    num_B=num_B,
    nxt_BxKxT=nxt_BxKxT,
    real_BxN=real_BxN,
    paths=paths,
  )


_ROUND_ARGS = (
  "prompts_BxP",
  "lengths_B",
  "tokens_BxN",
  "depth_BxN",
  "parent_BxN",
  "slots_BxW",
  "num_B",
  "nxt_BxKxT",
)


def _run_round(model: _Model, params, inputs, num_slots: int):
  """`_round` of `inputs`, jitted (under the current mesh, if any)."""
  run = jax.jit(functools.partial(_round, model.decoder, num_slots=num_slots))
  return run(params, *(jnp.asarray(inputs[k]) for k in _ROUND_ARGS))


def _check_round(model: _Model, inputs, tree_BxNxV, nxt_BxKxTxV, atol=None):
  """Tree logits against each root-to-node forward; the continuation after the commit
  against the forward of the committed sequence. atol None: RTOL * the largest logit."""
  prompts = [list(p[:n]) for p, n in zip(inputs["prompts_BxP"], inputs["lengths_B"], strict=True)]
  tokens_BxN = inputs["tokens_BxN"]
  error, scale = _tree_error(
    model, tree_BxNxV, prompts, tokens_BxN, inputs["parent_BxN"], inputs["real_BxN"]
  )
  atol = RTOL * scale if atol is None else atol
  assert error < atol, (error, atol)
  kept = [
    p + [int(tokens_BxN[b, j]) for j in inputs["paths"][b][: inputs["num_B"][b]]]
    for b, p in enumerate(prompts)
  ]
  nxt = inputs["nxt_BxKxT"]
  ref = model.reference([k + list(nxt[b, 0]) for b, k in enumerate(kept)])
  for b, k in enumerate(kept):
    np.testing.assert_allclose(nxt_BxKxTxV[b, 0], ref[b, len(k) : len(k) + 2], rtol=0, atol=atol)


# Gemma 2 (soft-caps, alternating windows) and Mistral (a window that bites) in the fast
# tier; the other families with --runslow.
@pytest.mark.parametrize("family", hf_checkpoints.family_params())
def test_every_family_scores_a_tree_as_the_causal_forward_of_each_path(family, tmp_path):
  """Llama (llama3 rope scaling), Qwen2 (biases), Gemma, Gemma 2 (soft-caps, a window of
  4 on the even layers), GPT-2 (learned positions) and Mistral (a window of 2 on every
  layer): windows shorter than prompt + depth and than the deepest path, so both the
  prefix and the node masks slide."""
  hf_checkpoints.write_tiny(tmp_path, family)
  bundle = load_pretrained(tmp_path)
  window = bundle.config.sliding_window
  model = _Model(bundle.config, bundle.params)
  n = 12
  inputs = _round_inputs(5, [7, 4], [11, 8], n, bundle.config.vocab_size)
  assert window is None or inputs["depth_BxN"].max() > window + 1
  tree_BxNxV, nxt_BxKxTxV = _run_round(model, bundle.params, inputs, n)
  _check_round(model, inputs, tree_BxNxV, nxt_BxKxTxV)


# A (data, model) mesh.


def test_model_sharded_tree_logits_match_one_device():
  """Query and key/value heads split over model = 2 (4 heads on 2 key/value heads), rows
  over data = 4: tree logits and the continuation after commit_nodes within 1e-5 of one
  device (and of the causal forward)."""
  model = _palm(2)
  inputs = _round_inputs(6, [5, 2, 7, 3], [8, 6, 8, 5], 8, test_models.VOCAB)
  single = _run_round(model, model.params, inputs, 8)
  mesh = sharding.make_mesh(4, 2, devices=jax.devices()[:8])
  params = sharding.shard_params(model.params, mesh, axes=model.decoder.param_axes())
  qkv_spec = jax.sharding.PartitionSpec(None, None, "model")
  assert params["layers"]["w_qkv"].sharding.spec == qkv_spec
  with jax.set_mesh(mesh):
    sharded = _run_round(model, params, inputs, 8)
  for want, got in zip(single, sharded, strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
  _check_round(model, inputs, *single, atol=ATOL)
