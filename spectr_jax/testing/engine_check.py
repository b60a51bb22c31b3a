"""Exactness through the engine at an LLM vocabulary: `check_engine(method)`.

`harness.check_verifier` checks a verify function on its own, on enumerated small trees
and on the first token at V = 32000. This checks a registered method the way users run it:
`engine.generate` with a draft and a target model, their caches, K-draft rounds, rollback
and bonus tokens, at V = 32000 in float32.

The pair: a random-weight target (the "target-test" architecture at V tokens, logits
sharpened to an LLM-like entropy) and a draft of the same architecture whose weights are
the target's plus Gaussian noise (correlated, not equal: drafts are accepted and
rejected). `rows` rows, split evenly over several prompts of different lengths and
contents (`PROMPTS`: the contexts the caches, rollbacks and length rules see differ), are
decoded for `new_tokens` tokens (in chunks of `chunk` rows, one compiled program per
prompt width), and each emitted token y is mapped to its randomized probability integral
transform under the target's conditional law q(. | prompt, earlier tokens): u = Q(y) +
U q(y), where Q sums q over the tokens before y in one fixed order per prompt (its first
conditional's, most target-favoured first) and U ~ Uniform(0, 1).
If the tokens follow the target's law, the u of every row and position are i.i.d.
Uniform(0, 1) (each is uniform given everything before it), whatever the order; the
order only sets which departures the bins see best. The rows' u are binned into
`num_bins` equal bins: one Pearson chi-square per drafting law over all positions, and
one per position (Bonferroni over all of a report's tests, as `check_verifier`).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sstats

from spectr_jax import engine
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params
from spectr_jax.testing.evidence import Report, Row
from spectr_jax.testing.power import detectable_tv

__all__ = ["PROMPTS", "check_engine", "chi_square", "random_pair", "uniforms"]

PROMPT = (1, 2, 3, 4)
# The prompts of `check_engine`: lengths 4, 2 and 7, different tokens.
PROMPTS = (PROMPT, (7, 3), (5, 9, 11, 2, 8, 13, 6))


def random_pair(
  vocab: int, seed: int = 0, *, sharpness: float = 2.5, noise: float = 1.0, model="draft-test"
):
  """(draft, target) `ModelBundle`s over `vocab` tokens of architecture `model`
  (`models.get_model_config`): the target's final norm scaled by `sharpness` (sharper
  logits), the draft the target plus `noise` times Gaussian noise of each weight's own
  scale. The defaults give, at V = 32000, a target of entropy about 5 nats after PROMPT
  and a draft 0.84 away from it in total variation."""
  config = get_model_config(model, vocab, max_len=32)
  params = init_params(config, jax.random.key(seed))

  def sharpen(path, x):
    return x * sharpness if "final_norm" in jax.tree_util.keystr(path) else x

  params = jax.tree_util.tree_map_with_path(sharpen, params)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  noisy = [
    x + noise * jnp.maximum(jnp.std(x), 1e-3) * jax.random.normal(k, x.shape, x.dtype)
    for x, k in zip(leaves, keys, strict=True)
  ]
  draft = ModelBundle(config, jax.tree_util.tree_unflatten(treedef, noisy))
  return draft, ModelBundle(config, params)


def _decode(spec: DecodeSpec, draft, target, key, rows: int, chunk: int, prompts=(PROMPT,)):
  """(tokens_RxT, tokens per round of each row) of `rows` rows, row i decoding prompt
  i mod len(prompts) (right-padded to one width: one compiled program), `chunk` rows per
  call."""
  width = max(map(len, prompts))
  table = np.zeros((len(prompts), width), np.int32)
  for i, prompt in enumerate(prompts):
    table[i, : len(prompt)] = prompt
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  tokens, per_round = [], []
  for i in range(math.ceil(rows / chunk)):
    which = np.arange(i * chunk, (i + 1) * chunk) % len(prompts)
    out = engine.generate(
      jax.random.fold_in(key, i),
      spec,
      draft=draft,
      target=target,
      prompts=jnp.asarray(table[which]),
      prompt_lengths=jnp.asarray(lengths[which]),
    )
    tokens.append(np.asarray(out.tokens_BxT))
    rounds_B = np.maximum(np.asarray(out.stats.rounds_B, np.float64), 1.0)
    per_round.append(np.asarray(out.stats.emitted_B) / rounds_B)
  return np.concatenate(tokens)[:rows], np.concatenate(per_round)[:rows]


def token_order(draft, target, prompt=PROMPT):
  """Every token, most target-favoured first: by log q - log p after `prompt` (where a
  verifier's acceptance and residual act, so where their mistakes show). A draft head
  reads the target's features of the prompt."""
  prompt = jnp.asarray([prompt], jnp.int32)
  logits_q, features = target.model.apply({"params": target.params}, prompt, return_features=True)
  if draft.decoder.reads_features:
    logits_p = draft.decoder.logits(draft.params, prompt, features)
  else:
    logits_p = draft.decoder.logits(draft.params, prompt)
  log_q, log_p = (jax.nn.log_softmax(x[0, -1].astype(jnp.float32)) for x in (logits_q, logits_p))
  return jnp.argsort(-(log_q - log_p))


def uniforms(target, tokens_RxT, key, order_V, chunk: int = 256, prompt=PROMPT):
  """The randomized probability integral transform of every token after `prompt` under
  its target conditional, tokens in `order_V` (module docstring): u_RxT, and whether any
  token had q = 0."""
  rows = tokens_RxT.shape[0]
  rank_V = jnp.argsort(order_V)

  @jax.jit
  def transform(seq_BxS, key):
    logits = target.model.apply({"params": target.params}, seq_BxS)
    q_BxTxV = jax.nn.softmax(logits[:, len(prompt) - 1 : -1].astype(jnp.float32), -1)
    y_BxT = seq_BxS[:, len(prompt) :]
    q_y_BxT = jnp.take_along_axis(q_BxTxV, y_BxT[..., None], -1)[..., 0]
    # Q(y): the mass of the tokens ranked before y.
    before_BxTxV = rank_V < rank_V[y_BxT][..., None]
    cdf_BxT = jnp.sum(jnp.where(before_BxTxV, q_BxTxV, 0.0), -1)
    u_BxT = cdf_BxT + jax.random.uniform(key, y_BxT.shape) * q_y_BxT
    return jnp.clip(u_BxT, 0.0, 1.0), jnp.any(q_y_BxT <= 0)

  prompts = np.broadcast_to(np.asarray(prompt, np.int32), (rows, len(prompt)))
  seq = np.hstack([prompts, tokens_RxT]).astype(np.int32)
  out, zero = [], False
  for start in range(0, rows, chunk):
    block = seq[start : start + chunk]
    pad = chunk - block.shape[0]
    if pad:
      block = np.concatenate([block, np.broadcast_to(block[:1], (pad, block.shape[1]))])
    u, z = transform(jnp.asarray(block), jax.random.fold_in(key, start))
    out.append(np.asarray(u)[: chunk - pad])
    zero |= bool(z)
  return np.concatenate(out), zero


def chi_square(u, num_bins: int) -> tuple[str, float]:
  """("statistic / df", p-value) of Pearson's chi-square of `u` in `num_bins` equal bins
  of [0, 1] against the uniform law."""
  counts = np.bincount(np.minimum((u * num_bins).astype(int), num_bins - 1), minlength=num_bins)
  statistic, pvalue = sstats.chisquare(counts, np.full(num_bins, u.size / num_bins))
  return f"{statistic:.1f} / {num_bins - 1}", float(pvalue)


def check_engine(
  method: str,
  *,
  num_drafts: int = 3,
  draft_len: int = 2,
  new_tokens: int = 3,
  vocab: int = 32_000,
  rows: int = 4096,
  chunk: int = 256,
  num_bins: int = 32,
  seed: int = 0,
  alpha: float = 1e-3,
  pair=None,
  prompts=PROMPTS,
  **settings,
) -> Report:
  """Checks that the registered `method` decodes the target's law through the engine at
  an LLM vocabulary, for each drafting law it claims (`Method.exact_for`; one run where
  it takes one draft).

  Args:
    method: a speculative method of the registry (`spectr_jax.methods.register` adds one).
    num_drafts, draft_len: K and L of its rounds (K capped at the method's largest).
    new_tokens: tokens decoded per row (several rounds: rollback and bonus tokens).
    vocab: V of the random pair.
    rows: rows decoded per law (split evenly over the prompts); chunk: rows per engine
      call (at most the rows of a prompt).
    num_bins: bins of the transformed tokens' chi-square.
    seed: the pair's weights and the keys.
    alpha: the report's false-alarm budget (Bonferroni over its tests).
    pair: (draft, target) to use instead of `random_pair(vocab, seed)`.
    prompts: the prompts (token ids; `PROMPTS` by default).
    **settings: other `DecodeSpec` fields of the decode, e.g. adaptive=0.3 (adaptive
      draft length) or dedup=True, node_budget=4.0 (the batch's tree budget, shared by
      the rows of each engine call of `chunk` rows).

  Returns:
    A `harness.Report`: per law, one row over all positions ("engine V..., every
    token") and one per position (pooled over the prompts), with the engine's tokens per
    round and the total variation between the binned laws each row detects
    (`harness.detectable_tv`).
  """
  record = DecodeSpec(method, 1, draft_len).verifier
  if not record.speculative:
    raise ValueError(f"method {method!r} verifies no drafts: nothing to check")
  if rows < num_bins * 5 * len(prompts):
    raise ValueError(
      f"rows={rows}: at least 5 per bin and prompt ({num_bins * 5 * len(prompts)}) for the "
      "chi-square"
    )
  k = min(num_drafts, record.max_drafts or num_drafts)
  laws = record.exact_for if k > 1 else (record.drafting,)
  draft, target = pair if pair is not None else random_pair(vocab, seed)
  key = jax.random.key(seed)
  orders = [token_order(draft, target, prompt) for prompt in prompts]
  num_tests = len(laws) * (1 + new_tokens)
  level = alpha / num_tests
  rows_out, pvalues = [], []
  for li, law in enumerate(laws):
    spec = DecodeSpec(method, k, draft_len, max_new_tokens=new_tokens, drafting=law, **settings)
    law_key = jax.random.fold_in(key, li)
    tokens, per_round = _decode(spec, draft, target, law_key, rows, chunk, prompts)
    us, zero = [], False
    for pi, (prompt, order_V) in enumerate(zip(prompts, orders, strict=True)):
      u_RxT, z = uniforms(
        target, tokens[pi :: len(prompts)], jax.random.fold_in(law_key, 100 + pi), order_V,
        chunk, prompt,
      )  # fmt: skip
      us.append(u_RxT)
      zero |= z
    u_RxT = np.concatenate(us)
    what = [("every token", u_RxT.ravel())]
    what += [(f"token {t + 1}", u_RxT[:, t]) for t in range(new_tokens)]
    for label, u in what:
      row = Row(f"engine V{target.config.num_logits} {label}", law, k, draft_len,
                target.config.num_logits, "engine", "", tokens=float(per_round.mean()),
                tokens_se=float(per_round.std(ddof=1) / math.sqrt(per_round.size)),
                detects=detectable_tv(u.size, num_bins - 1, level),
                effective_draws=float(u.size), df=num_bins - 1)  # fmt: skip
      if zero:
        row.statistic, row.pvalue, row.passed = "a token of q = 0", 0.0, False
        row.why = "a token of target probability 0"
      else:
        row.statistic, row.pvalue = chi_square(u, num_bins)
      rows_out.append(row)
      pvalues.append(row.pvalue)
  for row, pvalue in zip(rows_out, pvalues, strict=True):
    if pvalue < level and row.passed:
      row.passed, row.why = False, "law"
  return Report(f"{method} (engine)", tuple(laws), alpha, rows_out, len(pvalues))
