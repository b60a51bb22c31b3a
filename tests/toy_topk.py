"""A drafting scheme of a law the registry does not have, added in this one module
(issue 49): a tree drawn without replacement from the draft's top `TOP` tokens at every
node, renormalised (the draft samples its top tokens only; the target's law is untouched).

It reuses the public depth loop (`drafting.tree_depths`) and declares the law it draws
from (`Depths.proposal`), which the verifiers read: recursive rejection without
replacement (rrs) and Traversal Verification are exact for it, with dedup rounds,
adaptive draft length and node budgets. `BROKEN` draws the same drafts but hands the
verifiers the draft's whole law, as an engine does that verifies truncated drafts as if
they were sampled from the draft: its output law is not the target's.
"""

import functools

import jax
import jax.numpy as jnp

from spectr_jax import acceptance, drafting, methods

TOP = 2


def top_law(p_xV):
  """The draft's law kept on its `TOP` most likely tokens, renormalised: [..., V]. A token
  of probability 0 stays at 0 (ties at the cut keep every tied token)."""
  cut_x1 = jax.lax.top_k(p_xV, TOP)[0][..., -1:]
  kept_xV = jnp.where(p_xV >= cut_x1, p_xV, 0.0)
  return kept_xV / jnp.sum(kept_xV, -1, keepdims=True)


def depths(num_drafts, draft_len, branching=None):
  return drafting.tree_depths(num_drafts, draft_len, branching)._replace(proposal=top_law)


def _truncated(draw, key_BxK, p_BxKxV, *args):
  """A depth's draws from the top law, the verifiers left with the draft's whole law."""
  return draw(key_BxK, top_law(p_BxKxV), *args)


def broken_depths(num_drafts, draft_len, branching=None):
  tree = drafting.tree_depths(num_drafts, draft_len, branching)
  return tree._replace(
    first=functools.partial(_truncated, tree.first), draw=functools.partial(_truncated, tree.draw)
  )


def bound(p_XxV, q_XxV, k):
  """The bound of drafts without replacement, of the top law."""
  return acceptance.wor_bound_X(top_law(p_XxV), q_XxV, k)


def _scheme(name, fn, summary):
  return methods.Drafting(
    name=name,
    depths=fn,
    bound=bound,
    bound_label=f"optimal w/o replacement, top {TOP}",
    summary=summary,
    check=drafting.check_distinct,
    branches=True,
    law=f"wor_top{TOP}",
    verifiers=("rrs", "traversal"),
  )


SCHEME = _scheme(
  f"toy_top{TOP}", depths, f"toy: a tree without replacement from the draft's top {TOP}"
)
BROKEN = _scheme(
  f"toy_top{TOP}_broken", broken_depths, "toy, broken: verified against the whole draft law"
)
for _record in (SCHEME, BROKEN):
  methods.register_drafting(_record)
