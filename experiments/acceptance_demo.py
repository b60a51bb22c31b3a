r"""Exact per-position acceptance of every verifier on the SPEC examples and synthetic pairs.

Prints, for k in {1, 2, 4, 8}, the hit probability P(Y in drafts) of single-draft
speculative sampling, K-SEQ (rho* and rho = k), SpecInfer and the optimal-transport bound,
and checks K-SEQ's closed form against a Monte Carlo run of the jitted verifier.

  python experiments/acceptance_demo.py [--samples 20000]
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from spectr_jax import acceptance, sampling, tables, verify

_SAMPLES = flags.DEFINE_integer("samples", 20_000, "Monte Carlo samples per K-SEQ check.")


def _pairs():
  rng = np.random.default_rng(0)
  base = rng.normal(size=1000)
  llm = [np.exp(2.0 * (base + 0.5 * rng.normal(size=1000))) for _ in range(2)]
  return {
    "SPEC p=(.6,.4) q=(.3,.7)": ([0.6, 0.4], [0.3, 0.7]),
    "SPEC p=(1,0) q=(.5,.5)": ([1.0, 0.0], [0.5, 0.5]),
    "Dirichlet V=100": tuple(rng.dirichlet(np.ones(100)) for _ in range(2)),
    "LLM-like V=1000": tuple(x / x.sum() for x in llm),
  }


def _monte_carlo_hit(p_V, q_V, k, samples):
  def one(key):
    draft_key, verify_key = jax.random.split(key)
    drafts_K = jax.vmap(sampling.categorical, (0, None))(jax.random.split(draft_key, k), p_V)
    token, _ = verify.kseq(verify_key, drafts_K, p_V, q_V)
    return jnp.any(drafts_K == token)

  hits = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), samples))
  return float(jnp.mean(hits))


def main(argv):
  del argv
  methods = ("single", "kseq-star", "kseq-k", "specinfer", "optimal")
  cols = [("pair", "pair", "{}"), ("k", "k", "{}")]
  cols += [(m, m, "{:.4f}") for m in methods] + [("mc", "kseq-star (Monte Carlo)", "{:.4f}")]
  print(tables.markdown([], cols))
  for name, (p, q) in _pairs().items():
    p_V, q_V = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
    for k in (1, 2, 4, 8):
      exact = acceptance.compare_methods(p_V, q_V, k)
      mc = _monte_carlo_hit(p_V, q_V, k, _SAMPLES.value)
      row = {"pair": name, "k": k, "mc": mc, **{m: float(exact[m]) for m in methods}}
      print(tables.markdown([row], cols).splitlines()[-1], flush=True)


if __name__ == "__main__":
  app.run(main)
