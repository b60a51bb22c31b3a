"""Distillation of a draft against a frozen target: divergences, data sources, alignment.

A distillation step (`spectr_jax.train` with `TrainConfig.distill` on) scores its rows
with the draft being trained and the frozen target in the same jitted step and minimises
a divergence between their next-token distributions p and q, both under the decoding
transform the draft will serve (`sampling.transform_probs`). A draft head
(`spectr_jax.models.head`) reads the target's features of the same rows and the
target's embedding, which stay frozen. The rows come from the
corpus, from the target (sampled continuations of training-row starts) or from the
current draft (on-policy: sampled by the draft, scored by the target), or a mix; the
samples of step `i` use keys derived from `(seed, i)`, so a resumed run is exact.

What distillation is for is measured by `alignment` (at every evaluation): the exact
per-token acceptance sum_x min(p, q) and the K-draft optimal-transport bound alpha*
along sequences sampled from the target after held-out prompts.
"""

import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import acceptance, engine, runs, sampling
from spectr_jax.data import PAD_ID, Dataset, TokenizedSplit, make_prompts
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, Transformer, decoder
from spectr_jax.models.head import Head, share_target
from spectr_jax.pair_config import resolve
from spectr_jax.train_config import DISTILL_SOURCES, DistillConfig, TrainConfig

_SAMPLE_STREAM = 1  # fold_in(key(seed), _SAMPLE_STREAM): the sampling keys (0 is the init)
_TINY = float(np.finfo(np.float32).tiny)


def _log(x):
  """log, with 0 taken as the smallest normal float32 (truncated tokens, underflow)."""
  return jnp.log(jnp.maximum(x, _TINY))


def _kl(a_AxV: jax.Array, b_AxV: jax.Array) -> jax.Array:
  """KL(a || b) per row: sum_x a log(a / b), with 0 log 0 = 0."""
  return jnp.sum(jax.scipy.special.xlogy(a_AxV, a_AxV) - a_AxV * _log(b_AxV), axis=-1)


def divergence(p_AxV: jax.Array, q_AxV: jax.Array, name: str, skew: float = 0.5) -> jax.Array:
  """The divergence between the draft's p and the target's q at every position.

  Args:
    p_AxV: draft distributions (any leading shape A).
    q_AxV: target distributions, same shape.
    name: "forward_kl" KL(q || p), "reverse_kl" KL(p || q), "tv" 1 - sum min(p, q) (the
      total variation), "jsd" skew KL(q || m) + (1 - skew) KL(p || m) with
      m = skew q + (1 - skew) p.
    skew: the target's weight in "jsd".

  Returns:
    The divergence [A] (float32).
  """
  if name == "forward_kl":
    return _kl(q_AxV, p_AxV)
  if name == "reverse_kl":
    return _kl(p_AxV, q_AxV)
  if name == "tv":
    return 1.0 - acceptance.overlap(p_AxV, q_AxV)
  if name == "jsd":
    m_AxV = skew * q_AxV + (1.0 - skew) * p_AxV
    return skew * _kl(q_AxV, m_AxV) + (1.0 - skew) * _kl(p_AxV, m_AxV)
  raise ValueError(f"unknown divergence {name!r}")


def _probs(logits_BxTxV: jax.Array, config: DistillConfig) -> jax.Array:
  return sampling.transform_probs(logits_BxTxV, **config.transform())


def draft_logits(
  draft: Transformer,
  params: Any,
  tokens_BxT: jax.Array,
  target_params: Any = None,
  features_BxTxD: jax.Array | None = None,
  steps: int = 1,
) -> list[jax.Array]:
  """The draft's logits of whole rows: [logits_BxTxV] per unrolled step.

  A head (`models.head.Head`) reads the target's features of the same rows
  (`features_BxTxD`, the target's `return_features`) and the target's shared arrays
  (`share_target`), which get no gradient. With `steps` > 1, each later step reads the
  previous step's output instead of the target's features, as drafting does beyond a
  round's first depth (EAGLE-3's training-time test, Li et al., arXiv 2503.01840, in
  whole-row form). Another draft reads its tokens only (one step).
  """
  if not isinstance(draft, Head):
    return [draft.apply({"params": params}, tokens_BxT)]
  if features_BxTxD is None:
    raise ValueError("a head's logits read the target's features of the same rows")
  shared = share_target(params, jax.lax.stop_gradient(target_params))
  head, out = decoder(draft.config), []
  for _ in range(steps):
    logits_BxTxV, features_BxTxD = head.logits(shared, tokens_BxT, features_BxTxD, True)
    out.append(logits_BxTxV)
  return out


def _both_probs(draft, params, target, target_params, tokens_BxT, config, steps=1):
  """([p per step], q): the draft's and the target's transformed next-token laws of
  whole rows."""
  q_logits_BxTxV, features_BxTxD = target.apply(
    {"params": target_params}, tokens_BxT, return_features=True
  )
  p_logits = draft_logits(draft, params, tokens_BxT, target_params, features_BxTxD, steps)
  return [_probs(x, config) for x in p_logits], _probs(q_logits_BxTxV, config)


def distill_loss(
  params: Any,
  target_params: Any,
  rows: dict[str, jax.Array],
  draft: Transformer,
  target: Transformer,
  config: DistillConfig,
) -> jax.Array:
  """Mean divergence over the positions of every source's rows whose next token is not PAD
  (a head's: over its `config.head_steps` unrolled steps too).

  Args:
    params: the draft's parameters (differentiated).
    target_params: the frozen target's (no gradient flows to them).
    rows: {source: int32 rows [B_s, W_s]}; position t predicts token t + 1.
    draft, target: the two modules (a draft head reads the target's features).
    config: the divergence and the decoding transform.

  Returns:
    The scalar loss.
  """
  total, count = jnp.float32(0.0), jnp.float32(0.0)
  target_params = jax.lax.stop_gradient(target_params)
  for rows_BxW in rows.values():
    inputs_BxT, next_BxT = rows_BxW[:, :-1], rows_BxW[:, 1:]
    steps = config.head_steps if isinstance(draft, Head) else 1
    p_list, q_BxTxV = _both_probs(draft, params, target, target_params, inputs_BxT, config, steps)
    mask_BxT = (next_BxT != PAD_ID).astype(jnp.float32)
    for p_BxTxV in p_list:
      d_BxT = divergence(p_BxTxV, q_BxTxV, config.divergence, config.skew)
      total, count = total + jnp.sum(d_BxT * mask_BxT), count + jnp.sum(mask_BxT)
  return total / jnp.maximum(count, 1.0)


def continue_prompts(
  key: jax.Array,
  model: ModelBundle,
  prompts_BxP: jax.Array,
  lengths_B: jax.Array,
  num_tokens: int,
  config: DistillConfig,
  prompt_ids_B: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Samples T tokens after each prompt from `model` (`engine.generate`, autoregressive).

  Args:
    key: PRNG key; row b samples with fold_in(key, prompt_ids_B[b]) (default b).
    model: the model sampled from.
    prompts_BxP: right-padded prompts.
    lengths_B: their lengths.
    num_tokens: T.
    config: the decoding transform.
    prompt_ids_B: the prompts' ids for the randomness.

  Returns:
    tokens_BxW (W = P + T: prompt, samples, then PAD) and pos_BxT, the position of each
    sample in its row.
  """
  spec = DecodeSpec(
    method="autoregressive",
    max_new_tokens=num_tokens,
    temperature=config.temperature,
    top_k=config.top_k,
    top_p=config.top_p,
  )
  out = engine.generate(
    key,
    spec,
    draft=None,
    target=model,
    prompts=prompts_BxP,
    prompt_lengths=lengths_B,
    prompt_ids=prompt_ids_B,
  )
  b, width = np.shape(prompts_BxP)
  pos_BxT = jnp.asarray(lengths_B, jnp.int32)[:, None] + jnp.arange(num_tokens)[None, :]
  tokens_BxW = jnp.full((b, width + num_tokens), PAD_ID, jnp.int32)
  tokens_BxW = tokens_BxW.at[:, :width].set(jnp.asarray(prompts_BxP, jnp.int32))
  return tokens_BxW.at[jnp.arange(b)[:, None], pos_BxT].set(out.tokens_BxT), pos_BxT


def sample_rows(
  key: jax.Array, model: ModelBundle, rows_BxT1: np.ndarray, config: DistillConfig
) -> jax.Array:
  """Continues the first `prompt_len` tokens of corpus rows with samples from `model`.

  Args:
    key: PRNG key (row b samples with fold_in(key, b), as in `engine.generate`).
    model: the model sampled from (the target, or the draft for on-policy data).
    rows_BxT1: packed training rows; their starts are the prompts (PAD-free part only).
    config: prompt_len, sample_tokens and the decoding transform.

  Returns:
    int32 rows [B, prompt_len + sample_tokens]: prompt, samples, then PAD.
  """
  prompts_BxP = np.asarray(rows_BxT1[:, : config.prompt_len], np.int32)
  lengths_B = np.maximum((prompts_BxP != PAD_ID).sum(axis=1), 1).astype(np.int32)
  return continue_prompts(key, model, prompts_BxP, lengths_B, config.sample_tokens, config)[0]


def step_rows(
  config: TrainConfig, step: int, corpus_BxT1: np.ndarray, draft: ModelBundle, target: ModelBundle
) -> dict[str, Any]:
  """The rows of distillation step `step`, by source (a pure function of seed, step, draft).

  The step's corpus batch is split among the sources (`DistillConfig.rows`): corpus rows
  are used as they are, the others lend their starts as prompts for the samples.

  Args:
    config: the run.
    step: the step.
    corpus_BxT1: the step's corpus batch [batch_size, seq_len + 1].
    draft: the current draft (on-policy samples).
    target: the target.

  Returns:
    {source: rows} in `DISTILL_SOURCES` order.
  """
  counts = config.distill.rows(config.batch_size)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), _SAMPLE_STREAM), step)
  rows, start = {}, 0
  for index, name in enumerate(DISTILL_SOURCES):
    if name not in counts:
      continue
    part = corpus_BxT1[start : start + counts[name]]
    start += counts[name]
    if name == "corpus":
      rows[name] = part
    else:
      model = target if name == "target" else draft
      rows[name] = sample_rows(jax.random.fold_in(key, index), model, part, config.distill)
  return rows


def positions_per_step(config: TrainConfig) -> int:
  """Positions scored per distillation step (rows times their input length)."""
  counts = config.distill.rows(config.batch_size)
  width = config.distill.prompt_len + config.distill.sample_tokens - 1
  return sum(n * (config.data.seq_len if s == "corpus" else width) for s, n in counts.items())


def fingerprint(bundle: ModelBundle) -> str:
  """A short hash of a model's parameters (a resumed run checks its target by it)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(bundle.params):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]


def load_target(config: TrainConfig, dataset: Dataset) -> ModelBundle:
  """The frozen target of a distillation run, checked against the run's data and model.

  Raises:
    runs.CheckpointError: the target is missing or has another tokenizer or vocabulary.
  """
  path = resolve(config.distill.target_workdir)
  target = runs.load_bundle(path)
  if runs.load_tokenizer(path).model_proto != dataset.tokenizer.model_proto:
    raise runs.CheckpointError(
      f"the distillation target in {path} uses another tokenizer than this run's data "
      "(give the run the target's data config)"
    )
  vocab = (target.config.num_logits, config.model_config().num_logits)
  if vocab[0] != vocab[1]:
    raise runs.CheckpointError(f"target and draft vocabularies differ: {vocab[0]} vs {vocab[1]}")
  return target


def initial_params(config: TrainConfig) -> Any | None:
  """The parameters of `distill.init_workdir`'s final checkpoint (None when not set).

  Raises:
    runs.CheckpointError: that run's model is not this run's.
  """
  if not config.distill.init_workdir:
    return None
  path = resolve(config.distill.init_workdir)
  bundle = runs.load_bundle(path)
  if bundle.config != config.model_config():
    raise runs.CheckpointError(
      f"distill.init_workdir {path} holds a {runs.load_config(path).model} model, not this "
      f"run's {config.model} (with its overrides)"
    )
  return bundle.params


@functools.partial(jax.jit, static_argnames=("config", "num_drafts"))
def _alignment_sums(draft, target, tokens_BxW, pos_BxT, config, num_drafts):
  """[sum of sum_x min(p, q), sum of alpha*] over the sampled positions."""
  p_list, q_BxTxV = _both_probs(
    draft.model, draft.params, target.model, target.params, tokens_BxW, config
  )
  p_BxTxV, q_BxTxV = (
    jnp.take_along_axis(probs, (pos_BxT - 1)[..., None], axis=1) for probs in (p_list[0], q_BxTxV)
  )
  vocab = p_BxTxV.shape[-1]
  p_XxV, q_XxV = p_BxTxV.reshape(-1, vocab), q_BxTxV.reshape(-1, vocab)
  alpha_X = acceptance.optimal_acceptance_X(p_XxV, q_XxV, num_drafts)
  return jnp.stack([jnp.sum(acceptance.overlap(p_XxV, q_XxV)), jnp.sum(alpha_X)])


def alignment(
  draft: ModelBundle,
  target: ModelBundle,
  heldout: TokenizedSplit,
  config: DistillConfig,
  seed: int,
  num_drafts: int = 8,
  batch_size: int = 32,
) -> dict[str, float]:
  """Exact per-token acceptance and the K-draft bound along target samples.

  Draws `config.eval_prompts` held-out prompts (`make_prompts` with `seed`), samples
  `config.eval_tokens` tokens after each from the target under the decoding transform
  (row b with fold_in(key(seed), b), the samples of `analysis.collect_trajectories`) and
  averages over every sampled position (decoding goes on past EOS, as in the sweeps).

  Args:
    draft, target: the models.
    heldout: held-out sentences (never the distillation data).
    config: eval_prompts, eval_tokens, prompt_len and the decoding transform.
    seed: selects the prompts and seeds the sampling.
    num_drafts: K of the bound.
    batch_size: prompts per call.

  Returns:
    {"acceptance": mean sum_x min(p, q), "alpha_k<K>": mean alpha*(p, q, K) (the
    `acceptance.optimal_acceptance` bound), "positions": how many were averaged}.
  """
  prompts = make_prompts(heldout, config.eval_prompts, config.prompt_len, seed)
  sums = np.zeros(2)
  for start in range(0, config.eval_prompts, batch_size):
    rows = slice(start, min(start + batch_size, config.eval_prompts))
    tokens_BxW, pos_BxT = continue_prompts(
      jax.random.key(seed), target, prompts.tokens_BxP[rows], prompts.lengths_B[rows],
      config.eval_tokens, config, jnp.arange(rows.start, rows.stop, dtype=jnp.int32),
    )  # fmt: skip
    sums += np.asarray(_alignment_sums(draft, target, tokens_BxW, pos_BxT, config, num_drafts))
  count = config.eval_prompts * config.eval_tokens
  return {
    "acceptance": float(sums[0] / count),
    f"alpha_k{num_drafts}": float(sums[1] / count),
    "positions": count,
  }
