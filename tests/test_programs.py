"""spectr_jax.programs: reading loops, conditionals, matmuls and parameter converts from a
small jitted function's lowered and compiled HLO."""

import jax
import jax.numpy as jnp
import pytest

from spectr_jax import programs

W_SHAPE = (6, 6)


def _fn(w, x, n):
  """A data-dependent loop of rounds holding a fixed-trip loop, a conditional, a matmul
  and a convert of the weight; one more convert of the weight outside it."""

  def body(carry):
    i, y = carry
    y = y @ w.astype(jnp.bfloat16).astype(jnp.float32)
    y = jax.lax.fori_loop(0, 10, lambda j, z: jnp.sin(z) * 0.5 + j, y)
    y = jax.lax.cond(y.sum() > n, lambda z: jnp.cos(z) @ z.T @ z, lambda z: jnp.exp(-z), y)
    return i + 1, y

  _, y = jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))
  return y + w.astype(jnp.bfloat16).sum().astype(jnp.float32)


@pytest.fixture(scope="module")
def texts():
  args = (jnp.ones(W_SHAPE), jnp.ones((4, 6)), jnp.int32(3))
  lowered = jax.jit(_fn).lower(*args)
  return lowered.as_text(dialect="hlo", debug_info=True), lowered.compile().as_text()


def test_lowered_counts(texts):
  module = programs.parse(texts[0])
  converts = programs.parameter_converts(module, [W_SHAPE])
  assert sorted(inside for _, inside in converts) == [False, True]
  assert all(i.type.startswith("bf16[6,6]") for i, _ in converts)
  assert programs.parameter_converts(module, [(4, 6)]) == []  # x is never narrowed
  flow = programs.control_flow(module)
  assert sorted(c.kind for c in flow) == ["conditional", "while", "while"]
  loop, inside = programs.round_loop(module)
  assert loop is not None and loop.computation == module.entry and inside
  assert programs.count_matmuls(module) == 3
  assert programs.count_instructions(module) > programs.count_matmuls(module)


def test_compiled_counts(texts):
  module = programs.parse(texts[1])
  flow = programs.control_flow(module)
  whiles = [c for c in flow if c.kind == "while"]
  assert sorted(c.trip_count for c in whiles if c.trip_count is not None) == [10]
  (outer,) = [c for c in whiles if c.data_dependent]
  assert outer.in_round_loop and "while" in outer.op_name
  (cond,) = [c for c in flow if c.kind == "conditional"]
  assert cond.data_dependent and cond.in_round_loop and cond.op_name.endswith("cond")
  assert programs.scope(cond.op_name) == ""  # only JAX's own components
  assert programs.count_matmuls(module) >= 3
  assert 0 < programs.count_kernels(module) < programs.count_instructions(module)


def test_parse_reads_tuples_and_operands():
  trip = 'backend_config={"known_trip_count":{"n":"7"}}'
  scope = 'metadata={op_name="jit(f)/score/convert_element_type"}'
  text = """HloModule m, entry_computation_layout={()->f32[]}

%body.1 (p: (s32[], f32[2])) -> (s32[], f32[2]) {
  %p = (s32[], f32[2]{0}) parameter(0)
  ROOT %t = (s32[], f32[2]{0}) tuple(%a, %b)
}

ENTRY %main.9 (Arg_0.1: f32[3,4]) -> bf16[3,4] {
  %Arg_0.1 = f32[3,4]{1,0} parameter(0), metadata={op_name="x"}
  %w = (s32[], /*index=1*/f32[2]{0}) while(%init), condition=%c.2, body=%body.1, TRIP
  ROOT %convert.3 = bf16[3,4]{1,0} convert(%Arg_0.1), SCOPE
}
""".replace("TRIP", trip).replace("SCOPE", scope)
  module = programs.parse(text)
  assert module.entry == "main.9" and set(module.computations) == {"body.1", "main.9"}
  w = module.computations["main.9"][1]
  assert (w.opcode, w.type, w.trip_count) == ("while", "(s32[], /*index=1*/f32[2]{0})", 7)
  assert ("body", "body.1") in w.children()
  ((convert, inside),) = programs.parameter_converts(module, [(3, 4)])
  assert convert.operands == ("Arg_0.1",) and inside is False
  assert programs.scope(convert.op_name) == "score"
  assert programs.shape_of("f32[]") == ("f32", ())
