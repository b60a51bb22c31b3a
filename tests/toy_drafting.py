"""A drafting scheme added in this one module (issue 39's check of the independent axes):
K i.i.d. draft sequences drawn under randomness of their own (each draw's key folded with
a constant). Its law is the i.i.d. one, so every method exact for that law verifies it,
through the engine, sweeps and reports, with no new method record."""

import jax

from spectr_jax import acceptance, drafting, methods, sampling


def draw(key_BxK, p_BxKxV, source_BxK, level, node_BxKx2):
  """One depth: every tail draws its own token from its own p, its key folded with 7."""
  del level
  key_BxK = jax.vmap(jax.vmap(lambda key: jax.random.fold_in(key, 7)))(key_BxK)
  return jax.vmap(jax.vmap(sampling.categorical))(key_BxK, p_BxKxV), source_BxK, node_BxKx2


def depths(num_drafts, draft_len, branching=None):
  del num_drafts, branching
  return drafting.Depths(draw, draw, ((1, 1),) * draft_len)


SCHEME = methods.Drafting(
  name="toy_iid",
  depths=depths,
  bound=acceptance.optimal_acceptance_X,
  bound_label="optimal alpha*",
  summary="toy: K i.i.d. draft sequences under a folded key",
  law="iid",
)
methods.register_drafting(SCHEME)
