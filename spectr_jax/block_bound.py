"""Exact block-level analysis on enumerable draft trees (docs/BLOCK_VERIFICATION.md).

A *tree* is a pair of tables `p_tab`, `q_tab` of shape (L + 1) x V^L x V:
`p_tab[t, c]` = p(. | prefix) for the prefix of length t whose base-V code is c < V^t
(first token most significant); likewise `q_tab` (row t = L is the bonus law). K draft
paths are drawn i.i.d. from p's sequence law.

- `block_value`, `block_law`: the exact expected tokens per round and the exact output law
  of `block.block_verify` ("block" / "gbv"): every K-tuple of paths and every outcome of
  the path selection enumerated, float64 (the per-node selection plans come from
  `optimal.optimal_plan`, as in the library).
- `block_bound`: the largest expected tokens per round of ANY exact verifier that sees the
  K paths (and every probability of the tree): the multi-path verification LP, solved by
  HiGHS over multisets of paths. Needs scipy (imported inside the function).

Cost grows as V^(L K); meant for V^(L K) <= 4096.
"""

import itertools
import math

import numpy as np

from spectr_jax import optimal

__all__ = ["block_bound", "block_law", "block_value", "path_probs", "selection_probs"]


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
        np.asarray(plan.levels_N1, np.float64),
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
        w = np.array(weights)
        rho = np.maximum(w[:, None] * target_rows - draft_rows, 0).sum(axis=1)
        denom = rho + 1 - w
        stop = np.where(denom > 0, rho / np.where(denom > 0, denom, 1), 0)
        stop[draft_len], stop[0] = w[draft_len], 1.0
        yield prob, path, w, stop, draft_rows, target_rows
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


def block_value(p_tab, q_tab, num_drafts: int, draft_len: int) -> float:
  """Exact E[tokens per round] of `block.block_verify`: 1 + E[sum_{i=1..L} w_i].

  ("block" for K = 1, "gbv" for any K; P(tau >= i | history) = w_i.) Enumerates every
  K-tuple of paths and every outcome of the selection.
  """
  tree = _Tree(p_tab, q_tab, draft_len)
  value = 1.0
  for weight, paths in _tuples(p_tab, num_drafts, draft_len):
    for prob, _, w, _, _, _ in tree.outcomes(paths):
      value += weight * prob * w[1:].sum()
  return float(value)


def block_law(p_tab, q_tab, num_drafts: int, draft_len: int):
  """Exact law of `block.block_verify`'s output completed by exact target draws.

  Returns (law, num_law): law over V^(L+1) sequences (base-V code) and the law of
  num_tokens (index 1..L+1; index 0 is 0). Exactness means law = the target's law.
  """
  vocab = p_tab.shape[-1]
  tree = _Tree(p_tab, q_tab, draft_len)
  law = np.zeros(vocab ** (draft_len + 1))
  num_law = np.zeros(draft_len + 2)
  for weight, paths in _tuples(p_tab, num_drafts, draft_len):
    for prob, path, w, stop, draft_rows, target_rows in tree.outcomes(paths):
      after = np.concatenate([np.cumprod(1 - stop[::-1])[::-1][1:], [1.0]])
      tau_law = weight * prob * stop * after  # P(tau = i) = h_i prod_{j > i} (1 - h_j)
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


def block_bound(p_tab, q_tab, num_drafts: int, draft_len: int) -> float:
  """The multi-path verification LP: max E[tokens per round] over all exact verifiers.

  A verifier sees the K i.i.d. paths X (and the whole tree) and emits a string s = u y:
  u a node of X's draft tree (a prefix of some path, |u| <= L), y any token; then the
  target continues. Variables pi(m, u, y) >= 0 over multisets m of paths (an optimum is
  symmetric in the paths). Constraints:
    sum_{u, y} pi(m, u, y) = P(m)                                 (the drafts' law)
    c(s) = c(u) q(y | u) - Pi(s),  c(empty) = 1,  c(s) = 0 at |s| = L + 1
  where Pi(s) = sum_m pi(m, u, y) is the law of the emitted string and c(s) >= 0 the target
  mass still to be emitted below s; the output is then exactly the target's law. Objective:
  max sum pi(m, u, y) (|u| + 1). Solved exactly by scipy's HiGHS.

  Args:
    p_tab, q_tab: the tree (module docstring). num_drafts: K. draft_len: L.

  Returns:
    The optimum, in tokens per round (1 <= bound <= L + 1).
  """
  from scipy import sparse
  from scipy.optimize import linprog

  p_tab, q_tab = np.asarray(p_tab, np.float64), np.asarray(q_tab, np.float64)
  vocab = p_tab.shape[-1]
  num_paths = vocab**draft_len
  probs = path_probs(p_tab, draft_len)
  # Strings of length 1..L (the c variables) and 1..L+1 (the rows), by (length, code).
  c_index = {}
  for j in range(1, draft_len + 1):
    for code in range(vocab**j):
      c_index[(j, code)] = len(c_index)
  row_index = {}
  for j in range(1, draft_len + 2):
    for code in range(vocab**j):
      row_index[(j, code)] = len(row_index)
  rows, cols, vals, costs = [], [], [], []
  num_multisets = 0
  rhs_m = []
  for m in itertools.combinations_with_replacement(range(num_paths), num_drafts):
    counts = np.bincount(m, minlength=num_paths)[list(set(m))]
    mult = math.factorial(num_drafts) / np.prod([math.factorial(c) for c in counts])
    rhs_m.append(mult * np.prod(probs[list(m)]))
    nodes = {(0, 0)}
    for path in set(m):
      for j in range(1, draft_len + 1):
        nodes.add((j, path // vocab ** (draft_len - j)))
    for j, code in sorted(nodes):
      for y in range(vocab):
        col = len(costs)
        costs.append(-(j + 1.0))
        rows += [num_multisets, 0]
        cols += [col, col]
        vals += [1.0, 1.0]
        rows[-1] = -1 - row_index[(j + 1, code * vocab + y)]  # string row, fixed below
    num_multisets += 1
  num_pi = len(costs)
  rows = np.array(rows)
  rows = np.where(rows < 0, num_multisets + (-1 - rows), rows)
  rhs_s = np.zeros(len(row_index))
  # c terms of the string rows: + c(s) (|s| <= L), - q(y | u) c(u) (|u| >= 1), or the
  # constant q(y | empty) on the right side.
  for (j, code), r in row_index.items():
    u, y = code // vocab, code % vocab
    if j <= draft_len:
      rows = np.append(rows, num_multisets + r)
      cols.append(num_pi + c_index[(j, code)])
      vals.append(1.0)
    if j == 1:
      rhs_s[r] = q_tab[0, 0, y]
    else:
      rows = np.append(rows, num_multisets + r)
      cols.append(num_pi + c_index[(j - 1, u)])
      vals.append(-q_tab[j - 1, u, y])
  num_vars = num_pi + len(c_index)
  a_eq = sparse.csr_matrix(
    (vals, (rows, np.array(cols))), shape=(num_multisets + len(row_index), num_vars)
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
