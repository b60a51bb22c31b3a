"""Exactness evidence for a verifier in one call: `check_verifier(fn, level=..., laws=...)`.

A verifier is exact for a drafting law when, for drafts drawn by that law, its emitted
tokens completed by target draws follow the target's sequence law. `check_verifier` runs
three kinds of checks per law and returns a `Report` (one row per case, a markdown table):

- "law": small random trees (V = 2-4, L = 1-3, K = 1-4; dense, sparse, one-hot targets,
  tied ratios q = p, p = 0 where q > 0, q = 0 where p > 0). What is ENUMERATED: every
  draft tuple the law can draw, with its exact probability w_t (i.i.d.: every ordered
  K-tuple of paths with p > 0; "wor": every ordered tuple of paths of the default static
  tree (K, 1, ..., 1), `wor_reference.static_tree_law`). What is SAMPLED: for each tuple,
  the verifier's own randomness under M keys (one jitted, vmapped program per shape),
  and the target's draws that complete an emitted block to L + 1 tokens. The mixture
  estimate sum_t w_t P^_t of the completed sequences' law is compared with the target's
  law (`sequences.target_law`) by a Wald chi-square statistic whose covariance is the
  exact stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M, with P_t estimated
  (shrunk by one pseudo-observation towards the target's law) and outcomes of small
  expected count pooled; any mass on an outcome of target probability 0 fails outright.
  Beside it: the mixture mean of the tokens emitted per round and the LP bound of the
  law (`block_bound.multiset_bound`): a mean above the bound by more than sampling error
  (one-sided z-test) shows an inexact rule.
- "boundary": one-hot targets with drafts that miss and that hit, every uniform forced
  to 0.0 and to the largest float32 below 1 and every random word to 0 and 2^32 - 1
  (`jax.random.uniform` and `jax.random.bits` patched while the verifier is traced):
  a token of target probability 0 must never be emitted.
- "chi2-32k": the first token's law at V = 32000 (`sequences.llm_like`; drafts sampled
  from the law, K i.i.d. or K distinct by Gumbel-top-k), binned into equal-mass bins of
  the target, Pearson chi-square.

False alarms: every statistical test of a report (a law row holds two: the law and the
bound) rejects at alpha / (number of tests), so a correct verifier fails a report with
probability at most alpha (Bonferroni; default 1e-3). Keys are fixed by `seed`, so a run
is deterministic.
"""

import contextlib
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sstats

from spectr_jax import block_bound, sampling, verify
from spectr_jax.testing import sequences, wor_reference

__all__ = [
  "CASES",
  "Case",
  "Report",
  "Row",
  "check_verifier",
  "forced_randomness",
  "token_walk",
]

LAWS = ("iid", "wor")
BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
# Outcomes of expected count below this (at the effective sample size) are pooled.
_MIN_EXPECTED = 5.0
# Enumeration limit: draft tuples per case.
_MAX_TUPLES = 4096


@dataclasses.dataclass(frozen=True)
class Case:
  """One random tree: `kind` (see `make_tree`), vocabulary, draft length, drafts."""

  kind: str
  vocab: int
  draft_len: int
  num_drafts: int

  @property
  def name(self) -> str:
    return f"{self.kind} V{self.vocab} L{self.draft_len} K{self.num_drafts}"


# The law cases of a full check; `quick` runs the first QUICK of them (one of each kind).
CASES = (
  Case("dense", 4, 1, 3),
  Case("q0", 3, 2, 2),
  Case("sparse", 4, 2, 2),
  Case("one-hot", 3, 2, 2),
  Case("ties", 3, 1, 3),
  Case("p0", 3, 2, 2),
  Case("dense", 3, 2, 2),
  Case("dense", 2, 3, 2),
  Case("dense", 3, 3, 1),
  Case("dense", 2, 2, 4),
)
QUICK = 6
TREE_KINDS = ("dense", "sparse", "one-hot", "ties", "p0", "q0")


def make_tree(rng, case: Case):
  """(p_tab, q_tab) of `block_bound`'s layout for a case kind: "dense", "sparse",
  "one-hot", "ties" (`sequences.random_tree`'s random, sparse, one-hot, ties), "p0"
  (dense, then p = 0 on one token of every node where q keeps mass) and "q0" (dense,
  then q = 0 on one token of every node where p keeps mass)."""
  kind = {"dense": "random", "p0": "random", "q0": "random"}.get(case.kind, case.kind)
  p, q = sequences.random_tree(rng, case.vocab, case.draft_len, kind)
  if case.kind in ("p0", "q0"):
    table = p if case.kind == "p0" else q
    for node in itertools.product(range(table.shape[0]), range(table.shape[1])):
      table[node][rng.integers(case.vocab)] = 0.0
      table[node] /= table[node].sum()
  return p, q


@dataclasses.dataclass
class Row:
  """One case of a report. `statistic`: the law's Wald statistic / df (law rows), the
  Pearson statistic / df (chi2 rows) or violations / runs (boundary rows); `pvalue`: the
  smallest p-value of the row's tests (None for deterministic checks); `tokens`: the
  mixture mean of tokens per round (± its standard error); `bound`: the law's LP bound;
  `law_error`: the total variation between the estimated and the target law (law rows;
  its sampling error is part of it)."""

  case: str
  law: str
  num_drafts: int
  draft_len: int
  vocab: int
  kind: str
  statistic: str
  pvalue: float | None = None
  tokens: float | None = None
  tokens_se: float | None = None
  bound: float | None = None
  law_error: float | None = None
  passed: bool = True
  why: str = ""


COLUMNS = (
  "case",
  "law",
  "K",
  "L",
  "V",
  "check",
  "statistic",
  "TV",
  "p-value",
  "tokens/round",
  "LP bound",
  "result",
)


def _cells(row: Row) -> dict:
  tokens = "" if row.tokens is None else f"{row.tokens:.4f} ± {row.tokens_se:.4f}"
  return {
    "case": row.case,
    "law": row.law,
    "K": row.num_drafts,
    "L": row.draft_len,
    "V": row.vocab,
    "check": row.kind,
    "statistic": row.statistic,
    "TV": "" if row.law_error is None else f"{row.law_error:.2g}",
    "p-value": "" if row.pvalue is None else f"{row.pvalue:.3g}",
    "tokens/round": tokens,
    "LP bound": "" if row.bound is None else f"{row.bound:.4f}",
    "result": "pass" if row.passed else f"FAIL: {row.why}",
  }


@dataclasses.dataclass
class Report:
  """The evidence of one `check_verifier` call.

  rows: one `Row` per case. alpha: the report's false-alarm budget; every one of its
  `num_tests` statistical tests rejects at `level` = alpha / num_tests (Bonferroni).
  """

  name: str
  laws: tuple[str, ...]
  alpha: float
  rows: list[Row]
  num_tests: int

  @property
  def level(self) -> float:
    return self.alpha / max(self.num_tests, 1)

  @property
  def passed(self) -> bool:
    return all(row.passed for row in self.rows)

  @property
  def failures(self) -> list[Row]:
    return [row for row in self.rows if not row.passed]

  def markdown(self) -> str:
    """The rows as a markdown table, under a line naming the verifier and the budget."""
    head = (
      f"**{self.name}** for laws {', '.join(self.laws)}: "
      f"{'PASS' if self.passed else f'FAIL ({len(self.failures)} of {len(self.rows)} cases)'}; "
      f"{self.num_tests} tests, each at alpha / {self.num_tests} = {self.level:.2g} "
      f"(Bonferroni, alpha = {self.alpha:g})"
    )
    cells = [_cells(row) for row in self.rows]
    return head + "\n\n" + _markdown(cells, COLUMNS)

  def __str__(self) -> str:
    return self.markdown()


def _markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
  """The rows (text cells) as a markdown table: the project's writer
  (`spectr_jax.tables.markdown`) where it exists, else the same layout here."""
  try:
    from spectr_jax import tables
  except ImportError:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
  return tables.markdown(rows, [(c, c, "{}") for c in columns])


# ----------------------------------------------------------------------------- walking


def token_walk(fn: Callable, key, drafts_KxL, p_KxLxV, q_KxL1xV):
  """`verify.walk` for a token-level verify function `fn` (not a registry name): position
  t runs fn(fold_in(key, t), surviving drafts' tokens, p, q, valid) and the drafts equal
  to the emitted token survive; after a miss the walk stops; at t = L no draft is valid
  and fn draws the bonus from q (`verify.walk_positions`). Returns (tokens_L1,
  num_tokens)."""
  tokens_L1, num_tokens, _ = verify.walk_positions(
    lambda rep, t: fn, key, drafts_KxL, p_KxLxV, q_KxL1xV
  )
  return tokens_L1, num_tokens


def _block_fn(fn: Callable, level: str) -> Callable:
  """(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> (tokens_L1, num_tokens) for either level."""
  if level == "token":
    return functools.partial(token_walk, fn)
  if level == "block":

    def run(key, drafts_KxL, p_KxLxV, q_KxL1xV):
      verdict = fn(key, drafts_KxL, p_KxLxV, q_KxL1xV)
      return jnp.asarray(verdict[0], jnp.int32), jnp.asarray(verdict[1], jnp.int32)

    return run
  raise ValueError(f"level must be 'token' or 'block', got {level!r}")


# ------------------------------------------------------------------- enumerated drafts


def draft_tuples(p_tab, num_drafts: int, draft_len: int, law: str):
  """Every ordered tuple of K draft paths (base-V codes) the law can draw on the tree,
  with its exact probability: (codes_TxK int array, weights_T float64)."""
  if law == "iid":
    probs = block_bound.path_probs(np.asarray(p_tab, np.float64), draft_len)
    support = np.flatnonzero(probs > 0)
    count = support.size**num_drafts
    if count > _MAX_TUPLES:
      raise ValueError(f"{count} draft tuples to enumerate (limit {_MAX_TUPLES})")
    codes = np.array(list(itertools.product(support, repeat=num_drafts)), np.int64)
    return codes.reshape(-1, num_drafts), np.prod(probs[codes], axis=1)
  if law == "wor":
    branching = (num_drafts,) + (1,) * (draft_len - 1)
    law_map = wor_reference.static_tree_law(np.asarray(p_tab, np.float64), branching)
    if len(law_map) > _MAX_TUPLES:
      raise ValueError(f"{len(law_map)} draft tuples to enumerate (limit {_MAX_TUPLES})")
    codes = np.array(list(law_map), np.int64).reshape(-1, num_drafts)
    return codes, np.array(list(law_map.values()), np.float64)
  raise ValueError(f"unknown drafting law {law!r}; expected one of {LAWS}")


def _tuple_arrays(p_tab, q_tab, codes_TxK, draft_len):
  """drafts_TxKxL, p_TxKxLxV, q_TxKxL1xV of every tuple (index convention of
  `verify.verify_block`)."""
  vocab = p_tab.shape[-1]
  digits = [(codes_TxK // vocab ** (draft_len - 1 - t)) % vocab for t in range(draft_len)]
  drafts = np.stack(digits, -1)
  prefixes = [codes_TxK // vocab ** (draft_len - t) for t in range(draft_len + 1)]
  p = np.stack([p_tab[t, prefixes[t]] for t in range(draft_len)], 2)
  q = np.stack([q_tab[t, prefixes[t]] for t in range(draft_len + 1)], 2)
  return drafts.astype(np.int32), p.astype(np.float32), q.astype(np.float32)


# Samples per call of a sampler (the last chunk padded): one compile per (K, L, V).
_CHUNK = 8192


@functools.lru_cache(maxsize=64)
def _sampler(block_fn: Callable, draft_len: int, vocab: int):
  """A jitted (keys_N, drafts_NxKxL, p_NxKxLxV, q_NxKxL1xV, q_tab) -> (codes_N, num_N):
  each row's block verified under its key and completed by target draws (as
  `sequences.sample_blocks`)."""

  def one(key, drafts_KxL, p_KxLxV, q_KxL1xV, q_tab):
    verify_key, extend_key = jax.random.split(key)
    tokens_L1, num = block_fn(verify_key, drafts_KxL, p_KxLxV, q_KxL1xV)
    code = jnp.int32(0)
    for t in range(draft_len + 1):
      draw = sampling.categorical(jax.random.fold_in(extend_key, t), q_tab[t, code])
      code = code * vocab + jnp.where(t < num, tokens_L1[t], draw)
    return code, num

  return jax.jit(jax.vmap(one, (0, 0, 0, 0, None)))


def _sample_tuples(sample, key, drafts, p, q, q_tab, samples: int):
  """(codes_TxM, num_TxM): every tuple's block under M keys, in chunks of `_CHUNK`."""
  num_tuples = drafts.shape[0]
  total = num_tuples * samples
  keys = jax.random.split(key, total)
  index = np.repeat(np.arange(num_tuples), samples)
  codes, nums = [], []
  q_tab = jnp.asarray(q_tab, jnp.float32)
  for start in range(0, total, _CHUNK):
    rows = index[start : start + _CHUNK]
    pad = _CHUNK - rows.size
    rows_keys = keys[start : start + _CHUNK]
    if pad:
      rows = np.concatenate([rows, np.zeros(pad, rows.dtype)])
      rows_keys = jnp.concatenate([rows_keys, jax.random.split(jax.random.key(0), pad)])
    c, n = sample(rows_keys, drafts[rows], p[rows], q[rows], q_tab)
    codes.append(np.asarray(c)[: _CHUNK - pad])
    nums.append(np.asarray(n)[: _CHUNK - pad])
  shape = (num_tuples, samples)
  return np.concatenate(codes).reshape(shape), np.concatenate(nums).reshape(shape)


def _wald(counts_TxO, weights_T, target_O, samples: int):
  """(statistic, df, pvalue, why) of the stratified mixture against the target law.

  hat = sum_t w_t n_t / M estimates the mixture law; its covariance is the exact
  stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M, with P_t estimated by n_t / M
  and, on the diagonal, by (n_t + 2) / (M + 2) (an upper estimate: a cell a heavy
  stratum happened not to hit would otherwise get variance 0 there; the result is still
  a covariance, and conservative). Outcomes of expected count below 5 at the effective
  sample size M / sum_t w_t^2 are pooled into one cell (with the smallest other cell
  while that one is still below 5); the cells sum to 1, so one is dropped: the Wald
  statistic d^T Cov^-1 d is chi-square with (cells - 1) degrees of freedom.
  """
  hat_O = weights_T @ counts_TxO / samples
  if np.any(hat_O[target_O <= 0] > 0):
    return math.inf, 0, 0.0, "mass on an outcome of target probability 0"
  n_eff = samples / float(np.sum(weights_T**2))
  expected_O = target_O * n_eff
  order = [int(i) for i in np.argsort(expected_O) if target_O[i] > 0]
  pool = [i for i in order if expected_O[i] < _MIN_EXPECTED]
  kept = [i for i in order if expected_O[i] >= _MIN_EXPECTED]
  while pool and kept and expected_O[pool].sum() < _MIN_EXPECTED:
    pool.append(kept.pop(0))
  cols = [[i] for i in kept] + ([pool] if pool else [])
  if len(cols) < 2:
    return 0.0, 0, 1.0, ""
  counts = np.stack([counts_TxO[:, c].sum(1) for c in cols], 1).astype(np.float64)
  target = np.array([target_O[c].sum() for c in cols])
  probs_TxC = counts / samples
  upper_TxC = (counts + 2.0) / (samples + 2.0)
  w2 = weights_T**2
  cov = np.diag(w2 @ upper_TxC) - np.einsum("t,tc,td->cd", w2, probs_TxC, probs_TxC)
  cov /= samples
  d = (weights_T @ probs_TxC - target)[:-1]
  statistic = float(d @ np.linalg.solve(cov[:-1, :-1], d))
  df = len(cols) - 1
  return statistic, df, float(sstats.chi2.sf(statistic, df)), ""


def _law_case(sample, case, law, seed, samples, key):
  """The law row of one case and its two p-values (law, bound)."""
  rng = np.random.default_rng(
    [seed, TREE_KINDS.index(case.kind), case.vocab, case.draft_len, case.num_drafts]
  )
  p_tab, q_tab = make_tree(rng, case)
  vocab, draft_len, k = case.vocab, case.draft_len, case.num_drafts
  codes_TxK, weights_T = draft_tuples(p_tab, k, draft_len, law)
  drafts, p, q = _tuple_arrays(p_tab, q_tab, codes_TxK, draft_len)
  codes_TxM, num_TxM = _sample_tuples(sample, key, drafts, p, q, q_tab, samples)
  num_TxM = num_TxM.astype(np.float64)
  outcomes = vocab ** (draft_len + 1)
  counts_TxO = np.stack([np.bincount(c, minlength=outcomes) for c in codes_TxM])
  target_O = sequences.target_law(np.asarray(q_tab, np.float64), draft_len)
  statistic, df, p_law, why = _wald(counts_TxO, weights_T, target_O, samples)
  law_error = 0.5 * float(np.abs(weights_T @ counts_TxO / samples - target_O).sum())
  mean = float(weights_T @ num_TxM.mean(1))
  se = math.sqrt(float(weights_T**2 @ num_TxM.var(1, ddof=1)) / samples)
  multisets = block_bound.MULTISETS[law](p_tab, k, draft_len)
  bound = block_bound.multiset_bound(p_tab, q_tab, multisets, draft_len)
  if se > 0:
    p_bound = float(sstats.norm.sf((mean - bound) / se))
  else:
    p_bound = 0.0 if mean > bound + 1e-6 else 1.0
  row = Row(
    case.name,
    law,
    k,
    draft_len,
    vocab,
    "law",
    f"{statistic:.1f} / {df}",
    min(p_law, p_bound),
    mean,
    se,
    bound,
    law_error,
  )
  return row, (p_law, p_bound, why)


# ------------------------------------------------------------------- boundary uniforms


@contextlib.contextmanager
def forced_randomness(values: dict):
  """While active, `jax.random.uniform` returns `values["uniform"]` everywhere and
  `jax.random.bits` the word `values["word"]` (values may be tracers: set them inside the
  traced function); compiled programs are dropped on entry and exit."""

  def fake_uniform(key, shape=(), dtype=jnp.float32, minval=0.0, maxval=1.0):
    del key, minval, maxval
    return jnp.full(shape, values["uniform"], dtype)

  def fake_bits(key, shape=(), dtype=jnp.uint32):
    del key
    return jnp.full(shape, values["word"], dtype)

  saved = jax.random.uniform, jax.random.bits
  jax.random.uniform, jax.random.bits = fake_uniform, fake_bits
  jax.clear_caches()
  try:
    yield
  finally:
    jax.random.uniform, jax.random.bits = saved
    jax.clear_caches()


def _boundary_drafts(law, k, draft_len, allowed, hit, vocab):
  """Draft paths that hit (path 0 is `allowed` throughout) or miss (no path starts with
  it); under "wor" the first tokens are distinct (paths continue alone)."""
  forbidden = [t for t in range(vocab) if t != allowed]
  paths = []
  for i in range(k):
    if law == "wor":
      first = allowed if (hit and i == 0) else forbidden[(i - hit) % len(forbidden)]
    else:
      first = allowed if (hit and i == 0) else forbidden[i % len(forbidden)]
    rest = [
      allowed if (hit and i == 0) else forbidden[(i + t) % len(forbidden)]
      for t in range(1, draft_len)
    ]
    paths.append([first] + rest)
  return np.asarray(paths, np.int32)


def _boundary_rows(block_fn, law, drafts: Sequence[int], vocab: int = 4):
  rows = []
  values = {}

  def run(uniform, word, key, drafts_KxL, p_KxLxV, q_KxL1xV):
    values.update(uniform=uniform, word=word)
    return block_fn(key, drafts_KxL, p_KxLxV, q_KxL1xV)

  with forced_randomness(values):
    jitted = jax.jit(run)
    for k, draft_len in itertools.product(drafts, (1, 3)):
      if law == "wor" and k > vocab - 1:
        continue
      bad, runs = [], 0
      for allowed, hit, uniform, word in itertools.product(
        (0, 2), (False, True), (0.0, BELOW_ONE), (0, 2**32 - 1)
      ):
        paths = _boundary_drafts(law, k, draft_len, allowed, hit, vocab)
        p = jnp.full((k, draft_len, vocab), 1.0 / vocab)
        q = jnp.broadcast_to(jax.nn.one_hot(allowed, vocab), (k, draft_len + 1, vocab))
        tokens, num = jitted(
          jnp.float32(uniform), jnp.uint32(word), jax.random.key(0), jnp.asarray(paths), p, q
        )
        num = int(num)
        emitted = np.asarray(tokens)[:num]
        runs += 1
        if not (1 <= num <= draft_len + 1 and np.all(emitted == allowed)):
          bad.append(f"allowed={allowed} hit={hit} u={uniform:.9g} word={word}: {emitted}")
      rows.append(
        Row(
          "one-hot q, forced uniforms",
          law,
          k,
          draft_len,
          vocab,
          "boundary",
          f"{len(bad)} / {runs} runs",
          passed=not bad,
          why=("a token of probability 0: " + "; ".join(bad[:2])) if bad else "",
        )
      )
  return rows


# ------------------------------------------------------------------- large vocabulary


def _first_token_fn(fn: Callable, level: str) -> Callable:
  """(key, drafts_K, p_KxLxV, q_KxL1xV) -> (first token, tokens emitted) at L = 1: a
  token-level fn runs once at the first position (p and q shared by every row, so its
  per-position work is not repeated per row), a block-level one on the block."""
  if level == "token":

    def run(key, x_K, p_KxLxV, q_KxL1xV):
      verdict = fn(key, x_K, p_KxLxV[0, 0], q_KxL1xV[0, 0], jnp.ones(x_K.shape, bool))
      return verdict.token, 1 + jnp.any(x_K == verdict.token).astype(jnp.int32)

    return run
  block_fn = _block_fn(fn, level)

  def run_block(key, x_K, p_KxLxV, q_KxL1xV):
    tokens_L1, num = block_fn(key, x_K[:, None], p_KxLxV, q_KxL1xV)
    return tokens_L1[0], num

  return run_block


def _large_vocab_row(first_fn, law, k, vocab, samples, seed, key, num_bins=32, chunk=4000):
  """The first token's law at a large vocabulary, drafts sampled from the law (L = 1)."""
  p, q = sequences.llm_like(seed, vocab)
  p32, q32 = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  p_KxLxV = jnp.broadcast_to(p32, (k, 1, vocab))
  q_KxL1xV = jnp.broadcast_to(q32, (k, 2, vocab))
  logp = jnp.log(p32)

  def one(key):
    draft_key, verify_key = jax.random.split(key)
    if law == "wor":  # K distinct tokens in drawn order: Gumbel-top-k
      _, x_K = jax.lax.top_k(logp + jax.random.gumbel(draft_key, (vocab,)), k)
    else:
      x_K = jax.vmap(sampling.categorical, (0, None))(jax.random.split(draft_key, k), p32)
    return first_fn(verify_key, x_K.astype(jnp.int32), p_KxLxV, q_KxL1xV)

  run = jax.jit(jax.vmap(one))
  keys = jax.random.split(key, samples)
  tokens, nums = [], []
  for start in range(0, samples, chunk):
    t, n = run(keys[start : start + chunk])
    tokens.append(np.asarray(t))
    nums.append(np.asarray(n, np.float64))
  tokens, nums = np.concatenate(tokens), np.concatenate(nums)
  bin_of_token, bin_probs = sequences.equal_mass_bins(q, num_bins)
  row = Row(
    f"llm_like V{vocab} first token",
    law,
    k,
    1,
    vocab,
    "chi2-32k",
    "",
    tokens=float(nums.mean()),
    tokens_se=float(nums.std(ddof=1) / math.sqrt(samples)),
  )
  if np.any(q[tokens] <= 0):
    row.statistic, row.pvalue = "mass on q = 0", 0.0
    return row, 0.0
  counts = np.bincount(bin_of_token[tokens], minlength=num_bins)
  statistic, pvalue = sstats.chisquare(counts, bin_probs * samples)
  row.statistic, row.pvalue = f"{statistic:.1f} / {num_bins - 1}", float(pvalue)
  return row, float(pvalue)


# ------------------------------------------------------------------------ entry point


def check_verifier(
  fn: Callable,
  *,
  level: str,
  laws: Sequence[str],
  name: str = "",
  seed: int = 0,
  quick: bool = False,
  max_drafts: int | None = None,
  alpha: float = 1e-3,
  samples: int | None = None,
  cases: Sequence[Case] | None = None,
  boundary: bool = True,
  large_vocab: int | None = 32_000,
  large_samples: int | None = None,
) -> Report:
  """Checks that the verifier `fn` is exact for each drafting law in `laws`.

  Args:
    fn: a verify function of the registry's signature for `level` (`spectr_jax.methods`):
      token level fn(key, drafts_K, p_V, q_V, valid_K) -> Verdict (walked over the block
      by `token_walk`), block level fn(key, drafts_KxL, p_KxLxV, q_KxL1xV) ->
      BlockVerdict. Bind extra keyword arguments (K-SEQ's rho) with functools.partial.
    level: "token" or "block".
    laws: the drafting laws it claims exactness for ("iid", "wor").
    name: how the report names it.
    seed: trees and keys.
    quick: the first `QUICK` law cases, fewer samples, a smaller large-vocabulary run.
    max_drafts: the largest K it takes (cases with more drafts run at this K; at 1 every
      law draws the same single draft, so only the first law's cases run).
    alpha: the report's false-alarm budget (Bonferroni over its tests).
    samples: keys per enumerated draft tuple (default 2000, quick 400).
    cases: the law cases (default `CASES`, or its first `QUICK` with quick).
    boundary: run the boundary-uniform checks.
    large_vocab: the vocabulary of the large-vocabulary chi-square (None: skip it).
    large_samples: its sample size (default 20000, quick 4000).

  Returns:
    A `Report`: `.passed`, `.failures`, `.markdown()`.
  """
  for law in laws:
    if law not in LAWS:
      raise ValueError(f"unknown drafting law {law!r}; expected one of {LAWS}")
  block_fn = _block_fn(fn, level)
  samples = samples or (400 if quick else 2000)
  large_samples = large_samples or (4000 if quick else 20_000)
  if cases is None:
    cases = CASES[:QUICK] if quick else CASES
  if max_drafts is not None:
    cases = list(
      dict.fromkeys(dataclasses.replace(c, num_drafts=min(c.num_drafts, max_drafts)) for c in cases)
    )
  key = jax.random.key(seed)
  rows, pvalues = [], []  # pvalues[i]: the tests of row i
  # With one draft every law draws it from p: their cases coincide and run once, as the
  # first law's rows.
  run_laws = laws[:1] if max_drafts == 1 else laws
  for li, law in enumerate(run_laws):
    for ci, case in enumerate(cases):
      sample = _sampler(block_fn, case.draft_len, case.vocab)
      row, (p_law, p_bound, why) = _law_case(
        sample, case, law, seed, samples, jax.random.fold_in(key, 1000 * li + ci)
      )
      row.why = why
      rows.append(row)
      pvalues.append({"law": p_law, "above the LP bound": p_bound})
    if boundary:
      drafts = sorted({min(k, max_drafts or k) for k in (1, 2, 3)})
      for row in _boundary_rows(block_fn, law, drafts):
        rows.append(row)
        pvalues.append({})
    if large_vocab:
      k = min(3, max_drafts or 3)
      row, pvalue = _large_vocab_row(
        _first_token_fn(fn, level),
        law,
        k,
        large_vocab,
        large_samples,
        seed,
        jax.random.fold_in(key, 10_000 + li),
      )
      rows.append(row)
      pvalues.append({"first-token law": pvalue})
  num_tests = sum(len(p) for p in pvalues)
  level_ = alpha / max(num_tests, 1)
  for row, tests in zip(rows, pvalues, strict=True):
    failed = [what for what, pvalue in tests.items() if pvalue < level_]
    if failed:
      row.passed = False
      row.why = row.why or ", ".join(failed)
  return Report(name or getattr(fn, "__name__", "verifier"), tuple(laws), alpha, rows, num_tests)
