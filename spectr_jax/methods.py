"""The method registry: one record per decoding method and per drafting scheme.

A `Method` record holds a verifier's function and everything else the framework needs:
its level ("token": position by position; "block": over the whole block), the K it takes
and what it is at K = 1, whether it takes the split factor rho, its drafting scheme and
the drafting laws it is exact for, its workspace, its closed-form acceptance, and how
reports label and compare it. A `Drafting` record holds a scheme's per-depth draw
(`drafting.Depths`). Records reference their functions directly. The engine, sweeps,
memory plans, analyses and reports read these tables; none of them names a method.

Adding a verifier: write its verdict function with the signature of its level, add one
`Method` (`register` from your own module), and check it (`spectr_jax.testing`).

  token level:  fn(key, drafts_K, p_V, q_V, valid_K) -> verify.Verdict
                (methods with `takes_rho` also get keyword arguments rho_mode, rho_value)
  block level:  fn(key, drafts_KxL, p_KxLxV, q_KxL1xV[, length_K=]) -> verify.BlockVerdict

`python -m spectr_jax.methods` prints the registered methods and schemes as a table.
"""

import dataclasses
import functools
import importlib
import inspect
import sys
import warnings
from collections.abc import Callable, Sequence

import jax

from spectr_jax import acceptance, block, checks, drafting, optimal, traversal, verify
from spectr_jax.acceptance import RHO_NAMES, check_rho
from spectr_jax.drafting import PROPORTIONAL, check_branching
from spectr_jax.verdict import OVERSHOOT_TOL, BlockVerdict, Verdict

__all__ = [
  "DRAFTING",
  "LEVELS",
  "METHODS",
  "OVERSHOOT_TOL",
  "PROPORTIONAL",
  "RHO_NAMES",
  "BlockVerdict",
  "Drafting",
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
  "scheme",
  "table",
  "verify_drafts",
]

LEVELS = ("none", "token", "block")


def _function(value: Callable | str | None, what: str) -> Callable | str | None:
  """A record's function; a "module:name" string (the old form) is kept, with a warning,
  and imported where it is called (`resolve`)."""
  if isinstance(value, str) and value:
    warnings.warn(
      f"{what} as a 'module:function' string is deprecated: give the function itself",
      DeprecationWarning, stacklevel=4,
    )  # fmt: skip
  return value or None


def resolve(reference: Callable | str) -> Callable:
  """The function a record holds (a "module:name" string of the old form, imported)."""
  if callable(reference):
    return reference
  module, _, name = reference.partition(":")
  return getattr(importlib.import_module(module), name)


@dataclasses.dataclass(frozen=True)
class Drafting:
  """A drafting scheme: how a round's K draft paths are drawn.

  Attributes:
    name: the registry key.
    depths: (num_drafts, draft_len, branching) -> `drafting.Depths`, the scheme's
      per-depth draws and tree levels; `drafting.draft_paths` runs them (dedup and
      adaptive length included).
    bound: the per-position optimum for k drafts of this law, (p_XxV, q_XxV, k) -> [X],
      or None.
    bound_label: how tables name that bound.
    summary: one line for docs and reports.
    check: raises a clear error for concrete drafts_KxL this scheme cannot have drawn,
      or None.
    branches: whether the scheme draws a tree shape it is given (`DecodeSpec.branching`).
    law: the law its drafts follow ("iid": K i.i.d. paths; "wor": a tree drawn without
      replacement); default: its name. A verifier is exact for a scheme when the
      verifier's `exact_for` holds its law.
    verifiers: methods exact for this scheme besides those whose `exact_for` holds its
      law (a new law's author names the verifiers the workbench passed).
  """

  name: str
  depths: Callable | None = None
  bound: Callable | str | None = None
  bound_label: str = ""
  summary: str = ""
  check: Callable | str | None = None
  branches: bool = False
  law: str = ""
  verifiers: tuple[str, ...] = ()
  draft: Callable | str | None = None  # deprecated: a whole scheme function

  def __post_init__(self):
    set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
    if not self.law:
      set_("law", self.name)
    for name in ("bound", "check", "draft"):
      set_(name, _function(getattr(self, name), f"Drafting.{name}"))
    if self.depths is None and self.draft is None:
      raise ValueError(f"drafting scheme {self.name!r} needs its per-depth draws (depths)")


DRAFTING: dict[str, Drafting] = {
  d.name: d
  for d in (
    Drafting(
      name="iid",
      depths=drafting.iid_depths,
      bound=acceptance.optimal_acceptance_X,
      bound_label="optimal alpha*",
      summary="K i.i.d. draft sequences of length L (duplicates are separate chances)",
    ),
    Drafting(
      name="wor",
      depths=drafting.tree_depths,
      bound=acceptance.wor_bound_X,
      bound_label="optimal w/o replacement (prefix search)",
      summary="a static tree whose children are drawn without replacement at every node "
      "(Gumbel-top-k law); by default K distinct first tokens, each path continuing alone "
      "(Jeon et al., arXiv 2402.14160; Hu et al., arXiv 2502.18779; Sequoia, arXiv "
      "2402.12374); where a node has fewer tokens with mass than children, the extra "
      "children copy the first child's subtree",
      check=drafting.check_distinct,
      branches=True,
    ),
    Drafting(
      name="topk",
      depths=drafting.topk_depths,
      bound=acceptance.topk_acceptance_X,
      bound_label="target mass on the top-k draft tokens",
      summary="the field's mode: the static trees of wor, child j of every node the "
      "draft's j-th most likely token (ties to the lower index; deterministic: EAGLE, "
      "arXiv 2401.15077; SpecInfer, arXiv 2305.09781); where a node has fewer tokens "
      "with mass than children, the extra children copy the first child's subtree",
      check=drafting.check_distinct,
      branches=True,
      verifiers=("certain",),
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
    verify: its verdict function (None for level "none"; signatures in the module
      docstring).
    summary: one line for docs and reports (with the paper it comes from).
    max_drafts: the largest K it takes (None: any K >= 1).
    single: the method it is at K = 1 ("kseq" is "sd" there); sweeps run it only at
      K >= 2. None: itself.
    takes_rho: it has a split factor rho ("star", "k" or a number; one cell per rho).
    drafting: its default drafting scheme (a name in `DRAFTING`).
    exact_for: the drafting laws (`Drafting.law`) for which its output follows the
      target's law; default: its default scheme's law.
    workspace_bytes: one row's verifier workspace beyond the round's probability arrays
      (`memory.plan`).
    acceptance: its exact per-position hit probability with k drafts, (p_XxV, q_XxV,
      k[, rho]) -> [X], or None.
    label: the name tables and plots print.
    compare_with: methods it is compared with cell by cell (paired gains in reports).
  """

  name: str
  level: str
  verify: Callable | str | None
  summary: str
  max_drafts: int | None = None
  single: str | None = None
  takes_rho: bool = False
  drafting: str = "iid"
  exact_for: tuple[str, ...] = ()
  workspace_bytes: int = 0
  acceptance: Callable | str | None = None
  label: str = ""
  compare_with: tuple[str, ...] = ()

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"method {self.name!r}: level must be one of {LEVELS}")
    if self.drafting not in DRAFTING and self.level != "none":
      raise ValueError(f"method {self.name!r}: unknown drafting scheme {self.drafting!r}")
    object.__setattr__(self, "verify", _function(self.verify, "Method.verify"))
    object.__setattr__(self, "acceptance", _function(self.acceptance, "Method.acceptance"))
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

  @property
  def takes_length(self) -> bool:
    """Whether it verifies each path to a length of its own: every token-level method;
    a block-level one whose function takes `length_K=`."""
    if self.level != "block":
      return self.level == "token"
    return "length_K" in inspect.signature(self.function()).parameters

  def function(self) -> Callable:
    """The verdict function."""
    return resolve(self.verify)

  def acceptance_function(self) -> Callable | None:
    """The closed-form per-position acceptance, or None."""
    return None if self.acceptance is None else resolve(self.acceptance)

  def check_drafts(self, num_drafts: int) -> None:
    """Raises a clear error for a K this method cannot take."""
    if self.max_drafts is not None and num_drafts > self.max_drafts:
      raise ValueError(f"method {self.name!r} verifies a single draft, got K = {num_drafts}")

  def grid_drafts(self, num_drafts: Sequence[int]) -> list[int]:
    """The K values of a sweep grid this method runs (K = 1 only where it is itself)."""
    if not self.speculative or self.max_drafts is not None:
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
      verify=None,
      summary="target only, one token per round (the baseline)",
      max_drafts=1,
    ),
    Method(
      name="sd",
      level="token",
      verify=verify.sd_verdict,
      summary="single-draft speculative sampling (Leviathan et al. 2023; Chen et al. 2023)",
      max_drafts=1,
      exact_for=ONE_DRAFT_LAWS,
      acceptance=acceptance.overlap_X,
    ),
    Method(
      name="kseq",
      level="token",
      verify=verify.kseq_verdict,
      summary="SpecTr's K-SEQ with split factor rho (Sun et al., NeurIPS 2023)",
      single="sd",
      takes_rho=True,
      acceptance=acceptance.kseq_acceptance_X,
    ),
    Method(
      name="specinfer",
      level="token",
      verify=verify.specinfer_verdict,
      summary="SpecInfer's recursive rejection sampling (Miao et al. 2024)",
      single="sd",
      acceptance=acceptance.specinfer_acceptance_X,
    ),
    Method(
      name="optimal",
      level="token",
      verify=optimal.position_verdict,
      summary="the OT-optimal verifier reaching alpha* (docs/OPTIMAL_VERIFIER.md)",
      single="sd",
      workspace_bytes=PLAN_WORKSPACE_BYTES,
      acceptance=acceptance.optimal_acceptance_X,
      compare_with=("kseq",),
    ),
    Method(
      name="rrs",
      level="token",
      verify=verify.rrs_verdict,
      summary="recursive rejection sampling without replacement on drafts without "
      "replacement (Jeon et al., RSD, arXiv 2402.14160; SPEC section 5)",
      single="sd",
      drafting="wor",
      acceptance=acceptance.rrs_acceptance_X,
      label="RRS w/o replacement",
      compare_with=("specinfer", "kseq", "optimal"),
    ),
    Method(
      name="certain",
      level="token",
      verify=verify.certain_verdict,
      summary="verification of a deterministic tree as serving engines do it (vLLM, "
      "SGLang): Y ~ q at each node, on to the child equal to Y, else Y ends the round; "
      "the draft law is not read",
      drafting="topk",
      acceptance=acceptance.topk_acceptance_X,
      label="certain (top-k tree)",
      compare_with=("rrs", "traversal"),
    ),
    Method(
      name="block",
      level="block",
      verify=block.verify_paths,
      summary="block verification of one draft (Sun et al., ICLR 2025)",
      max_drafts=1,
      exact_for=ONE_DRAFT_LAWS,
      compare_with=("sd",),
    ),
    Method(
      name="gbv",
      level="block",
      verify=block.verify_paths,
      summary="multi-path block verification: OT-optimal selection, then block "
      "verification against its law (derived here, docs/BLOCK_VERIFICATION.md)",
      single="block",
      workspace_bytes=PLAN_WORKSPACE_BYTES,
      compare_with=("optimal", "kseq"),
    ),
    Method(
      name="gbv_tp",
      level="block",
      verify=block.verify_tp_paths,
      summary="greedy multi-path block verification: the lexicographically largest path "
      "in q/p order, block-verified against its skewed law (Thomas & Pal, arXiv 2602.16961)",
      single="block",
      compare_with=("gbv", "optimal", "kseq"),
    ),
    Method(
      name="traversal",
      level="block",
      verify=traversal.verify_tree,
      summary="Traversal Verification: the tree of drafts without replacement verified "
      "leaf to root with sequence-level acceptance (Weng et al., arXiv 2505.12398)",
      single="block",
      drafting="wor",
      label="Traversal",
      compare_with=("rrs",),
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
  method exact for it then verifies it, in the engine, sweeps and reports. Registering
  the same record again is a no-op.

  Raises:
    ValueError: another scheme holds its name.
  """
  if DRAFTING.get(scheme.name, scheme) != scheme:
    raise ValueError(f"a different drafting scheme is registered as {scheme.name!r}")
  DRAFTING[scheme.name] = scheme


def _exact(method: Method, scheme: Drafting) -> bool:
  return scheme.law in method.exact_for or method.name in scheme.verifiers


def exact_for(drafting: str) -> tuple[str, ...]:
  """The speculative methods whose output follows the target's law on the drafts of
  scheme `drafting` (registry order)."""
  chosen = get_drafting(drafting)
  return tuple(m.name for m in METHODS.values() if m.speculative and _exact(m, chosen))


def get_drafting(name: str) -> Drafting:
  """The drafting scheme `name`; a clear error listing the known ones otherwise."""
  if name not in DRAFTING:
    raise ValueError(f"unknown drafting scheme {name!r}; expected one of {tuple(DRAFTING)}")
  return DRAFTING[name]


def scheme(method: str | Method, drafting: str = "") -> Drafting | None:
  """The drafting scheme a decode of `method` (a name or its record) uses: `drafting`,
  or the method's default where it is ""; None for a method without drafts.

  Raises:
    ValueError: an unknown method or scheme, or a pair whose output would not follow the
      target's law, named with why and with the methods that are exact for the scheme.
  """
  record = get(method) if isinstance(method, str) else method
  if not record.speculative:
    return None
  chosen = get_drafting(drafting or record.drafting)
  if not _exact(record, chosen):
    raise ValueError(
      f"method {record.name!r} is not exact for drafting scheme {chosen.name!r}: it is exact "
      f"for drafts of law {' or '.join(record.exact_for)}, and {chosen.name!r} draws "
      f"{chosen.law!r} drafts ({chosen.summary.split(';')[0]}), so its output would not "
      f"follow the target's law; methods exact for {chosen.name!r}: "
      f"{', '.join(exact_for(chosen.name))}"
    )
  return chosen


def verify_drafts(
  key, drafts_KxL, p_KxLxV, q_KxL1xV, *, method="kseq", rho="star", return_stats=False,
  drafting="",
):  # fmt: skip
  """Runs registered method `method` on one block of K draft paths of length L.

  Index convention: p[i, t] = p(. | h, drafts[i, :t]) and q[i, t] = q(. | h,
  drafts[i, :t]); q[i, L] is the bonus distribution after a full draft. Token-level
  methods walk the block position by position, keeping the drafts equal to what was
  emitted, and stop at the first miss; block-level methods decide at once. The emitted
  tokens follow the target's sequence law.

  Args:
    key: PRNG key.
    drafts_KxL: int draft tokens. p_KxLxV: draft distributions. q_KxL1xV: target
      distributions.
    method: a speculative method of the registry.
    rho: K-SEQ's split factor: "star", "k" or a number; ignored by methods without one.
    return_stats: also return the `verify.WalkStats`.
    drafting: the scheme the drafts come from ("": the method's default); the method
      must be exact for it, and the scheme's check runs on concrete drafts.

  Returns:
    (tokens_L1, num_tokens[, stats]): `tokens_L1[:num_tokens]` are emitted (the rest 0)
    and 1 <= num_tokens <= L + 1.
  """
  checks.shape("drafts_KxL", drafts_KxL, (None, None))
  record = get(method)
  if not record.speculative:
    raise ValueError(f"method {method!r} verifies no drafts")
  record.check_drafts(drafts_KxL.shape[0])
  checks.block("verify_drafts", drafts_KxL, p_KxLxV, q_KxL1xV)
  chosen = scheme(record, drafting)
  if chosen.check is not None:
    resolve(chosen.check)(drafts_KxL)
  rho_mode, rho_value = acceptance.split_rho(rho)
  tokens_L1, num_tokens, stats = _walk(
    key, drafts_KxL, p_KxLxV, q_KxL1xV, rho_value, verifier=record, rho_mode=rho_mode
  )
  if return_stats:
    return tokens_L1, num_tokens, stats
  return tokens_L1, num_tokens


@functools.partial(jax.jit, static_argnames=("verifier", "rho_mode"))
def _walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, rho_value, *, verifier, rho_mode):
  return verify.walk(key, drafts_KxL, p_KxLxV, q_KxL1xV, rho_value, verifier, rho_mode)


verify.install_registry(get, verify_drafts)  # for verify's deprecated forms naming a method


def table() -> str:
  """The registered methods and drafting schemes as markdown tables."""
  rows = [
    "| method | level | K | rho | drafting (exact for) | summary |",
    "|---|---|---|---|---|---|",
  ]
  for m in METHODS.values():
    k = "1" if m.max_drafts == 1 else ("any" if m.single is None else f">= 2 ({m.single} at 1)")
    exact = "-" if not m.speculative else f"{m.drafting} ({', '.join(m.exact_for)})"
    rows.append(
      f"| {m.name} | {m.level} | {k} | {'yes' if m.takes_rho else '-'} | {exact} | {m.summary} |"
    )
  rows += ["", "| drafting | law | tree | summary |", "|---|---|---|---|"]
  for d in DRAFTING.values():
    rows.append(f"| {d.name} | {d.law} | {'yes' if d.branches else '-'} | {d.summary} |")
  return "\n".join(rows)


if __name__ == "__main__":
  sys.stdout.write(table() + "\n")
