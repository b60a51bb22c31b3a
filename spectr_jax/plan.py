"""A `DecodeSpec` resolved once into the static plan of its compiled program.

`resolve` turns a spec and its models' configs into a frozen, hashable `DecodePlan`:
the verifier's and drafting scheme's records themselves, how the target scores
(`scoring.Tails` or `scoring.Tree`), the length policy (`lengths`), and the static
sizes. The plan keys the compiled program (`engine.compiled_program`); `traced` gives
the values the program takes as arguments, so specs that differ only in them share it.
`rounds.run_round` reads the plan as a straight line: draft, choose lengths, score,
verify, commit.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from spectr_jax import acceptance, drafting, lengths, methods, sampling, scoring, sharding
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import Decoder, ModelConfig, decoder

__all__ = ["DecodePlan", "Traced", "resolve", "traced"]


class Traced(NamedTuple):
  """The settings a compiled program takes as arguments (a sweep changes them without
  recompiling; greedy or sampling is static: `DecodePlan.greedy`)."""

  temperature: jax.Array
  top_p: jax.Array
  rho_value: jax.Array
  eos_ids: jax.Array  # int32 [A] stop tokens (-1: none)
  # Tokens a row emits at most (int32; never more than DecodePlan.max_new_tokens).
  token_limit: jax.Array | int = 2**31 - 1
  # The length policy's value (float32; `lengths.LengthPolicy.value`).
  length: jax.Array | float = 0.0


@dataclasses.dataclass(frozen=True)
class DecodePlan:
  """Everything that fixes the compiled program (static under jit, hashable).

  Attributes:
    verifier: the method's record (`methods.Method`).
    drafter: `drafting.Drafter` (its scheme and tree shape) or `drafting.NoDrafts`.
    scoring: `scoring.Tails` or `scoring.Tree`.
    length: the length policy (`lengths.LengthPolicy`).
    num_drafts, draft_len, max_new_tokens: K, L and T.
    top_k: keep the top_k most likely tokens (None: all). use_top_p: apply
      `Traced.top_p`. greedy: one-hot on the argmax instead of sampling.
    rho_mode: "star", "k" or "fixed" for a method with a split factor, else "".
    draft_config, target_config: the models (the draft None without drafts).
    scan_layers: the models' layers under `lax.scan` (True), unrolled (False), or by
      depth (None: `models.layout.scans`).
  """

  verifier: methods.Method
  drafter: drafting.Drafter | drafting.NoDrafts
  scoring: scoring.Tails | scoring.Tree
  length: lengths.LengthPolicy
  num_drafts: int
  draft_len: int
  max_new_tokens: int
  top_k: int | None
  use_top_p: bool
  greedy: bool
  rho_mode: str
  draft_config: ModelConfig | None
  target_config: ModelConfig
  scan_layers: bool | None = None

  @property
  def round_width(self) -> int:
    """L + 1: the most tokens one round can emit."""
    return self.draft_len + 1

  @property
  def draft(self) -> Decoder | None:
    """The draft model's decoder (None without drafts)."""
    return None if self.draft_config is None else decoder(self.draft_config)

  @property
  def target(self) -> Decoder:
    """The target model's decoder."""
    return decoder(self.target_config)

  @property
  def features(self) -> bool:
    """The draft reads the target's features (a head): the target's calls return them."""
    return self.draft is not None and self.draft.reads_features

  def probs(self, logits_AxV, traced: Traced):
    """Sampling distributions of logits [..., V] under the decode's transforms (float32)."""
    top_p = traced.top_p if self.use_top_p else None
    logits_AxV = sharding.replicate_over_model(logits_AxV)
    return sampling.transform_probs(
      logits_AxV, traced.temperature, top_k=self.top_k, top_p=top_p, greedy=self.greedy
    )

  def replace(self, **changes: Any) -> "DecodePlan":
    """A copy with `changes` (e.g. another length policy)."""
    return dataclasses.replace(self, **changes)


def resolve(spec: DecodeSpec, draft: ModelConfig | None, target: ModelConfig) -> DecodePlan:
  """The plan of decoding `spec` with these models (what `engine.compiled_program` is
  keyed by)."""
  verifier = spec.verifier
  scheme = spec.scheme
  return DecodePlan(
    verifier=verifier,
    drafter=drafting.NoDrafts()
    if scheme is None
    else drafting.Drafter(scheme, spec.branching or None),
    scoring=scoring.Tree() if spec.dedup else scoring.Tails(),
    length=lengths.policy(spec),
    num_drafts=spec.num_drafts,
    draft_len=spec.draft_len,
    max_new_tokens=spec.max_new_tokens,
    top_k=spec.top_k or None,
    use_top_p=spec.top_p < 1,
    greedy=spec.greedy,
    rho_mode=acceptance.split_rho(spec.rho)[0] if verifier.takes_rho else "",
    draft_config=draft if spec.speculative else None,
    target_config=target,
    scan_layers=spec.scan_layers,
  )


def traced(spec: DecodeSpec, plan: DecodePlan | None = None) -> Traced:
  """The values of `spec` its program takes as arguments (one program serves them all)."""
  policy = lengths.policy(spec) if plan is None else plan.length
  return Traced(
    temperature=jnp.float32(spec.temperature),
    top_p=jnp.float32(spec.top_p),
    rho_value=acceptance.split_rho(spec.rho)[1],
    eos_ids=jnp.asarray(spec.eos_ids or (-1,), jnp.int32),
    token_limit=jnp.int32(spec.token_limit or spec.max_new_tokens),
    length=policy.value(spec),
  )
