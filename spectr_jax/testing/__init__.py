"""References for checking the library, importable by tests and scripts alike.

- `reference`: float64 output laws of the verifiers by enumeration, and the LP bounds
  of acceptance (scipy's linprog): what the closed forms and Monte Carlo tests are
  checked against.
- `sequences`: random and constant (p, q) trees of block_bound's layout, and the
  sequence-level verifiers run on them (scripts/block_table.py, tests).
- `wor_reference`: the laws of drafts without replacement and their verifiers.
- `hsd`: HSD (Zhou et al., arXiv 2601.05724), the two readings of its authors' code
  (`algorithm_clean.py`, deleted before publication, and the rule in the repository at
  publication), in JAX and as exact float64 chain laws: rules found NOT exact, kept
  here (not in the method registry) so that tests and scripts/block_table.py show where
  they fail.
- `harness` (the exactness checks of a verify function), with `power` (the Wald test and
  the total variation a check detects) and `evidence` (its rows and report).
- `hf_checkpoints`: tiny Hugging Face checkpoints (config.json, safetensors,
  tokenizer.json) of each family, written in the hub's format, for the loaders' tests
  and load benchmarks.

The exactness harness is exported here (imported on first use, so the references above
load without JAX):

- `check_verifier(fn, level=..., laws=...)`: the evidence that a verifier of either level
  is exact for the drafting laws it claims, as a `Report` (a markdown table of cases,
  `.passed`, `.failures`); see `spectr_jax.testing.harness` and docs/NEW_VERIFIER.md.
- `check_engine(method)`: a registered method's output law through the engine at
  V = 32000 (random-weight models), as a `Report`; see `spectr_jax.testing.engine_check`.
"""

__all__ = ["Report", "check_engine", "check_verifier"]
_HOME = {"Report": "harness", "check_verifier": "harness", "check_engine": "engine_check"}


def __getattr__(name):
  if name in _HOME:
    import importlib

    return getattr(importlib.import_module(f"spectr_jax.testing.{_HOME[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
