"""Evaluation of a draft/target pair: perplexity and single-draft acceptance.

The acceptance of one draft token at a position is `sum_x min(p(x), q(x))` for the
draft's next-token distribution p and the target's q there. It is measured twice:
teacher-forced on held-out text, and along sequences sampled from the target (the
prefixes that speculative decoding actually visits).
"""

import dataclasses
import functools
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import acceptance, analysis, checks, runs, train
from spectr_jax.data import BOS_ID, PAD_ID, Dataset, Prompts, heldout_rows, make_prompts
from spectr_jax.models import ModelBundle, count_params
from spectr_jax.schema import Schema


@dataclasses.dataclass(frozen=True)
class EvalConfig(Schema):
  """What `evaluate.evaluate_pair` measures.

  Attributes:
    eval_rows: held-out rows of `seq_len + 1` tokens for perplexity and teacher-forced
      acceptance (0 = all).
    batch_size: rows per forward pass.
    num_prompts: prompts (held-out sentence starts) for the sampled acceptance.
    prompt_len: sentence ids per prompt (after BOS).
    num_tokens: tokens sampled from the target after each prompt.
    temperature: sampling temperature of the target (and of both distributions).
    seed: selects the prompts and seeds the sampling.
  """

  eval_rows: int = 0
  batch_size: int = 32
  num_prompts: int = 64
  prompt_len: int = 8
  num_tokens: int = 32
  temperature: float = 1.0
  seed: int = 0


def _overlap_BxT(
  draft: ModelBundle, target: ModelBundle, tokens_BxT: jax.Array, temperature, greedy: bool
) -> jax.Array:
  """Returns `sum_x min(p, q)` of the next-token distributions at every position."""
  p_BxTxV = analysis.next_token_probs(draft, tokens_BxT, temperature, greedy=greedy)
  q_BxTxV = analysis.next_token_probs(target, tokens_BxT, temperature, greedy=greedy)
  return acceptance.overlap(p_BxTxV, q_BxTxV)


@functools.partial(jax.jit, static_argnames="greedy")
def _teacher_forced_sums(
  draft: ModelBundle, target: ModelBundle, rows_BxT1: jax.Array, temperature: jax.Array, greedy
) -> jax.Array:
  """Returns [sum of overlaps, count] over targets that are neither PAD nor BOS."""
  tokens_BxT, next_BxT = rows_BxT1[:, :-1], rows_BxT1[:, 1:]
  overlap_BxT = _overlap_BxT(draft, target, tokens_BxT, temperature, greedy)
  mask_BxT = ((next_BxT != PAD_ID) & (next_BxT != BOS_ID)).astype(jnp.float32)
  return jnp.stack([jnp.sum(overlap_BxT * mask_BxT), jnp.sum(mask_BxT)])


def teacher_forced_acceptance(
  draft: ModelBundle,
  target: ModelBundle,
  rows_ExT1: np.ndarray,
  batch_size: int,
  temperature: float = 1.0,
) -> float:
  """Mean `sum_x min(p, q)` over the positions of held-out rows.

  Args:
    draft: the draft model (p).
    target: the target model (q).
    rows_ExT1: int32 packed held-out rows [E, T + 1].
    batch_size: rows per forward pass.
    temperature: softmax temperature of both models.

  Returns:
    The mean acceptance over positions whose next token is not PAD or BOS.
  """
  total = np.zeros(2)
  for start in range(0, len(rows_ExT1), batch_size):
    batch = rows_ExT1[start : start + batch_size]
    pad = np.full((batch_size - len(batch), batch.shape[1]), PAD_ID, np.int32)
    rows = np.concatenate([batch, pad])
    sums = _teacher_forced_sums(
      draft, target, rows, jnp.float32(temperature), greedy=float(temperature) <= 0
    )
    total += np.asarray(sums)
  return float(total[0] / max(total[1], 1.0))


def sampled_acceptance(
  draft: ModelBundle,
  target: ModelBundle,
  prompts: Prompts,
  num_tokens: int,
  key: jax.Array,
  temperature: float = 1.0,
) -> tuple[float, np.ndarray, int]:
  """Mean `sum_x min(p, q)` along continuations sampled from the target.

  Positions after a sampled EOS are left out (the sentence has ended there). The
  trajectories come from `analysis.collect_trajectories`.

  Args:
    draft: the draft model (p).
    target: the target model (q), sampled from.
    prompts: the prompts.
    num_tokens: T, tokens sampled per prompt.
    key: PRNG key of the sampling.
    temperature: sampling and softmax temperature.

  Returns:
    The mean acceptance, the mean at each of the T positions [T] (NaN where no row is
    still in its sentence), and the number of positions averaged.
  """
  traj = analysis.collect_trajectories(draft, target, prompts, num_tokens, key, temperature)
  overlap_BxT = np.asarray(acceptance.overlap(traj.p_BxTxV, traj.q_BxTxV))
  mask_BxT = np.asarray(traj.in_sentence_BxT)
  counts_T = mask_BxT.sum(axis=0)
  per_position_T = np.where(
    counts_T > 0, (overlap_BxT * mask_BxT).sum(axis=0) / np.maximum(counts_T, 1), np.nan
  )
  count = int(mask_BxT.sum())
  return float((overlap_BxT * mask_BxT).sum() / max(count, 1)), per_position_T, count


def iid_block_efficiency(acceptance: float, draft_len: int) -> float:
  """Tokens per target call of single-draft decoding if every position accepts i.i.d.

  Args:
    acceptance: per-token acceptance a.
    draft_len: L, draft tokens per round.

  Returns:
    `(1 - a^(L+1)) / (1 - a)`: a rough guide, since real acceptances vary by position.
  """
  if acceptance >= 1.0:
    return float(draft_len + 1)
  return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)


def evaluate_pair(
  draft: ModelBundle, target: ModelBundle, dataset: Dataset, seq_len: int, config: EvalConfig
) -> dict[str, Any]:
  """Measures perplexities and both acceptance figures of a pair.

  Args:
    draft: the draft model.
    target: the target model (same vocabulary).
    dataset: the dataset both were trained on (its held-out split is used).
    seq_len: model input length of the held-out rows.
    config: what to measure.

  Returns:
    A JSON-able dict of the figures.
  """
  vocab = (draft.config.vocab_size, target.config.vocab_size, dataset.tokenizer.vocab_size)
  if len(set(vocab)) != 1:
    raise ValueError(f"draft, target and tokenizer vocabularies differ: {vocab}")
  rows = heldout_rows(dataset.heldout, seq_len, config.eval_rows)
  prompts = make_prompts(dataset.heldout, config.num_prompts, config.prompt_len, config.seed)
  draft_nll = train.heldout_loss(draft, rows, config.batch_size)
  target_nll = train.heldout_loss(target, rows, config.batch_size)
  for name, nll in (("draft", draft_nll), ("target", target_nll)):
    if not np.isfinite(nll):
      raise checks.NonFiniteError(
        f"the {name} model's held-out loss is {nll}: its logits are not finite (its "
        "parameters may be damaged); nothing is evaluated"
      )
  teacher = teacher_forced_acceptance(draft, target, rows, config.batch_size, config.temperature)
  sampled, per_position, sampled_positions = sampled_acceptance(
    draft, target, prompts, config.num_tokens, jax.random.key(config.seed), config.temperature
  )
  return {
    "draft_params": count_params(draft.params),
    "target_params": count_params(target.params),
    "heldout_rows": int(len(rows)),
    "heldout_tokens_scored": int(np.sum((rows[:, 1:] != PAD_ID) & (rows[:, 1:] != BOS_ID))),
    "draft_heldout_ppl": float(np.exp(draft_nll)),
    "target_heldout_ppl": float(np.exp(target_nll)),
    "teacher_forced_acceptance": teacher,
    "sampled_acceptance": sampled,
    "sampled_acceptance_by_position": [float(x) for x in per_position],
    "sampled_positions": sampled_positions,
    "iid_block_efficiency_L4": iid_block_efficiency(sampled, 4),
    "config": dataclasses.asdict(config),
  }


def evaluate_workdirs(
  draft_workdir: str | pathlib.Path,
  target_workdir: str | pathlib.Path,
  config: EvalConfig,
  output: str | pathlib.Path | None = None,
) -> dict[str, Any]:
  """Loads two finished runs, checks they share a tokenizer, and evaluates the pair.

  Args:
    draft_workdir: the draft's run directory.
    target_workdir: the target's run directory.
    config: what to measure.
    output: optional path of a JSON file for the results.

  Returns:
    The results of `evaluate_pair`, plus the training meta of both runs.
  """
  if runs.load_tokenizer(draft_workdir).model_proto != (
    runs.load_tokenizer(target_workdir).model_proto
  ):
    raise ValueError(f"{draft_workdir} and {target_workdir} use different tokenizers")
  target_config = runs.load_config(target_workdir)
  draft = runs.load_bundle(draft_workdir)
  target = runs.load_bundle(target_workdir)
  dataset = runs.dataset_for(target_workdir)
  results = evaluate_pair(draft, target, dataset, target_config.data.seq_len, config)
  for name, workdir in (("draft", draft_workdir), ("target", target_workdir)):
    meta = runs.checkpoint_meta(workdir)
    results[f"{name}_train_tokens"] = round(meta["positions_seen"] * meta["row_fill"])
    results[f"{name}_train_wall_time_s"] = meta["wall_time_s"]
    results[f"{name}_model"] = meta["config"]["model"]
  results["corpus_train_tokens"] = dataset.train.num_tokens
  if output:
    pathlib.Path(output).write_text(json.dumps(results, indent=2))
  return results
