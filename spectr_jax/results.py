"""The results store of a sweep directory (plain files, no JAX).

  results.jsonl     one JSON record per finished cell, keyed by a hash of the cell
  provenance.jsonl  one record per run that wrote cells (config, versions, devices, pair)
  analysis.json     the per-position rho ablation (when one ran there)

Every JSONL file is read by `read_jsonl` (a partial last line is skipped; a damaged
complete line, or one that is not a record of the file's schema, is an error naming the
file and line) and written by `append_record` (one O_APPEND write per line, fsynced; the
writer, who holds the folder's lock, cuts a partial last line first). Whole files
(analysis.json, a run's config.json) are written aside and renamed (`write_whole`). A
write that fails (a full disk) is an `OSError` with its errno that names the file, and
leaves no partial line or file behind.

The schema of a results record is one table, `RECORD_FIELDS` (with `CELL_FIELDS` for its
"cell"); a new field is one more row (`required=False` while older records lack it).
Fields outside the table pass unchecked.
"""

import dataclasses
import errno
import json
import numbers
import os
import pathlib
from collections.abc import Callable
from typing import Any

from absl import logging

from spectr_jax.sweep_config import KEY_WHEN_SET_FIELDS, LEGACY_DECODING

RESULTS_FILE = "results.jsonl"
PROVENANCE_FILE = "provenance.jsonl"
ANALYSIS_FILE = "analysis.json"


class DamagedFileError(ValueError):
  """A results-store file with a damaged complete line, or a record not of its schema."""


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


# What a field's value must be: kind -> (test, description for the message).
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
  "str": (lambda v: isinstance(v, str), "a string"),
  "int": (_is_int, "an integer"),
  "number": (_is_number, "a number"),
  "bool": (lambda v: isinstance(v, bool), "true or false"),
  "ints": (lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers"),
  "numbers": (lambda v: isinstance(v, list) and all(map(_is_number, v)), "a list of numbers"),
  "rho": (lambda v: v is None or isinstance(v, str) or _is_number(v), "null, a string or a number"),
  "object": (lambda v: isinstance(v, dict), "an object"),
}
# How long a list field is, from its cell: one entry per prompt, per walk position
# t = 0..L (t = L is the bonus draw), or per count of tokens a round emits (0..L+1).
_LENGTHS: dict[str, Callable[[dict[str, Any]], int]] = {
  "prompts": lambda cell: cell["num_prompts"],
  "positions": lambda cell: cell["draft_len"] + 1,
  "counts": lambda cell: cell["draft_len"] + 2,
}


@dataclasses.dataclass(frozen=True)
class Field:
  """One field of a record: its kind (a key of `_KINDS`), for a list the length it must
  have (a key of `_LENGTHS`, None: any), and whether every record holds it."""

  kind: str
  length: str | None = None
  required: bool = True


_TYPE_KINDS = {float: "number", int: "int", bool: "bool", str: "str"}
# A cell (`experiment.Cell.as_record`: its fields with the decoding settings inlined).
CELL_FIELDS: dict[str, Field] = {
  "method": Field("str"),
  "num_drafts": Field("int"),
  "draft_len": Field("int"),
  "rho": Field("rho"),
  "seed": Field("int"),
  **{
    name: Field(_TYPE_KINDS[type(default)], required=name not in KEY_WHEN_SET_FIELDS)
    for name, default in LEGACY_DECODING.items()
  },
  "pair": Field("str"),
}
# A results record (`experiment.run_cell`, completed by the sweep).
RECORD_FIELDS: dict[str, Field] = {
  "key": Field("str"),
  "cell": Field("object"),
  "emitted": Field("ints", "prompts"),
  "rounds": Field("ints", "prompts"),
  "draft_calls": Field("ints", "prompts"),
  # Target positions scored per prompt (issue 27: fewer with `tree`; older records lack it).
  "target_positions": Field("ints", "prompts", required=False),
  # Draft positions computed per prompt (fewer with `tree`; older records lack it).
  "draft_positions": Field("ints", "prompts", required=False),
  "tokens_per_round": Field("ints", "counts"),
  "reached": Field("ints", "positions"),
  "hits": Field("ints", "positions"),
  "accepted": Field("ints", "positions"),
  "survivors": Field("ints", "positions"),
  # Where the verifier was not exact (issue 24; older records lack them).
  "invalid": Field("ints", "positions", required=False),
  "overshoot": Field("numbers", "positions", required=False),
  "nonfinite": Field("int"),
  "block_efficiency": Field("number"),
  "warmup_seconds": Field("number"),
  "decode_seconds": Field("number"),
  # The host's 1-minute load average as the timed decodes start (older records lack it).
  "load_average": Field("number", required=False),
  "timed_tokens": Field("int"),
  "timed_prompts": Field("int"),
  "batch_size": Field("int"),
  "run": Field("str"),
  "device_kind": Field("str"),
  "num_devices": Field("int"),
  "draft_params": Field("int"),
  "target_params": Field("int"),
  # "head": a draft head reading the target's features; "model": a separate draft
  # (older records lack it: separate drafts).
  "draft_kind": Field("str", required=False),
}


def _check_fields(values: Any, fields: dict[str, Field], what: str) -> None:
  """Raises ValueError naming the first field of `fields` that `values` lacks (when
  required) or holds with a wrong kind."""
  if not isinstance(values, dict):
    raise ValueError(f"{what} is not a JSON object")
  for name, field in fields.items():
    if name not in values:
      if field.required:
        raise ValueError(f"{what} has no field {name!r}")
      continue
    test, description = _KINDS[field.kind]
    if not test(values[name]):
      raise ValueError(f"{what}: field {name!r} must be {description}, got {values[name]!r:.80}")


def check_object(record: Any) -> None:
  """Raises ValueError unless `record` is a JSON object (the check of every JSONL line)."""
  _check_fields(record, {}, "the line")


def check_record(record: Any) -> None:
  """Raises ValueError naming the first field of a results record that is missing or has
  a wrong type or length (see `RECORD_FIELDS`, `CELL_FIELDS`)."""
  _check_fields(record, RECORD_FIELDS, "the record")
  cell = record["cell"]
  _check_fields(cell, CELL_FIELDS, "its cell")
  for name, field in RECORD_FIELDS.items():
    if field.length is not None and name in record:
      want = _LENGTHS[field.length](cell)
      if len(record[name]) != want:
        raise ValueError(
          f"the record: field {name!r} has {len(record[name])} entries, its cell needs "
          f"{want} (one per {field.length[:-1]})"
        )


def check_provenance(record: Any) -> None:
  """Raises ValueError unless a provenance record is an object naming its pair's
  fingerprint (what `latest_pair_fingerprint` reads)."""
  _check_fields(record, {"pair": Field("object")}, "the record")
  _check_fields(record["pair"], {"fingerprint": Field("str")}, "its pair")


def read_jsonl(path: str | pathlib.Path, check: Callable[[Any], None] = check_object) -> list[Any]:
  """The records of a JSONL file ([] when it does not exist), the one reader of them all.

  A partial last line (no trailing newline: a writer killed mid-line, or one writing now)
  is skipped with a warning; the folder's writer cuts it before its next append
  (`append_record`).

  Args:
    path: the file.
    check: raises ValueError for a record that is not of the file's schema (default:
      every line must hold a JSON object).

  Raises:
    DamagedFileError: a complete line is not JSON or fails `check`; the message names
      the file and the line number.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return []
  text = path.read_bytes()
  if text and not text.endswith(b"\n"):
    end = text.rfind(b"\n") + 1
    logging.warning("skipping a partial last line of %s (%d bytes)", path, len(text) - end)
    text = text[:end]
  records = []
  for number, line in enumerate(text.split(b"\n"), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      check(record)
    except ValueError as error:  # also JSONDecodeError and UnicodeDecodeError
      raise DamagedFileError(
        f"{path}, line {number}: damaged record ({error}); move the file aside, or delete "
        "that line (a results line: its cell reruns)"
      ) from None
    records.append(record)
  return records


def load_results(results_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """Reads results.jsonl into {key: record}, each record checked (`check_record`; see
  `read_jsonl`); a repeated key keeps its first record."""
  records = {}
  for record in read_jsonl(pathlib.Path(results_dir) / RESULTS_FILE, check_record):
    records.setdefault(record["key"], record)
  return records


def read_analysis(path: str | pathlib.Path) -> dict[str, Any] | None:
  """The rho ablation's analysis.json (None when absent).

  Raises:
    DamagedFileError: it is not a JSON object.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return None
  try:
    analysis = json.loads(path.read_bytes())
    check_object(analysis)
  except ValueError as error:
    raise DamagedFileError(f"{path}: damaged ({error}); move it aside to redo it") from None
  return analysis


def _write_all(fd: int, data: bytes, path: pathlib.Path, undo: Callable[[], str]) -> None:
  """Writes all of `data` at `fd` (after a short write, the rest again: a full disk then
  raises ENOSPC) and fsyncs it.

  Raises:
    OSError: the write or the fsync failed; same errno (so the same subclass), with a
      message naming `path` ("the disk is full" for ENOSPC) and what `undo()`, called
      first, says it left.
  """
  done = 0
  try:
    while done < len(data):
      written = os.write(fd, data[done:])
      if written <= 0:  # no progress and no error: nothing more fits
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      done += written
    os.fsync(fd)
  except OSError as error:
    what = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
    raise OSError(
      error.errno,
      f"could not write {path}: {what} ({done} of {len(data)} bytes written; {undo()})",
    ) from error


def append_record(path: str | pathlib.Path, record: dict[str, Any]) -> None:
  """Appends `record` to the JSONL file `path` as one line (O_APPEND, fsynced).

  Only the folder's writer (the holder of its lock) calls it; it first cuts a partial
  last line left by a killed writer, so the record starts on a fresh line.

  Raises:
    OSError: the line could not be written (errno ENOSPC: "the disk is full"); the
      message names the file, and the part of the line written is cut again.
  """
  path = pathlib.Path(path)
  line = (json.dumps(record) + "\n").encode()
  fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)

  def undo() -> str:
    try:
      os.ftruncate(fd, size)
    except OSError:
      return "a partial last line is left, which readers skip and the next append cuts"
    return "the part written was cut again"

  try:
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
      tail = os.pread(fd, size, 0)
      size = tail.rfind(b"\n") + 1
      logging.warning("cutting a partial last line of %s (%d bytes)", path, len(tail) - size)
      os.ftruncate(fd, size)
    _write_all(fd, line, path, undo)
  finally:
    os.close(fd)


def write_whole(path: str | pathlib.Path, text: str) -> None:
  """Writes `text` to `path` whole or not at all: to `<path>.partial`, fsynced, renamed.

  Raises:
    OSError: it could not be written (errno ENOSPC: "the disk is full"); the message
      names the file, and `path` is left as it was.
  """
  path = pathlib.Path(path)
  partial = path.with_name(path.name + ".partial")

  def undo() -> str:
    partial.unlink(missing_ok=True)
    return f"{path} is unchanged"

  fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  try:
    _write_all(fd, text.encode(), path, undo)
  finally:
    os.close(fd)
  partial.replace(path)


def check_writable(results_dir: str | pathlib.Path) -> None:
  """Raises a clear OSError (PermissionError, ...) unless results.jsonl and
  provenance.jsonl in `results_dir` can be appended to; a sweep checks before it writes
  anything. A file the check creates is removed again."""
  for name in (PROVENANCE_FILE, RESULTS_FILE):
    path = pathlib.Path(results_dir) / name
    existed = path.exists()
    try:
      os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as error:
      raise OSError(
        error.errno,
        f"{path} cannot be written ({error.strerror}): no cell could be recorded, so nothing "
        "was run; make it writable, or set another results_dir",
      ) from error
    if not existed:
      path.unlink()


def latest_pair_fingerprint(results_dir: str | pathlib.Path) -> str | None:
  """The pair fingerprint of the newest run in provenance.jsonl (None without one)."""
  runs = read_jsonl(pathlib.Path(results_dir) / PROVENANCE_FILE, check_provenance)
  return runs[-1]["pair"]["fingerprint"] if runs else None


def strategy_name(rho: str | float) -> str:
  """ "rho*", "rho=K" or "rho=<value>" for a K-SEQ `rho` ("star", "k" or a number)."""
  if rho == "star":
    return "rho*"
  return "rho=K" if rho == "k" else f"rho={float(rho):g}"
