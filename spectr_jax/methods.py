"""The method registry: one record per decoding method, the seam every layer iterates over.

A record says everything the rest of the framework needs to know about a method: its
verify function and whether it decides per position ("token") or over the whole block
("block"), which K it takes and what it becomes at K = 1, whether it takes the split
factor rho, the drafting scheme its drafts come from, its verifier workspace (memory
plan), its closed-form per-position acceptance where one exists, and how reports label,
order, and compare it (plots give each multi-draft method its own colour, in registry
order). The engine, `experiment.expand`, `memory`, `analysis`, `report` and the configs
read this table; none of them names a method.

Adding a verifier: write its function (one module, or one function in an existing one)
with the signature of its level, add one `Method` to `METHODS` below, and test it
(tests/test_methods.py checks every record's references and the boundary uniforms).

  token level:  fn(key, drafts_K, p_V, q_V, valid_K) -> Verdict
                (methods with `takes_rho` also get keyword arguments rho_mode, rho_value)
                k = sum(valid_K) valid drafts, i.i.d. from p (or drawn by the method's
                drafting scheme); with none valid, the function samples q.
  block level:  fn(key, drafts_KxL, p_KxLxV, q_KxL1xV) -> BlockVerdict
                (index convention of `verify.verify_block`).

Functions are named by "module:function" strings and imported on first use, so this
module (and the config boundary that validates method names with it) imports no JAX.
"""

import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = [
  "LEVELS",
  "METHODS",
  "OVERSHOOT_TOL",
  "PROPORTIONAL",
  "BlockVerdict",
  "Drafting",
  "DRAFTING",
  "Method",
  "Verdict",
  "check_branching",
  "check_rho",
  "exact_for",
  "get",
  "get_drafting",
  "names",
  "register",
  "register_drafting",
  "resolve",
  "scheme",
]

LEVELS = ("none", "token", "block")
RHO_NAMES = ("star", "k")
# An overshoot (`Verdict.overshoot`) above this marks a position whose output law is not q
# (float32 rounding of an exact verifier stays orders of magnitude below it).
OVERSHOOT_TOL = 1e-6


class Verdict(NamedTuple):
  """What a token-level verifier returns for one position.

  token: the int32 output token. accepted: whether it came from the accept branch.
  rho: the split factor used (K-SEQ; 1 for single-draft rules, 0 for methods without one).
  overshoot: sum_x max(A(x) - q(x), 0), the mass by which the accept branch's law A
    exceeds the target: 0 for an exact verifier; > 0 means the residual would be
    negative and the output law is not q (a fixed rho below what the position needs).
  """

  token: Any
  accepted: Any
  rho: Any = 0.0
  overshoot: Any = 0.0


class BlockVerdict(NamedTuple):
  """What a block-level verifier returns for one block (index t = 0..L).

  tokens_L1: the emitted tokens, `tokens_L1[:num_tokens]` (the rest 0).
  num_tokens: 1 <= num_tokens <= L + 1.
  survivors_L1: the draft paths that agree with the verified path at depth t.
  """

  tokens_L1: Any
  num_tokens: Any
  survivors_L1: Any


def resolve(reference: str) -> Callable:
  """The object a "module:name" reference names (imported on first use)."""
  module, _, name = reference.partition(":")
  return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class Drafting:
  """A drafting scheme: how a round's K draft sequences are drawn.

  Attributes:
    name: the registry key.
    draft: "module:function" of the scheme (see `spectr_jax.drafting`).
    bound: "module:function" of the per-position optimum for k drafts of this scheme,
      (p_XxV, q_XxV, k) -> [X], or "" where none is implemented.
    bound_label: how tables name that bound.
    summary: one line for docs and reports.
    check: "module:function" that raises a clear error for concrete drafts_KxL this
      scheme cannot have drawn (`verify.verify_block` runs it), or "".
    branches: whether the scheme draws a tree and takes its shape, children per depth
      or "proportional" (`DecodeSpec.branching`, passed on as the scheme's
      `branching`).
    law: the drafting law its drafts follow, which decides the verifiers exact for it
      (`Method.exact_for`): "iid" (K i.i.d. sequences) or "wor" (a tree drawn without
      replacement); default: the scheme's name. A new scheme of an existing law is
      verified by every verifier exact for that law, with no new method record.
  """

  name: str
  draft: str
  bound: str
  bound_label: str
  summary: str
  check: str = ""
  branches: bool = False
  law: str = ""

  def __post_init__(self):
    if not self.law:
      object.__setattr__(self, "law", self.name)


DRAFTING: dict[str, Drafting] = {
  d.name: d
  for d in (
    Drafting(
      name="iid",
      draft="spectr_jax.drafting:iid",
      bound="spectr_jax.acceptance:optimal_acceptance_X",
      bound_label="optimal alpha*",
      summary="K i.i.d. draft sequences of length L (duplicates are separate chances)",
    ),
    Drafting(
      name="wor",
      draft="spectr_jax.drafting:without_replacement",
      bound="spectr_jax.acceptance:wor_bound_X",
      bound_label="optimal w/o replacement (prefix search)",
      summary="a static tree whose children are drawn without replacement at every node "
      "(Gumbel-top-k law); by default K distinct first tokens, each path continuing alone "
      "(Jeon et al., arXiv 2402.14160; Hu et al., arXiv 2502.18779; Sequoia, arXiv "
      "2402.12374); where a node has fewer tokens with mass than children, the extra "
      "children copy the first child's subtree",
      check="spectr_jax.drafting:check_distinct",
      branches=True,
    ),
  )
}


@dataclasses.dataclass(frozen=True)
class Method:
  """One decoding method.

  Attributes:
    name: the registry key (what configs, cells and `engine.generate` use).
    level: "none" (autoregressive: no drafts), "token" (walked position by position by
      `verify.walk`) or "block" (decides over the whole block).
    verify: "module:function" of the verify function ("" for level "none").
    summary: one line for docs and reports (with the paper it comes from).
    max_drafts: the largest K it takes (None: any K >= 1).
    single: the method it is at K = 1 ("kseq" is "sd" there); sweeps run it only at
      K >= 2 and draw that method's K = 1 cell as the start of its line. None: itself.
    takes_rho: it has a split factor rho ("star", "k" or a number; one sweep cell per
      rho); only these verify functions see rho.
    drafting: its default drafting scheme (a name in `DRAFTING`); a decode may name
      another (`DecodeSpec.drafting`) of a law in `exact_for`.
    exact_for: the drafting laws (`Drafting.law`) for which its output follows the
      target's law; default: its default scheme's law.
    workspace_bytes: one row's verifier workspace beyond the round's probability arrays
      (`memory.plan`; e.g. the optimal plan's levels).
    acceptance: "module:function" of its exact per-position hit probability with k
      drafts, (p_XxV, q_XxV, k[, rho]) -> [X] (methods with `takes_rho` get rho), or "".
    label: the name tables and plots print.
    compare_with: methods it is compared with cell by cell (paired gains in reports).
    takes_length: a block-level verify function that takes length_K= (each path verified
      up to its own length: a tree budget, `adaptive.budget_nodes`); token-level methods
      all do (`verify.walk_positions`).
  """

  name: str
  level: str
  verify: str
  summary: str
  max_drafts: int | None = None
  single: str | None = None
  takes_rho: bool = False
  drafting: str = "iid"
  exact_for: tuple[str, ...] = ()
  workspace_bytes: int = 0
  acceptance: str = ""
  label: str = ""
  compare_with: tuple[str, ...] = ()
  takes_length: bool = False

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"method {self.name!r}: level must be one of {LEVELS}")
    if self.drafting not in DRAFTING and self.level != "none":
      raise ValueError(f"method {self.name!r}: unknown drafting scheme {self.drafting!r}")
    if not self.label:
      object.__setattr__(self, "label", self.name)
    if not self.exact_for and self.level != "none":
      object.__setattr__(self, "exact_for", (DRAFTING[self.drafting].law,))

  @property
  def speculative(self) -> bool:
    """Whether it verifies drafts (all but autoregressive decoding)."""
    return self.level != "none"

  @property
  def multi_draft(self) -> bool:
    """Whether it takes K >= 2."""
    return self.speculative and self.max_drafts is None

  def function(self) -> Callable:
    """The verify function (imported on first use)."""
    return resolve(self.verify)

  def acceptance_function(self) -> Callable | None:
    """The closed-form per-position acceptance, or None."""
    return resolve(self.acceptance) if self.acceptance else None

  def check_drafts(self, num_drafts: int) -> None:
    """Raises a clear error for a K this method cannot take."""
    if self.max_drafts is not None and num_drafts > self.max_drafts:
      raise ValueError(f"method {self.name!r} verifies a single draft, got K = {num_drafts}")

  def grid_drafts(self, num_drafts: Sequence[int]) -> list[int]:
    """The K values of a sweep grid this method runs (K = 1 only where it is itself)."""
    if not self.speculative:
      return [1]
    if self.max_drafts is not None:
      return [1]
    if self.single is None:
      return list(num_drafts)
    return [k for k in num_drafts if k >= 2]


# One draft sequence is a draw from the draft model under either law.
ONE_DRAFT_LAWS = ("iid", "wor")
# The optimal plan's workspace: its O(M^2) levels and rates at M = 128 cuts, 1232 KiB
# measured at V = 1024, K = 2 (docs/RESULTS.md, "Memory"; it grows little with V).
PLAN_WORKSPACE_BYTES = 1232 * 1024

METHODS: dict[str, Method] = {
  m.name: m
  for m in (
    Method(
      name="autoregressive",
      level="none",
      verify="",
      summary="target only, one token per round (the baseline)",
      max_drafts=1,
    ),
    Method(
      name="sd",
      level="token",
      verify="spectr_jax.verify:sd_position",
      summary="single-draft speculative sampling (Leviathan et al. 2023; Chen et al. 2023)",
      max_drafts=1,
      exact_for=ONE_DRAFT_LAWS,
      acceptance="spectr_jax.acceptance:overlap_X",
    ),
    Method(
      name="kseq",
      level="token",
      verify="spectr_jax.verify:kseq_position",
      summary="SpecTr's K-SEQ with split factor rho (Sun et al., NeurIPS 2023)",
      single="sd",
      takes_rho=True,
      acceptance="spectr_jax.acceptance:kseq_acceptance_X",
    ),
    Method(
      name="specinfer",
      level="token",
      verify="spectr_jax.verify:specinfer_position",
      summary="SpecInfer's recursive rejection sampling (Miao et al. 2024)",
      single="sd",
      acceptance="spectr_jax.acceptance:specinfer_acceptance_X",
    ),
    Method(
      name="optimal",
      level="token",
      verify="spectr_jax.optimal:position_verdict",
      summary="the OT-optimal verifier reaching alpha* (docs/OPTIMAL_VERIFIER.md)",
      single="sd",
      workspace_bytes=PLAN_WORKSPACE_BYTES,
      acceptance="spectr_jax.acceptance:optimal_acceptance_X",
      compare_with=("kseq",),
    ),
    Method(
      name="rrs",
      level="token",
      verify="spectr_jax.verify:rrs_position",
      summary="recursive rejection sampling without replacement on drafts without "
      "replacement (Jeon et al., RSD, arXiv 2402.14160; SPEC section 5)",
      single="sd",
      drafting="wor",
      acceptance="spectr_jax.acceptance:rrs_acceptance_X",
      label="RRS w/o replacement",
      compare_with=("specinfer", "kseq", "optimal"),
    ),
    Method(
      name="block",
      level="block",
      verify="spectr_jax.block:verify_paths",
      summary="block verification of one draft (Sun et al., ICLR 2025)",
      max_drafts=1,
      exact_for=ONE_DRAFT_LAWS,
      compare_with=("sd",),
    ),
    Method(
      name="gbv",
      level="block",
      verify="spectr_jax.block:verify_paths",
      summary="multi-path block verification: OT-optimal selection, then block "
      "verification against its law (derived here, docs/BLOCK_VERIFICATION.md)",
      single="block",
      workspace_bytes=PLAN_WORKSPACE_BYTES,
      compare_with=("optimal", "kseq"),
    ),
    Method(
      name="gbv_tp",
      level="block",
      verify="spectr_jax.block:verify_tp_paths",
      summary="greedy multi-path block verification: the lexicographically largest path "
      "in q/p order, block-verified against its skewed law (Thomas & Pal, arXiv 2602.16961)",
      single="block",
      compare_with=("gbv", "optimal", "kseq"),
    ),
    Method(
      name="traversal",
      level="block",
      verify="spectr_jax.traversal:verify_tree",
      summary="Traversal Verification: the tree of drafts without replacement verified "
      "leaf to root with sequence-level acceptance (Weng et al., arXiv 2505.12398)",
      single="block",
      drafting="wor",
      label="Traversal",
      compare_with=("rrs",),
      takes_length=True,
    ),
  )
}


def names(*, speculative: bool | None = None, level: str | None = None) -> tuple[str, ...]:
  """The registered method names in registry order, optionally filtered."""
  return tuple(
    m.name
    for m in METHODS.values()
    if (speculative is None or m.speculative == speculative) and (level is None or m.level == level)
  )


def get(name: str) -> Method:
  """The record of method `name`; a clear error listing the known ones otherwise."""
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; expected one of {names()}")
  return METHODS[name]


def register(method: Method) -> None:
  """Adds a method to `METHODS` (one record, in the method's own module): the engine,
  sweeps, memory plans and reports then run it like a built-in one. Registering the same
  record again is a no-op.

  Raises:
    ValueError: another method holds its name.
  """
  if METHODS.get(method.name, method) != method:
    raise ValueError(f"a different method is registered as {method.name!r}")
  METHODS[method.name] = method


def register_drafting(scheme: Drafting) -> None:
  """Adds a drafting scheme to `DRAFTING` (one record, in the scheme's own module): every
  method exact for its law (`Method.exact_for`) then verifies it, in the engine, sweeps
  and reports. Registering the same record again is a no-op.

  Raises:
    ValueError: another scheme holds its name.
  """
  if DRAFTING.get(scheme.name, scheme) != scheme:
    raise ValueError(f"a different drafting scheme is registered as {scheme.name!r}")
  DRAFTING[scheme.name] = scheme


def exact_for(drafting: str) -> tuple[str, ...]:
  """The speculative methods whose output follows the target's law on the drafts of
  scheme `drafting` (registry order)."""
  law = get_drafting(drafting).law
  return tuple(m.name for m in METHODS.values() if law in m.exact_for)


def get_drafting(name: str) -> Drafting:
  """The drafting scheme `name`; a clear error listing the known ones otherwise."""
  if name not in DRAFTING:
    raise ValueError(f"unknown drafting scheme {name!r}; expected one of {tuple(DRAFTING)}")
  return DRAFTING[name]


def scheme(method: str, drafting: str = "") -> Drafting | None:
  """The drafting scheme a decode of `method` uses: `drafting`, or the method's default
  where it is ""; None for a method without drafts.

  Raises:
    ValueError: an unknown method or scheme, or a pair whose output would not follow the
      target's law (the method is not exact for the scheme's drafting law), named with
      why and with the methods that are.
  """
  record = get(method)
  if not record.speculative:
    return None
  chosen = get_drafting(drafting or record.drafting)
  if chosen.law not in record.exact_for:
    raise ValueError(
      f"method {method!r} is not exact for drafting scheme {chosen.name!r}: it is exact "
      f"for drafts of law {' or '.join(record.exact_for)}, and {chosen.name!r} draws "
      f"{chosen.law!r} drafts ({chosen.summary.split(';')[0]}), so its output would not follow the "
      f"target's law; methods exact for {chosen.name!r}: {', '.join(exact_for(chosen.name))}"
    )
  return chosen


# A tree shape drawn from the draft's path probabilities (`Drafting.branches` schemes).
PROPORTIONAL = "proportional"


def check_branching(branching, num_drafts: int, draft_len: int) -> None:
  """Raises a clear error unless `branching` is L integers >= 1 whose product is K, or
  `PROPORTIONAL` (a tree shaped by the draft's path probabilities, drawn by
  `drafting.without_replacement`)."""
  if branching == PROPORTIONAL:
    return
  if not (
    isinstance(branching, tuple)
    and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in branching)
  ):
    raise ValueError(
      f"branching must be a tuple of integers >= 1 or {PROPORTIONAL!r}, got {branching!r}"
    )
  if len(branching) != draft_len or math.prod(branching) != num_drafts:
    raise ValueError(
      f"branching {branching} must have draft_len = {draft_len} entries whose product is "
      f"num_drafts = {num_drafts} (one path per leaf)"
    )


def check_rho(rho: Any) -> str | float:
  """A split factor as configs and cells store it: "star", "k" or a float >= 1.

  Raises:
    ValueError: anything else (a string other than those two, a non-finite number, a
      number below 1, a bool, a sequence).
  """
  if isinstance(rho, str):
    if rho not in RHO_NAMES:
      raise ValueError(f"unknown rho {rho!r}: expected 'star', 'k' or a number >= 1")
    return rho
  try:
    value = float(rho)
  except (TypeError, ValueError):
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}") from None
  if isinstance(rho, bool) or not (1.0 <= value < float("inf")):
    raise ValueError(f"a fixed rho must be a finite number >= 1, got {rho!r}")
  return value
