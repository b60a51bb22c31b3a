"""Length policies: how many of its L drafted positions each path of a round verifies.

A policy is one decode option. It carries its static part (its class: the compile key),
reads its traced value from one `DecodeSpec` field, and checks its own pairing with the
spec's verifier, drafting scheme and scoring. `rounds.run_round` asks it for each path's
length after drafting; the draft loop asks it when to stop. Adding an option means one
policy here and its field in `decode_spec.DecodeSpec`.

  Fixed       every path verifies all L positions (the default).
  Adaptive    DecodeSpec.adaptive: a confidence threshold (`adaptive.confident_length`).
  NodeBudget  DecodeSpec.node_budget: nodes per row of the batch's tree budget
              (`adaptive.budget_nodes`).

Exactness: a path's length at position t may depend only on what was drafted before t
and on draws independent of its own (docs/ADAPTIVE.md).
"""

import dataclasses
import numbers
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import adaptive

__all__ = ["POLICIES", "Adaptive", "Fixed", "LengthPolicy", "Lengths", "NodeBudget", "policy"]


class Lengths(NamedTuple):
  """A round's path lengths.

  all_BxK: each path's verified length, int32 in [1, L] (0 where L = 0).
  ragged_BxK: the same where paths may verify fewer than L positions (the target then
    scores, and the verifier walks, each path to its own length); None where every path
    verifies L.
  """

  all_BxK: jax.Array
  ragged_BxK: jax.Array | None

  @classmethod
  def ragged(cls, length_BxK) -> "Lengths":
    return cls(length_BxK, length_BxK)


@dataclasses.dataclass(frozen=True)
class LengthPolicy:
  """The base: every path verifies its L positions; subclasses override what differs.

  field: the `DecodeSpec` field that turns the policy on (0 is off) and holds its traced
    value ("" for the default).
  """

  field: ClassVar[str] = ""

  def check(self, spec: Any) -> None:
    """Raises a clear error where the policy cannot run with `spec` (its verifier,
    drafting scheme, scoring or value)."""

  def value(self, spec: Any) -> jax.Array:
    """The traced value the compiled program takes (float32)."""
    return jnp.float32(getattr(spec, self.field) if self.field else 0.0)

  def stop_drafting(self, value: jax.Array) -> jax.Array | None:
    """A threshold at which the draft loop stops early (`drafting.draft_paths`), or
    None to draft all L positions."""
    del value

  def lengths(self, drafts_BxKxL, p_BxKxLxV, value, active_B) -> "Lengths":
    """Each path's verified length (`Lengths`)."""
    del p_BxKxLxV, value, active_B
    b, k, length = drafts_BxKxL.shape
    return Lengths(jnp.full((b, k), length, jnp.int32), None)

  def draft_calls(self, length_BxK, draft_len: int) -> jax.Array | int:
    """The draft model calls the round made (statistics)."""
    del length_BxK
    return draft_len


@dataclasses.dataclass(frozen=True)
class Fixed(LengthPolicy):
  """Every path verifies all L positions."""


@dataclasses.dataclass(frozen=True)
class Adaptive(LengthPolicy):
  """Each row verifies its confident length: position j >= 1 while the likeliest draft
  prefix before j has probability >= the threshold; drafting stops at the batch's
  longest (`adaptive.confident_length`)."""

  field: ClassVar[str] = "adaptive"

  def check(self, spec: Any) -> None:
    value = spec.adaptive
    if not (isinstance(value, numbers.Real) and 0 < value <= 1):
      raise ValueError(f"adaptive must be a threshold in (0, 1], or 0 for off, got {value!r}")
    if spec.verifier.level != "token":
      raise ValueError(
        f"adaptive draft length needs a token-level verifier: method {spec.method!r} "
        "verifies whole blocks (its walk cannot stop at a chosen position)"
      )
    if spec.dedup:
      raise ValueError("adaptive draft length drafts and scores tails: set dedup false")

  def stop_drafting(self, value):
    return value

  def lengths(self, drafts_BxKxL, p_BxKxLxV, value, active_B):
    del active_B
    b, k, _ = drafts_BxKxL.shape
    length_B = jax.vmap(adaptive.confident_length, (0, 0, None))(drafts_BxKxL, p_BxKxLxV, value)
    return Lengths.ragged(jnp.broadcast_to(length_B[:, None], (b, k)))

  def draft_calls(self, length_BxK, draft_len):
    del draft_len
    return jnp.max(length_BxK)


@dataclasses.dataclass(frozen=True)
class NodeBudget(LengthPolicy):
  """The batch's tree budget: the live rows share floor(budget x live rows) of the
  drafted tree's K L nodes (`adaptive.budget_nodes`); each path is verified, and
  scored, to the depth its kept nodes reach."""

  field: ClassVar[str] = "node_budget"

  def check(self, spec: Any) -> None:
    nodes, value = spec.num_drafts * spec.draft_len, spec.node_budget
    if not (isinstance(value, numbers.Real) and 1 <= value <= nodes):
      raise ValueError(
        f"node_budget must lie in [1, K L = {nodes}], or be 0 for off, got {value!r}"
      )
    scheme = spec.scheme
    if scheme is None or not scheme.branches or spec.branching != "":
      raise ValueError(
        "node_budget shares the nodes of a tree drafting scheme in its default shape "
        f"(drafting 'wor' with branching ''): method {spec.method!r} draws "
        f"{'no tree' if scheme is None or not scheme.branches else 'a tree'}"
        f"{f' of branching {spec.branching!r}' if spec.branching != '' else ''}"
      )
    if not spec.dedup:
      raise ValueError(
        "node_budget needs dedup: the target scores the kept nodes of the round's tree "
        "(tails would score every path's L + 1 positions whatever it keeps)"
      )
    if not spec.verifier.takes_length:
      raise ValueError(f"method {spec.method!r} cannot verify paths to lengths of their own")

  def lengths(self, drafts_BxKxL, p_BxKxLxV, value, active_B):
    return Lengths.ragged(adaptive.budget_nodes(drafts_BxKxL, p_BxKxLxV, value, active_B))


# The policies a `DecodeSpec` field turns on.
POLICIES: tuple[type[LengthPolicy], ...] = (Adaptive, NodeBudget)


def policy(spec: Any) -> LengthPolicy:
  """The length policy `spec` asks for (at most one field set), checked against it.

  Raises:
    ValueError: two policies at once, or the policy's own check.
  """
  off = lambda value: isinstance(value, numbers.Real) and value == 0  # noqa: E731
  chosen = [cls for cls in POLICIES if not off(getattr(spec, cls.field))]
  if len(chosen) > 1:
    fields = " and ".join(cls.field for cls in chosen)
    raise ValueError(f"{fields} are not combined: choose one")
  if not chosen:
    return Fixed()
  chosen = chosen[0]()
  chosen.check(spec)
  return chosen
