"""`config.DecodeSpec`, the one decode specification: validated in one place, normalised so
that specs that decode alike are equal, and read from the benchmarks' short form."""

import pytest

from spectr_jax import methods
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.sweep_config import SweepConfig


def test_the_short_form_round_trips():
  for text in ("kseq:8:4", "rrs:8:4:4x2x1x1", "rrs:4:2:proportional", "autoregressive"):
    assert DecodeSpec.parse(text).label() == text
  spec = DecodeSpec.parse("rrs/wor:8:4:4x2x1x1", max_new_tokens=16)
  assert (spec.method, spec.num_drafts, spec.draft_len) == ("rrs", 8, 4)
  assert spec.branching == (4, 2, 1, 1) and spec.max_new_tokens == 16
  assert spec.drafting == ""  # rrs's own scheme, named: the same spec as unnamed
  assert DecodeSpec.parse("kseq:4:4", rho=2.0, dedup=True).label() == "kseq:4:4 rho=2.0 dedup"
  for bad in ("kseq:8", "kseq:a:4", "kseq:1:2:3:4"):
    with pytest.raises(ValueError, match="expected method"):
      DecodeSpec.parse(bad)


def test_specs_that_decode_alike_are_equal():
  """Fields a method does not use are normalised away, so it keys one program."""
  assert DecodeSpec(method="autoregressive", num_drafts=4, draft_len=8, rho=2.0) == DecodeSpec(
    method="autoregressive"
  )
  assert DecodeSpec(method="sd", draft_len=3, rho=1.5) == DecodeSpec(method="sd", draft_len=3)
  assert DecodeSpec(method="kseq", num_drafts=2, drafting="iid") == DecodeSpec(
    method="kseq", num_drafts=2
  )
  assert DecodeSpec(eos_ids=3) == DecodeSpec(eos_ids=[3]) == DecodeSpec(eos_ids=(3,))
  assert hash(DecodeSpec(temperature=1)) == hash(DecodeSpec(temperature=1.0))


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(method="beam"), "unknown method"),
    (dict(method="specinfer", num_drafts=4, drafting="wor"), "not exact for drafting scheme"),
    (dict(method="kseq", num_drafts=4, branching="proportional"), "draws no tree"),
    (dict(method="rrs", num_drafts=4, draft_len=2, branching=(2, 3)), "product is"),
    (dict(method="rrs", branching="4-2"), "children per depth"),
    (dict(method="sd", num_drafts=2), "single draft"),
    (dict(method="kseq", num_drafts=2, rho=3.0), r"rho must be .* in \[1, K = 2\]"),
    (dict(method="kseq", rho="x"), "unknown rho"),
    (dict(draft_len=0), "draft_len must be an integer >= 1"),
    (dict(max_new_tokens=4, token_limit=5), r"token_limit must lie in \[1, max_new_tokens"),
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(eos_ids=(1, -2)), "eos_ids must be an integer >= 0"),
    (dict(dedup=1), "dedup must be true or false"),
    (dict(layer_stack="loop"), "layer_stack must be one of"),
    (dict(drafting=3), "drafting must be a scheme name"),
  ],
)
def test_a_bad_spec_is_refused_when_it_is_built(fields, message):
  with pytest.raises(ValueError, match=message):
    DecodeSpec(**fields)


def test_a_sweeps_template_makes_each_cells_spec():
  """`SweepConfig.cell_spec`: the template's shared fields, the pair's stop tokens where
  asked, the branching only for a scheme that draws a tree."""
  settings = SweepConfig().replace(
    temperature=0.5, top_k=3, stop_at_eos=True, branching="proportional", methods=("kseq",)
  )
  spec = settings.cell_spec("rrs", 4, 2, eos_ids=(2, 9))
  assert (spec.temperature, spec.top_k, spec.eos_ids, spec.branching) == (
    0.5,
    3,
    (2, 9),
    "proportional",
  )
  assert settings.cell_spec("kseq", 4, 2, rho=2.0).branching == ""
  assert settings.cell_spec("autoregressive").draft_len == 0
  assert set(methods.exact_for("wor")) >= {"rrs", "traversal"}
