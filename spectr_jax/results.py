"""The results store of a sweep directory (plain files, no JAX).

  results.jsonl     one JSON record per finished cell, keyed by a hash of the cell
  provenance.jsonl  one record per run that wrote cells (config, versions, devices, pair)
  analysis.json     the per-position rho ablation (when one ran there)

Every JSONL file is read by `read_jsonl` (a partial last line is skipped, a damaged
complete line is an error naming the file and line) and written by `append_record` (one
atomic O_APPEND write per line, fsynced; the writer, who holds the folder's lock, cuts a
partial last line first).
"""

import json
import os
import pathlib
from typing import Any

from absl import logging

RESULTS_FILE = "results.jsonl"
PROVENANCE_FILE = "provenance.jsonl"
ANALYSIS_FILE = "analysis.json"


class DamagedFileError(ValueError):
  """A JSONL file with a damaged complete line (not a partial last line)."""


def read_jsonl(path: str | pathlib.Path) -> list[Any]:
  """The records of a JSONL file ([] when it does not exist), the one reader of them all.

  A partial last line (no trailing newline: a writer killed mid-line, or one writing now)
  is skipped with a warning; the folder's writer cuts it before its next append
  (`append_record`). A damaged complete line is a `DamagedFileError` naming the file and
  the line number.
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
      records.append(json.loads(line))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
      raise DamagedFileError(
        f"{path}, line {number}: damaged record ({error}); move the file aside, or delete "
        "that line so its cell reruns"
      ) from None
  return records


def load_results(results_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """Reads results.jsonl into {key: record} (see `read_jsonl`; a repeated key keeps its
  first record)."""
  records = {}
  for record in read_jsonl(pathlib.Path(results_dir) / RESULTS_FILE):
    records.setdefault(record["key"], record)
  return records


def append_record(path: str | pathlib.Path, record: dict[str, Any]) -> None:
  """Appends `record` to the JSONL file `path` as one line: one `os.write` with O_APPEND,
  then fsync. Only the folder's writer (the holder of its lock) calls it; it first cuts a
  partial last line left by a killed writer, so the record starts on a fresh line."""
  line = (json.dumps(record) + "\n").encode()
  fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
      tail = os.pread(fd, size, 0)
      end = tail.rfind(b"\n") + 1
      logging.warning("cutting a partial last line of %s (%d bytes)", path, size - end)
      os.ftruncate(fd, end)
    if os.write(fd, line) != len(line):
      raise OSError(f"short write to {path}")
    os.fsync(fd)
  finally:
    os.close(fd)


def latest_pair_fingerprint(results_dir: str | pathlib.Path) -> str | None:
  """The pair fingerprint of the newest run in provenance.jsonl (None without one)."""
  runs = read_jsonl(pathlib.Path(results_dir) / PROVENANCE_FILE)
  return runs[-1]["pair"]["fingerprint"] if runs else None


def strategy_name(rho: str | float) -> str:
  """ "rho*", "rho=K" or "rho=<value>" for a K-SEQ `rho` ("star", "k" or a number)."""
  if rho == "star":
    return "rho*"
  return "rho=K" if rho == "k" else f"rho={float(rho):g}"
