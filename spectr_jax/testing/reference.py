"""Float64 numpy references: exact conditional output laws of the verifiers.

`*_law(x, p, q, ...)` returns P(Y = . | drafts = x) exactly. Averaging it over all draft
tuples (`enumerate_position`) gives the verifier's output law and hit probability with no
sampling error, which the library's closed forms and Monte Carlo tests are checked against.
"""

import itertools

import numpy as np
from scipy.optimize import linprog


def rho_star(p, q, k, iters=200):
  """rho* by float64 bisection (the reference for `acceptance.rho_star`)."""

  def excess(rho):
    beta = np.minimum(p, q / rho).sum()
    return 1 - (1 - beta) ** k - rho * beta

  if excess(1.0) <= 0:
    return 1.0
  lo, hi = 1.0, float(k)
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    lo, hi = (lo, mid) if excess(mid) <= 0 else (mid, hi)
  return hi


def _normalised_or(r, fallback):
  total = r.sum()
  return r / total if total > 1e-300 else fallback


def kseq_law(x, p, q, rho):
  """Exact law of K-SEQ's output given the drafts x (residual clipped, renormalised)."""
  k = len(x)
  m = np.minimum(p, q / rho)
  beta = m.sum()
  p_accept = 1 - (1 - beta) ** k if k else 0.0
  accept_mass = p_accept / beta * m if beta > 0 else np.zeros_like(p)
  residual = _normalised_or(np.maximum(q - accept_mass, 0), q)
  law, stay = np.zeros_like(p), 1.0
  for xi in x:
    a = m[xi] / p[xi] if p[xi] > 0 else 0.0
    law[xi] += stay * a
    stay *= 1 - a
  return law + stay * residual


def sd_law(x, p, q):
  """Exact law of single-draft speculative sampling given the draft x = (x_1,)."""
  (xi,) = x
  a = min(1.0, q[xi] / p[xi]) if p[xi] > 0 else 0.0
  law = _normalised_or(np.maximum(q - p, 0), q) * (1 - a)
  law[xi] += a
  return law


def specinfer_law(x, p, q):
  """Exact law of SpecInfer's recursive rejection given the drafts x."""
  law, stay, r = np.zeros_like(p), 1.0, q.copy()
  for xi in x:
    a = min(1.0, r[xi] / p[xi]) if p[xi] > 0 else 0.0
    law[xi] += stay * a
    stay *= 1 - a
    r = _normalised_or(np.maximum(r - p, 0), r)
  return law + stay * r


def enumerate_position(law_fn, p, q, k):
  """Output law and hit probability of a verifier, by enumerating all k-tuples of drafts."""
  support = np.flatnonzero(p > 0)
  out = np.zeros_like(q)
  hit = 0.0
  for x in itertools.product(support, repeat=k):
    weight = np.prod(p[list(x)])
    law = law_fn(x, p, q)
    out += weight * law
    hit += weight * law[list(set(x))].sum()
  return out, hit


def hit_lp(outcomes, q) -> float:
  """max P(Y in S) over couplings of a random draft set S and Y ~ q, by the exact
  transport LP; `outcomes` lists (S as a collection of tokens, its probability)."""
  v = len(q)
  n = len(outcomes) * v
  cost = np.zeros(n)
  a_eq, b_eq = [], []
  for i, (tokens, mass) in enumerate(outcomes):
    row = np.zeros(n)
    row[i * v : (i + 1) * v] = 1
    a_eq.append(row)
    b_eq.append(mass)
    for y in set(tokens):
      cost[i * v + y] = -1
  for y in range(v):
    row = np.zeros(n)
    row[y::v] = 1
    a_eq.append(row)
    b_eq.append(q[y])
  res = linprog(cost, A_eq=np.array(a_eq), b_eq=np.array(b_eq), bounds=(0, None), method="highs")
  assert res.success, res.message
  return -res.fun


def optimal_lp(p, q, k):
  """alpha*(p, q, k) by the exact transport LP over all V^k draft tuples (tiny V, k)."""
  tuples = itertools.product(range(len(p)), repeat=k)
  return hit_lp([(x, np.prod(p[list(x)])) for x in tuples], q)
