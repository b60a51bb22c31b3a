"""(p, q) along decoded trajectories, and the rho ablation on these real distributions.

`collect_trajectories` samples continuations of prompts from the target (the law that
exact speculative decoding outputs) and records, at every sampled position, the draft's
next-token distribution p and the target's q: what a verifier sees there.
`rho_ablation` evaluates each K-SEQ split-factor strategy on those pairs exactly (closed
forms of `spectr_jax.acceptance`, no sampling): the mean probability that the output hits
a draft, the optimal-transport bound alpha*, the gap between them, and how often a fixed
rho is invalid (the accept branch overshoots q somewhere, so the residual would be
negative and the output would not follow q). `run_rho_ablation` adds the block-level
effect: a decoding sweep with every strategy.
"""

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from spectr_jax import acceptance, experiment, sampling
from spectr_jax.data import EOS_ID, PAD_ID, Prompts, make_prompts
from spectr_jax.models import ModelBundle

ANALYSIS_FILE = "analysis.json"
_VALID_TOL = 1e-6


def next_token_probs(bundle: ModelBundle, tokens_BxT: jax.Array, temperature) -> jax.Array:
  """The model's next-token distribution after every prefix: probs_BxTxV (float32)."""
  logits_BxTxV = bundle.model.apply({"params": bundle.params}, tokens_BxT)
  return sampling.transform_probs(logits_BxTxV, temperature)


@functools.partial(jax.jit, static_argnames="num_tokens")
def sample_target(
  target: ModelBundle,
  tokens_BxP: jax.Array,
  lengths_B: jax.Array,
  num_tokens: int,
  key: jax.Array,
  temperature: jax.Array,
) -> jax.Array:
  """Samples `num_tokens` tokens after each prompt (full forward per token, no cache).

  Args:
    target: the model sampled from.
    tokens_BxP: int32 right-padded prompts [B, P].
    lengths_B: int32 prompt lengths.
    num_tokens: N, tokens to sample per row.
    key: PRNG key; token `s` uses `fold_in(key, s)`.
    temperature: float32 scalar > 0.

  Returns:
    int32 [B, P + N]: row b holds its prompt, then its N samples from position
    `lengths_B[b]` on, then PAD.
  """
  batch, width = tokens_BxP.shape[0], tokens_BxP.shape[1] + num_tokens
  tokens_BxW = (
    jnp.full((batch, width), PAD_ID, jnp.int32).at[:, : tokens_BxP.shape[1]].set(tokens_BxP)
  )
  rows_B = jnp.arange(batch)

  def body(s, tokens_BxW):
    logits_BxWxV = target.model.apply({"params": target.params}, tokens_BxW)
    pos_B = lengths_B + s
    logits_BxV = logits_BxWxV[rows_B, pos_B - 1].astype(jnp.float32)
    next_B = jax.random.categorical(jax.random.fold_in(key, s), logits_BxV / temperature)
    return tokens_BxW.at[rows_B, pos_B].set(next_B.astype(jnp.int32))

  return jax.lax.fori_loop(0, num_tokens, body, tokens_BxW)


class Trajectories(NamedTuple):
  """Sampled continuations and the distributions at each sampled position.

  tokens_BxW: prompts followed by N target samples (see `sample_target`).
  p_BxNxV, q_BxNxV: draft and target next-token distributions before each sample.
  in_sentence_BxN: positions up to and including the first sampled EOS.
  """

  tokens_BxW: jax.Array
  p_BxNxV: jax.Array
  q_BxNxV: jax.Array
  in_sentence_BxN: jax.Array


@functools.partial(jax.jit, static_argnames="num_tokens")
def _distributions(draft, target, tokens_BxW, lengths_B, num_tokens, temperature):
  pos_BxN = lengths_B[:, None] - 1 + jnp.arange(num_tokens)[None, :]
  p_BxNxV, q_BxNxV = (
    jnp.take_along_axis(next_token_probs(m, tokens_BxW, temperature), pos_BxN[..., None], 1)
    for m in (draft, target)
  )
  sampled_BxN = jnp.take_along_axis(tokens_BxW, pos_BxN + 1, axis=1)
  eos_before_BxN = jnp.cumsum(sampled_BxN == EOS_ID, axis=1) - (sampled_BxN == EOS_ID)
  return p_BxNxV, q_BxNxV, eos_before_BxN == 0


def collect_trajectories(
  draft: ModelBundle,
  target: ModelBundle,
  prompts: Prompts,
  num_tokens: int,
  key: jax.Array,
  temperature: float = 1.0,
) -> Trajectories:
  """Samples N tokens after each prompt from the target and records (p, q) along them.

  Args:
    draft: the draft model (p).
    target: the target model (q), sampled from.
    prompts: the prompts (B of them).
    num_tokens: N, tokens sampled per prompt.
    key: PRNG key of the sampling.
    temperature: sampling temperature (> 0), also applied to p and q.

  Returns:
    The trajectories (device arrays).
  """
  temp = jnp.float32(temperature)
  tokens_BxW = sample_target(target, prompts.tokens_BxT, prompts.lengths_B, num_tokens, key, temp)
  p_BxNxV, q_BxNxV, in_sentence_BxN = _distributions(
    draft, target, tokens_BxW, jnp.asarray(prompts.lengths_B), num_tokens, temp
  )
  return Trajectories(tokens_BxW, p_BxNxV, q_BxNxV, in_sentence_BxN)


def strategy_name(rho: str | float) -> str:
  """ "rho*", "rho=K" or "rho=<value>" for a `rho` argument of K-SEQ."""
  if rho == "star":
    return "rho*"
  return "rho=K" if rho == "k" else f"rho={float(rho):g}"


@functools.partial(jax.jit, static_argnames="rho_mode")
def _kseq_X(p_XxV, q_XxV, k, rho_value, *, rho_mode):
  return jax.vmap(
    lambda p_V, q_V: acceptance._kseq_acceptance(p_V, q_V, k, rho_value, rho_mode=rho_mode)
  )(p_XxV, q_XxV)


@functools.partial(jax.jit, static_argnames="k")
def _bounds_X(p_XxV, q_XxV, *, k):
  single_X = acceptance.overlap(p_XxV, q_XxV)
  specinfer_X = jax.vmap(lambda p, q: acceptance._specinfer_acceptance(p, q, k))(p_XxV, q_XxV)
  optimal_X = jax.vmap(acceptance._optimal_acceptance, (0, 0, None))(p_XxV, q_XxV, k)
  return single_X, specinfer_X, optimal_X


def position_metrics(
  p_XxV: jax.Array, q_XxV: jax.Array, k: int, rhos: Sequence[str | float]
) -> dict[str, dict[str, np.ndarray]]:
  """Exact per-position acceptance of every strategy with k i.i.d. drafts.

  Args:
    p_XxV, q_XxV: draft and target distributions at X positions.
    k: number of drafts.
    rhos: K-SEQ split factors ("star", "k" or numbers; numbers are clipped to [1, k]).

  Returns:
    {strategy name: {"hit", "p_accept", "deficit", "rho"} arrays [X]} for each rho, plus
    "specinfer" and "optimal" ({"hit"}), "single" ({"hit"}: one draft) and "rho*"'s
    split factor under "rho_star" ({"rho"}).
  """
  out = {}
  for rho in dict.fromkeys((*rhos, "star")):
    mode, value = acceptance.split_rho(rho)
    result = _kseq_X(p_XxV, q_XxV, k, value, rho_mode=mode)
    out[strategy_name(rho)] = {f: np.asarray(getattr(result, f)) for f in result._fields}
  out["rho_star"] = {"rho": out["rho*"]["rho"]}
  if "star" not in rhos:
    del out["rho*"]
  single_X, specinfer_X, optimal_X = _bounds_X(p_XxV, q_XxV, k=k)
  out["single"] = {"hit": np.asarray(single_X)}
  out["specinfer"] = {"hit": np.asarray(specinfer_X)}
  out["optimal"] = {"hit": np.asarray(optimal_X)}
  return out


def summarize_metrics(
  metrics: Mapping[str, Mapping[str, np.ndarray]], k: int, rhos: Sequence[str | float]
) -> list[dict[str, Any]]:
  """One row per strategy (the rhos, then SpecInfer and the bound) from `position_metrics`.

  Each row: K, strategy, acceptance (mean hit probability), optimal (mean alpha*), gap
  (optimal - acceptance), p_accept (mean accept-branch probability), mean_rho, below_star
  (share of positions where rho < rho*), invalid (share where the residual would be
  negative), mean_deficit (mean overshoot mass), positions.
  """
  optimal_X = metrics["optimal"]["hit"]
  rho_star_X = metrics["rho_star"]["rho"]
  rows = []
  for name in [strategy_name(r) for r in rhos] + ["specinfer", "optimal"]:
    m = metrics[name]
    row = {
      "K": k,
      "strategy": name,
      "acceptance": float(np.mean(m["hit"])),
      "optimal": float(np.mean(optimal_X)),
      "gap": float(np.mean(optimal_X - m["hit"])),
      "positions": int(optimal_X.size),
    }
    if "rho" in m:
      row.update(
        p_accept=float(np.mean(m["p_accept"])),
        mean_rho=float(np.mean(m["rho"])),
        below_star=float(np.mean(m["rho"] < rho_star_X - 1e-6)),
        invalid=float(np.mean(m["deficit"] > _VALID_TOL)),
        mean_deficit=float(np.mean(m["deficit"])),
      )
    rows.append(row)
  return rows


def _rhos_for(rhos: Sequence[str | float], k: int) -> list[str | float]:
  """The strategies that differ at k drafts: a fixed rho above k would be clipped to k."""
  return [r for r in rhos if isinstance(r, str) or r <= k]


@dataclasses.dataclass(frozen=True)
class AnalysisConfig:
  """The per-position part of the rho ablation (see `configs/rho_ablation.py`).

  The prompts are the first `num_prompts` of the sweep's prompt set for its first seed;
  rhos, temperature and prompt length are the sweep's.
  """

  num_drafts: tuple[int, ...]
  num_prompts: int
  num_tokens: int
  batch_size: int


def rho_ablation(
  pair: experiment.Pair, sweep: experiment.SweepConfig, config: AnalysisConfig
) -> dict[str, Any]:
  """Per-position exact acceptance of every rho strategy along target samples.

  Args:
    pair: the models and held-out text.
    sweep: the decoding sweep whose prompts, rhos, temperature and EOS rule are used.
    config: the analysis settings.

  Returns:
    {"positions": X, "single": mean one-draft acceptance, "rows": `summarize_metrics`
    rows for each K}.
  """
  seed = sweep.seeds[0]
  prompts = make_prompts(pair.heldout, sweep.num_prompts, sweep.prompt_len, seed)
  per_k = {k: [] for k in config.num_drafts}
  for chunk, start in enumerate(range(0, config.num_prompts, config.batch_size)):
    rows = slice(start, min(start + config.batch_size, config.num_prompts))
    chunk_prompts = Prompts(*(x[rows] for x in dataclasses.astuple(prompts)))
    key = jax.random.fold_in(jax.random.key(seed), chunk)
    traj = collect_trajectories(
      pair.draft, pair.target, chunk_prompts, config.num_tokens, key, sweep.temperature
    )
    keep_BxN = np.asarray(traj.in_sentence_BxN) | (not sweep.stop_at_eos)
    p_XxV, q_XxV = np.asarray(traj.p_BxNxV)[keep_BxN], np.asarray(traj.q_BxNxV)[keep_BxN]
    for k in config.num_drafts:
      per_k[k].append(position_metrics(p_XxV, q_XxV, k, _rhos_for(sweep.rhos, k)))
    logging.info("rho ablation: %d/%d prompts", rows.stop, config.num_prompts)
  result = {"positions": 0, "single": 0.0, "rows": []}
  for k, chunks in per_k.items():
    metrics = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
    result["rows"] += summarize_metrics(metrics, k, _rhos_for(sweep.rhos, k))
    result["positions"] = int(metrics["single"]["hit"].size)
    result["single"] = float(np.mean(metrics["single"]["hit"]))
  return result


@dataclasses.dataclass(frozen=True)
class RhoAblationConfig:
  """The block-level sweep and the per-position analysis of `configs/rho_ablation.py`."""

  sweep: experiment.SweepConfig
  analysis: AnalysisConfig

  def __post_init__(self):
    if self.analysis.num_prompts > self.sweep.num_prompts:
      raise ValueError(
        f"analysis.num_prompts ({self.analysis.num_prompts}) exceeds the sweep's prompt set "
        f"({self.sweep.num_prompts})"
      )

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "RhoAblationConfig":
    """Builds the config from a nested mapping (a `ConfigDict.to_dict()`)."""
    analysis = dict(values["analysis"], num_drafts=tuple(values["analysis"]["num_drafts"]))
    return cls(experiment.SweepConfig.from_dict(values["sweep"]), AnalysisConfig(**analysis))


def run_rho_ablation(
  config: RhoAblationConfig, pair: experiment.Pair | None = None, provenance_config: Any = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Runs the block-level sweep (resumable) and the per-position analysis (cached).

  The analysis is written to <results_dir>/analysis.json with a key that hashes its
  settings and the pair; a rerun with the same key loads it.

  Args:
    config: the ablation.
    pair: the models (default: `experiment.load_pair(config.sweep)`, trained when missing).
    provenance_config: what to record as the run's config (default: `config`).

  Returns:
    The sweep's records and the analysis (see `rho_ablation`, plus its key).
  """
  if provenance_config is None:
    provenance_config = dataclasses.asdict(config)
  pair = pair or experiment.load_pair(config.sweep)
  records = experiment.run_sweep(config.sweep, pair, provenance_config)
  shared = ("seeds", "num_prompts", "prompt_len", "rhos", "temperature", "stop_at_eos")
  defining = {f: getattr(config.sweep, f) for f in shared}
  defining.update(analysis=dataclasses.asdict(config.analysis), pair=pair.fingerprint)
  key = hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]
  path = config.sweep.results_path / ANALYSIS_FILE
  if path.exists() and json.loads(path.read_text()).get("key") == key:
    logging.info("rho ablation: loading %s", path)
    return records, json.loads(path.read_text())
  analysis = {"key": key, **rho_ablation(pair, config.sweep, config.analysis)}
  if jax.process_index() == 0:
    path.write_text(json.dumps(analysis, indent=1))
  return records, analysis
