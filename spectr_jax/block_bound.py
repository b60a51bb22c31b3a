"""Exact block-level analysis on enumerable draft trees (docs/BLOCK_VERIFICATION.md).

A *tree* is a pair of tables `p_tab`, `q_tab` of shape (L + 1) x V^L x V:
`p_tab[t, c]` = p(. | prefix) for the prefix of length t whose base-V code is c < V^t
(first token most significant); likewise `q_tab` (row t = L is the bonus law). K draft
paths are drawn i.i.d. from p's sequence law.

- `block_value`, `block_law`: the exact expected tokens per round and the exact output law
  of `block.block_verify` ("block" / "gbv" / "gbv_tp"): every K-tuple of paths and every
  outcome of the path selection enumerated, float64. "gbv"'s per-node selection plans come
  from `optimal.optimal_plan` (float32, as in the library). For "gbv_tp" the selected
  path is the lexicographic maximum of the tuple in the order of `block.ratio_rank`, and
  its draft law is the library's `block.skewed_law` run in float64, with x_u and C_u
  summed over the enumerated prefixes (not the library's recursion): so the law matches
  the target only if the closed form is the law of the selection (`selected_path_law`).
- `multiset_bound`: the largest expected tokens per round of ANY exact verifier that sees
  the draft paths (and every probability of the tree), for any drafting law given as the
  law of the multiset of paths (`MULTISETS`: one function per drafting scheme of
  `methods.DRAFTING`); `block_bound` for K i.i.d. paths. The multi-path verification LP,
  solved by HiGHS over multisets of paths. Needs scipy (imported inside the function).

Cost grows as V^(L K); meant for V^(L K) <= 4096.
"""

import itertools
import math
from collections.abc import Callable

import jax
import numpy as np

from spectr_jax import block, optimal

__all__ = [
  "MULTISETS",
  "block_bound",
  "block_law",
  "block_value",
  "iid_multisets",
  "multiset_bound",
  "path_probs",
  "selected_path_law",
  "selection_probs",
  "topk_multisets",
  "topk_paths",
  "wor_multisets",
]


def path_probs(p_tab, draft_len: int) -> np.ndarray:
  """Sequence-law probability of every path (index = base-V code), shape V^L."""
  vocab = p_tab.shape[-1]
  probs = np.ones(1)
  for t in range(draft_len):
    probs = (probs[:, None] * p_tab[t, : vocab**t]).ravel()
  return probs


def selection_probs(x, levels_V1, slot_V) -> dict[int, float]:
  """P(Z = token | drafts x) for the selection rule of `block.select` (and `optimal`).

  Integrates over the level uniform exactly: between consecutive distinct levels the
  active breakpoints do not change; the pick is uniform over the group's drafts.
  """
  slots = [int(slot_V[xi]) for xi in x]
  first = min(slots)
  out, prev = {}, 0.0
  for level in np.unique(levels_V1[levels_V1 > 0]):
    end = min(j for j in range(first, len(levels_V1)) if levels_V1[j] >= level)
    group = [xi for xi, s in zip(x, slots, strict=True) if s <= end]
    for xi in group:
      out[int(xi)] = out.get(int(xi), 0.0) + (level - prev) / len(group)
    prev = level
  return out


def _stops(weights, draft_rows, target_rows):
  """The stop probabilities h_0..h_L of a block plan (as `block.block_plan`)."""
  w = np.array(weights)
  rho = np.maximum(w[:, None] * target_rows - draft_rows, 0).sum(axis=1)
  denom = rho + 1 - w
  stop = np.where(denom > 0, rho / np.where(denom > 0, denom, 1), 0)
  stop[-1], stop[0] = w[-1], 1.0
  return w, stop


class _Tree:
  """Per-node plans of the selection rule, cached (float32 like the library, then f64)."""

  def __init__(self, p_tab, q_tab, draft_len):
    self.p_tab, self.q_tab, self.draft_len = p_tab, q_tab, draft_len
    self.vocab = p_tab.shape[-1]
    self._plans = {}

  def node(self, t, code, k):
    if (t, code, k) not in self._plans:
      plan = optimal.optimal_plan(
        np.float32(self.p_tab[t, code]), np.float32(self.q_tab[t, code]), k
      )
      self._plans[(t, code, k)] = (
        np.asarray(plan.levels_Vs1, np.float64),
        np.asarray(plan.slot_V),
        np.asarray(plan.r_V, np.float64),
      )
    return self._plans[(t, code, k)]

  def outcomes(self, paths):
    """Every outcome of "gbv"'s path selection for the draft paths (token tuples).

    Yields (prob, path, weight_L1, stop_L1, draft_L1xV, target_L1xV) as in `BlockPlan`.
    """
    draft_len, vocab = self.draft_len, self.vocab
    stack = [(0, 0, tuple(paths), 1.0, [1.0], [], [], [])]
    while stack:
      t, code, alive, prob, weights, path, drafts, targets = stack.pop()
      q = self.q_tab[t, code]
      if t == draft_len:
        draft_rows = np.array(drafts + [np.zeros(vocab)])
        target_rows = np.array(targets + [q])
        yield prob, path, *_stops(weights, draft_rows, target_rows), draft_rows, target_rows
        continue
      p = self.p_tab[t, code]
      x = [a[t] for a in alive]
      if len(alive) == 1:
        r, choice = p, {x[0]: 1.0}
      else:
        levels, slot, r = self.node(t, code, len(alive))
        choice = selection_probs(x, levels, slot)
      for z, pz in choice.items():
        w = min(1.0, weights[-1] * q[z] / r[z]) if r[z] > 0 else 0.0
        stack.append(
          (
            t + 1,
            code * vocab + z,
            tuple(a for a in alive if a[t] == z),
            prob * pz,
            weights + [w],
            path + [z],
            drafts + [r],
            targets + [q],
          )
        )


def _tuples(p_tab, num_drafts, draft_len):
  vocab = p_tab.shape[-1]
  paths = list(itertools.product(range(vocab), repeat=draft_len))
  probs = path_probs(p_tab, draft_len)
  for idx in itertools.product(range(len(paths)), repeat=num_drafts):
    yield np.prod(probs[list(idx)]), [paths[i] for i in idx]


class _MaxTree:
  """ "gbv_tp" on an enumerable tree, float64: node orders and skewed laws from the
  library's `block.ratio_rank` and `block.skewed_law` run with 64-bit floats."""

  def __init__(self, p_tab, q_tab, num_drafts, draft_len):
    self.p_tab, self.q_tab = np.asarray(p_tab, np.float64), np.asarray(q_tab, np.float64)
    self.num_drafts, self.draft_len = num_drafts, draft_len
    self.vocab = p_tab.shape[-1]
    self._orders, self._shares = {}, {}

  def order(self, t, code):
    """(rank_V, below_V) of `block.ratio_rank` at the node."""
    if (t, code) not in self._orders:
      with jax.enable_x64(True):
        rank, below = block.ratio_rank(self.p_tab[t, code], self.q_tab[t, code])
      self._orders[(t, code)] = np.asarray(rank), np.asarray(below, np.float64)
    return self._orders[(t, code)]

  def key(self, path):
    """The path's place in the lexicographic order: its tokens' ranks, depth by depth."""
    key, code = [], 0
    for t, z in enumerate(path):
      key.append(int(self.order(t, code)[0][z]))
      code = code * self.vocab + z
    return tuple(key)

  def shares(self, t, code):
    """(x_u / C_u, A / C_u) at the node u, summed over every prefix of length t."""
    if t not in self._shares:
      probs = path_probs(self.p_tab, t)
      keys = [self.key(np.unravel_index(c, (self.vocab,) * t)) for c in range(probs.size)]
      self._shares[t] = probs, keys
    probs, keys = self._shares[t]
    below = sum(prob for prob, k in zip(probs, keys, strict=True) if k < keys[code])
    at = probs[code]
    return at / (at + below), below / (at + below)

  def path_law(self):
    """P(Z = z) for the lexicographic maximum Z of K i.i.d. paths, by enumeration."""
    law = {}
    for weight, paths in _tuples(self.p_tab, self.num_drafts, self.draft_len):
      if weight > 0:
        z = max((tuple(path) for path in paths), key=self.key)
        law[z] = law.get(z, 0.0) + weight
    return law

  def outcomes(self):
    """Yields (prob, path, weight_L1, stop_L1, draft_L1xV, target_L1xV) per path Z."""
    for path, prob in self.path_law().items():
      code, weights, drafts, targets = 0, [1.0], [], []
      for t, z in enumerate(path):
        x, a = self.shares(t, code)
        with jax.enable_x64(True):
          s = block.skewed_law(self.p_tab[t, code], self.order(t, code)[1], x, a, self.num_drafts)
        s, q = np.asarray(s, np.float64), self.q_tab[t, code]
        weights.append(min(1.0, weights[-1] * q[z] / s[z]) if s[z] > 0 else 0.0)
        drafts.append(s)
        targets.append(q)
        code = code * self.vocab + z
      draft_rows = np.array(drafts + [np.zeros(self.vocab)])
      target_rows = np.array(targets + [self.q_tab[self.draft_len, code]])
      yield prob, list(path), *_stops(weights, draft_rows, target_rows), draft_rows, target_rows


def selected_path_law(p_tab, q_tab, num_drafts: int, draft_len: int) -> dict[tuple, float]:
  """The exact law of "gbv_tp"'s selected path (token tuples), by enumerating K-tuples."""
  return _MaxTree(p_tab, q_tab, num_drafts, draft_len).path_law()


def _outcomes(p_tab, q_tab, num_drafts, draft_len, method):
  """Every (prob, path, weight_L1, stop_L1, draft_L1xV, target_L1xV) of the method."""
  if method == "gbv_tp":
    yield from _MaxTree(p_tab, q_tab, num_drafts, draft_len).outcomes()
    return
  if method not in ("block", "gbv"):
    raise ValueError(f"no exact enumeration of method {method!r}; expected block, gbv, gbv_tp")
  tree = _Tree(p_tab, q_tab, draft_len)
  for weight, paths in _tuples(p_tab, num_drafts, draft_len):
    for prob, *rest in tree.outcomes(paths):
      yield weight * prob, *rest


def block_value(p_tab, q_tab, num_drafts: int, draft_len: int, method: str = "gbv") -> float:
  """Exact E[tokens per round] of `block.block_verify`: 1 + E[sum_{i=1..L} w_i].

  ("block" for K = 1, "gbv" or "gbv_tp" for any K; P(tau >= i | history) = w_i.)
  Enumerates every K-tuple of paths and every outcome of the selection.
  """
  value = 1.0
  for prob, _, w, _, _, _ in _outcomes(p_tab, q_tab, num_drafts, draft_len, method):
    value += prob * w[1:].sum()
  return float(value)


def block_law(p_tab, q_tab, num_drafts: int, draft_len: int, method: str = "gbv"):
  """Exact law of `block.block_verify`'s output completed by exact target draws.

  Returns (law, num_law): law over V^(L+1) sequences (base-V code) and the law of
  num_tokens (index 1..L+1; index 0 is 0). Exactness means law = the target's law.
  """
  vocab = p_tab.shape[-1]
  law = np.zeros(vocab ** (draft_len + 1))
  num_law = np.zeros(draft_len + 2)
  for prob, path, w, stop, draft_rows, target_rows in _outcomes(
    p_tab, q_tab, num_drafts, draft_len, method
  ):
    after = np.concatenate([np.cumprod(1 - stop[::-1])[::-1][1:], [1.0]])
    tau_law = prob * stop * after  # P(tau = i) = h_i prod_{j > i} (1 - h_j)
    for tau in range(draft_len + 1):
      if tau_law[tau] <= 0:
        continue
      target = target_rows[tau]
      left = np.maximum(w[tau] * target - draft_rows[tau], 0)
      y_law = left / left.sum() if tau < draft_len and left.sum() > 0 else target
      num_law[tau + 1] += tau_law[tau]
      code = 0
      for z in path[:tau]:
        code = code * vocab + z
      prefix_law = np.zeros(vocab ** (tau + 1))
      prefix_law[code * vocab : (code + 1) * vocab] = tau_law[tau] * y_law
      for t in range(tau + 1, draft_len + 1):  # complete with exact target draws
        prefix_law = (prefix_law[:, None] * q_tab[t, : vocab**t]).ravel()
      law += prefix_law
  return law, num_law


def iid_multisets(p_tab, num_drafts: int, draft_len: int) -> dict[tuple[int, ...], float]:
  """The law of the multiset of K i.i.d. paths: {sorted tuple of path codes: probability}
  (multisets of probability 0 left out)."""
  probs = path_probs(np.asarray(p_tab, np.float64), draft_len)
  support = [int(c) for c in np.flatnonzero(probs > 0)]
  law = {}
  for m in itertools.combinations_with_replacement(support, num_drafts):
    counts = np.unique(m, return_counts=True)[1]
    mult = math.factorial(num_drafts) / np.prod([math.factorial(int(c)) for c in counts])
    law[m] = mult * float(np.prod(probs[list(m)]))
  return law


def wor_multisets(p_tab, num_drafts: int, draft_len: int) -> dict[tuple[int, ...], float]:
  """The law of the multiset of the K paths of `drafting.without_replacement`: the first
  tokens drawn without replacement from p_tab[0, 0] (successive draws), each path then
  i.i.d. from its own prefix; where s < K tokens have mass, the K - s extra paths are
  copies of the first drawn path (no new node of the draft tree, so no new chance).
  Multisets of probability 0 left out."""
  p_tab = np.asarray(p_tab, np.float64)
  vocab = p_tab.shape[-1]
  first_V = p_tab[0, 0]
  probs = path_probs(p_tab, draft_len)
  span = vocab ** (draft_len - 1)  # paths per first token
  support = [int(y) for y in np.flatnonzero(first_V > 0)]
  law = {}
  for x in itertools.permutations(support, min(num_drafts, len(support))):
    weight, left = 1.0, first_V.copy()
    for y in x:  # successive draws: P(y | drawn so far) = p(y) / p(not yet drawn)
      weight *= first_V[y] / left.sum()
      left[y] = 0.0
    tails = [
      [(c, probs[c] / first_V[y]) for c in range(y * span, (y + 1) * span) if probs[c] > 0]
      for y in x
    ]
    for combo in itertools.product(*tails):
      codes = [c for c, _ in combo] + [combo[0][0]] * (num_drafts - len(x))
      key = tuple(sorted(codes))
      law[key] = law.get(key, 0.0) + weight * float(np.prod([w for _, w in combo]))
  return law


def topk_paths(p_tab, num_drafts: int, draft_len: int) -> list[int]:
  """The K paths of `drafting.topk_depths` with the default branching, in order (base-V
  codes): the first tokens are the K most likely of p_tab[0, 0] (ties to the lower
  index), each path then takes its prefix's most likely token at every depth; where s < K
  tokens have mass, the K - s extra paths are copies of the first."""
  p_tab = np.asarray(p_tab, np.float64)
  vocab, first_V = p_tab.shape[-1], p_tab[0, 0]
  order = np.argsort(-first_V, kind="stable")[:num_drafts]
  paths = []
  for code in (int(y) for y in order if first_V[y] > 0):
    for t in range(1, draft_len):
      code = code * vocab + int(np.argmax(p_tab[t, code]))
    paths.append(code)
  return paths + paths[:1] * (num_drafts - len(paths))


def topk_multisets(p_tab, num_drafts: int, draft_len: int) -> dict[tuple[int, ...], float]:
  """The law of the multiset of the K paths of `drafting.topk_depths`: one multiset,
  probability 1 (`topk_paths`)."""
  return {tuple(sorted(topk_paths(p_tab, num_drafts, draft_len))): 1.0}


# The law of the multiset of draft paths of each drafting scheme (`methods.DRAFTING`), as
# (p_tab, K, L) -> {sorted tuple of path codes: probability}: the block-level bound of a
# method is `multiset_bound` of its scheme's law.
MULTISETS: dict[str, Callable] = {
  "iid": iid_multisets,
  "wor": wor_multisets,
  "topk": topk_multisets,
}


def block_bound(p_tab, q_tab, num_drafts: int, draft_len: int) -> float:
  """`multiset_bound` for K i.i.d. draft paths (`iid_multisets`)."""
  return multiset_bound(p_tab, q_tab, iid_multisets(p_tab, num_drafts, draft_len), draft_len)


def multiset_bound(p_tab, q_tab, multisets: dict[tuple[int, ...], float], draft_len: int) -> float:
  """The multi-path verification LP: max E[tokens per round] over all exact verifiers.

  A verifier sees the draft paths X (and the whole tree) and emits a string s = u y: u a
  node of X's draft tree (a prefix of some path, |u| <= L), y any token; then the target
  continues. Variables pi(m, u, y) >= 0 over multisets m of paths (the constraints see
  the paths only through their draft tree, so a verifier that also sees their order
  gains nothing). Constraints:
    sum_{u, y} pi(m, u, y) = P(m)                                 (the drafts' law)
    c(s) = c(u) q(y | u) - Pi(s),  c(empty) = 1,  c(s) = 0 at |s| = L + 1
  where Pi(s) = sum_m pi(m, u, y) is the law of the emitted string and c(s) >= 0 the target
  mass still to be emitted below s; the output is then exactly the target's law. Objective:
  max sum pi(m, u, y) (|u| + 1). Solved exactly by scipy's HiGHS.

  Args:
    p_tab, q_tab: the tree (module docstring).
    multisets: the drafting law, {sorted tuple of path codes: probability} (`MULTISETS`).
    draft_len: L.

  Returns:
    The optimum, in tokens per round (1 <= bound <= L + 1).
  """
  from scipy import sparse
  from scipy.optimize import linprog

  q_tab = np.asarray(q_tab, np.float64)
  vocab = q_tab.shape[-1]
  # Strings of length 1..L (the c variables) and 1..L+1 (the rows), by (length, code).
  c_index = {}
  for j in range(1, draft_len + 1):
    for code in range(vocab**j):
      c_index[(j, code)] = len(c_index)
  row_index = {}
  for j in range(1, draft_len + 2):
    for code in range(vocab**j):
      row_index[(j, code)] = len(row_index)
  num_multisets = len(multisets)
  rows, cols, vals, costs, rhs_m = [], [], [], [], []
  for i, (m, prob) in enumerate(multisets.items()):
    rhs_m.append(prob)
    nodes = {(0, 0)}
    for path in set(m):
      for j in range(1, draft_len + 1):
        nodes.add((j, path // vocab ** (draft_len - j)))
    for j, code in sorted(nodes):
      for y in range(vocab):
        col = len(costs)
        costs.append(-(j + 1.0))
        rows += [i, num_multisets + row_index[(j + 1, code * vocab + y)]]
        cols += [col, col]
        vals += [1.0, 1.0]
  num_pi = len(costs)
  rhs_s = np.zeros(len(row_index))
  # c terms of the string rows: + c(s) (|s| <= L), - q(y | u) c(u) (|u| >= 1), or the
  # constant q(y | empty) on the right side.
  for (j, code), r in row_index.items():
    u, y = code // vocab, code % vocab
    if j <= draft_len:
      rows.append(num_multisets + r)
      cols.append(num_pi + c_index[(j, code)])
      vals.append(1.0)
    if j == 1:
      rhs_s[r] = q_tab[0, 0, y]
    else:
      rows.append(num_multisets + r)
      cols.append(num_pi + c_index[(j - 1, u)])
      vals.append(-q_tab[j - 1, u, y])
  num_vars = num_pi + len(c_index)
  a_eq = sparse.csr_matrix(
    (vals, (np.array(rows), np.array(cols))), shape=(num_multisets + len(row_index), num_vars)
  )
  b_eq = np.concatenate([rhs_m, rhs_s])
  cost = np.concatenate([costs, np.zeros(len(c_index))])
  # HiGHS's default choice, with presolve, wrongly reports some of these LPs infeasible
  # (a trivially feasible point exists: emit one target token); dual simplex does not.
  for method, options in (("highs-ds", {}), ("highs-ipm", {"presolve": False})):
    res = linprog(cost, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method=method, options=options)
    if res.success:
      break
  else:
    raise RuntimeError(f"block_bound LP failed: {res.message}")
  return float(-res.fun)
