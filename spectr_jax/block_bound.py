"""Exact block-level analysis on enumerable draft trees (docs/BLOCK_VERIFICATION.md).

A *tree* is a pair of tables `p_tab`, `q_tab` of shape (L + 1) x V^L x V:
`p_tab[t, c]` = p(. | prefix) for the prefix of length t whose base-V code is c < V^t
(first token most significant); likewise `q_tab` (row t = L is the bonus law). K draft
paths are drawn i.i.d. from p's sequence law.

- `tree_blocks`: every ordered K-tuple of paths as `verify_block` inputs, with its weight.
- `block_value`, `block_law`: the exact expected tokens per round and the exact output law
  of `block.block_verify` ("block" / "gbv"), from its plan (no sampling).
- `block_bound`: the largest expected tokens per round of ANY exact verifier that sees the
  K paths (and every probability of the tree): the multi-path verification LP, solved by
  HiGHS over multisets of paths. Needs scipy (imported inside the function).

Cost grows as V^(L K); meant for V^(L K) <= 4096.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from spectr_jax import block

__all__ = ["block_bound", "block_law", "block_value", "path_probs", "tree_blocks"]


def _digits(code: int, length: int, vocab: int) -> list[int]:
  return [(code // vocab ** (length - 1 - t)) % vocab for t in range(length)]


def path_probs(p_tab, draft_len: int) -> np.ndarray:
  """Sequence-law probability of every path (index = base-V code), shape V^L."""
  vocab = p_tab.shape[-1]
  probs = np.ones(1)
  for t in range(draft_len):
    probs = (probs[:, None] * p_tab[t, : vocab**t]).ravel()
  return probs


def tree_blocks(p_tab, q_tab, num_drafts: int, draft_len: int):
  """All V^(L K) ordered K-tuples of draft paths, as `verify_block` inputs.

  Returns (weight_N, drafts_NxKxL, p_NxKxLxV, q_NxKxL1xV), N = V^(L K), float64 weights.
  """
  vocab = p_tab.shape[-1]
  num_paths = vocab**draft_len
  tokens_PxL = np.array([_digits(c, draft_len, vocab) for c in range(num_paths)], np.int32)
  prefix_PxL1 = np.array(
    [[c // vocab ** (draft_len - t) for t in range(draft_len + 1)] for c in range(num_paths)]
  )
  t_idx = np.arange(draft_len + 1)
  p_PxLxV = p_tab[t_idx[:-1], prefix_PxL1[:, :-1]]
  q_PxL1xV = q_tab[t_idx, prefix_PxL1]
  probs = path_probs(p_tab, draft_len)
  tuples_NxK = np.array(list(itertools.product(range(num_paths), repeat=num_drafts)))
  weight_N = np.prod(probs[tuples_NxK], axis=1)
  return weight_N, tokens_PxL[tuples_NxK], p_PxLxV[tuples_NxK], q_PxL1xV[tuples_NxK]


@jax.jit
def _plans(drafts_NxKxL, p_NxKxLxV, q_NxKxL1xV):
  return jax.vmap(block.block_plan)(drafts_NxKxL, p_NxKxLxV, q_NxKxL1xV)


def _tree_plans(p_tab, q_tab, num_drafts, draft_len):
  weight_N, drafts, p, q = tree_blocks(p_tab, q_tab, num_drafts, draft_len)
  plan = _plans(jnp.asarray(drafts), jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
  return weight_N, jax.tree.map(lambda x: np.asarray(x, np.float64), plan)


def block_value(p_tab, q_tab, num_drafts: int, draft_len: int) -> float:
  """Exact E[tokens per round] of `block.block_verify`: 1 + E[sum_{i=1..L} w_i].

  ("block" for K = 1, "gbv" for any K; P(tau >= i | history) = w_i.)
  """
  weight_N, plan = _tree_plans(p_tab, q_tab, num_drafts, draft_len)
  return float(1.0 + weight_N @ plan.weight_L1[:, 1:].sum(axis=1))


def block_law(p_tab, q_tab, num_drafts: int, draft_len: int):
  """Exact law of `block.block_verify`'s output completed by exact target draws.

  Returns (law, num_law): law over V^(L+1) sequences (base-V code) and the law of
  num_tokens (index 1..L+1; index 0 is 0). Exactness means law = the target's law.
  """
  vocab = p_tab.shape[-1]
  weight_N, plan = _tree_plans(p_tab, q_tab, num_drafts, draft_len)
  law = np.zeros(vocab ** (draft_len + 1))
  num_law = np.zeros(draft_len + 2)
  for n, weight in enumerate(weight_N):
    stop = plan.stop_L1[n]
    after = np.concatenate([np.cumprod(1 - stop[::-1])[::-1][1:], [1.0]])
    tau_law = stop * after  # P(tau = i) = h_i prod_{j > i} (1 - h_j)
    path = plan.path_L[n].astype(int)
    for tau in range(draft_len + 1):
      if tau_law[tau] <= 0:
        continue
      target = plan.target_L1xV[n, tau]
      if tau == draft_len:
        y_law = target
      else:
        left = np.maximum(plan.weight_L1[n, tau] * target - plan.draft_L1xV[n, tau], 0)
        y_law = left / left.sum() if left.sum() > 0 else target
      num_law[tau + 1] += weight * tau_law[tau]
      code = 0
      for t in range(tau):
        code = code * vocab + path[t]
      prefix_law = np.zeros(vocab ** (tau + 1))
      prefix_law[code * vocab : (code + 1) * vocab] = weight * tau_law[tau] * y_law
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
