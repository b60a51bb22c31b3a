"""The engine tests' pair and helpers: random-weight models over V = 4 tokens, the exact
law of the target's continuations of one prompt by enumeration, and a batched decode of
that prompt (tests/decoding/test_engine.py, tests/decoding/test_engine_law.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import engine, sampling
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params

V = 4
PROMPT = (1, 2, 3)
# Rows of the engine's law tests. At 10k rows a missing cache rollback (Pearson's
# statistic 8971 at 50k rows) is rejected with an estimated power of at least 0.99
# (`stats.rejection_power`, asserted where it runs), so every engine law test catches a
# break of that size. A commit of the wrong tree path (1066 at 50k rows) needs more: its
# test decodes `WRONG_PATH_ROWS` (at 30k its power fell below 0.99). 20k rows before
# (the suite's time budget).
WRONG_PATH_ROWS = 60_000
NUM_SAMPLES = 10_000


def bundle(name, seed, logit_scale, attention_scale=1.0):
  """A random-weight model with scaled logits (via its final norm) and attention weights."""
  config = get_model_config(name, V, max_len=24)
  params = init_params(config, jax.random.key(seed))

  def scale(path, x):
    name = jax.tree_util.keystr(path)
    if "final_norm" in name:
      return x * logit_scale
    return x * attention_scale if any(w in name for w in ("w_q", "w_k", "w_v", "w_o")) else x

  return ModelBundle(config, jax.tree_util.tree_map_with_path(scale, params))


def models():
  """The engine tests' pair (draft, target) of random-weight models over V tokens."""
  # Random weights mostly repeat the last token; flipping the draft's logits makes the
  # draft and target disagree, so a large share of tokens comes from the residual path.
  # Sharper, stronger attention makes the target depend on its context, so that cache
  # bugs (a missing rollback) change its law visibly.
  return bundle("draft-test", 1, -1.0), bundle("target-test", 2, 0.5, attention_scale=3.0)


def exact_law(target, num_tokens, temperature=1.0, top_k=None):
  """The transformed target's law over all V^n continuations of PROMPT, by enumeration."""
  seqs = np.array(list(itertools.product(range(V), repeat=num_tokens)), np.int32)
  prompt = np.broadcast_to(np.array(PROMPT, np.int32), (len(seqs), len(PROMPT)))
  logits = target.model.apply({"params": target.params}, jnp.asarray(np.hstack([prompt, seqs])))
  p0 = len(PROMPT) - 1
  probs = np.asarray(
    sampling.transform_probs(logits[:, p0 : p0 + num_tokens], temperature, top_k=top_k),
    np.float64,
  )
  law = np.prod(np.take_along_axis(probs, seqs[:, :, None], axis=2)[:, :, 0], axis=1)
  return law / law.sum()


def codes(tokens_BxT):
  tokens = np.asarray(tokens_BxT)
  return tokens @ (V ** np.arange(tokens.shape[1])[::-1])


def generate(
  draft, target, method, num_drafts, draft_len, n, key=0, batch=NUM_SAMPLES, mesh=None, **spec
):
  """`batch` rows of PROMPT decoded by `DecodeSpec(method, K, L, max_new_tokens=n, **spec)`."""
  prompts = jnp.tile(jnp.asarray([PROMPT], jnp.int32), (batch, 1))
  spec = DecodeSpec(
    method=method, num_drafts=num_drafts, draft_len=draft_len, max_new_tokens=n, **spec
  )
  return engine.generate(
    jax.random.key(key),
    spec,
    draft=draft,
    target=target,
    prompts=prompts,
    prompt_lengths=jnp.full((batch,), len(PROMPT)),
    mesh=mesh,
  )


def residual_share(out, draft_len):
  s = out.stats
  residual = np.sum(np.asarray(s.reached_BxL1 - s.accepted_BxL1)[:, :draft_len])
  return residual / np.sum(np.asarray(s.emitted_B))
