"""What a verifier returns: the records every verifier module shares (a leaf module)."""

from typing import Any, NamedTuple

__all__ = ["OVERSHOOT_TOL", "BlockVerdict", "Verdict"]

# An overshoot (`Verdict.overshoot`) above this marks a position whose output law is not q
# (float32 rounding of an exact verifier stays orders of magnitude below it).
OVERSHOOT_TOL = 1e-6


class Verdict(NamedTuple):
  """A token-level verifier's decision at one position.

  token: the int32 output token. accepted: whether it came from the accept branch.
  rho: the split factor used (K-SEQ; 1 for single-draft rules, 0 for methods without one).
  overshoot: sum_x max(A(x) - q(x), 0), the mass by which the accept branch's law A
    exceeds q: 0 for an exact verifier, > 0 where a fixed rho is below what the
    position needs (the output law is then not q).
  """

  token: Any
  accepted: Any
  rho: Any = 0.0
  overshoot: Any = 0.0


class BlockVerdict(NamedTuple):
  """A block-level verifier's decision on one block (index t = 0..L).

  tokens_L1: the emitted tokens, `tokens_L1[:num_tokens]` (the rest 0).
  num_tokens: 1 <= num_tokens <= L + 1.
  survivors_L1: the draft paths that agree with the verified path at depth t.
  """

  tokens_L1: Any
  num_tokens: Any
  survivors_L1: Any
