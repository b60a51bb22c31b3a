"""The results store of a sweep directory (plain files, no JAX).

  results.jsonl     one JSON record per finished cell, keyed by a hash of the cell
  provenance.jsonl  one record per run that wrote cells (config, versions, devices, pair)
  analysis.json     the per-position rho ablation (when one ran there)

Writers append whole lines and fsync them; a reader cuts a partial last line (a run
killed while writing) so the next append starts on a fresh line.
"""

import json
import os
import pathlib
from typing import Any

from absl import logging

RESULTS_FILE = "results.jsonl"
PROVENANCE_FILE = "provenance.jsonl"
ANALYSIS_FILE = "analysis.json"


def load_results(results_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """Reads results.jsonl into {key: record}.

  A trailing partial line (a run killed while writing) is cut off the file, so the next
  append starts on a fresh line; a repeated key keeps its first record.
  """
  path = pathlib.Path(results_dir) / RESULTS_FILE
  if not path.exists():
    return {}
  text = path.read_bytes()
  if text and not text.endswith(b"\n"):
    end = text.rfind(b"\n") + 1
    logging.warning("dropping a partial last line of %s (%d bytes)", path, len(text) - end)
    with path.open("r+b") as f:
      f.truncate(end)
    text = text[:end]
  records = {}
  for line in text.decode().splitlines():
    if line.strip():
      record = json.loads(line)
      records.setdefault(record["key"], record)
  return records


def append_record(path: str | pathlib.Path, record: dict[str, Any]) -> None:
  """Appends `record` to the JSONL file `path` as one line, flushed to disk."""
  with pathlib.Path(path).open("a") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())


def latest_pair_fingerprint(results_dir: str | pathlib.Path) -> str | None:
  """The pair fingerprint of the newest run in provenance.jsonl (None without one)."""
  path = pathlib.Path(results_dir) / PROVENANCE_FILE
  if not path.exists():
    return None
  return json.loads(path.read_text().splitlines()[-1])["pair"]["fingerprint"]


def strategy_name(rho: str | float) -> str:
  """ "rho*", "rho=K" or "rho=<value>" for a K-SEQ `rho` ("star", "k" or a number)."""
  if rho == "star":
    return "rho*"
  return "rho=K" if rho == "k" else f"rho={float(rho):g}"
