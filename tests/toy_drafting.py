"""A drafting scheme added in this one module (issue 39's check of the independent axes):
K i.i.d. draft sequences drawn by `drafting.iid` under randomness of its own (each row's
key folded with a constant). Its law is the i.i.d. one, so every method exact for that law
verifies it, through the engine, sweeps and reports, with no new method record."""

import jax

from spectr_jax import drafting, methods

SCHEME = methods.Drafting(
  name="toy_iid",
  draft="tests.toy_drafting:draw",
  bound="spectr_jax.acceptance:optimal_acceptance_X",
  bound_label="optimal alpha*",
  summary="toy: K i.i.d. draft sequences under a folded key",
  law="iid",
)
methods.register_drafting(SCHEME)


def draw(extend, params, cache, pending_Bx2, num_pending_B, key_B, probs, **kw):
  """`drafting.iid` with each row's key folded with 7."""
  key_B = jax.vmap(lambda key: jax.random.fold_in(key, 7))(key_B)
  return drafting.iid(extend, params, cache, pending_Bx2, num_pending_B, key_B, probs, **kw)
