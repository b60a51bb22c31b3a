"""Exactness evidence for a verifier in one call: `check_verifier(fn, level=..., laws=...)`.

A verifier is exact for a drafting law when, for drafts drawn by that law, its emitted
tokens completed by target draws follow the target's sequence law. `check_verifier` runs
three kinds of checks per law and returns a `Report` (one row per case, a markdown table,
and what each row would detect):

- "law": small random trees (V = 2-4, L = 1-3, K = 1-4; dense, sparse, one-hot targets,
  tied ratios q = p, p = 0 where q > 0, q = 0 where p > 0). What is ENUMERATED: every
  draft tuple the law can draw, with its exact probability w_t (i.i.d.: every ordered
  K-tuple of paths with p > 0; "wor": every ordered tuple of paths of the default static
  tree (K, 1, ..., 1), `wor_reference.static_tree_law`). What is SAMPLED: the verifier's
  own randomness, M_t draws for tuple t in proportion to w_t (one jitted, vmapped program
  per shape), and the target's draws that complete an emitted block to L + 1 tokens. The
  mixture estimate sum_t w_t P^_t of the completed sequences' law is compared with the
  target's law (`sequences.target_law`) by a Wald chi-square statistic whose covariance
  is the exact stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M_t, with P_t
  estimated and outcomes of small expected count pooled; any mass on an outcome of
  target probability 0 fails outright. Beside it: the mixture mean of the tokens emitted
  per round and the LP bound of the law (`block_bound.multiset_bound`): a mean above the
  bound by more than sampling error (one-sided z-test) shows an inexact rule.
- "boundary": one-hot targets with drafts that miss and that hit, every uniform forced
  to 0.0 and to the largest float32 below 1 and every random word to 0 and 2^32 - 1
  (`jax.random.uniform` and `jax.random.bits` patched while the verifier is traced):
  a token of target probability 0 must never be emitted.
- "chi2-32k": every position of a block, the bonus included, at V = 32000 (draft and
  target laws `sequences.llm_like` per depth; drafts drawn by the law), each position's
  completed token binned into equal-mass bins of its target law, Pearson chi-square.

Power. The harness knows the null law exactly, so what a test detects is computed, not
hoped for (`detectable_tv`): the smallest total variation from the target law that a row's
test rejects with probability `POWER` at the report's per-test level, in the worst
direction. The default mode sizes its draws by it: every case of an informative tree kind
(`INFORMATIVE`: where a wrong rule changes the law) detects `DETECT_TV` = 0.01, the V =
32k rows `LARGE_VOCAB_TV` between the binned laws; the one-hot and tie trees (whose law
most broken rules reproduce) run a fixed number of draws for their boundary behaviour.
`quick=True` is a smoke test with a few thousand draws per case, and its report says it is
no evidence (docs/NEW_VERIFIER.md, "What passing means").

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
import warnings
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize
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
# The default mode's power: any law at total variation DETECT_TV or more from the target
# fails an informative case's law test with probability at least POWER, at the report's
# per-test level (`detectable_tv`); the large-vocabulary rows detect LARGE_VOCAB_TV
# between the binned laws.
DETECT_TV = 0.01
LARGE_VOCAB_TV = 0.05
POWER = 0.99
# Draws of a law case go to its draft tuples in proportion to their probability (the
# variance of the mixture estimate is then that of as many plain draws), at least this many
# each, so every tuple's law is estimated.
MIN_PER_TUPLE = 4
# Draws of the one-hot and tie cases (their law is the target's under most broken rules
# too: they check behaviour at the boundary, not power) and of quick mode's cases.
BOUNDARY_DRAWS = 20_000
QUICK_DRAWS = 20_000
QUICK_LARGE_SAMPLES = 4_000


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
# The tree kinds where a wrong rule changes the law: the default mode sizes their cases to
# detect DETECT_TV.
INFORMATIVE = ("dense", "sparse", "p0", "q0")


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
  # The smallest total variation from the target (law rows; between the binned laws for
  # chi2-32k rows) that the row's test rejects with probability POWER at the report's
  # level (`detectable_tv`); None for deterministic rows.
  detects: float | None = None
  # What `detects` was computed from: the effective draws, degrees of freedom and the
  # target mass of the pooled outcomes (a deviation inside them is not seen).
  effective_draws: float | None = None
  df: int | None = None
  pooled_mass: float = 0.0


COLUMNS = (
  "case",
  "law",
  "K",
  "L",
  "V",
  "check",
  "statistic",
  "TV",
  "detects TV >=",
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
    "detects TV >=": "" if row.detects is None else f"{row.detects:.3g}",
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
  # "default", or "quick" (a smoke test: too few draws to be evidence of exactness).
  mode: str = "default"

  @property
  def level(self) -> float:
    return self.alpha / max(self.num_tests, 1)

  def power(self) -> dict[tuple[str, str], float]:
    """{(check, tree kind): the largest `Row.detects` of its rows}: any law at that total
    variation from the target or more fails the check with probability `POWER` (each kind
    at its worst case); a kind's "law" entry, a chi2-32k row's binned laws."""
    table: dict[tuple[str, str], float] = {}
    for row in self.rows:
      if row.detects is not None:
        key = (row.kind, row.case.split()[0] if row.kind == "law" else f"position {row.draft_len}")
        table[key] = max(table.get(key, 0.0), row.detects)
    return table

  def power_markdown(self) -> str:
    """`power` as a markdown table (check, tree kind or position, detectable TV)."""
    cells = [
      {"check": check, "tree kind": kind, "detects TV >=": f"{tv:.3g}"}
      for (check, kind), tv in sorted(self.power().items())
    ]
    return _markdown(cells, ("check", "tree kind", "detects TV >="))

  @property
  def passed(self) -> bool:
    return all(row.passed for row in self.rows)

  @property
  def failures(self) -> list[Row]:
    return [row for row in self.rows if not row.passed]

  def markdown(self) -> str:
    """The rows as a markdown table, under a line naming the verifier and the budget."""
    informative = [
      r.detects
      for r in self.rows
      if r.kind == "law" and r.case.split()[0] in INFORMATIVE
      if r.detects is not None
    ]
    power = (
      f"; its law cases detect any law at TV >= {max(informative):.3g} from the target "
      f"with probability {POWER:g}"
      if informative
      else ""
    )
    quick = (
      "QUICK MODE: a smoke test, too few draws to be evidence of exactness. "
      if self.mode == "quick"
      else ""
    )
    head = (
      f"{quick}**{self.name}** for laws {', '.join(self.laws)}: "
      f"{'PASS' if self.passed else f'FAIL ({len(self.failures)} of {len(self.rows)} cases)'}; "
      f"{self.num_tests} tests, each at alpha / {self.num_tests} = {self.level:.2g} "
      f"(Bonferroni, alpha = {self.alpha:g}){power}"
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
  `methods.verify_drafts`)."""
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


def _sample_tuples(sample, key, drafts, p, q, q_tab, per_tuple):
  """(codes_N, num_N, tuple_N): per_tuple[t] draws of tuple t's block (each under its
  own key), in chunks of `_CHUNK`; tuple_N names the tuple of each draw."""
  index = np.repeat(np.arange(drafts.shape[0]), per_tuple)
  total = index.size
  keys = jax.random.split(key, total)
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
  return np.concatenate(codes), np.concatenate(nums), index


def noncentrality(df: int, level: float, power: float = POWER) -> float:
  """The noncentrality a chi-square test of `df` degrees of freedom at `level` needs to
  reject with probability `power` (its statistic noncentral chi-square under an
  alternative)."""
  critical = sstats.chi2.isf(level, df)
  return float(optimize.brentq(lambda lam: sstats.ncx2.sf(critical, df, lam) - power, 0.0, 1e7))


def detectable_tv(
  effective_draws: float, df: int, level: float, power: float = POWER, pooled_mass: float = 0.0
) -> float:
  """The smallest total variation from the target law that the law test rejects with
  probability `power` at `level`, whatever the direction of the deviation.

  The Wald statistic d' Cov^-1 d of the mixture estimate (d its deviation from the
  target) is noncentral chi-square under an alternative, with noncentrality
  delta' Cov^-1 delta for the alternative's deviation delta. Cov = sum_t w_t^2 C_t / M_t,
  C_t a multinomial covariance, and s' C_t s <= 1 for any s of entries +-1 (the variance
  of a +-1 variable), so with s = sign(delta), Cauchy-Schwarz gives delta' Cov^-1 delta
  >= (s' delta)^2 / s' Cov s >= (2 TV)^2 n_eff, n_eff = 1 / sum_t (w_t^2 / M_t) (the
  effective draws). A deviation inside the pooled outcomes (target mass `pooled_mass`)
  is not seen: it is added. Against the Pearson statistic of B equal-mass bins (n draws)
  the same bound holds with n_eff = n, the total variation that of the binned laws.
  """
  if df < 1 or effective_draws <= 0:
    return 1.0
  return math.sqrt(noncentrality(df, level, power) / (4.0 * effective_draws)) + pooled_mass


def draws_for(tv: float, df: int, level: float, power: float = POWER) -> int:
  """The effective draws that make `detectable_tv` (no pooling) equal to `tv`."""
  return math.ceil(noncentrality(df, level, power) / (4.0 * tv * tv))


def _allocation(weights_T, draws: int) -> np.ndarray:
  """Draws per tuple: in proportion to the tuple's probability, at least MIN_PER_TUPLE."""
  return np.maximum(np.ceil(draws * weights_T).astype(np.int64), MIN_PER_TUPLE)


@dataclasses.dataclass(frozen=True)
class _Wald:
  statistic: float
  df: int
  pvalue: float
  why: str
  effective_draws: float
  pooled_mass: float


def _wald(counts_TxO, weights_T, target_O, per_tuple_T) -> _Wald:
  """The Wald test of the stratified mixture against the target law.

  hat = sum_t w_t n_t / M_t estimates the mixture law (M_t draws of tuple t); its
  covariance is the exact stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M_t, with
  P_t estimated by n_t / M_t and, on the diagonal, by (n_t + 2) / (M_t + 2) (an upper
  estimate: a cell a heavy stratum happened not to hit would otherwise get variance 0
  there; the result is still a covariance, and conservative). Outcomes of expected count
  below 5 at the effective draws n_eff = 1 / sum_t (w_t^2 / M_t) are pooled into one cell
  (with the smallest other cell while that one is still below 5); the cells sum to 1, so
  one is dropped: the Wald statistic d^T Cov^-1 d is chi-square with (cells - 1) degrees
  of freedom.
  """
  m_T = per_tuple_T.astype(np.float64)
  hat_O = (weights_T / m_T) @ counts_TxO
  n_eff = 1.0 / float(np.sum(weights_T**2 / m_T))
  if np.any(hat_O[target_O <= 0] > 0):
    return _Wald(math.inf, 0, 0.0, "mass on an outcome of target probability 0", n_eff, 0.0)
  expected_O = target_O * n_eff
  order = [int(i) for i in np.argsort(expected_O) if target_O[i] > 0]
  pool = [i for i in order if expected_O[i] < _MIN_EXPECTED]
  kept = [i for i in order if expected_O[i] >= _MIN_EXPECTED]
  while pool and kept and expected_O[pool].sum() < _MIN_EXPECTED:
    pool.append(kept.pop(0))
  pooled_mass = float(target_O[pool].sum()) if pool else 0.0
  cols = [[i] for i in kept] + ([pool] if pool else [])
  if len(cols) < 2:
    return _Wald(0.0, 0, 1.0, "", n_eff, pooled_mass)
  counts = np.stack([counts_TxO[:, c].sum(1) for c in cols], 1).astype(np.float64)
  target = np.array([target_O[c].sum() for c in cols])
  probs_TxC = counts / m_T[:, None]
  upper_TxC = (counts + 2.0) / (m_T[:, None] + 2.0)
  w2 = weights_T**2 / m_T
  cov = np.diag(w2 @ upper_TxC) - np.einsum("t,tc,td->cd", w2, probs_TxC, probs_TxC)
  d = (weights_T @ probs_TxC - target)[:-1]
  statistic = float(d @ np.linalg.solve(cov[:-1, :-1], d))
  df = len(cols) - 1
  return _Wald(statistic, df, float(sstats.chi2.sf(statistic, df)), "", n_eff, pooled_mass)


def _law_case(sample, case, law, seed, key, draws=None, per_tuple=None):
  """The law row of one case and its two p-values (law, bound): `draws` allocated over
  the draft tuples by probability (`_allocation`), or `per_tuple` draws of every tuple."""
  rng = np.random.default_rng(
    [seed, TREE_KINDS.index(case.kind), case.vocab, case.draft_len, case.num_drafts]
  )
  p_tab, q_tab = make_tree(rng, case)
  vocab, draft_len, k = case.vocab, case.draft_len, case.num_drafts
  codes_TxK, weights_T = draft_tuples(p_tab, k, draft_len, law)
  drafts, p, q = _tuple_arrays(p_tab, q_tab, codes_TxK, draft_len)
  if per_tuple is None:
    m_T = _allocation(weights_T, draws)
  else:
    m_T = np.full(weights_T.shape, per_tuple, np.int64)
  codes_N, num_N, tuple_N = _sample_tuples(sample, key, drafts, p, q, q_tab, m_T)
  outcomes = vocab ** (draft_len + 1)
  counts_TxO = np.bincount(
    tuple_N * outcomes + codes_N, minlength=weights_T.size * outcomes
  ).reshape(weights_T.size, outcomes)
  target_O = sequences.target_law(np.asarray(q_tab, np.float64), draft_len)
  wald = _wald(counts_TxO, weights_T, target_O, m_T)
  law_error = 0.5 * float(np.abs((weights_T / m_T) @ counts_TxO - target_O).sum())
  num_N = num_N.astype(np.float64)
  sums_T = np.bincount(tuple_N, num_N, weights_T.size)
  squares_T = np.bincount(tuple_N, num_N**2, weights_T.size)
  means_T = sums_T / m_T
  vars_T = np.maximum(squares_T - m_T * means_T**2, 0.0) / np.maximum(m_T - 1, 1)
  mean = float(weights_T @ means_T)
  se = math.sqrt(float(np.sum(weights_T**2 * vars_T / m_T)))
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
    f"{wald.statistic:.1f} / {wald.df}",
    min(wald.pvalue, p_bound),
    mean,
    se,
    bound,
    law_error,
    effective_draws=wald.effective_draws,
    df=wald.df,
    pooled_mass=wald.pooled_mass,
  )
  return row, (wald.pvalue, p_bound, wald.why)


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


def _large_vocab_rows(block_fn, law, k, draft_len, vocab, samples, seed, key, level, chunk=1000):
  """Every position's law at a large vocabulary, the bonus included: draft and target laws
  that differ by depth but not by prefix (`sequences.llm_like` per depth), K drafts drawn
  by the law (i.i.d.; "wor": K distinct first tokens by Gumbel-top-k, each path then
  continuing alone), each block verified and completed by target draws. Under an exact
  verifier the completed token at position t is distributed as that depth's target law;
  per position, its Pearson chi-square in `num_bins` equal-mass bins of that law. Returns
  the rows and their p-values."""
  num_bins = 32
  pairs = [sequences.llm_like([seed, t], vocab) for t in range(draft_len + 1)]
  p_LxV = jnp.asarray(np.stack([p for p, _ in pairs[:draft_len]]), jnp.float32)
  q_L1xV = jnp.asarray(np.stack([q for _, q in pairs]), jnp.float32)
  p_KxLxV = jnp.broadcast_to(p_LxV, (k, draft_len, vocab))
  q_KxL1xV = jnp.broadcast_to(q_L1xV, (k, draft_len + 1, vocab))
  logp_LxV = jnp.log(p_LxV)

  def one(key):
    draft_key, verify_key, extend_key = jax.random.split(key, 3)
    columns = []
    for t, depth_key in enumerate(jax.random.split(draft_key, draft_len)):
      if law == "wor" and t == 0:  # K distinct tokens in drawn order: Gumbel-top-k
        x_K = jax.lax.top_k(logp_LxV[0] + jax.random.gumbel(depth_key, (vocab,)), k)[1]
      else:
        x_K = jax.vmap(sampling.categorical, (0, None))(jax.random.split(depth_key, k), p_LxV[t])
      columns.append(x_K.astype(jnp.int32))
    tokens_L1, num = block_fn(verify_key, jnp.stack(columns, 1), p_KxLxV, q_KxL1xV)
    completed = [
      jnp.where(
        t < num, tokens_L1[t], sampling.categorical(jax.random.fold_in(extend_key, t), q_L1xV[t])
      )
      for t in range(draft_len + 1)
    ]
    return jnp.stack(completed), num

  run = jax.jit(jax.vmap(one))
  keys = jax.random.split(key, samples)
  tokens, nums = [], []
  for start in range(0, samples, chunk):
    t, n = run(keys[start : start + chunk])
    tokens.append(np.asarray(t))
    nums.append(np.asarray(n, np.float64))
  tokens_NxL1, nums = np.concatenate(tokens), np.concatenate(nums)
  rows, pvalues = [], []
  for t in range(draft_len + 1):
    q = pairs[t][1]
    where = "bonus" if t == draft_len else f"position {t}"
    row = Row(
      f"llm_like V{vocab} {where}",
      law,
      k,
      t,
      vocab,
      "chi2-32k",
      "",
      tokens=float(nums.mean()),
      tokens_se=float(nums.std(ddof=1) / math.sqrt(samples)),
      detects=detectable_tv(samples, num_bins - 1, level, POWER),
      effective_draws=float(samples),
      df=num_bins - 1,
    )
    if np.any(q[tokens_NxL1[:, t]] <= 0):
      row.statistic, row.pvalue = "mass on q = 0", 0.0
    else:
      bin_of_token, bin_probs = sequences.equal_mass_bins(q, num_bins)
      counts = np.bincount(bin_of_token[tokens_NxL1[:, t]], minlength=num_bins)
      statistic, pvalue = sstats.chisquare(counts, bin_probs * samples)
      row.statistic, row.pvalue = f"{statistic:.1f} / {num_bins - 1}", float(pvalue)
    rows.append(row)
    pvalues.append(row.pvalue)
  return rows, pvalues


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
  draws: int | None = None,
) -> Report:
  """Checks that the verifier `fn` is exact for each drafting law in `laws`.

  The default mode is evidence: each law case of an informative tree kind (`INFORMATIVE`)
  gets the draws that make its law test reject any law at total variation `DETECT_TV`
  from the target with probability `POWER` at the report's per-test level, and the V =
  32k check every position's binned law at `LARGE_VOCAB_TV`; each row reports what it
  detects (`Row.detects`, `Report.power`). `quick=True` is a smoke test (a few law cases,
  few draws) and says so in its report.

  Args:
    fn: a verify function of the registry's signature for `level` (`spectr_jax.methods`):
      token level fn(key, drafts_K, p_V, q_V, valid_K) -> Verdict (walked over the block
      by `token_walk`), block level fn(key, drafts_KxL, p_KxLxV, q_KxL1xV) ->
      BlockVerdict. Bind extra keyword arguments (K-SEQ's rho) with functools.partial.
    level: "token" or "block".
    laws: the drafting laws it claims exactness for ("iid", "wor").
    name: how the report names it.
    seed: trees and keys.
    quick: the first `QUICK` law cases with `QUICK_DRAWS` each, a small V = 32k run.
    max_drafts: the largest K it takes (cases with more drafts run at this K; at 1 every
      law draws the same single draft, so only the first law's cases run).
    alpha: the report's false-alarm budget (Bonferroni over its tests).
    samples: deprecated: draws of every draft tuple alike (use `draws`).
    cases: the law cases (default `CASES`, or its first `QUICK` with quick).
    boundary: run the boundary-uniform checks.
    large_vocab: the vocabulary of the large-vocabulary check (None: skip it).
    large_samples: its blocks (default: those detecting `LARGE_VOCAB_TV`; quick 4000).
    draws: draws of every law case, allocated to its draft tuples by probability
      (default: as the mode sizes them).

  Returns:
    A `Report`: `.passed`, `.failures`, `.power()`, `.markdown()`.
  """
  for law in laws:
    if law not in LAWS:
      raise ValueError(f"unknown drafting law {law!r}; expected one of {LAWS}")
  if samples is not None:
    warnings.warn(
      "check_verifier(samples=...) (draws of every draft tuple) is deprecated: use "
      "draws=... (draws of a case, allocated to its tuples by probability)",
      DeprecationWarning,
      stacklevel=2,
    )
  block_fn = _block_fn(fn, level)
  if cases is None:
    cases = CASES[:QUICK] if quick else CASES
  if max_drafts is not None:
    cases = list(
      dict.fromkeys(dataclasses.replace(c, num_drafts=min(c.num_drafts, max_drafts)) for c in cases)
    )
  key = jax.random.key(seed)
  # With one draft every law draws it from p: their cases coincide and run once, as the
  # first law's rows.
  run_laws = laws[:1] if max_drafts == 1 else laws
  large_k, large_len = min(3, max_drafts or 3), 2
  # The report's tests, counted first: each test's level sizes the draws.
  num_tests = len(run_laws) * (2 * len(cases) + (large_len + 1 if large_vocab else 0))
  test_level = alpha / max(num_tests, 1)
  rows, pvalues = [], []  # pvalues[i]: the tests of row i
  for li, law in enumerate(run_laws):
    for ci, case in enumerate(cases):
      sample = _sampler(block_fn, case.draft_len, case.vocab)
      case_key = jax.random.fold_in(key, 1000 * li + ci)
      if samples is not None:
        sizing = dict(per_tuple=samples)
      elif draws is not None:
        sizing = dict(draws=draws)
      elif quick or case.kind not in INFORMATIVE:
        sizing = dict(draws=QUICK_DRAWS if quick else BOUNDARY_DRAWS)
      else:
        outcomes = case.vocab ** (case.draft_len + 1)
        sizing = dict(draws=draws_for(0.9 * DETECT_TV, outcomes - 1, test_level))
      row, (p_law, p_bound, why) = _law_case(sample, case, law, seed, case_key, **sizing)
      row.why = why
      if row.df:
        row.detects = detectable_tv(row.effective_draws, row.df, test_level, POWER, row.pooled_mass)
      rows.append(row)
      pvalues.append({"law": p_law, "above the LP bound": p_bound})
    if boundary:
      drafts = sorted({min(k, max_drafts or k) for k in (1, 2, 3)})
      for row in _boundary_rows(block_fn, law, drafts):
        rows.append(row)
        pvalues.append({})
    if large_vocab:
      n = large_samples or (
        QUICK_LARGE_SAMPLES if quick else draws_for(LARGE_VOCAB_TV, 31, test_level)
      )
      large_rows, large_pvalues = _large_vocab_rows(
        block_fn, law, large_k, large_len, large_vocab, n, seed,
        jax.random.fold_in(key, 10_000 + li), test_level,
      )  # fmt: skip
      rows += large_rows
      pvalues += [{"binned law": pvalue} for pvalue in large_pvalues]
  assert num_tests == sum(len(p) for p in pvalues)
  for row, tests in zip(rows, pvalues, strict=True):
    failed = [what for what, pvalue in tests.items() if pvalue < test_level]
    if failed:
      row.passed = False
      row.why = row.why or ", ".join(failed)
  name = name or getattr(fn, "__name__", "verifier")
  return Report(name, tuple(laws), alpha, rows, num_tests, "quick" if quick else "default")
