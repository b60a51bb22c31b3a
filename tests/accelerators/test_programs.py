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


_COUNTED = """HloModule m, entry_computation_layout={()->f32[]}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(LIMIT)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[4])) -> (s32[], f32[4]) {
  %q = (s32[], f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %j2 = s32[] copy(%j)
  %one = s32[] constant(STEP)
  %next = s32[] add(%j2, %one)
  %x = f32[4]{0} get-tuple-element(%q), index=1
  %y = f32[4]{0} sine(%x)
  ROOT %t = (s32[], f32[4]{0}) tuple(%next, %y)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %zero = s32[] constant(START)
  %start = s32[] copy(%zero)
  %init = (s32[], f32[4]{0}) tuple(%start, %a)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4]{0} get-tuple-element(%w), index=1
}
"""


@pytest.mark.parametrize(
  "limit, step, start, trips", [(20, 1, 0, 20), (20, 1, 3, 17), (20, 2, 0, None), (0, 1, 5, 0)]
)
def test_trip_count_of_a_counted_loop_without_a_known_count(limit, step, start, trips):
  """A compiled TPU module's loops carry no trip count: a loop whose condition compares a
  counter with a constant, the body adding one to it (through copies) and the loop
  starting it at a constant, runs limit - start times; any other loop is data-dependent."""
  text = _COUNTED.replace("LIMIT", str(limit)).replace("STEP", str(step))
  module = programs.parse(text.replace("START", str(start)))
  (loop,) = [i for i in module.instructions() if i.opcode == "while"]
  assert programs.trip_count(module, loop) == trips
  (flow,) = programs.control_flow(module)
  assert flow.data_dependent == (trips is None)


def test_costs_of_a_round_count_loops_by_their_trips():
  """The per-round costs read from a compiled program: a scan over 5 layers of a stacked
  weight counts 5 matmuls' flops and reads each layer once (the fused slice, not the
  stack); the same program unrolled (`loops.unrolled`) costs the same."""
  from spectr_jax import loops

  w = jnp.ones((5, 64, 64))
  x = jnp.ones((8, 64))

  def f(w, x, n):
    def layer(x, w_l):
      return jnp.tanh(x @ w_l), None

    def body(c):
      return c[0] + 1, loops.scan(layer, c[1], w)[0]

    return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]

  flops = 5 * 2 * 8 * 64 * 64
  module = programs.parse(jax.jit(f).lower(w, x, jnp.int32(3)).compile().as_text())
  looped = programs.round_costs(module)
  assert looped.flops == flops and looped.unknown_loops == 0
  # Each layer's slice (on this CPU a copy, then the matmul's read) and the activations:
  # below one read of the whole stack per layer.
  assert w.nbytes <= looped.hbm_bytes < 5 * w.nbytes
  with loops.unrolled():
    lowered = jax.jit(lambda w, x: loops.scan(lambda x, w_l: (jnp.tanh(x @ w_l), None), x, w)[0])
    unrolled = programs.parse(lowered.lower(w, x).compile().as_text())
  assert not [c for c in programs.control_flow(unrolled) if c.kind == "while"]
  assert programs.computation_costs(unrolled, unrolled.entry).flops == flops


def test_weight_copies_find_a_converted_weight():
  """A weight converted to bfloat16 inside a program is a weight-sized copy (on this CPU
  converted back to float32 for the matmul: one fusion of 1 MiB); copies smaller than
  `min_bytes` are not counted."""
  w = jnp.ones((512, 512))
  text = jax.jit(lambda w, x: x @ w.astype(jnp.bfloat16)).lower(w, jnp.ones((4, 512), jnp.bfloat16))
  module = programs.parse(text.compile().as_text())
  assert len(programs.weight_copies(module, [w.shape], min_bytes=2**16)) == 1
  assert programs.weight_copies(module, [w.shape], min_bytes=2 * w.nbytes) == []


_THUNKS = """000: kCommandBuffer [source | next=004 (1)]
    001: kCustomKernel [source | sink] loop_fusion grid: [1, 1, 1]
004: kWhile [prev=000 (1) | sink]
condition:
    005: kCustomKernel [source | sink] wrapped_compare grid: [1, 1, 1]
  body:
    000: kCommandBuffer [source | next=009 (1)]
        006: kCustomKernel [source | sink] gemm_fusion_dot grid: [16, 1, 1]
        007: kCustomKernel [source | sink] loop_add_fusion grid: [1, 1, 1]
    009: kWhile [prev=000 (1) | sink]
condition:
        010: kCustomKernel [source | sink] loop_compare grid: [1, 1, 1]
      body:
        011: kCopy [source | sink] kCopy
        012: kCustomKernel [source | sink] loop_slice grid: [1, 1, 1]
"""


def test_gpu_execution_from_a_thunk_sequence():
  """The loop of rounds runs on the host here (a kWhile outside any command buffer), one
  inner loop too: per round the host decides twice (the two loops) and launches five
  thunks (the two conditions' kernels, one command buffer, the inner loop's two), and 2
  of the round's 6 kernels are in a graph; a loop inside a command buffer is a graph's
  (device-side) loop."""
  execution = programs.gpu_execution(programs.parse_thunks(_THUNKS))
  assert execution == programs.GpuExecution(False, 2, 5, 6, 2 / 6)
  graphed = "000: kCommandBuffer [source | sink]\n" + "\n".join(
    "    " + line if line.strip() and not line.startswith("condition") else line
    for line in _THUNKS.splitlines()
  )
  execution = programs.gpu_execution(programs.parse_thunks(graphed))
  assert execution.round_loop_in_graph and execution.host_waits == 0 and execution.launches == 0
  assert execution.in_graphs == 1.0


def test_a_fusion_reads_only_what_its_gathers_take():
  """A fused kernel computes only the elements its results need: an operand that reaches
  a gather through element-wise operations and an in-place update is read as the
  gathered rows; one that reaches the result whole, in full."""
  text = """HloModule m, entry_computation_layout={()->f32[4,1000]{1,0}}

%fused (param_0: f32[64,1000], param_1: f32[64,1000], param_2: s32[4,1]) -> f32[4,1000] {
  %param_0 = f32[64,1000]{1,0} parameter(0)
  %param_1 = f32[64,1000]{1,0} parameter(1)
  %param_2 = s32[4,1]{1,0} parameter(2)
  %neg = f32[64,1000]{1,0} negate(f32[64,1000]{1,0} %param_0)
  %zero = s32[] constant(0)
  %upd = f32[64,1000]{1,0} dynamic-update-slice(f32[64,1000]{1,0} %neg, f32[64,1000]{1,0} %param_1, s32[] %zero, s32[] %zero)
  ROOT %g = f32[4,1000]{1,0} gather(f32[64,1000]{1,0} %upd, s32[4,1]{1,0} %param_2), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,1000}
}

%whole (param_0: f32[64,1000]) -> f32[64,1000] {
  %param_0 = f32[64,1000]{1,0} parameter(0)
  ROOT %neg = f32[64,1000]{1,0} negate(f32[64,1000]{1,0} %param_0)
}

ENTRY %main (a: f32[64,1000], b: f32[64,1000], i: s32[4,1]) -> f32[4,1000] {
  %a = f32[64,1000]{1,0} parameter(0)
  %b = f32[64,1000]{1,0} parameter(1)
  %i = s32[4,1]{1,0} parameter(2)
  %w = f32[64,1000]{1,0} fusion(f32[64,1000]{1,0} %a), kind=kLoop, calls=%whole
  ROOT %f = f32[4,1000]{1,0} fusion(f32[64,1000]{1,0} %w, f32[64,1000]{1,0} %b, s32[4,1]{1,0} %i), kind=kLoop, calls=%fused
}
"""  # noqa: E501
  module = programs.parse(text)
  rows, whole, out = 4 * 1000 * 4, 64 * 1000 * 4, 4 * 1000 * 4
  index = 4 * 4
  costs = programs.computation_costs(module, module.entry)
  # %whole: the operand in full and its result; %fused: the gathered rows of both
  # operands (at most), the indices and the result.
  assert costs.hbm_bytes == (whole + whole) + (rows + rows + index + out), costs
