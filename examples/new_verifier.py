"""A new verifier, from its function to a checked, registered, swept and reported method
(the runnable code of docs/NEW_VERIFIER.md).

  python examples/new_verifier.py           # about 2 minutes on CPU
  python examples/new_verifier.py --quick   # fewer checks and cells (the test runs this)

Steps: (1) a naive multi-draft rule, which `check_verifier` shows inexact; (2) the fixed
rule, "chain": exact for i.i.d. drafts, not for drafts without replacement, which the
same call shows; (3) its `methods.Method` record, registered at runtime, and its law
through the engine (`check_engine`, V = 32000; not with --quick); (4) a tiny sweep on
random test models beside SpecInfer and single-draft sampling, summarised by
`report.summarize`.
"""

import argparse
import dataclasses
import pathlib
import sys
import tempfile

# The repository root: the configs package imports from there.
ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from spectr_jax import acceptance, methods  # noqa: E402
from spectr_jax.methods import Verdict  # noqa: E402
from spectr_jax.sampling import categorical  # noqa: E402


def _ratio(r_V, p_V, x):
  """min(1, r(x) / p(x)) as the accept test reads it (0 where p(x) = 0)."""
  return jnp.where(p_V[x] > 0, r_V[x] / jnp.where(p_V[x] > 0, p_V[x], 1.0), 0.0)


def naive_position(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """INEXACT: every valid draft in turn is accepted with min(1, q / p), the target never
  updated; if all are rejected, the single-draft residual norm(max(q - p, 0))."""
  accept_key, residual_key = jax.random.split(key)
  u_K = jax.random.uniform(accept_key, drafts_K.shape)
  accept_K = valid_K & (u_K < jax.vmap(lambda x: _ratio(q_V, p_V, x))(drafts_K))
  y = categorical(residual_key, acceptance.residual(q_V, p_V))
  token = jnp.where(jnp.any(accept_K), drafts_K[jnp.argmax(accept_K)], y)
  return Verdict(token.astype(jnp.int32), jnp.any(accept_K))


def chain_position(key, drafts_K, p_V, q_V, valid_K) -> Verdict:
  """Recursive rejection: the valid drafts in turn, each accepted with min(1, r / p)
  where r starts at q and after each rejection becomes norm(max(r - p, 0)); if all are
  rejected, a draw from the last r. Each step is single-draft speculative sampling of r
  with a fresh draft from p, so the output is q for i.i.d. drafts (not for drafts without
  replacement: the second draft is not from p)."""
  accept_key, residual_key = jax.random.split(key)
  u_K = jax.random.uniform(accept_key, drafts_K.shape)

  def step(carry, inputs):
    r_V, accepted, token = carry
    x, valid, u = inputs
    tried = valid & ~accepted
    accept = tried & (u < _ratio(r_V, p_V, x))
    r_V = jnp.where(tried & ~accept, acceptance.residual(r_V, p_V), r_V)
    return (r_V, accepted | accept, jnp.where(accept, x, token)), None

  init = (q_V, jnp.bool_(False), jnp.int32(0))
  (r_V, accepted, token), _ = jax.lax.scan(step, init, (drafts_K, valid_K, u_K))
  y = categorical(residual_key, r_V)
  return Verdict(jnp.where(accepted, token, y).astype(jnp.int32), accepted)


# The method record: what the engine, sweeps, memory plans and reports read.
CHAIN = methods.Method(
  name="chain",
  level="token",
  verify=chain_position,
  summary="recursive rejection written as a scan (docs/NEW_VERIFIER.md's example)",
  single="sd",
  exact_for=("iid",),
  label="chain (example)",
  compare_with=("specinfer",),
)


def check(quick: bool) -> None:
  """Steps 1 and 2: the evidence, as markdown tables (--quick: a smoke test of the steps,
  one tree per law, where both failures show; else `check_verifier`'s default mode)."""
  from spectr_jax.testing import check_verifier
  from spectr_jax.testing.harness import CASES

  light = dict(quick=True, boundary=False, large_vocab=None, cases=CASES[:1]) if quick else {}
  naive = check_verifier(naive_position, level="token", laws=("iid",), name="naive", **light)
  print(naive.markdown(), "\n")
  assert not naive.passed
  chain = check_verifier(chain_position, level="token", laws=("iid", "wor"), name="chain",
                         **light)  # fmt: skip
  print(chain.markdown(), "\n")
  print(chain.power_markdown(), "\n")
  assert {row.law for row in chain.failures} == {"wor"}, "chain: exact for iid, not wor"


def check_through_the_engine() -> None:
  """Step 3b: the registered method through the engine at V = 32000 (about 90 s on CPU)."""
  from spectr_jax.testing import check_engine

  report = check_engine("chain", num_drafts=2)
  print(report.markdown(), "\n")
  assert report.passed, "chain decodes the target's law through the engine"


def random_pair(seed: int = 0):
  """Random-weight test models (V = 16) and 40 random held-out sentences (as the sweep
  tests' `random_pair`)."""
  from spectr_jax import pairs
  from spectr_jax.data import TokenizedSplit
  from spectr_jax.models import ModelBundle, get_model_config, init_params

  draft_config = get_model_config("draft-test", 16, max_len=32)
  target_config = get_model_config("target-test", 16, max_len=32)
  draft = ModelBundle(draft_config, init_params(draft_config, jax.random.key(seed)))
  target = ModelBundle(target_config, init_params(target_config, jax.random.key(seed + 1)))
  rng = np.random.default_rng(seed)
  heldout = TokenizedSplit.from_ids(
    [list(rng.integers(4, 16, rng.integers(1, 8))) for _ in range(40)]
  )
  return pairs.make_pair(draft, target, heldout, what="random")


def sweep(quick: bool, results_dir: str) -> list[dict]:
  """Step 4: the sweep's cells, decoded and stored in results_dir; the summary rows."""
  from configs import lm1b_spectr
  from spectr_jax import experiment, report
  from spectr_jax.sweep_config import SweepConfig

  config = SweepConfig.from_dict(lm1b_spectr.get_config("test").to_dict())
  names = ("autoregressive", "specinfer", "chain")
  if not quick:
    names = ("autoregressive", "sd", "specinfer", "chain")
  config = dataclasses.replace(
    config, results_dir=results_dir, methods=names, num_drafts=(2,) if quick else (1, 2, 3),
    seeds=(0,) if quick else (0, 1),
  )  # fmt: skip
  records = experiment.run_sweep(config, random_pair())
  rows = report.summarize(records)
  print(report.markdown_table(rows))
  return rows


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer checks and sweep cells")
  parser.add_argument(
    "--results-dir", default="", help="where the sweep writes (default: a temp dir)"
  )
  args = parser.parse_args(argv)
  check(args.quick)
  methods.register(CHAIN)  # step 3: from here on "chain" is a method like any other
  if args.quick:  # tests/workbench/test_engine_check.py runs the same call on K-SEQ
    print("(--quick: the check through the engine, step 3b, is left out)\n")
  else:
    check_through_the_engine()
  with tempfile.TemporaryDirectory() as tmp:
    rows = sweep(args.quick, args.results_dir or tmp)
  # The same rule and the same random draws as SpecInfer (`verify.specinfer_verdict`
  # splits the key and draws its uniforms the same way): the same tokens.
  by_method = {(r["method"], r["K"]): r["block_efficiency"] for r in rows}
  for (name, k), value in by_method.items():
    if name == "chain":
      assert abs(value - by_method[("specinfer", k)]) < 1e-9, (k, value)
  return rows


if __name__ == "__main__":
  main()
