"""spectr-jax: exact multi-draft speculative decoding (SpecTr / K-SEQ) in JAX.

Shape letters used in names throughout the package (one meaning each; `x` separates
axes, e.g. p_BxKxLxV):
  B   batch: rows of one call (prompts, training rows, or the draws of a statistical test)
  K   drafts                          L   draft length; L1 = L + 1, L2 = L + 2
  V   vocabulary; V1 = V + 1, V2 = V + 2   X   positions flattened into one axis
  Vb, Vt  the sampler's blocks of the vocabulary and the tokens of one block
  Vs  the optimal verifier's slot groups of the vocabulary; Vs1 = Vs + 1 breakpoints
  T   time: tokens along a sequence (the new tokens of a call); T1 = T + 1
  P   prompt width (right-padded)     W   width of a token buffer (prompt + new tokens,
                                          or the output buffer of a decode)
  S   cache length (prefix slots)     R   cache tail slots (per draft)
  D   model width; Dh head width      F   MLP width
  H   attention heads; Hk key/value heads; G query heads per key/value head
  N   nodes of a token tree (`tree`)  M   candidate breakpoints (optimal verifier)
  J   the children drawn at one node of a draft tree (`drafting`)
  Y   layers                          Q   quadrature nodes (`acceptance`'s race integral)
  E   examples: rows of a data set (held-out rows) or prompts of one seed
  Z   seeds of a sweep                I   bootstrap resamples
  A   any length or leading shape (generic helpers)   C   columns stacked side by side

Layers: a module imports only the modules listed before it in `ORDER` (bottom up) of
tests/test_layers.py, which checks it. Entry points (experiments/, scripts/) sit on top.

The names below are importable from the package itself (`spectr_jax.generate`); they
are loaded on first use, so importing one light module (e.g. `spectr_jax.report`) does
not import JAX.
"""

import importlib

_EXPORTS = {
  "generate": "engine",
  "GenerateOutput": "engine",
  "DecodeStats": "engine",
  "verify_drafts": "methods",
  "verify_block": "verify",
  "DecodePlan": "plan",
  "kseq": "verify",
  "specinfer": "verify",
  "speculative_sampling": "verify",
  "block_verify": "block",
  "block_bound": "block_bound",
  "kseq_acceptance": "acceptance",
  "specinfer_acceptance": "acceptance",
  "optimal_acceptance": "acceptance",
  "TrainConfig": "train_config",
  "PairConfig": "pair_config",
  "DecodeSettings": "config",
  "DecodeSpec": "decode_spec",
  "SweepConfig": "sweep_config",
  "AnalysisConfig": "sweep_config",
  "RhoAblationConfig": "sweep_config",
  "EvalConfig": "evaluate",
  "Pair": "pairs",
  "load_pair": "pairs",
  "run_sweep": "experiment",
  "run_rho_ablation": "analysis",
  "load_bundle": "runs",
  "load_results": "results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"spectr_jax.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'spectr_jax' has no attribute {name!r}")
