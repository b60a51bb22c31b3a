"""spectr-jax: exact multi-draft speculative decoding (SpecTr / K-SEQ) in JAX.

Shape letters used in names throughout the package:
  B batch (prompts), K drafts, L draft length, L1 = L + 1, V vocabulary,
  D model width, T time (new tokens in a call), S cache length, H heads, N layers.
"""
