"""`DecodeSpec`: what one decode does, validated in one place (the decoding layer's schema).

Config files, sweeps (a `DecodeSpec` template per sweep), the engine, `engine.lower` and
the benchmarks (`DecodeSpec.parse`) all describe a decode with it; `plan.resolve` turns
it into the compiled program's static plan.
"""

import dataclasses
import functools
import math
import numbers
from collections.abc import Sequence
from typing import Any

from spectr_jax import lengths, methods
from spectr_jax.models import ModelConfig
from spectr_jax.schema import Schema, integers

__all__ = ["LAYER_STACKS", "DecodeSpec"]

# `DecodeSpec.layer_stack` -> the models' `scan_layers` (`DecodeSpec.scan_layers`).
LAYER_STACKS = {"auto": None, "scan": True, "unroll": False}


def _eos_tuple(eos_ids: Any) -> tuple[int, ...]:
  """The stop tokens as a tuple: None or () for none, one id, or a sequence of ids."""
  if eos_ids is None:
    return ()
  if isinstance(eos_ids, Sequence) and not isinstance(eos_ids, str):
    return tuple(eos_ids)
  return (eos_ids,)


def _branching(value: Any) -> str | tuple[int, ...]:
  """A tree shape as the spec holds it: "" (the scheme's default), "proportional", or a
  tuple of children per depth (from a sequence or text such as "4x2x1x1")."""
  if value is None:
    return ""
  if isinstance(value, str):
    if value in ("", methods.PROPORTIONAL):
      return value
    try:
      return tuple(int(b) for b in value.split("x"))
    except ValueError:
      raise ValueError(
        f"branching must be '', {methods.PROPORTIONAL!r} or children per depth such as "
        f"'4x2x1x1', got {value!r}"
      ) from None
  if isinstance(value, Sequence):
    return tuple(value)
  raise ValueError(f"branching must be a string or a sequence of integers, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DecodeSpec(Schema):
  """What `engine.generate` decodes: the one decode specification, validated here.

  A round is named by three axes: the verifier (`method`), how its drafts are drawn
  (`drafting`) and a tree scheme's shape (`branching`). With method "" the spec is a
  template: each sweep cell sets method, K, L and rho (`replace`), and the checks that
  depend on the method run then. `DecodeSpec.parse("kseq:8:4")` reads the short form.

  Attributes:
    method: the verifier, a name of the method registry (`python -m spectr_jax.methods`
      lists them); "" for a template.
    num_drafts: K, draft paths per round (1 for "autoregressive").
    draft_len: L, draft tokens per path (0 for "autoregressive").
    drafting: the drafting scheme (a name in `methods.DRAFTING`); "" for the method's
      own. The method must be exact for the scheme's law, else the spec is refused.
    branching: the tree a branching scheme draws: children per node at each depth (L
      integers whose product is K, or text such as "4x2x1x1"), "proportional" (shaped by
      the draft's probabilities) or "" for the scheme's default.
    rho: K-SEQ's split factor: "star", "k" or a number in [1, K] (traced).
    max_new_tokens: T, tokens generated per row; it sizes the program's buffers.
    token_limit: stop each row after this many tokens, in [1, T] (traced); None = T.
    temperature: >= 0; 0 is greedy (its own program), other values are traced.
    top_k: keep the top_k most likely tokens (0 = all; static).
    top_p: nucleus mass in (0, 1]; 1 = no truncation (traced below 1).
    eos_ids: the stop tokens (any of them ends a row); () for none.
    dedup: score and draft each distinct prefix once (a token tree), not K tails.
    layer_stack: "scan", "unroll" or "auto" (scan deep models).
    adaptive: a confidence threshold in (0, 1] for adaptive draft length
      (`lengths.Adaptive`); 0 = off (traced).
    node_budget: drafted nodes per row of the batch's tree budget, in [1, K L]
      (`lengths.NodeBudget`); 0 = off (traced).
  """

  method: str = "kseq"
  num_drafts: int = 1
  draft_len: int = 4
  drafting: str = ""
  branching: str | tuple[int, ...] = ""
  rho: str | float = "star"
  max_new_tokens: int = 32
  token_limit: int | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_ids: tuple[int, ...] = ()
  dedup: bool = False
  layer_stack: str = "auto"
  adaptive: float = 0.0
  node_budget: float = 0.0

  def __post_init__(self):
    set_ = functools.partial(object.__setattr__, self)
    integers("max_new_tokens", [self.max_new_tokens], 1)
    self._check_sampling()
    set_("eos_ids", _eos_tuple(self.eos_ids))
    integers("eos_ids", self.eos_ids, 0)
    if not isinstance(self.dedup, bool):
      raise ValueError(f"dedup must be true or false, got {self.dedup!r}")
    if self.layer_stack not in LAYER_STACKS:
      raise ValueError(
        f"layer_stack must be one of {tuple(LAYER_STACKS)}, got {self.layer_stack!r}"
      )
    if not isinstance(self.drafting, str):
      raise ValueError(f"drafting must be a scheme name or '', got {self.drafting!r}")
    set_("branching", _branching(self.branching))
    if self.method == "":
      self._check_template()
      set_("_verifier", None)
      set_("_scheme", None)
      return
    record = methods.get(self.method)
    if not record.speculative:  # nothing drafted: one spec (and program) however named
      for name, value in (("num_drafts", 1), ("draft_len", 0), ("drafting", ""),
                          ("branching", ""), ("rho", "star"), ("dedup", False),
                          ("adaptive", 0.0), ("node_budget", 0.0)):  # fmt: skip
        set_(name, value)
    integers("num_drafts", [self.num_drafts], 1)
    integers("draft_len", [self.draft_len], 1 if record.speculative else 0)
    record.check_drafts(self.num_drafts)
    scheme = methods.scheme(record, self.drafting)  # refuses an inexact pair
    # "" for the method's own scheme: one spec (and program) however it is named.
    set_("drafting", "" if scheme is None or scheme.name == record.drafting else scheme.name)
    if self.branching != "":
      if scheme is None or not scheme.branches:
        name = "no drafts" if scheme is None else f"scheme {scheme.name!r}"
        raise ValueError(f"method {self.method!r} with {name} draws no tree: branching must be ''")
      methods.check_branching(self.branching, self.num_drafts, self.draft_len)
    set_("rho", methods.check_rho(self.rho) if record.takes_rho else "star")
    if not isinstance(self.rho, str) and self.rho > self.num_drafts:
      raise ValueError(
        f"rho must be 'star', 'k' or a number in [1, K = {self.num_drafts}], got {self.rho}"
      )
    set_("dedup", self.dedup and self.draft_len > 0)
    set_("_verifier", record)
    set_("_scheme", scheme)
    # The length policy checks itself against the spec (`lengths.policy`).
    lengths.policy(self)
    for cls in lengths.POLICIES:
      set_(cls.field, float(getattr(self, cls.field)))

  def _check_sampling(self) -> None:
    """The fields every spec checks, a template's included (normalised types)."""
    if self.token_limit is not None:
      integers("token_limit", [self.token_limit], 1)
      if self.token_limit > self.max_new_tokens:
        raise ValueError(
          f"token_limit must lie in [1, max_new_tokens = {self.max_new_tokens}], "
          f"got {self.token_limit}"
        )
    if not isinstance(self.temperature, numbers.Real):
      raise ValueError(
        "temperature must be a number, not a traced value: greedy decoding (0) and sampling "
        f"compile to different programs; got {self.temperature!r}"
      )
    if not 0 <= self.temperature < math.inf:
      raise ValueError(f"temperature must be finite and >= 0, got {self.temperature!r}")
    integers("top_k", [self.top_k], 0)
    if not (isinstance(self.top_p, numbers.Real) and 0 < self.top_p <= 1):
      raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
    # Normalise the types, so equal specs hash (and key programs) equally.
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))

  def _check_template(self) -> None:
    """A template's method-dependent fields, as far as they can be checked alone."""
    if self.drafting:
      methods.get_drafting(self.drafting)
    if self.branching not in ("", methods.PROPORTIONAL):
      raise ValueError(
        f"a template's branching must be '' or {methods.PROPORTIONAL!r} (a static branching "
        f"fits one K and L only), got {self.branching!r}"
      )
    methods.check_rho(self.rho)
    if not (isinstance(self.adaptive, numbers.Real) and 0 <= self.adaptive <= 1):
      raise ValueError(
        f"adaptive must be a threshold in (0, 1], or 0 for off, got {self.adaptive!r}"
      )
    if not (isinstance(self.node_budget, numbers.Real) and (
        self.node_budget == 0 or self.node_budget >= 1)):  # fmt: skip
      raise ValueError(f"node_budget must be >= 1, or 0 for off, got {self.node_budget!r}")
    for cls in lengths.POLICIES:
      object.__setattr__(self, cls.field, float(getattr(self, cls.field)))

  @property
  def is_template(self) -> bool:
    """Whether the spec leaves its method to each cell of a sweep (method "")."""
    return self.method == ""

  @property
  def verifier(self) -> "methods.Method":
    """The method's registry record."""
    if self._verifier is None:
      raise ValueError("a template (method '') has no verifier: replace its method first")
    return self._verifier

  @property
  def speculative(self) -> bool:
    """Whether it verifies drafts (every method but "autoregressive")."""
    return self.verifier.speculative

  @property
  def scheme(self) -> "methods.Drafting | None":
    """The drafting scheme its drafts come from (None for "autoregressive")."""
    return self._scheme

  @property
  def scan_layers(self) -> bool | None:
    """`layer_stack` as the models take it: True (scan), False (unroll), None (auto)."""
    return LAYER_STACKS[self.layer_stack]

  @property
  def greedy(self) -> bool:
    """Whether it decodes greedily (temperature 0)."""
    return self.temperature <= 0

  def replace(self, **changes) -> "DecodeSpec":
    """A copy with `changes`, validated again."""
    return dataclasses.replace(self, **changes)

  def check_models(self, target: ModelConfig, draft: ModelConfig | None, prompt_width: int) -> None:
    """Raises a clear error where the spec does not fit the models: no draft for a
    speculative method, vocabularies that differ, top_k or a stop token outside the
    vocabulary, or prompt_width + max_new_tokens + L + 1 positions beyond a max_len."""
    if self.speculative and draft is None:
      raise ValueError(f"method {self.method!r} needs a draft model")
    if self.speculative and draft.num_logits != target.num_logits:
      raise ValueError(
        f"draft and target vocabularies differ: {draft.num_logits} vs {target.num_logits}"
      )
    if self.top_k > target.num_logits:
      raise ValueError(f"top_k = {self.top_k} exceeds the vocabulary ({target.num_logits})")
    for eos in self.eos_ids:
      if eos >= target.num_logits:
        raise ValueError(
          f"every value of eos_ids must lie in [0, {target.num_logits - 1}], got {eos}"
        )
    needed = prompt_width + self.max_new_tokens + self.draft_len + 1
    for name, model in (("target", target), ("draft", draft if self.speculative else None)):
      if model is not None and needed > model.max_len:
        raise ValueError(
          f"prompt width {prompt_width} + max_new_tokens {self.max_new_tokens} + "
          f"draft_len + 1 = {needed} exceeds the {name}'s max_len {model.max_len}"
        )

  @classmethod
  def parse(cls, text: str, **fields) -> "DecodeSpec":
    """The spec of the benchmarks' short form `method[/drafting]:K:L[:branching]`, e.g.
    "kseq:8:4", "rrs:8:4:4x2x1x1", "sd/iid:1:4", "autoregressive"; `fields` set the
    rest (max_new_tokens, temperature, ...).

    Raises:
      ValueError: naming the text and the form it should have.
    """
    parts = text.split(":")
    method, _, drafting = parts[0].partition("/")
    sizes = parts[1:3]
    if len(parts) not in (1, 3, 4) or not all(s.isdigit() for s in sizes):
      raise ValueError(
        f"{text!r}: expected method[/drafting]:K:L[:branching] with K and L integers (e.g. "
        "'kseq:8:4', 'rrs/wor:8:4:4x2x1x1') or a method alone ('autoregressive')"
      )
    if sizes:
      fields.update(num_drafts=int(sizes[0]), draft_len=int(sizes[1]))
    branching = parts[3] if len(parts) == 4 else fields.pop("branching", "")
    return cls(method=method, drafting=drafting, branching=branching, **fields)

  def label(self) -> str:
    """The short form `parse` reads (with rho where it is not "star", dedup marked)."""
    text = self.method + (f"/{self.drafting}" if self.drafting else "")
    if self.speculative:
      text += f":{self.num_drafts}:{self.draft_len}"
      if self.branching:
        shape = self.branching
        text += ":" + (shape if isinstance(shape, str) else "x".join(map(str, shape)))
    if self.rho != "star":
      text += f" rho={self.rho}"
    return text + (" dedup" if self.dedup else "")
