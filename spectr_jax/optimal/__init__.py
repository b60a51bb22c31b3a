"""The exact, OT-optimal multi-draft verifier (design: docs/OPTIMAL_VERIFIER.md).

With k i.i.d. drafts X_1..X_k ~ p, `optimal` outputs Y ~ q exactly and hits a draft with
probability up to alpha*(p, q, k), the optimal-transport bound
(`acceptance.optimal_acceptance`), of which K-SEQ is only guaranteed 1 - (1 - 1/k)^k.

Notation. The tokens are merged into Vs slot groups ("slots"): each token its own slot
when V <= H + 258, otherwise the H tokens of largest p + q one slot each and the others
by log2(q / p) in 1/16-octave buckets (q = 0 and p = 0 in one each); H = REFINE_FACTOR x
num_cuts, the cuts a refined plan may use.
Slots with p > 0 sorted by q/p descending are slots 1..n (slots with p = 0 follow and are
never drafted); breakpoint j sits after slot j (j = 0..Vs). P_j = p(slots 1..j),
u_j = 1 - P_j, Q_j = q(slots 1..j), h_j = 1 - u_j^k (the chance that a draft falls in
slots 1..j). Each breakpoint has a level in [0, 1]. The rule:

  U ~ Uniform(0, 1]; breakpoints with level >= U cut the slots into groups;
  Z = a uniformly chosen draft of the earliest group that holds a draft (duplicates count);
  accept Z with probability min(1, q(Z) / r(Z)), else sample norm(q - min(r, q)),

where r is the law of Z. While group (i, l] exists, each of its tokens t is selected at
rate p_t H_{k-1}(u_i, u_l) (H_d: complete homogeneous symmetric polynomial), so r follows
from the levels by integrating over U. r is always computed from the slots and levels
actually used, so the output law is q for ANY slots and levels; only the acceptance
depends on them (merging tokens of one bucket costs at most 4e-5 of alpha* on the pairs
measured: a slot is never split, so only a bucket that straddles the optimum costs).

Levels: the vertices of the lower convex hull of (Q_j, h_j) (the blocks) get level 1, and
the `num_cuts` heaviest interior breakpoints (by p + q of the slot before them) get the
removal times of a deletion-only kinetic hull (docs/OPTIMAL_VERIFIER.md), found for all
candidates at once by Newton steps on U; all others get level 0. Where the O(n) check
`OptimalPlan.shortfall` exceeds REFINE_SHORTFALL = 2e-3 of the bound, the levels are
redone with REFINE_FACTOR = 2 times the cuts on the same slots, sums and blocks (only
the cuts, levels and rates are recomputed). With num_cuts >= V the levels
are those of the note and sum min(r, q) = alpha*. Measured acceptance, LLM-like and
near-flat pairs: docs/OPTIMAL_VERIFIER.md. With k <= 1 valid drafts no plan is built:
the one draft is Z with r = p (single-draft speculative sampling), or none, and q is
sampled.

Numerics: every prefix sum the construction relies on is monotone by construction and
has accurate local differences (`Sums`: two exact int32 sums, of 2^-29 units and of
the remainders in finer units), and the hull and level tests compare slopes of local
differences, so ties, zero masses and float noise cost acceptance at float precision only.

CPU note: the hull is a sequential pass over the Vs slots written so that XLA updates its
stack in place; under `vmap` it runs position by position (`lax.map`, a custom batching
rule), the rest is batched.

Data-dependent loops (on a GPU every iteration is a host round trip), per position with
k >= 2: `apply._plan_where` and `plan.build_plan`'s refinement, `lax.while_loop`s of at
most one step (a plan is built only where a position needs it; under vmap a `lax.cond`
would build it for every position); the hull's monotone-chain pass (`slots._hull_stack`,
at most 2 (Vs + 1) steps, each a push or a pop); the kinetic levels' Newton steps
(`levels.kinetic_levels`, 5-8, at most nmant + 1). They stay: they skip or shorten the
plan, which is this verifier's cost, and a fixed-trip form would run every bound.

Layout: `slots` (slot groups and order, the exact prefix sums `Sums`, the hull and its
blocks), `levels` (the kinetic levels and the selection rates), `plan` (`OptimalPlan`,
the cut plan and its refinement, REFINE_FACTOR and REFINE_SHORTFALL), `apply` (the
selection and the verifier).
"""

from spectr_jax.optimal.apply import optimal, position_verdict, select, select_draft
from spectr_jax.optimal.plan import DEFAULT_NUM_CUTS, OptimalPlan, optimal_plan, selection_law

__all__ = [
  "DEFAULT_NUM_CUTS",
  "OptimalPlan",
  "optimal",
  "optimal_plan",
  "position_verdict",
  "select",
  "select_draft",
  "selection_law",
]
