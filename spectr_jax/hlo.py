"""Reading an XLA program's text into computations of `Instruction`s.

Works on either form of a jitted function's HLO module: the pre-optimisation module
(`lowered.as_text(dialect="hlo", debug_info=True)`) or the compiled one
(`lowered.compile().as_text()`). Pure text parsing, no JAX: `parse` reads the module;
`shape_of` and `float_bits` read its types.
"""

import dataclasses
import re
from collections.abc import Iterable, Iterator

__all__ = ["Instruction", "Module", "float_bits", "parse", "shape_of", "split_top"]

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
  root: bool = False

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


def split_top(text: str) -> list[str]:
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
    part.strip().split(" ")[-1].lstrip("%") for part in split_top(rest[open_at + 1 : close_at])
  )
  attributes = rest[close_at + 1 :].lstrip(", ")
  root = line.lstrip().startswith("ROOT ")
  return Instruction(
    match.group(1), type_, opcode.group(1), operands, attributes, computation, root
  )


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


def float_bits(element_type: str) -> int | None:
  """Bits of a floating-point element type (f8 and f4 variants included), else None."""
  if element_type in _FLOAT_BITS:
    return _FLOAT_BITS[element_type]
  match = re.fullmatch(r"f(\d)e\w+", element_type)
  return int(match.group(1)) if match else None
