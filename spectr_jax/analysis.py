"""(p, q) along decoded trajectories, and the rho ablation on these real distributions.

`collect_trajectories` samples continuations of prompts from the target with
`engine.generate` (method "autoregressive") (the law that exact speculative decoding
outputs, with every sampling transform applied) and records, at every sampled position,
the draft's next-token distribution p and the target's q under the same transforms:
what a verifier sees there. `rho_ablation` evaluates each K-SEQ split-factor strategy on
those pairs exactly (closed forms of `spectr_jax.acceptance`, no sampling): the mean
probability that the output hits a draft, the optimal-transport bound alpha*, the gap
between them, and how often a fixed rho is invalid (the accept branch overshoots q
somewhere, so the residual would be negative and the output would not follow q).
`run_rho_ablation` adds the block-level effect: a decoding sweep with every strategy.
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

from spectr_jax import engine, experiment, locks, methods, pairs, results, sampling
from spectr_jax.data import EOS_ID, RESERVED, Prompts, SpecialIds, make_prompts
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle
from spectr_jax.sweep_config import AnalysisConfig, RhoAblationConfig, SweepConfig, rhos_for


def next_token_probs(
  bundle: ModelBundle,
  tokens_BxT: jax.Array,
  temperature,
  top_k: int | None = None,
  top_p: float | None = None,
  greedy: bool | None = None,
) -> jax.Array:
  """The model's next-token distribution after every prefix: probs_BxTxV (float32);
  `greedy` as in `sampling.transform_probs` (needed with a traced temperature)."""
  logits_BxTxV = bundle.decoder.logits(bundle.params, tokens_BxT)
  return sampling.transform_probs(
    logits_BxTxV, temperature, top_k=top_k, top_p=top_p, greedy=greedy
  )


class Trajectories(NamedTuple):
  """Sampled continuations and the distributions at each sampled position.

  tokens_BxW: each prompt (right-padded to P) with its T target samples from position
    `lengths_B[b]` on, then PAD (W = P + T).
  p_BxTxV, q_BxTxV: draft and target next-token distributions before each sample.
  in_sentence_BxT: positions up to and including the first sampled EOS.
  """

  tokens_BxW: jax.Array
  p_BxTxV: jax.Array
  q_BxTxV: jax.Array
  in_sentence_BxT: jax.Array


def distributions(draft, target, tokens_BxW, lengths_B, num_tokens, temperature, top_k=None,
                  top_p=None, eos_ids_A=None):  # fmt: skip
  """p and q before each of the T sampled tokens, and which of them are in the sentence.

  Args:
    draft, target: the models.
    tokens_BxW: prompts with their samples (see `Trajectories`).
    lengths_B: prompt lengths.
    num_tokens: T, samples per row.
    temperature, top_k, top_p: the sampling transforms (as in `engine.generate`; the
      temperature a number: 0 compiles greedy decoding's program).
    eos_ids_A: int32 stop tokens that end the sentence (default: EOS_ID).

  Returns:
    (p_BxTxV, q_BxTxV, in_sentence_BxT).
  """
  greedy = float(temperature) <= 0
  return _distributions(draft, target, tokens_BxW, lengths_B, num_tokens, temperature, top_k,
                        top_p, eos_ids_A, greedy)  # fmt: skip


@functools.partial(jax.jit, static_argnames=("num_tokens", "top_k", "greedy"))
def _distributions(draft, target, tokens_BxW, lengths_B, num_tokens, temperature, top_k, top_p,
                   eos_ids_A, greedy):  # fmt: skip
  pos_BxT = lengths_B[:, None] - 1 + jnp.arange(num_tokens)[None, :]
  p_BxTxV, q_BxTxV = (
    jnp.take_along_axis(
      next_token_probs(m, tokens_BxW, temperature, top_k, top_p, greedy), pos_BxT[..., None], 1
    )
    for m in (draft, target)
  )
  sampled_BxT = jnp.take_along_axis(tokens_BxW, pos_BxT + 1, axis=1)
  eos_ids_A = jnp.asarray([EOS_ID] if eos_ids_A is None else eos_ids_A, jnp.int32)
  is_eos_BxT = jnp.any(sampled_BxT[..., None] == eos_ids_A, axis=-1)
  eos_before_BxT = jnp.cumsum(is_eos_BxT, axis=1) - is_eos_BxT
  return p_BxTxV, q_BxTxV, eos_before_BxT == 0


def collect_trajectories(
  draft: ModelBundle,
  target: ModelBundle,
  prompts: Prompts,
  num_tokens: int,
  key: jax.Array,
  temperature: float = 1.0,
  top_k: int | None = None,
  top_p: float | None = None,
  prompt_ids: jax.Array | None = None,
  special: SpecialIds = RESERVED,
) -> Trajectories:
  """Samples T tokens after each prompt from the target and records (p, q) along them.

  Args:
    draft: the draft model (p).
    target: the target model (q), sampled from with `engine.generate`.
    prompts: the prompts (B of them).
    num_tokens: T, tokens sampled per prompt (no stop at EOS).
    key: PRNG key; row b uses fold_in(key, prompt_ids[b]) as in `engine.generate`.
    temperature, top_k, top_p: the sampling transforms, also applied to p and q.
    prompt_ids: B ints naming the prompts for the randomness (default 0..B-1).
    special: the pair's PAD (fills the samples' rows) and EOS ids (end the sentence).

  Returns:
    The trajectories (device arrays).
  """
  spec = DecodeSpec(
    method="autoregressive",
    max_new_tokens=num_tokens,
    temperature=temperature,
    top_k=top_k or 0,
    top_p=1.0 if top_p is None else top_p,
  )
  out = engine.generate(
    key,
    spec,
    draft=None,
    target=target,
    prompts=prompts.tokens_BxP,
    prompt_lengths=prompts.lengths_B,
    prompt_ids=prompt_ids,
  )
  b, width = prompts.tokens_BxP.shape
  lengths_B = jnp.asarray(prompts.lengths_B, jnp.int32)
  tokens_BxW = (
    jnp.full((b, width + num_tokens), special.pad, jnp.int32)
    .at[:, :width]
    .set(jnp.asarray(prompts.tokens_BxP, jnp.int32))
  )
  pos_BxT = lengths_B[:, None] + jnp.arange(num_tokens)[None, :]
  tokens_BxW = tokens_BxW.at[jnp.arange(b)[:, None], pos_BxT].set(out.tokens_BxT)
  p_BxTxV, q_BxTxV, in_sentence_BxT = distributions(
    draft, target, tokens_BxW, lengths_B, num_tokens, jnp.float32(temperature), top_k,
    None if top_p is None else jnp.float32(top_p), jnp.asarray(special.eos, jnp.int32),
  )  # fmt: skip
  return Trajectories(tokens_BxW, p_BxTxV, q_BxTxV, in_sentence_BxT)


def _fields(result) -> dict[str, np.ndarray]:
  """A closed form's result as arrays: its fields (e.g. `acceptance.KSeqAcceptance`), or
  {"hit": result} for a plain array."""
  if hasattr(result, "_asdict"):
    return {f: np.asarray(v) for f, v in result._asdict().items()}
  return {"hit": np.asarray(result)}


def _multi_draft(drafting: str = "") -> list[tuple[methods.Method, str]]:
  """(method, drafting scheme) of the multi-draft methods of the registry with a
  closed-form acceptance, in order: each with its own scheme (drafting "") or, for a
  named scheme, those exact for its law (their closed forms are of that law)."""
  exact = methods.exact_for(drafting) if drafting else tuple(methods.METHODS)
  return [
    (m, drafting or m.drafting)
    for m in methods.METHODS.values()
    if m.multi_draft and m.acceptance and m.name in exact
  ]


def _bound_name(scheme: str) -> str:
  """The `position_metrics` entry of a drafting scheme's bound ("optimal" for i.i.d.)."""
  return "optimal" if scheme == "iid" else f"optimal:{scheme}"


def position_metrics(
  p_XxV: jax.Array, q_XxV: jax.Array, k: int, rhos: Sequence[str | float], drafting: str = ""
) -> dict[str, dict[str, np.ndarray]]:
  """Exact per-position acceptance of every strategy with k drafts, beside the bound of
  each strategy's drafting law.

  Args:
    p_XxV, q_XxV: draft and target distributions at X positions.
    k: number of drafts.
    rhos: split factors of the methods that take one ("star", "k" or numbers; numbers
      are clipped to [1, k]).
    drafting: the drafting scheme of every method ("" for each method's own); with one
      named, the methods exact for its law, each beside that scheme's bound.

  Returns:
    {strategy name: arrays [X]} for every multi-draft method of the registry with a
    closed form (methods with a split factor: one strategy per rho, named by
    `results.strategy_name`, with "hit", "p_accept", "deficit", "rho"; the others by
    method name with "hit" and the closed form's other fields), "single" ({"hit"}: one
    draft), "optimal" ({"hit"}: the bound alpha* of i.i.d. drafts), "optimal:<scheme>"
    ({"hit"}: the bound of every other drafting scheme of those methods, e.g.
    "optimal:wor") and rho*'s split factor under "rho_star" ({"rho"}).
  """
  out = {}
  for method, _ in _multi_draft(drafting):
    closed_form = method.acceptance_function()
    if not method.takes_rho:
      out[method.name] = _fields(closed_form(p_XxV, q_XxV, k))
      continue
    for rho in dict.fromkeys((*rhos, "star")):
      out[results.strategy_name(rho)] = _fields(closed_form(p_XxV, q_XxV, k, rho))
  out["rho_star"] = {"rho": out["rho*"]["rho"]}
  if "star" not in rhos:
    del out["rho*"]
  single = [m for m in methods.METHODS.values() if m.speculative and m.max_drafts == 1]
  out["single"] = _fields(single[0].acceptance_function()(p_XxV, q_XxV, 1))
  for scheme in dict.fromkeys(["iid"] + [scheme for _, scheme in _multi_draft(drafting)]):
    bound = methods.DRAFTING[scheme].bound
    out[_bound_name(scheme)] = {"hit": np.asarray(bound(p_XxV, q_XxV, k))}
  return out


def summarize_metrics(
  metrics: Mapping[str, Mapping[str, np.ndarray]],
  k: int,
  rhos: Sequence[str | float],
  drafting: str = "",
) -> list[dict[str, Any]]:
  """One row per strategy (as `position_metrics` names them, in registry order) from
  `position_metrics`.

  Each row: K, strategy, acceptance (mean hit probability), optimal (mean bound of the
  method's drafting scheme: alpha* for i.i.d. drafts), gap (optimal - acceptance),
  drafting (the scheme of the strategy's drafts: `drafting`, or the method's own), bound
  (how `methods.DRAFTING` names its bound), p_accept (mean
  accept-branch probability), mean_rho, below_star (share of positions where rho <
  rho*), invalid (share where the residual would be negative), mean_deficit (mean
  overshoot mass), positions.
  """
  rho_star_X = metrics["rho_star"]["rho"]
  names = []
  for method, scheme in _multi_draft(drafting):
    names += (
      [(results.strategy_name(r), scheme) for r in rhos]
      if method.takes_rho
      else [(method.name, scheme)]
    )
  rows = []
  for name, scheme in names:
    m = metrics[name]
    optimal_X = metrics[_bound_name(scheme)]["hit"]
    row = {
      "K": k,
      "strategy": name,
      "acceptance": float(np.mean(m["hit"])),
      "optimal": float(np.mean(optimal_X)),
      "gap": float(np.mean(optimal_X - m["hit"])),
      "drafting": scheme,
      "bound": methods.DRAFTING[scheme].bound_label,
      "positions": int(optimal_X.size),
    }
    if "rho" in m:
      row.update(
        p_accept=float(np.mean(m["p_accept"])),
        mean_rho=float(np.mean(m["rho"])),
        below_star=float(np.mean(m["rho"] < rho_star_X - 1e-6)),
        invalid=float(np.mean(m["deficit"] > methods.OVERSHOOT_TOL)),
        mean_deficit=float(np.mean(m["deficit"])),
      )
    rows.append(row)
  return rows


def _chunk_positions(pair: pairs.Pair, prompts: Prompts, rows: slice, config, seed: int,
                     sweep: SweepConfig) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
  """(p_XxV, q_XxV) at the kept positions of the trajectories of prompts `rows`."""
  chunk = Prompts(*(x[rows] for x in dataclasses.astuple(prompts)))
  traj = collect_trajectories(
    pair.draft,
    pair.target,
    chunk,
    config.num_tokens,
    jax.random.key(seed),
    sweep.decode.temperature,
    sweep.decode.top_k or None,
    None if sweep.decode.top_p >= 1 else sweep.decode.top_p,
    prompt_ids=jnp.arange(rows.start, rows.stop, dtype=jnp.int32),
    special=pair.special,
  )
  keep_BxT = np.asarray(traj.in_sentence_BxT) | (not sweep.prompts.stop_at_eos)
  return np.asarray(traj.p_BxTxV)[keep_BxT], np.asarray(traj.q_BxTxV)[keep_BxT]


def rho_ablation(pair: pairs.Pair, sweep: SweepConfig, config: AnalysisConfig) -> dict[str, Any]:
  """Per-position exact acceptance of every rho strategy along target samples.

  Args:
    pair: the models and held-out text.
    sweep: the decoding sweep whose prompts, rhos and decoding settings are used.
    config: the analysis settings.

  Returns:
    {"positions": X, "single": mean one-draft acceptance, "rows": `summarize_metrics`
    rows for each K}.
  """
  seed, drafting = sweep.seeds[0], sweep.decode.drafting
  prompts = make_prompts(
    pair.heldout, sweep.prompts.num_prompts, sweep.prompts.prompt_len, seed, pair.special
  )
  per_k = {k: [] for k in config.num_drafts}
  for start in range(0, config.num_prompts, config.batch_size):
    rows = slice(start, min(start + config.batch_size, config.num_prompts))
    p_XxV, q_XxV = _chunk_positions(pair, prompts, rows, config, seed, sweep)
    for k in config.num_drafts:
      per_k[k].append(position_metrics(p_XxV, q_XxV, k, rhos_for(sweep.rhos, k), drafting))
    logging.info("rho ablation: %d/%d prompts", rows.stop, config.num_prompts)
  result = {"positions": 0, "single": 0.0, "rows": []}
  for k, chunks in per_k.items():
    metrics = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
    result["rows"] += summarize_metrics(metrics, k, rhos_for(sweep.rhos, k), drafting)
    result["positions"] = int(metrics["single"]["hit"].size)
    result["single"] = float(np.mean(metrics["single"]["hit"]))
  return result


def run_rho_ablation(
  config: RhoAblationConfig,
  pair: pairs.Pair | None = None,
  provenance_config: Any = None,
  wait: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Runs the block-level sweep (resumable) and the per-position analysis (cached).

  The analysis is written to <results_dir>/analysis.json with a key that hashes its
  settings and the pair; a rerun with the same key loads it.

  Args:
    config: the ablation.
    pair: the models (default: `pairs.load_pair(config.sweep.pair)`).
    provenance_config: what to record as the run's config (default: `config`).
    wait: wait for another run holding the results folder instead of raising (the
      folder is locked for the whole ablation, see `experiment.run_sweep`).

  Returns:
    The sweep's records and the analysis (see `rho_ablation`, plus its key).
  """
  folder = config.sweep.results_path
  with locks.exclusive(folder, "rho ablation", wait, holder=jax.process_index() == 0):
    return _run_rho_ablation(config, pair, provenance_config)


def _run_rho_ablation(config, pair, provenance_config):
  if provenance_config is None:
    provenance_config = dataclasses.asdict(config)
  pair = pair or pairs.load_pair(config.sweep.pair)
  records = experiment.run_sweep(config.sweep, pair, provenance_config)
  defining = {
    "seeds": config.sweep.seeds,
    "rhos": config.sweep.rhos,
    "decoding": config.sweep.decoding_record(),
    "analysis": dataclasses.asdict(config.analysis),
    "pair": pair.fingerprint,
    "trajectories": "engine",
    # The rows: which strategies (and the drafting scheme whose bound each row shows).
    "strategies": [(m.name, scheme) for m, scheme in _multi_draft(config.sweep.decode.drafting)],
  }
  key = hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]
  path = config.sweep.results_path / results.ANALYSIS_FILE
  saved = results.read_analysis(path)
  if saved is not None and saved.get("key") == key:
    logging.info("rho ablation: loading %s", path)
    return records, saved
  analysis = {"key": key, **rho_ablation(pair, config.sweep, config.analysis)}
  if jax.process_index() == 0:
    results.write_whole(path, json.dumps(analysis, indent=1))  # whole or not at all
  return records, analysis
