"""Reading an XLA program's text: its instructions, loops, conditionals, matmuls and the
converts applied to its parameters.

Works on either form of a jitted function's HLO module, read by `hlo.parse` (re-exported
here with `Instruction`, `Module` and `shape_of`). Pure text parsing, no JAX: the
functions below count what a program report (scripts/program_report.py) prints.

Terms:
  loop of rounds: the outermost `while` (one reached from the entry computation through
    no other loop) with the most instructions beneath it; in the engine's program, the
    loop over decoding rounds.
  fixed-trip loop: a `while` whose backend_config carries XLA's "known_trip_count" (the
    CPU and GPU compilers write one), or whose condition compares its counter with a
    constant, the counter starting at a constant and growing by one (`trip_count`: how
    the loops of a compiled TPU module, which carry no trip count, are read); any other
    `while` and every `conditional` is data-dependent: on a GPU, outside a command buffer,
    each iteration or branch is decided on the host.
  kernel: an instruction of the compiled module that runs as its own operation (a fusion,
    a dot, a copy...): one outside fused and applied computations (reducers, comparators)
    that is not bookkeeping (parameter, constant, tuple, get-tuple-element, bitcast) or a
    control-flow container (while, conditional, call).
"""

import collections
import dataclasses
import math
import re
from collections.abc import Iterable

from spectr_jax.hlo import Instruction, Module, float_bits, parse, shape_of, split_top

__all__ = [
  "ControlFlow",
  "Instruction",
  "Module",
  "control_flow",
  "count_instructions",
  "count_kernels",
  "count_matmuls",
  "executed_computations",
  "parameter_converts",
  "parse",
  "round_loop",
  "scope",
  "scope_counts",
  "shape_of",
]

_BOOKKEEPING = frozenset(
  ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all")
)
_CONTAINERS = frozenset(("while", "conditional", "call"))


def count_instructions(module: Module) -> int:
  """Instructions in the module, in every computation (fused and applied ones included)."""
  return sum(len(instructions) for instructions in module.computations.values())


def executed_computations(module: Module) -> set[str]:
  """The computations run as control flow: the entry and those reached from it through
  while bodies and conditions, conditional branches and calls (not the computations of
  fusions, reducers or comparators)."""
  seen, stack = set(), [module.entry]
  while stack:
    name = stack.pop()
    if name in seen or name not in module.computations:
      continue
    seen.add(name)
    for i in module.computations[name]:
      if i.opcode in _CONTAINERS:
        stack += [c for _, c in i.children()]
  return seen


def count_kernels(module: Module) -> int:
  """Kernels of a compiled module (see the module docstring)."""
  return sum(
    1
    for name in executed_computations(module)
    for i in module.computations[name]
    if i.opcode not in _BOOKKEEPING and i.opcode not in _CONTAINERS
  )


def count_matmuls(module: Module) -> int:
  """Matmuls anywhere in the module: dot and convolution instructions, and custom calls
  whose target names a matmul (e.g. oneDNN's)."""
  return sum(
    1
    for i in module.instructions()
    if i.opcode in ("dot", "convolution")
    or (i.opcode == "custom-call" and "matmul" in i.attributes.lower())
  )


@dataclasses.dataclass(frozen=True)
class ControlFlow:
  """A while or conditional instruction.

  Attributes:
    kind: "while" or "conditional".
    name: the instruction's name.
    op_name: its metadata's op_name (the JAX named-scope path), or "".
    trip_count: a while's known trip count, else None.
    in_round_loop: it sits inside the loop of rounds (`round_loop`), or is that loop.
  """

  kind: str
  name: str
  op_name: str
  trip_count: int | None
  in_round_loop: bool

  @property
  def data_dependent(self) -> bool:
    """A conditional, or a while without a known trip count."""
    return self.kind == "conditional" or self.trip_count is None


def round_loop(module: Module) -> tuple[Instruction | None, set[str]]:
  """The loop of rounds (see the module docstring) and the computations beneath it (its
  body, condition and all they call); (None, set()) without a loop."""
  not_loops = ("calls", "to_apply", "true_computation", "false_computation", "branch")
  outer = module.reachable([module.entry], not_loops)
  best, best_inside, best_size = None, set(), -1
  for name in outer:
    for i in module.computations[name]:
      if i.opcode != "while":
        continue
      inside = module.reachable(c for e, c in i.children() if e in ("body", "condition"))
      size = sum(len(module.computations[c]) for c in inside)
      if size > best_size:
        best, best_inside, best_size = i, inside, size
  return best, best_inside


def control_flow(module: Module) -> list[ControlFlow]:
  """Every while and conditional of the module, in text order."""
  loop, inside = round_loop(module)
  return [
    ControlFlow(
      i.opcode,
      i.name,
      i.op_name,
      trip_count(module, i) if i.opcode == "while" else None,
      i.computation in inside or (loop is not None and i.name == loop.name),
    )
    for i in module.instructions()
    if i.opcode in ("while", "conditional")
  ]


def parameter_converts(
  module: Module, shapes: Iterable[tuple[int, ...]], source: str = "f32"
) -> list[tuple[Instruction, bool]]:
  """The converts of weight-sized tensors: each convert whose operand is a `source`
  tensor with one of `shapes` (the parameters' shapes) and whose result is a narrower
  float, with whether it sits inside the loop of rounds."""
  shapes = {tuple(s) for s in shapes}
  types = module.types()
  _, inside = round_loop(module)
  found = []
  for i in module.instructions():
    if i.opcode != "convert" or not i.operands:
      continue
    operand = shape_of(types.get(i.operands[0], ""))
    result = shape_of(i.type)
    if operand is None or result is None or operand[0] != source or operand[1] not in shapes:
      continue
    bits, source_bits = float_bits(result[0]), float_bits(source)
    if bits is not None and source_bits is not None and bits < source_bits:
      found.append((i, i.computation in inside))
  return found


_PLUMBING = re.compile(
  r"^(?:jit\(.*\)|vmap\(.*\)|shard_map|while|body|cond|closed_call|branch_\d+_fun)$"
)


def scope(op_name: str) -> str:
  """The first named scope of an op_name past JAX's own components (jit(...), vmap(...),
  while/body, cond/branch_i_fun, closed_call): "score" for
  "jit(_decode)/while/body/score/...", "" when none."""
  for part in op_name.split("/"):
    if not _PLUMBING.match(part):
      return part
  return ""


def scope_counts(instructions: Iterable[Instruction]) -> dict[str, int]:
  """Instruction counts by `scope` of their op_name, most first ("(none)" without one).
  In a pre-optimisation module a computation called from several places (a jitted
  function's body) carries op_names relative to that function."""
  counts = collections.Counter(scope(i.op_name) or "(none)" for i in instructions)
  return dict(counts.most_common())


def _defining(module: Module, computation: str) -> dict[str, Instruction]:
  return {i.name: i for i in module.computations.get(computation, ())}


def _through(instruction: Instruction | None, defining: dict | None) -> Instruction | None:
  """The instruction behind copies, bitcasts and converts (looked up in `defining`)."""
  while (
    instruction is not None and defining and instruction.opcode in ("copy", "bitcast", "convert")
  ):
    instruction = defining.get(instruction.operands[0])
  return instruction


def _constant(instruction: Instruction | None, defining: dict | None = None) -> int | None:
  """The value of an integer scalar constant instruction (through copies and bitcasts of
  one, looked up in `defining`), else None."""
  instruction = _through(instruction, defining)
  if instruction is None or instruction.opcode != "constant" or not instruction.operands:
    return None
  try:
    return int(instruction.operands[0])
  except ValueError:
    return None


def trip_count(module: Module, loop: Instruction) -> int | None:
  """A while's trip count: XLA's known trip count, else the counted-loop pattern (module
  docstring: the condition's root is `counter < constant` for a tuple element the body
  increments by one and the loop starts at a constant); None for a data-dependent loop."""
  if loop.trip_count is not None:
    return loop.trip_count
  edges = dict(loop.children())
  cond, body = edges.get("condition"), edges.get("body")
  if cond not in module.computations or body not in module.computations:
    return None
  in_cond = _defining(module, cond)
  root = next((i for i in module.computations[cond] if i.root), None)
  if root is None or root.opcode != "compare" or "direction=LT" not in root.attributes:
    return None
  counter, bound = (in_cond.get(o) for o in root.operands[:2])
  limit = _constant(bound, in_cond)
  if counter is None or counter.opcode != "get-tuple-element" or limit is None:
    return None
  index = int(re.search(r"index=(\d+)", counter.attributes).group(1))
  # The body's result tuple: element `index` must be that element plus one.
  in_body = _defining(module, body)
  body_root = next((i for i in module.computations[body] if i.root), None)
  if body_root is None or body_root.opcode != "tuple" or index >= len(body_root.operands):
    return None
  step = in_body.get(body_root.operands[index])
  if step is None or step.opcode != "add":
    return None
  parts = [_through(in_body.get(o), in_body) for o in step.operands]
  if not any(_constant(p, in_body) == 1 for p in parts) or not any(
    p is not None and p.opcode == "get-tuple-element" and f"index={index}" in p.attributes
    for p in parts
  ):
    return None
  # The loop's initial tuple, element `index`: a constant.
  outer = _defining(module, loop.computation)
  init = outer.get(loop.operands[0])
  if init is None or init.opcode != "tuple" or index >= len(init.operands):
    return None
  start = _constant(outer.get(init.operands[index]), outer)
  return None if start is None else max(limit - start, 0)


_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](\{[^}]*\})?")
_ITEM_BYTES = {
  "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
  "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SLICES = frozenset(("slice", "dynamic-slice", "gather"))
_VIEWS = frozenset(("bitcast", "reshape", "get-tuple-element"))


def array_bytes(type_: str, hbm_only: bool = False) -> int:
  """Bytes of the arrays in a result type (a tuple's elements summed); with `hbm_only`,
  of those in the default memory space (a layout marked S(n), n > 0, is on-chip memory
  of a TPU, e.g. the staging buffers weights stream through)."""
  total = 0
  for element, dims, layout in _ARRAY.findall(type_):
    if element not in _ITEM_BYTES and float_bits(element) is None:
      continue
    if hbm_only and re.search(r"S\([1-9]\d*\)", layout or ""):
      continue
    size = _ITEM_BYTES.get(element) or float_bits(element) / 8
    count = 1
    for d in filter(None, dims.split(",")):
      count *= int(d)
    total += int(count * size)
  return total


# Element-wise operations: each element of the result reads one element of each operand
# of the result's shape, so a fusion computes only the elements a later slice or gather
# takes of them.
_ELEMENTWISE = frozenset((
  "abs", "add", "and", "clamp", "compare", "convert", "divide", "exponential", "log",
  "maximum", "minimum", "multiply", "negate", "not", "or", "select", "subtract", "xor",
))  # fmt: skip


def _elements(type_: str) -> int:
  shape = shape_of(type_)
  return math.prod(shape[1]) if shape else 0


def _fused_reads(module: Module, fused: str, operand: int, full: int) -> int:
  """Bytes a fusion reads of its operand `operand` (`full` bytes). A fused kernel computes
  only the elements its results need: where every use of the operand inside the fused
  computation (through views, element-wise operations, in-place updates and nested
  fusions) ends in a slice or gather, it reads the elements those take, else all of it."""
  instructions = module.computations.get(fused, ())
  param = next(
    (i for i in instructions if i.opcode == "parameter" and i.operands == (str(operand),)), None
  )
  if param is None or not _elements(param.type):
    return full
  users: dict[str, list[Instruction]] = collections.defaultdict(list)
  for i in instructions:
    for o in i.operands:
      users[o].append(i)
  roots = {i.name for i in instructions if i.root}
  memo: dict[str, int] = {}

  def demand(value: Instruction) -> int:
    """Elements of `value` the fusion's results need."""
    if value.name in memo:
      return memo[value.name]
    size = _elements(value.type)
    need = 0
    for user in [] if value.name in roots else users[value.name]:
      if user.opcode in _VIEWS:
        need += demand(user)
      elif user.opcode in _SLICES and user.operands[0] == value.name:
        need += _elements(user.type)
      elif user.opcode == "dynamic-update-slice" and user.root and user.operands[0] == value.name:
        continue  # updated in place: only the update is written
      elif user.opcode == "dynamic-update-slice" and value.name in user.operands[:2]:
        need += demand(user)
      elif user.opcode in _ELEMENTWISE and _elements(user.type) == size:
        need += demand(user)
      elif user.opcode == "fusion":
        nested = dict(user.children()).get("calls")
        need += sum(
          _fused_reads(module, nested, n, size) for n, o in enumerate(user.operands)
          if o == value.name
        )  # fmt: skip
      else:
        need = size
        break
    memo[value.name] = size if value.name in roots else min(need, size)
    return memo[value.name]

  return full * demand(param) // _elements(param.type)


def _in_place_update(module: Module, fused: str) -> int | None:
  """The bytes written by a fusion whose root is a dynamic-update-slice (the output is
  the operand updated in place): the update's size; None for any other fusion."""
  instructions = module.computations.get(fused, ())
  root = next((i for i in instructions if i.root), None)
  if root is None or root.opcode != "dynamic-update-slice":
    return None
  return array_bytes(_defining(module, fused)[root.operands[1]].type)


def _dot_flops(module: Module, instruction: Instruction, types: dict[str, str]) -> float:
  """2 x output elements x contracted elements of a dot or of a GPU library matmul (a
  custom call whose backend_config holds dot_dimension_numbers); 0 for anything else."""
  if instruction.opcode == "dot":
    found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)
  elif instruction.opcode == "custom-call" and "dot_dimension_numbers" in instruction.attributes:
    found = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instruction.attributes)
  else:
    return 0.0
  result = _ARRAY.search(instruction.type)
  lhs = shape_of(types.get(instruction.operands[0], ""))
  if result is None or lhs is None or found is None:
    return 0.0
  contracted = 1
  for d in re.findall(r"\d+", found.group(1)):
    contracted *= lhs[1][int(d)]
  out = 1
  for d in filter(None, result.group(2).split(",")):
    out *= int(d)
  return 2.0 * out * contracted


@dataclasses.dataclass(frozen=True)
class Costs:
  """What a stretch of a compiled program executes, its loops' bodies times their trip
  counts (`trip_count`).

  Attributes:
    flops: dot flops (2 x output x contracted elements; elementwise work not counted).
    hbm_bytes: bytes its kernels read and write in device memory: each kernel's operands
      and results, a fused slice counted as the slice, an in-place update as the update;
      on a TPU without the on-chip staging buffers (`array_bytes`). The traffic a kernel
      would need with perfect caching; what a cache hit saves is not modelled.
    kernels: kernels executed (`count_kernels`).
    unknown_loops: data-dependent loops inside, counted as one trip (a lower bound).
    branches: conditionals inside, counted as their costliest branch.
  """

  flops: float = 0.0
  hbm_bytes: float = 0.0
  kernels: int = 0
  unknown_loops: int = 0
  branches: int = 0

  def __add__(self, other: "Costs") -> "Costs":
    pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)
    return Costs(*(a + b for a, b in pairs))

  def __mul__(self, times: int) -> "Costs":
    return Costs(self.flops * times, self.hbm_bytes * times, self.kernels * times,
                 self.unknown_loops, self.branches)  # fmt: skip


def computation_costs(module: Module, computation: str) -> Costs:
  """The costs of one run of `computation` (a loop's body, the entry...), the loops and
  conditionals it runs included (see `Costs`)."""
  types = module.types()
  total = Costs()
  for i in module.computations.get(computation, ()):
    if i.opcode == "while":
      edges = dict(i.children())
      trips = trip_count(module, i)
      inner = computation_costs(module, edges["body"]) + computation_costs(
        module, edges["condition"]
      )
      total += inner * (trips if trips is not None else 1)
      if trips is None:
        total += Costs(unknown_loops=1)
      continue
    if i.opcode == "conditional":
      branches = [computation_costs(module, c) for e, c in i.children() if e != "to_apply"]
      if branches:
        total += max(branches, key=lambda c: (c.hbm_bytes, c.flops))
      total += Costs(branches=1)
      continue
    if i.opcode == "call":
      for _, c in i.children():
        total += computation_costs(module, c)
      continue
    if i.opcode in _BOOKKEEPING:
      continue
    fused = dict(i.children()).get("calls") if i.opcode == "fusion" else None
    flops = _dot_flops(module, i, types)
    if fused is not None:
      flops += sum(_dot_flops(module, f, types) for f in module.computations.get(fused, ()))
    written = _in_place_update(module, fused) if fused else None
    if i.opcode == "dynamic-update-slice":
      written = array_bytes(types.get(i.operands[1], ""), hbm_only=True)
    read = 0
    for n, operand in enumerate(i.operands):
      full = array_bytes(types.get(operand, ""), hbm_only=True)
      if written is not None and n == 0:
        continue  # the buffer updated in place
      if full and i.opcode in _SLICES and n == 0:
        full = min(full, array_bytes(i.type))  # the slice only
      read += _fused_reads(module, fused, n, full) if fused and full else full
    out = array_bytes(i.type, hbm_only=True) if written is None else written
    if i.opcode in ("copy-start", "slice-start"):
      # An async copy (on a TPU, mostly into on-chip memory) moves its data once: the
      # destination buffer, the first element of copy-start's result, the second of
      # slice-start's ((operands), destination, context).
      parts = split_top(i.type.strip()[1:-1])
      moved = array_bytes(parts[0 if i.opcode == "copy-start" else 1])
      read, out = (min(read, moved) if read else 0), 0
    elif i.opcode.endswith("-done"):
      read = 0
    total += Costs(flops=flops, hbm_bytes=read + out, kernels=1)
  return total


def round_costs(module: Module) -> Costs:
  """The costs of one iteration of the loop of rounds (`round_loop`: its body and its
  condition); a round program's are `computation_costs(module, module.entry)`."""
  loop, _ = round_loop(module)
  if loop is None:
    raise ValueError("the program has no loop of rounds")
  edges = dict(loop.children())
  return computation_costs(module, edges["body"]) + computation_costs(module, edges["condition"])


def weight_copies(
  module: Module,
  shapes: Iterable[tuple[int, ...]],
  stacked: Iterable[tuple[int, ...]] = (),
  min_bytes: int = 2**20,
) -> list[Instruction]:
  """Kernels of the compiled module that copy, transpose or convert a weight: a copy,
  transpose or convert (or a fusion whose root is one) of at least `min_bytes` whose
  result in device memory has one of the parameters' `shapes`, or one layer of a
  `stacked` parameter (its shape without the leading layer axis). A TPU's staging copies
  into on-chip memory are not counted."""
  wanted = {tuple(s) for s in shapes} | {tuple(s[1:]) for s in stacked}
  found = []
  for name in executed_computations(module):
    for i in module.computations[name]:
      opcode = i.opcode
      if opcode == "fusion":
        fused = dict(i.children()).get("calls")
        root = next((f for f in module.computations.get(fused, ()) if f.root), None)
        opcode = root.opcode if root is not None else opcode
      if opcode not in ("copy", "transpose", "convert"):
        continue
      shape = shape_of(i.type)
      if shape is not None and shape[1] in wanted and array_bytes(i.type, True) >= min_bytes:
        found.append(i)
  return found


_THUNK = re.compile(r"^(\s*)(\d+): (k\w+)\s*\[[^\]]*\]\s*(.*)$")
_LABEL = re.compile(r"^\s*(condition|body|branch_\d+):\s*$")
_CONTAINER_THUNKS = frozenset(("kWhile", "kConditional", "kCommandBuffer", "kSequential"))


@dataclasses.dataclass
class Thunk:
  """One thunk of XLA:GPU's thunk sequence (what the GPU runtime executes).

  Attributes:
    kind: e.g. "kCustomKernel", "kGemm", "kCopy", "kWhile", "kConditional",
      "kCommandBuffer" (its children are recorded into a CUDA graph and launched as one).
    name: the rest of its line (a kernel's name and launch shape).
    label: where it sits in its parent: "body", "condition", "branch_i" or "".
    children: the thunks it holds.
  """

  kind: str
  name: str
  label: str = ""
  children: list["Thunk"] = dataclasses.field(default_factory=list)


def parse_thunks(text: str) -> Thunk:
  """Reads an XLA:GPU thunk sequence dump (`*.thunk_sequence*.txt` under
  `--xla_dump_to`) into a tree under a root "kSequential" thunk."""
  root = Thunk("kSequential", "")
  stack: list[tuple[int, Thunk]] = [(-1, root)]
  label = ""
  for line in text.splitlines():
    found = _LABEL.match(line)
    if found:
      label = found.group(1)
      continue
    found = _THUNK.match(line)
    if not found:
      continue
    indent = len(found.group(1))
    while stack[-1][0] >= indent:
      stack.pop()
    parent = stack[-1][1]
    thunk = Thunk(
      found.group(3), found.group(4).strip(), label if parent.kind != "kSequential" else ""
    )
    parent.children.append(thunk)
    stack.append((indent, thunk))
  return root


@dataclasses.dataclass(frozen=True)
class GpuExecution:
  """How the loop of rounds of a GPU program runs (`gpu_execution`).

  Attributes:
    round_loop_in_graph: the loop of rounds is a command buffer's WHILE (a CUDA graph
      conditional node: its iterations never wait on the host).
    host_waits: host-side decisions per round: each iteration (and the exit test) of a
      loop, and each branch, that runs outside a command buffer (trip counts unknown here
      count once).
    launches: host launches per round: command buffers and the thunks outside them.
    kernels: kernels per round, inside command buffers or not (fixed loops counted once).
    in_graphs: the share of those kernels recorded into command buffers.
  """

  round_loop_in_graph: bool
  host_waits: int
  launches: int
  kernels: int
  in_graphs: float


def _loops_of_rounds(root: Thunk) -> list[tuple[Thunk, bool]]:
  """The outermost while thunks, with whether each sits inside a command buffer."""
  found = []

  def visit(thunk: Thunk, in_graph: bool):
    for child in thunk.children:
      if child.kind == "kWhile":
        found.append((child, in_graph))
      else:
        visit(child, in_graph or child.kind == "kCommandBuffer")

  visit(root, False)
  return found


def gpu_execution(root: Thunk) -> GpuExecution | None:
  """Reads a GPU program's thunk tree (`parse_thunks`) for its loop of rounds: the
  outermost loop holding the most kernels; None without a loop."""
  loops = _loops_of_rounds(root)
  if not loops:
    return None

  def kernels(thunk: Thunk) -> int:
    own = 0 if thunk.kind in _CONTAINER_THUNKS else 1
    return own + sum(kernels(c) for c in thunk.children)

  loop, in_graph = max(loops, key=lambda item: kernels(item[0]))
  waits = launches = graph_kernels = 0

  def visit(thunk: Thunk, graph: bool):
    nonlocal waits, launches, graph_kernels
    for child in thunk.children:
      inside = graph or child.kind == "kCommandBuffer"
      if not graph:
        launches += child.kind not in ("kWhile", "kConditional")
        waits += child.kind in ("kWhile", "kConditional")
      if inside and child.kind not in _CONTAINER_THUNKS:
        graph_kernels += 1
      visit(child, inside)

  visit(loop, in_graph)
  total = kernels(loop)
  return GpuExecution(
    round_loop_in_graph=in_graph,
    host_waits=waits + (0 if in_graph else 1),
    launches=launches,
    kernels=total,
    in_graphs=graph_kernels / max(total, 1),
  )
