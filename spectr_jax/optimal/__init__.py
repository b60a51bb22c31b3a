"""The exact, OT-optimal multi-draft verifier (derivation: docs/OPTIMAL_VERIFIER.md).

With k i.i.d. drafts from p, `optimal` outputs a token distributed exactly as q. It hits
a draft with probability up to alpha*(p, q, k) (`acceptance.optimal_acceptance`).
Entry points: `optimal`, `optimal_plan` (one `OptimalPlan` per position), `selection_law`,
`select_draft` and `select` (the selection alone), `position_verdict` (for the registry).

Notation. The V tokens merge into Vs slots. Slots with p > 0, sorted by q/p descending,
are 1..n; breakpoint j sits after slot j (j = 0..Vs). P_j and Q_j are the p and q of
slots 1..j, u_j = 1 - P_j and h_j = 1 - u_j^k. Each breakpoint has a level in [0, 1]:
1 at a block end, a kinetic level at M = num_cuts candidates (2M when refined), else 0.

The rule. U ~ Uniform(0, 1]; breakpoints of level >= U cut the slots into groups. Z is a
uniform draft of the earliest group holding one, and r is its law. Z is accepted with
probability min(1, q(Z) / r(Z)), else the token is drawn from norm(q - min(r, q)). The
output law is q for any slots and levels; they set only the acceptance.

Data-dependent loops per position with k >= 2 (on a GPU, a host round trip per step):
the plan and its refinement (at most one step each), the hull (`slots._hull_stack`) and
the Newton steps of `levels.kinetic_levels` (5-8). A fixed-trip form would always run
their bound, so they stay.
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
