"""Float64 references for drafts without replacement (SPEC section 5), by enumeration.

A test oracle for `drafting.distinct_tokens`, `verify.rrs_verdict` and the bound and
acceptance of `spectr_jax.acceptance` (nothing in spectr_jax imports it). Small V only.

- `ordered_draws(p, k)`: every ordered tuple of k distinct tokens drawn without
  replacement (successive sampling, the law of Gumbel-top-k in the order of the
  perturbed values) with its probability; k is cut to the support size, as the scheme
  does (the remaining drafts are copies of the first: they add nothing).
- `rrs_law(x, p, q)`: the exact output law of recursive rejection without replacement
  given the ordered drafts x; `specinfer_law` of spectr_jax/testing/reference.py is the broken
  variant (the draft law not renormalised).
- `enumerate_wor(law_fn, p, q, k)`: output law and hit probability over all draws.
- `subset_prob(p, g, k)`: P(S subset of G), S the set of drafts.
- `bound_by_cuts(p, q, k)`: min over ALL token sets G of q(G) + 1 - P(S subset of G).
- `bound_by_prefixes(p, q, k)`: the same minimum over the prefixes of the q/p-ascending
  order only (what the library computes at large V).
- `bound_lp(p, q, k)`: max P(Y in S) by the exact coupling LP over the draft sets.
- `multiset_law(p_tab, k, draft_len)`: the law of the multiset of K draft paths of the
  "wor" scheme on an enumerable tree (the input of a block-level LP).
- `static_tree_law(p_tab, branching)`: the law of the K paths, in order, of the "wor"
  scheme with a static branching per depth.
- `proportional_tree_law(p_tab, k)`: the same for branching "proportional".
- `tree_walk_law(paths, p_tab, q_tab)`: RRS walking a tree node by node, exact law.
- `traversal_law(paths, p_tab, q_tab)`: Traversal Verification of a tree (leaf to root),
  exact law and mean tokens; `broken` gives its two broken variants.
"""

import itertools

import numpy as np

from spectr_jax.testing import reference


def support_size(p) -> int:
  return int(np.count_nonzero(np.asarray(p) > 0))


def ordered_draws(p, k):
  """[(x tuple, probability)] of k successive draws without replacement from p (k is cut
  to the support size)."""
  p = np.asarray(p, np.float64)
  k = min(k, support_size(p))
  support = np.flatnonzero(p > 0)
  out = []
  for x in itertools.permutations(support, k):
    prob, left = 1.0, p.copy()
    for xi in x:
      prob *= p[xi] / left.sum()  # summed, not 1 - the drawn mass (no cancellation)
      left[xi] = 0.0
    out.append((tuple(int(xi) for xi in x), prob))
  return out


def _normalised_or(r, fallback):
  total = r.sum()
  return r / total if total > 1e-300 else fallback


def rrs_law(x, p, q):
  """Exact law of recursive rejection without replacement given the ordered drafts x."""
  law, stay, r, left = np.zeros_like(q), 1.0, q.copy(), p.copy()
  for xi in x:
    p_i = left / left.sum()
    a = min(1.0, r[xi] / p_i[xi])
    law[xi] += stay * a
    stay *= 1 - a
    r = _normalised_or(np.maximum(r - p_i, 0), r)
    left[xi] = 0.0
  return law + stay * r


def enumerate_wor(law_fn, p, q, k):
  """Output law and hit probability of a verifier over every ordered draw of k drafts."""
  out, hit = np.zeros_like(q), 0.0
  for x, weight in ordered_draws(p, k):
    law = law_fn(x, p, q)
    out += weight * law
    hit += weight * law[list(x)].sum()
  return out, hit


def subset_prob(p, g, k) -> float:
  """P(every draft lies in the token set g)."""
  g = set(int(t) for t in g)
  return sum(w for x, w in ordered_draws(p, k) if set(x) <= g)


def bound_by_cuts(p, q, k) -> tuple[float, tuple[int, ...]]:
  """(min over every token set G of q(G) + 1 - P(S subset G), the minimising G)."""
  v = len(p)
  best = (np.inf, ())
  for size in range(v + 1):
    for g in itertools.combinations(range(v), size):
      value = q[list(g)].sum() + 1.0 - subset_prob(p, g, k)
      best = min(best, (value, g))
  return best


def prefix_order(p, q):
  """Tokens by q/p ascending (q = 0 < p first, p = 0 last), ties by token id."""
  ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf)
  return np.argsort(ratio, kind="stable")


def bound_by_prefixes(p, q, k) -> float:
  """The cut minimum over the prefixes of `prefix_order` only."""
  order = prefix_order(p, q)
  return min(q[order[:j]].sum() + 1.0 - subset_prob(p, order[:j], k) for j in range(len(p) + 1))


def bound_lp(p, q, k) -> float:
  """max P(Y in S) over couplings of the draft set S (law of `ordered_draws`) and Y ~ q."""
  sets = {}
  for x, w in ordered_draws(p, k):
    key = tuple(sorted(x))
    sets[key] = sets.get(key, 0.0) + w
  return reference.hit_lp(list(sets.items()), q)


def multiset_law(p_tab, k, draft_len) -> dict[tuple[int, ...], float]:
  """The law of the multiset of the K draft paths of the "wor" scheme on a tree.

  `p_tab` as in `spectr_jax.block_bound` ((L + 1) x V^L x V, row t = the law after the
  prefix of length t with that base-V code). The first tokens are drawn without
  replacement from p_tab[0, 0]; every path then continues i.i.d. from its own prefix.
  Where fewer than K tokens have mass, the remaining paths copy the first drawn path
  (the verifier ignores them), so that path appears K - s + 1 times in the multiset.

  Returns:
    {sorted tuple of K path codes (base-V, first token most significant): probability}.
  """
  vocab = p_tab.shape[-1]
  law = {}
  for x, weight in ordered_draws(p_tab[0, 0], k):
    tails = []
    for first in x:
      # Every continuation of a path starting with `first`, with its probability.
      paths = [(first, 1.0)]
      for t in range(1, draft_len):
        paths = [
          (code * vocab + y, prob * p_tab[t, code, y])
          for code, prob in paths
          for y in range(vocab)
          if p_tab[t, code, y] > 0
        ]
      tails.append(paths)
    copies = k - len(x)
    for combo in itertools.product(*tails):
      codes = [c for c, _ in combo] + [combo[0][0]] * copies
      prob = weight * np.prod([w for _, w in combo])
      key = tuple(sorted(codes))
      law[key] = law.get(key, 0.0) + prob
  return law


def static_tree_law(p_tab, branching) -> dict[tuple[int, ...], float]:
  """The law of the K draft paths, in path order, of the "wor" scheme with a static
  branching (`drafting.without_replacement`): every node at depth t draws branching[t]
  children without replacement from p_tab[t, its prefix code] (cut to its support; the
  extra children copy child 0's subtree), and child j's paths are the j-th block of its
  node's paths.

  Returns:
    {tuple of K path codes (base-V, first token most significant): probability}.
  """
  vocab = p_tab.shape[-1]

  def subtree(t, code):
    if t == len(branching):
      return [((code,), 1.0)]
    out = []
    for x, weight in ordered_draws(p_tab[t, code], branching[t]):
      children = [subtree(t + 1, code * vocab + xi) for xi in x]
      for combo in itertools.product(*children):
        paths = [c for sub, _ in combo for c in sub]
        paths += list(combo[0][0]) * (branching[t] - len(x))
        out.append((tuple(paths), weight * np.prod([w for _, w in combo])))
    return out

  law = {}
  for paths, prob in subtree(0, 0):
    law[paths] = law.get(paths, 0.0) + prob
  return law


def proportional_tree_law(p_tab, num_drafts, drop=False) -> dict[tuple[int, ...], float]:
  """The law of the K draft paths, in path order, of the "wor" scheme with branching
  "proportional" (`drafting._proportional`): a node of m paths draws children without
  replacement from p_tab[t, its prefix code]; child j gets max(1, round(m p(x_j))) of
  the paths left (draws stop when none are left), paths left when the support runs out
  go to child 0, and child j's paths are the j-th block of its node's paths. With
  `drop` (the broken rule of tests/verify/test_wor.py), a draw gets round(m p(x_j)) paths and
  one that gets 0 is not a child.

  Returns:
    {tuple of K path codes (base-V, first token most significant): probability}.
  """
  vocab, depth = p_tab.shape[-1], p_tab.shape[0] - 1

  def allocations(p, size):
    """[(children tokens, their paths, probability)] of one node's draws."""
    out = []

    def draw(left, paths_left, xs, gots, prob):
      if paths_left == 0 or not np.any(left > 0):
        gots = list(gots)
        gots[0] += paths_left
        out.append((tuple(xs), tuple(gots), prob))
        return
      for x in np.flatnonzero(left > 0):
        got = min(paths_left, max(0 if drop else 1, int(np.round(size * p[x]))))
        rest = left.copy()
        rest[x] = 0.0
        draw(rest, paths_left - got, xs + [int(x)], gots + [got], prob * left[x] / left.sum())

    draw(np.asarray(p, np.float64), size, [], [], 1.0)
    return out

  def subtree(t, code, size):
    if t == depth:
      return [((code,) * size, 1.0)]
    out = []
    for xs, gots, weight in allocations(p_tab[t, code], size):
      pairs = [(x, g) for x, g in zip(xs, gots, strict=True) if g]
      children = [subtree(t + 1, code * vocab + x, g) for x, g in pairs]
      for combo in itertools.product(*children):
        paths = tuple(c for sub, _ in combo for c in sub)
        out.append((paths, weight * np.prod([w for _, w in combo])))
    return out

  law = {}
  for paths, prob in subtree(0, 0, num_drafts):
    law[paths] = law.get(paths, 0.0) + prob
  return law


def tree_walk_law(paths, p_tab, q_tab, rule=rrs_law):
  """The exact law of one round's L + 1 tokens (base-V codes, as `block_bound`) when RRS
  walks the draft tree of `paths` (K path codes) node by node: at each node recursive
  rejection without replacement over its children in the order of their first path
  (`rule`, (x, p, q) -> law of the node's token; `rrs_law`); an accepted child continues
  the walk, a residual token ends it and the target draws the rest; after a leaf, the
  bonus from q."""
  vocab, depth = p_tab.shape[-1], p_tab.shape[0] - 1
  tokens = [tuple(int(c) // vocab ** (depth - 1 - t) % vocab for t in range(depth)) for c in paths]
  out = np.zeros(vocab ** (depth + 1))

  def complete(t, code, weight):
    if t == depth + 1:
      out[code] += weight
      return
    for y in np.flatnonzero(q_tab[t, code] > 0):
      complete(t + 1, code * vocab + y, weight * q_tab[t, code, y])

  def walk(t, code, group, weight):
    if t == depth:
      complete(t, code, weight)
      return
    children = list(dict.fromkeys(path[t] for path in group))
    law = rule(children, p_tab[t, code], q_tab[t, code])
    for y in np.flatnonzero(law > 0):
      if y in children:
        walk(t + 1, code * vocab + y, [g for g in group if g[t] == y], weight * law[y])
      else:
        complete(t + 1, code * vocab + y, weight * law[y])

  walk(0, 0, tokens, 1.0)
  return out


def _complete(out, vocab, depth, t, code, weight, law, q_tab):
  """Adds weight x (token t ~ law, then the target's draws to depth L) to `out`."""
  for y in np.flatnonzero(law > 0):
    if t == depth:
      out[code * vocab + y] += weight * law[y]
    else:
      _complete(
        out,
        vocab,
        depth,
        t + 1,
        code * vocab + y,
        weight * law[y],
        q_tab[t + 1, code * vocab + y],
        q_tab,
      )


def traversal_law(paths, p_tab, q_tab, broken=""):
  """The exact law of one round's L + 1 tokens (base-V codes) under Traversal
  Verification (Weng et al., arXiv 2505.12398) of the draft tree of `paths`, and the
  mean number of tokens it emits.

  Nodes are tested leaf to root in post-order (children in the order of their first
  path). With w(root) = 1 and w(u.x) = min(1, w(u) Q_u(x) / P_u(x)) (Q_u, P_u: the
  node's current target and draft laws, at first q and p), a node is accepted with
  probability w (the root always); the emitted tokens are its prefix, then a bonus
  from its Q. A rejected node u.x updates its parent u with a = w(u):
    S = sum_y max(a Q_u(y) - P_u(y), 0),  Q_u <- norm(max(a Q_u - P_u, 0)),
    w(u) <- S / (S + 1 - a),  P_u <- P_u with x removed, renormalised,
  and the weights below u are recomputed. `broken`: "bonus" draws the bonus from the
  node's original q (its residual ignored); "draft" never renormalises P_u.
  """
  vocab, depth = p_tab.shape[-1], p_tab.shape[0] - 1
  tokens = [tuple(int(c) // vocab ** (depth - 1 - t) % vocab for t in range(depth)) for c in paths]
  children = {}
  for path in tokens:
    for t in range(depth):
      kids = children.setdefault(path[:t], [])
      if path[t] not in kids:
        kids.append(path[t])

  def code(u):
    return sum(x * vocab ** (len(u) - 1 - i) for i, x in enumerate(u))

  target, draft, order = {}, {}, []

  def post(u):
    target[u] = q_tab[len(u), code(u)].astype(np.float64).copy()
    if len(u) < depth:
      draft[u] = p_tab[len(u), code(u)].astype(np.float64).copy()
    for x in children.get(u, []):
      post(u + (x,))
    order.append(u)

  post(())
  weight = {(): 1.0}

  def reweigh(u):
    for x in children.get(u, []):
      ratio = target[u][x] / draft[u][x] if draft[u][x] > 0 else 0.0
      weight[u + (x,)] = min(1.0, weight[u] * ratio)
      reweigh(u + (x,))

  reweigh(())
  out, reach, mean = np.zeros(vocab ** (depth + 1)), 1.0, 0.0
  for u in order:
    accept = 1.0 if u == () else weight[u]
    bonus = q_tab[len(u), code(u)] if broken == "bonus" else target[u]
    _complete(out, vocab, depth, len(u), code(u), reach * accept, bonus, q_tab)
    mean += reach * accept * (len(u) + 1)
    reach *= 1.0 - accept
    if u == ():
      break
    parent, x = u[:-1], u[-1]
    a = weight[parent]
    left = np.maximum(a * target[parent] - draft[parent], 0.0)
    s = left.sum()
    weight[parent] = s / (s + 1.0 - a) if s + 1.0 - a > 0 else 0.0
    target[parent] = _normalised_or(left, target[parent])
    if broken != "draft":
      draft[parent][x] = 0.0
      draft[parent] = _normalised_or(draft[parent], draft[parent])
    reweigh(parent)
  return out, mean
