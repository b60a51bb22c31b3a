"""Every verifier's exact expected tokens per round beside the block-level LP bound.

On small trees, by enumeration (nothing sampled): the SPEC examples (context-independent
p and q) and random trees of five kinds (p and q drawn per prefix from a Dirichlet with
a = 0.3, 1 or 3; "sparse": a = 1 with random zeros in p and q; "ties": q = p on a random
set of >= 2 tokens per prefix) over every (V, L, K) with V in 2-4, L in 1-3, K in 1-4 and
V^(L K) <= 4096:

  token-level walks (`methods.verify_drafts`): sd, kseq (rho*), specinfer, optimal:
    E[tokens] over all K-tuples of paths, walking each position's exact conditional law
    given the surviving drafts; rrs on drafts without replacement: every ordered draw of
    distinct first tokens, then the one surviving path (its first token is unique)
    walked as single-draft rejection;
  block-level (`block.block_verify`): block, gbv, gbv_tp: 1 + E[sum_i w_i]
    (`block_bound.block_value`); traversal on the "wor" scheme's trees (default
    branching): every tree (`wor_reference.static_tree_law`), each verified by
    `wor_reference.traversal_law`;
  the single-draft methods (sd, block) at K = 1 on the same tree, in every row;
  unregistered rules (`UNREGISTERED`, not exact): hsd, HSD as transcribed from its authors'
    code (`algorithm_clean.py`, deleted before the paper appeared)
    (Zhou et al., arXiv 2601.05724; `hsd.chain_law`), on one chain (K = 1), with the
    L1 distance of its output law from the target's;
  bound: the multi-path verification LP for each method's drafting scheme
    (`block_bound.multiset_bound` of `block_bound.MULTISETS[scheme]`).

Prints a markdown table and a summary: each method's ratio to its bound, who reaches it,
where gbv_tp gains or loses against gbv, block and optimal, and traversal against rrs on
the same trees.

Usage: PYTHONPATH=$PWD python scripts/block_table.py [--cases 150] [--seed 0]
"""

import functools
import itertools

import numpy as np
from absl import app, flags

from spectr_jax import block_bound, drafting, methods, optimal, tables
from spectr_jax.testing import hsd, reference, sequences, wor_reference

# The script's own flags when run; private ones when imported (tests/verify/test_block.py).
FLAGS = flags.FLAGS if __name__ == "__main__" else flags.FlagValues()
_CASES = flags.DEFINE_integer("cases", 150, "Number of random trees.", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random trees.", flag_values=FLAGS)

TOL = 1e-5  # tokens per round: "at the bound", "above", "below" (float32 plans)


@functools.cache
def _optimal_plan(p_bytes: bytes, q_bytes: bytes, k: int):
  p, q = np.frombuffer(p_bytes), np.frombuffer(q_bytes)
  plan = optimal.optimal_plan(np.float32(p), np.float32(q), k)
  return (
    np.asarray(plan.levels_Vs1, np.float64),
    np.asarray(plan.slot_V),
    np.asarray(plan.r_V, np.float64),
  )


def optimal_law(x, p, q):
  """Exact law of `optimal.optimal`'s output given the drafts x (float64 from its plan):
  select Z (`block_bound.selection_probs`), accept it with probability min(1, q / r),
  else draw norm(q - min(r, q))."""
  levels, slot, r = _optimal_plan(p.tobytes(), q.tobytes(), len(x))
  select = np.zeros_like(p)
  for z, prob in block_bound.selection_probs(x, levels, slot).items():
    select[z] = prob
  accept = np.where(r > 0, np.minimum(1.0, q / np.where(r > 0, r, 1.0)), 0.0)
  left = np.maximum(q - np.minimum(r, q), 0.0)
  residual = left / left.sum() if left.sum() > 1e-12 else q
  return select * accept + (1.0 - (select * accept).sum()) * residual


LAWS = {
  "sd": reference.sd_law,
  "kseq": lambda x, p, q: reference.kseq_law(x, p, q, reference.rho_star(p, q, len(x))),
  "specinfer": reference.specinfer_law,
  "optimal": optimal_law,
}
WOR_LAWS = {"rrs": wor_reference.rrs_law}  # token-level methods on drafts w/o replacement
BLOCK_ENUMERATED = ("block", "gbv", "gbv_tp")  # `block_bound.block_value` methods
WOR_TREES = ("traversal",)  # block-level on the "wor" scheme's trees: `wor_tree_value`
# The table's columns: every registered speculative method (registry order) that has an
# exact enumeration here; the others are named in the summary.
COLUMNS = tuple(
  m
  for m in methods.names(speculative=True)
  if m in LAWS or m in WOR_LAWS or m in BLOCK_ENUMERATED or m in WOR_TREES
)
NOT_ENUMERATED = tuple(m for m in methods.names(speculative=True) if m not in COLUMNS)
SCHEMES = tuple(dict.fromkeys(methods.get(m).drafting for m in COLUMNS))
# Published rules found NOT exact, so not in the registry: name -> (p_tab, q_tab, K, L) ->
# (E[tokens per round], L1 distance of the output law from the target's); K = 1 rules are
# measured against the K = 1 bound.
UNREGISTERED = {"hsd": lambda p_tab, q_tab, num_drafts, draft_len: _hsd(p_tab, q_tab, draft_len)}


def _hsd(p_tab, q_tab, draft_len):
  law, tokens = hsd.chain_law(p_tab, q_tab, draft_len)
  return tokens, float(np.abs(law - sequences.target_law(q_tab, draft_len)).sum())


def token_value(p_tab, q_tab, num_drafts: int, draft_len: int, method: str) -> float:
  """Exact E[tokens per round] of the token-level walk `methods.verify_drafts(method=...)`."""
  vocab = p_tab.shape[-1]
  law_fn = LAWS[method]

  @functools.cache
  def law(t, code, x):
    return law_fn(x, p_tab[t, code], q_tab[t, code])

  @functools.cache
  def walk(t, code, survivors):  # survivors: the surviving paths' token tuples
    if t == draft_len:
      return 1.0
    out = law(t, code, tuple(s[t] for s in survivors))
    total = 0.0
    for y in range(vocab):
      alive = tuple(s for s in survivors if s[t] == y)
      rest = walk(t + 1, code * vocab + y, alive) if alive else 0.0
      total += out[y] * (1.0 + rest)
    return total

  paths = list(itertools.product(range(vocab), repeat=draft_len))
  probs = block_bound.path_probs(p_tab, draft_len)
  value = 0.0
  for idx in itertools.product(range(len(paths)), repeat=num_drafts):
    weight = np.prod(probs[list(idx)])
    if weight > 0:
      value += weight * walk(0, 0, tuple(paths[i] for i in idx))
  return value


def wor_token_value(p_tab, q_tab, num_drafts: int, draft_len: int, method: str) -> float:
  """Exact E[tokens per round] of `method` (rrs) on the "wor" scheme's drafts: the first
  tokens are an ordered draw without replacement (`wor_reference.ordered_draws`; extra
  copies of path 0 past the support are ignored by the verifier), so at most one path
  survives position 0 and its i.i.d. continuation is verified one draft at a time."""
  vocab = p_tab.shape[-1]

  @functools.cache
  def tail(t, code):  # E[tokens from depth t on], one surviving path after prefix `code`
    if t == draft_len:
      return 1.0
    p, q = p_tab[t, code], q_tab[t, code]
    total = 0.0
    for d in np.flatnonzero(p > 0):
      out = WOR_LAWS[method]((int(d),), p, q)
      total += p[d] * (1.0 + out[d] * tail(t + 1, code * vocab + int(d)))
    return total

  p, q = p_tab[0, 0], q_tab[0, 0]
  value = 0.0
  for x, weight in wor_reference.ordered_draws(p, num_drafts):
    out = WOR_LAWS[method](x, p, q)
    value += weight * (1.0 + sum(out[d] * tail(1, d) for d in x))
  return value


def wor_tree_value(p_tab, q_tab, num_drafts: int, draft_len: int) -> float:
  """Exact E[tokens per round] of Traversal Verification on the "wor" scheme's trees with
  the default branching (K distinct first tokens, each path continuing alone)."""
  branching = drafting.default_branching(num_drafts, draft_len)
  trees = wor_reference.static_tree_law(p_tab, branching)
  return sum(prob * wor_reference.traversal_law(t, p_tab, q_tab)[1] for t, prob in trees.items())


def single_draft(method: str) -> bool:
  return methods.get(method).max_drafts == 1


def case_values(p_tab, q_tab, num_drafts: int, draft_len: int) -> dict[str, float]:
  """Every method's exact E[tokens per round] on one tree (single-draft methods at
  K = 1), the bound of each drafting scheme ("bound <scheme>") and the K = 1 bound."""
  values = {}
  for method in COLUMNS:
    k = 1 if single_draft(method) else num_drafts
    if method in LAWS:
      values[method] = token_value(p_tab, q_tab, k, draft_len, method)
    elif method in WOR_LAWS:
      values[method] = wor_token_value(p_tab, q_tab, k, draft_len, method)
    elif method in WOR_TREES:
      values[method] = wor_tree_value(p_tab, q_tab, k, draft_len)
    else:
      values[method] = block_bound.block_value(p_tab, q_tab, k, draft_len, method=method)
  for scheme in SCHEMES:
    law = block_bound.MULTISETS[scheme](p_tab, num_drafts, draft_len)
    values[f"bound {scheme}"] = block_bound.multiset_bound(p_tab, q_tab, law, draft_len)
  values["bound K=1"] = block_bound.block_bound(p_tab, q_tab, 1, draft_len)
  for name, fn in UNREGISTERED.items():
    values[name], values[f"{name} error"] = fn(p_tab, q_tab, 1, draft_len)
  return values


def bound_of(row: dict, method: str) -> float:
  """The bound a method is measured against: its scheme's at the row's K (K = 1 for the
  single-draft methods)."""
  if single_draft(method):
    return row["bound K=1"]
  return row[f"bound {methods.get(method).drafting}"]


def random_tree(rng, vocab: int, draft_len: int, kind: str):
  """A random tree of one of the kinds of the module docstring ("a=0.3", "a=1", "a=3",
  "sparse", "ties")."""
  if kind.startswith("a="):
    return sequences.random_tree(rng, vocab, draft_len, concentration=float(kind[2:]))
  return sequences.random_tree(rng, vocab, draft_len, kind, concentration=1.0)


SHAPES = [
  (v, n, k) for v in (2, 3, 4) for n in (1, 2, 3) for k in (1, 2, 3, 4) if v ** (n * k) <= 4096
]
KINDS = ("a=0.3", "a=1", "a=3", "sparse", "ties")
SPEC_EXAMPLES = {
  "toy (Sun et al.)": ([1 / 3, 2 / 3], [2 / 3, 1 / 3], ((2, 1), (2, 2), (2, 3), (3, 1), (3, 3))),
  "spec-example": ([0.6, 0.4], [0.3, 0.7], ((2, 1), (2, 2), (2, 3), (3, 1), (3, 3))),
  "p = q uniform": ([0.5, 0.5], [0.5, 0.5], ((1, 1), (1, 2), (1, 3), (2, 2), (2, 3))),
}


def cases(num_random: int, seed: int):
  """(name, V, L, K, p_tab, q_tab): the SPEC examples, then random trees (every shape
  once per kind, kinds in turn)."""
  out = []
  for name, (p, q, shapes) in SPEC_EXAMPLES.items():
    for draft_len, num_drafts in shapes:
      out.append((name, len(p), draft_len, num_drafts, *sequences.constant_tree(p, q, draft_len)))
  rng = np.random.default_rng(seed)
  for i in range(num_random):
    vocab, draft_len, num_drafts = SHAPES[i % len(SHAPES)]
    kind = KINDS[(i // len(SHAPES)) % len(KINDS)]
    out.append((kind, vocab, draft_len, num_drafts, *random_tree(rng, vocab, draft_len, kind)))
  return out


def _count(diffs, what: str) -> str:
  diffs = np.asarray(diffs)
  return (
    f"{what}: above on {np.sum(diffs > TOL)}, equal (within {TOL:g}) on "
    f"{np.sum(np.abs(diffs) <= TOL)}, below on {np.sum(diffs < -TOL)}; mean difference "
    f"{diffs.mean():+.4f}, largest gain {diffs.max():+.4f}, largest loss {diffs.min():+.4f}"
  )


def summary(rows) -> list[str]:
  """Lines: each method against its bound; gbv_tp against gbv, block and optimal; rrs
  against the i.i.d. verifiers and the two schemes' bounds."""
  lines = []
  multi = [r for r in rows if r["K"] > 1]
  for col in COLUMNS:
    group = [r for r in rows if r["K"] == 1] if single_draft(col) else rows
    ratios = np.array([r[col] / bound_of(r, col) for r in group])
    gaps = np.array([bound_of(r, col) - r[col] for r in group])
    at = np.sum(gaps <= TOL)
    line = (
      f"- {col}: {len(group)} cases{' (K = 1)' if single_draft(col) else ''}, mean ratio "
      f"to the bound {ratios.mean():.4f} (worst {ratios.min():.4f}), at the bound on {at} "
      f"({at / len(group):.0%})"
    )
    if not single_draft(col):
      at_multi = sum(bound_of(r, col) - r[col] <= TOL for r in multi)
      line += f"; with K > 1: {at_multi} of {len(multi)} ({at_multi / len(multi):.0%})"
    lines.append(line)
  above = max(r[c] - bound_of(r, c) for r in rows for c in COLUMNS)
  lines.append(f"- largest excess of any method over its bound: {above:.2e} (float32 plans)")
  if {"gbv", "gbv_tp"} <= set(COLUMNS) and multi:
    lines.append(
      f"- K > 1 ({len(multi)} cases), "
      + _count([r["gbv_tp"] - r["gbv"] for r in multi], "gbv_tp vs gbv")
    )
    lines.append(
      "- K > 1, "
      + _count([r["gbv_tp"] - r["block"] for r in multi], "gbv_tp (K drafts) vs block (one draft)")
    )
    lines.append(
      "- K > 1, "
      + _count([r["gbv_tp"] - r["optimal"] for r in multi], "gbv_tp vs optimal (token level)")
    )
    lines.append("- K > 1, " + _count([r["gbv"] - r["optimal"] for r in multi], "gbv vs optimal"))
  if {"rrs", "specinfer", "optimal"} <= set(COLUMNS) and multi:
    for other in ("specinfer", "kseq", "optimal", "gbv"):
      lines.append(
        "- K > 1, " + _count([r["rrs"] - r[other] for r in multi], f"rrs (w/o repl.) vs {other}")
      )
    lines.append(
      "- K > 1, "
      + _count([r["bound wor"] - r["bound iid"] for r in multi], "bound (wor) vs bound (iid)")
    )
  if {"traversal", "rrs"} <= set(COLUMNS) and multi:
    for other in ("rrs", "specinfer", "kseq", "optimal", "gbv", "gbv_tp"):
      lines.append(
        "- K > 1, " + _count([r["traversal"] - r[other] for r in multi], f"traversal vs {other}")
      )
    lines.append(
      "- K > 1, "
      + _count([r["traversal"] - r["block"] for r in multi], "traversal (K drafts) vs block (one)")
    )
  for name in UNREGISTERED:
    gaps = np.array([r[name] - r["bound K=1"] for r in rows])
    errors = np.array([r[f"{name} error"] for r in rows])
    lines.append(
      f"- {name} (K = 1, not exact): above the K = 1 bound on {np.sum(gaps > TOL)} of "
      f"{len(rows)} cases (by up to {gaps.max():+.4f}), at it on {np.sum(np.abs(gaps) <= TOL)}, "
      f"below on {np.sum(gaps < -TOL)}; output law off the target's (L1 > 1e-6) on "
      f"{np.sum(errors > 1e-6)}, largest L1 distance {errors.max():.4f}"
    )
  if NOT_ENUMERATED:
    lines.append(f"- registered but not enumerated here: {', '.join(NOT_ENUMERATED)}")
  return lines


def breakdown(rows) -> list[str]:
  """By tree kind, K and L (cases with K > 1): each multi-draft method's mean ratio to its
  bound and its share of cases at the bound, and how often it is the best of them."""
  multi = [c for c in COLUMNS if not single_draft(c)]
  cols = [("name", "cases (K > 1)", "{}"), ("n", "n", "{}")]
  cols += [(c, c, "{}") for c in multi] + [("best", "best (share of cases)", "{}")]
  table = []
  groups = {}
  for field, label in (("kind", "{}"), ("K", "K = {}"), ("L", "L = {}")):
    for r in rows:
      if r["K"] > 1:
        groups.setdefault(label.format(r[field]), []).append(r)
  for name, group in groups.items():
    row, best = {"name": name, "n": len(group)}, {c: 0 for c in multi}
    for c in multi:
      ratio = np.mean([r[c] / bound_of(r, c) for r in group])
      at = np.mean([bound_of(r, c) - r[c] <= TOL for r in group])
      row[c] = f"{ratio:.4f} ({at:.0%})"
    for r in group:
      top = max(r[c] for c in multi)
      for c in multi:
        best[c] += r[c] >= top - TOL
    row["best"] = ", ".join(f"{c} {best[c] / len(group):.0%}" for c in multi if best[c])
    table.append(row)
  return tables.markdown(table, cols).splitlines()


def case_columns() -> list[tuple[str, str, str]]:
  """The columns of the table of cases."""
  cols = [("kind", "case", "{}"), ("V", "V", "{}"), ("L", "L", "{}"), ("K", "K", "{}")]
  cols += [(c, f"{c} (K=1)" if single_draft(c) else c, "{:.4f}") for c in COLUMNS]
  cols += [(f"bound {s}", f"bound ({s})", "{:.4f}") for s in SCHEMES]
  return cols + [(name, f"{name} (K=1, inexact)", "{:.4f}") for name in UNREGISTERED]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  rows = []
  cols = case_columns()
  print(tables.markdown([], cols))
  for name, vocab, draft_len, num_drafts, p_tab, q_tab in cases(_CASES.value, _SEED.value):
    values = case_values(p_tab, q_tab, num_drafts, draft_len)
    rows.append({**values, "K": num_drafts, "L": draft_len, "kind": name, "V": vocab})
    print(tables.markdown(rows[-1:], cols).splitlines()[-1], flush=True)
  print()
  print("\n".join(summary(rows)))
  print()
  print("\n".join(breakdown(rows)))


if __name__ == "__main__":
  app.run(main)
