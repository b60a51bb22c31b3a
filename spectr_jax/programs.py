"""Reading an XLA program's text: its instructions, loops, conditionals, matmuls and the
converts applied to its parameters.

Works on either form of a jitted function's HLO module: the pre-optimisation module
(`lowered.as_text(dialect="hlo", debug_info=True)`) or the compiled one
(`lowered.compile().as_text()`). Pure text parsing, no JAX: `parse` reads the module into
computations of `Instruction`s; the functions below count what a program report
(scripts/program_report.py) prints.

Terms:
  loop of rounds: the outermost `while` (one reached from the entry computation through
    no other loop) with the most instructions beneath it; in the engine's program, the
    loop over decoding rounds.
  fixed-trip loop: a `while` whose backend_config carries XLA's "known_trip_count" (only
    compiled modules have one); any other `while` and every `conditional` is
    data-dependent: on a GPU each iteration or branch is decided on the host.
  kernel: an instruction of the compiled module that runs as its own operation (a fusion,
    a dot, a copy...): one outside fused and applied computations (reducers, comparators)
    that is not bookkeeping (parameter, constant, tuple, get-tuple-element, bitcast) or a
    control-flow container (while, conditional, call).
"""

import collections
import dataclasses
import re
from collections.abc import Iterable, Iterator

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

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\)\s*->\s*.*)?\{\s*$")
_NAME = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_SHAPE = re.compile(r"^(\w+)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CHILD = re.compile(
  r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_BOOKKEEPING = frozenset(
  ("parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all")
)
_CONTAINERS = frozenset(("while", "conditional", "call"))
_FLOAT_BITS = {"f64": 64, "f32": 32, "bf16": 16, "f16": 16}


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction: `name = type opcode(operands), attributes`.

  Attributes:
    name: the instruction's name (without %).
    type: its result type text, e.g. "f32[2048,128]{1,0}" or a tuple "(s32[], ...)".
    opcode: e.g. "convert", "dot", "while".
    operands: the operands' names (without %; literal text for a constant).
    attributes: the rest of the line (called computations, metadata, backend_config).
    computation: the name of the computation holding it.
  """

  name: str
  type: str
  opcode: str
  operands: tuple[str, ...]
  attributes: str
  computation: str

  @property
  def op_name(self) -> str:
    """The op_name of its metadata (JAX's named-scope path, e.g.
    "jit(_decode)/while/body/verify/while"), or "" without metadata."""
    match = _OP_NAME.search(self.attributes)
    return match.group(1) if match else ""

  @property
  def trip_count(self) -> int | None:
    """XLA's known trip count of a while (compiled modules only), else None."""
    match = _TRIP.search(self.attributes)
    return int(match.group(1)) if match else None

  def children(self) -> list[tuple[str, str]]:
    """(edge, computation) for each computation it calls; edge is "calls", "to_apply",
    "body", "condition", "true_computation", "false_computation" or "branch"."""
    found = _CHILD.findall(self.attributes)
    for branches in _BRANCHES.findall(self.attributes):
      found += [("branch", b.strip().lstrip("%")) for b in branches.split(",") if b.strip()]
    return found


@dataclasses.dataclass
class Module:
  """An HLO module: computation name -> its instructions, and the entry's name."""

  computations: dict[str, list[Instruction]]
  entry: str

  def instructions(self) -> Iterator[Instruction]:
    """Every instruction of every computation."""
    for instructions in self.computations.values():
      yield from instructions

  def types(self) -> dict[str, str]:
    """Instruction name -> result type, over the whole module (HLO names are unique)."""
    return {i.name: i.type for i in self.instructions()}

  def reachable(self, roots: Iterable[str], edges: Iterable[str] | None = None) -> set[str]:
    """The computations reachable from `roots` (included) through calls of the given
    edge kinds (all kinds when None)."""
    edges = None if edges is None else set(edges)
    seen, stack = set(), list(roots)
    while stack:
      name = stack.pop()
      if name in seen or name not in self.computations:
        continue
      seen.add(name)
      for instruction in self.computations[name]:
        stack += [c for e, c in instruction.children() if edges is None or e in edges]
    return seen


def _closing(text: str, start: int) -> int:
  """The index of the parenthesis closing the one at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i
  return len(text) - 1


def _split_top(text: str) -> list[str]:
  """Splits at the commas outside parentheses and braces."""
  parts, depth, current = [], 0, []
  for ch in text:
    depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(ch, 0)
    if ch == "," and depth == 0:
      parts.append("".join(current))
      current = []
    else:
      current.append(ch)
  if "".join(current).strip():
    parts.append("".join(current))
  return parts


def _instruction(line: str, computation: str) -> Instruction | None:
  """Parses one instruction line (None for anything else)."""
  match = _NAME.match(line)
  if not match:
    return None
  rest = line[match.end() :]
  if rest.startswith("("):  # a tuple type
    end = _closing(rest, 0) + 1
  else:
    end = rest.find(" ")
    end = len(rest) if end < 0 else end
  type_, rest = rest[:end], rest[end:]
  opcode = _OPCODE.match(rest)
  if not opcode:
    return None
  open_at = opcode.end() - 1
  close_at = _closing(rest, open_at)
  operands = tuple(
    part.strip().split(" ")[-1].lstrip("%") for part in _split_top(rest[open_at + 1 : close_at])
  )
  attributes = rest[close_at + 1 :].lstrip(", ")
  return Instruction(match.group(1), type_, opcode.group(1), operands, attributes, computation)


def parse(text: str) -> Module:
  """Reads an HLO module's text (pre-optimisation or compiled) into a `Module`."""
  computations, current, entry = {}, None, None
  for line in text.splitlines():
    if not line.strip() or line.startswith("HloModule"):
      continue
    if not line[0].isspace():
      header = _HEADER.match(line)
      if header:
        current = header.group(2)
        computations[current] = []
        entry = current if header.group(1) else entry
      elif line.strip() == "}":
        current = None
      continue
    if current is not None:
      instruction = _instruction(line, current)
      if instruction is not None:
        computations[current].append(instruction)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return Module(computations, entry)


def shape_of(type_: str) -> tuple[str, tuple[int, ...]] | None:
  """(element type, dimensions) of an array type like "f32[2048,128]{1,0}", None for a
  tuple or token."""
  match = _SHAPE.match(type_)
  if not match:
    return None
  dims = match.group(2)
  return match.group(1), tuple(int(d) for d in dims.split(",")) if dims else ()


def _float_bits(element_type: str) -> int | None:
  """Bits of a floating-point element type (f8 and f4 variants included), else None."""
  if element_type in _FLOAT_BITS:
    return _FLOAT_BITS[element_type]
  match = re.fullmatch(r"f(\d)e\w+", element_type)
  return int(match.group(1)) if match else None


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
      i.trip_count if i.opcode == "while" else None,
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
    bits, source_bits = _float_bits(result[0]), _float_bits(source)
    if bits is not None and source_bits is not None and bits < source_bits:
      found.append((i, i.computation in inside))
  return found


_PLUMBING = re.compile(r"^(?:jit\(.*\)|vmap\(.*\)|while|body|cond|closed_call|branch_\d+_fun)$")


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
