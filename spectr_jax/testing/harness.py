"""Exactness evidence for a verifier in one call: `check_verifier(fn, level=..., laws=...)`.

A verifier is exact for a drafting law when its emitted tokens, completed by target draws,
follow the target's sequence law. Per law, `check_verifier` runs three checks and returns
a `Report`: one row per case, with what each row would detect. The checks, their power
and what passing means: docs/NEW_VERIFIER.md, section 2.

- "law": small random trees. Every draft tuple the law can draw is enumerated with its
  exact probability w_t ("wor": `wor_reference.static_tree_law`; "topk": its one tree,
  `block_bound.topk_paths`). The verifier's own randomness is sampled, M_t draws for
  tuple t in proportion to w_t. The mixture estimate
  sum_t w_t P^_t is compared with `sequences.target_law` by a Wald chi-square. Its
  covariance is the exact stratified one, sum_t w_t^2 (diag(P_t) - P_t P_t^T) / M_t, with
  P_t estimated and outcomes of small expected count pooled. Any mass on an outcome of
  target probability 0 fails outright. Beside it, the mean tokens per round is tested
  against the law's LP bound (`block_bound.multiset_bound`) by a one-sided z-test.
- "boundary": one-hot targets, with every uniform and random word forced to its extremes
  (`jax.random.uniform` and `jax.random.bits` patched while the verifier is traced).
- "chi2-32k": every position of a block at V = 32000, in equal-mass bins, Pearson chi-square.

Draws are sized by `detectable_tv`: each `INFORMATIVE` case detects `DETECT_TV`, the V = 32k
rows `LARGE_VOCAB_TV`; `quick=True` is a smoke test, not evidence. Each test rejects at
alpha / (number of tests) (Bonferroni), and keys are fixed by `seed`. The statistics live
in `testing.power`, the `Report` in `testing.evidence` (both imported here).
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
from scipy import stats as sstats

from spectr_jax import block_bound, sampling, verify
from spectr_jax.testing import sequences, wor_reference
from spectr_jax.testing.evidence import Report, Row
from spectr_jax.testing.power import (
  DETECT_TV,
  INFORMATIVE,
  LARGE_VOCAB_TV,
  POWER,
  detectable_tv,
  draws_for,
  wald,
)

__all__ = [
  "CASES",
  "Case",
  "Report",
  "Row",
  "check_verifier",
  "forced_randomness",
  "token_walk",
]

LAWS = ("iid", "wor", "topk")
# The laws whose first tokens are distinct (later depths continue each path alone).
_DISTINCT_FIRST = ("wor", "topk")
BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
# Enumeration limit: draft tuples per case.
_MAX_TUPLES = 4096
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
  if law == "topk":  # deterministic: one tuple
    codes = block_bound.topk_paths(np.asarray(p_tab, np.float64), num_drafts, draft_len)
    return np.array([codes], np.int64), np.ones(1)
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


def _allocation(weights_T, draws: int) -> np.ndarray:
  """Draws per tuple: in proportion to the tuple's probability, at least MIN_PER_TUPLE."""
  return np.maximum(np.ceil(draws * weights_T).astype(np.int64), MIN_PER_TUPLE)


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
  law_test = wald(counts_TxO, weights_T, target_O, m_T)
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
    f"{law_test.statistic:.1f} / {law_test.df}",
    min(law_test.pvalue, p_bound),
    mean,
    se,
    bound,
    law_error,
    effective_draws=law_test.effective_draws,
    df=law_test.df,
    pooled_mass=law_test.pooled_mass,
  )
  return row, (law_test.pvalue, p_bound, law_test.why)


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
  it); under "wor" and "topk" the first tokens are distinct (paths continue alone)."""
  forbidden = [t for t in range(vocab) if t != allowed]
  paths = []
  for i in range(k):
    if law in _DISTINCT_FIRST:
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
      if law in _DISTINCT_FIRST and k > vocab - 1:
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
  continuing alone; "topk": the K most likely first tokens, each path then continuing
  with the most likely token), each block verified and completed by target draws. Under
  an exact verifier the completed token at position t is distributed as that depth's
  target law; per position, its Pearson chi-square in `num_bins` equal-mass bins of that
  law. Returns (row, {"binned law": p-value}) per position."""
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
      elif law == "topk":  # deterministic: the K most likely first, then the most likely
        x_K = sampling.top_tokens(p_LxV[t], k if t == 0 else 1)[0]
        x_K = jnp.broadcast_to(x_K, (k,))
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
  checked = []
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
    checked.append((row, {"binned law": row.pvalue}))
  return checked


# ------------------------------------------------------------------------ entry point


def _check_arguments(laws: Sequence[str], samples: int | None):
  """Raises on an unknown drafting law; warns that `samples` is deprecated."""
  for law in laws:
    if law not in LAWS:
      raise ValueError(f"unknown drafting law {law!r}; expected one of {LAWS}")
  if samples is not None:
    warnings.warn(
      "check_verifier(samples=...) (draws of every draft tuple) is deprecated: use "
      "draws=... (draws of a case, allocated to its tuples by probability)",
      DeprecationWarning,
      stacklevel=3,
    )


def _resolve_cases(
  cases: Sequence[Case] | None, quick: bool, max_drafts: int | None
) -> Sequence[Case]:
  """The law cases to run: `cases` (default `CASES`, its first `QUICK` with quick), at
  most `max_drafts` drafts each (cases that then coincide run once)."""
  if cases is None:
    cases = CASES[:QUICK] if quick else CASES
  if max_drafts is not None:
    cases = list(
      dict.fromkeys(dataclasses.replace(c, num_drafts=min(c.num_drafts, max_drafts)) for c in cases)
    )
  return cases


def _sizing(case: Case, level: float, quick: bool, samples, draws) -> dict:
  """The draws of a law case, as `_law_case`'s keyword: `samples` per tuple, `draws`,
  the fixed draws of quick mode and of uninformative kinds, or those detecting
  `DETECT_TV` at `level`."""
  if samples is not None:
    return dict(per_tuple=samples)
  if draws is not None:
    return dict(draws=draws)
  if quick or case.kind not in INFORMATIVE:
    return dict(draws=QUICK_DRAWS if quick else BOUNDARY_DRAWS)
  outcomes = case.vocab ** (case.draft_len + 1)
  return dict(draws=draws_for(0.9 * DETECT_TV, outcomes - 1, level))


def _law_rows(block_fn, law, law_index, cases, seed, key, level, *, quick, samples, draws):
  """(row, {test: p-value}) of each law case of one drafting law (case i under
  fold_in(key, 1000 * law_index + i)), with what the row detects at `level`."""
  checked = []
  for ci, case in enumerate(cases):
    sample = _sampler(block_fn, case.draft_len, case.vocab)
    case_key = jax.random.fold_in(key, 1000 * law_index + ci)
    sizing = _sizing(case, level, quick, samples, draws)
    row, (p_law, p_bound, why) = _law_case(sample, case, law, seed, case_key, **sizing)
    row.why = why
    if row.df:
      row.detects = detectable_tv(row.effective_draws, row.df, level, POWER, row.pooled_mass)
    checked.append((row, {"law": p_law, "above the LP bound": p_bound}))
  return checked


def _judge(checked: list[tuple[Row, dict]], num_tests: int, level: float) -> list[Row]:
  """The rows, each failed where one of its `num_tests` tests (counted first) is below
  `level` (its why: the failed tests, unless set)."""
  assert num_tests == sum(len(tests) for _, tests in checked)
  for row, tests in checked:
    failed = [what for what, pvalue in tests.items() if pvalue < level]
    if failed:
      row.passed = False
      row.why = row.why or ", ".join(failed)
  return [row for row, _ in checked]


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
    laws: the drafting laws it claims exactness for ("iid", "wor", "topk").
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
  _check_arguments(laws, samples)
  block_fn = _block_fn(fn, level)
  cases = _resolve_cases(cases, quick, max_drafts)
  key = jax.random.key(seed)
  # With one draft every law draws it from p: their cases coincide and run once, as the
  # first law's rows.
  run_laws = laws[:1] if max_drafts == 1 else laws
  large_k, large_len = min(3, max_drafts or 3), 2
  # The report's tests, counted first: each test's level sizes the draws.
  num_tests = len(run_laws) * (2 * len(cases) + (large_len + 1 if large_vocab else 0))
  test_level = alpha / max(num_tests, 1)
  checked = []  # (row, {test: p-value}) per row
  for li, law in enumerate(run_laws):
    checked += _law_rows(
      block_fn, law, li, cases, seed, key, test_level, quick=quick, samples=samples, draws=draws
    )
    if boundary:
      drafts = sorted({min(k, max_drafts or k) for k in (1, 2, 3)})
      checked += [(row, {}) for row in _boundary_rows(block_fn, law, drafts)]
    if large_vocab:
      n = large_samples or (
        QUICK_LARGE_SAMPLES if quick else draws_for(LARGE_VOCAB_TV, 31, test_level)
      )
      checked += _large_vocab_rows(
        block_fn, law, large_k, large_len, large_vocab, n, seed,
        jax.random.fold_in(key, 10_000 + li), test_level,
      )  # fmt: skip
  rows = _judge(checked, num_tests, test_level)
  name = name or getattr(fn, "__name__", "verifier")
  return Report(name, tuple(laws), alpha, rows, num_tests, "quick" if quick else "default")
