"""The results store: records checked against their schema on read, full disks reported
as such with nothing partial left behind."""

import errno
import json
import os

import pytest

from spectr_jax import results


def valid_record(key: str = "a", draft_len: int = 2, num_prompts: int = 3, **changes) -> dict:
  """A results record of the schema (`results.RECORD_FIELDS`), with `changes` applied
  (a value of None deletes the field)."""
  cell = {
    "method": "kseq",
    "num_drafts": 2,
    "draft_len": draft_len,
    "rho": "star",
    "seed": 0,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "num_prompts": num_prompts,
    "prompt_len": 4,
    "max_new_tokens": 6,
    "stop_at_eos": False,
    "pair": "p",
  }
  prompts, positions = [6] * num_prompts, [1] * (draft_len + 1)
  record = {
    "key": key,
    "cell": cell,
    "emitted": prompts,
    "rounds": prompts,
    "draft_calls": prompts,
    "tokens_per_round": [0] * (draft_len + 2),
    "reached": positions,
    "hits": positions,
    "accepted": positions,
    "survivors": positions,
    "nonfinite": 0,
    "block_efficiency": 1.5,
    "warmup_seconds": 0.5,
    "decode_seconds": 0.1,
    "timed_tokens": 6,
    "timed_prompts": 1,
    "batch_size": 2,
    "run": "r",
    "device_kind": "cpu",
    "num_devices": 1,
    "draft_params": 1,
    "target_params": 10,
  }
  record.update(changes)
  return {k: v for k, v in record.items() if v is not None}


def _cell(**changes):
  return {k: v for k, v in dict(valid_record()["cell"], **changes).items() if v is not None}


@pytest.mark.parametrize(
  "line, problem",
  [
    ({"foo": 1}, "has no field 'key'"),
    (valid_record("b", emitted=None), "has no field 'emitted'"),
    (valid_record("b", emitted=[6, 6.5, 6]), "field 'emitted' must be a list of integers"),
    (valid_record("b", emitted="666"), "field 'emitted' must be a list of integers"),
    (valid_record("b", rounds=[6, 6]), "field 'rounds' has 2 entries, its cell needs 3"),
    (valid_record("b", hits=[1, 1]), "field 'hits' has 2 entries, its cell needs 3"),
    (valid_record("b", tokens_per_round=[0, 0, 0]), "'tokens_per_round' has 3 entries"),
    (valid_record("b", nonfinite=True), "field 'nonfinite' must be an integer"),
    (valid_record("b", decode_seconds="0.1"), "field 'decode_seconds' must be a number"),
    (valid_record("b", load_average="1.5"), "field 'load_average' must be a number"),
    (valid_record("b", cell=_cell(num_prompts=None)), "its cell has no field 'num_prompts'"),
    (valid_record("b", cell=_cell(rho=[1])), "field 'rho' must be null, a string or a number"),
    (valid_record("b", cell="kseq"), "field 'cell' must be an object"),
    ([1, 2], "the record is not a JSON object"),
  ],
)
def test_a_record_not_of_the_schema_is_an_error_naming_file_line_and_field(tmp_path, line, problem):
  path = tmp_path / results.RESULTS_FILE
  lines = [valid_record("a"), line, valid_record("c")]
  path.write_text("".join(json.dumps(r) + "\n" for r in lines))
  with pytest.raises(results.DamagedFileError, match=rf"{path}, line 2: damaged record") as error:
    results.load_results(tmp_path)
  assert problem in str(error.value)


def test_valid_records_and_unknown_fields_pass_and_optional_fields_are_checked(
  tmp_path, monkeypatch
):
  path = tmp_path / results.RESULTS_FILE
  lines = [valid_record("a", extra={"new": 1}), valid_record("b", draft_len=0, rho=None)]
  lines.append(valid_record("c", cell=_cell(rho=1.5), block_efficiency=2))
  path.write_text("".join(json.dumps(r) + "\n" for r in lines))
  assert list(results.load_results(tmp_path)) == ["a", "b", "c"]
  # A field added later: one row of the table; records without it still load.
  optional = results.Field("numbers", "positions", required=False)
  monkeypatch.setitem(results.RECORD_FIELDS, "invalid", optional)
  assert list(results.load_results(tmp_path)) == ["a", "b", "c"]
  path.write_text(json.dumps(valid_record("d", invalid=[0.5, 0.0])) + "\n")
  with pytest.raises(results.DamagedFileError, match="'invalid' has 2 entries, its cell needs 3"):
    results.load_results(tmp_path)


def test_provenance_and_analysis_are_checked_minimally(tmp_path):
  path = tmp_path / results.PROVENANCE_FILE
  path.write_text('{"run": 1, "pair": {"fingerprint": "f"}}\n[1]\n')
  with pytest.raises(results.DamagedFileError, match=rf"{path}, line 2: .* not a JSON object"):
    results.read_jsonl(path)
  path.write_text('{"run": 1, "pair": {"fingerprint": "f"}}\n{"run": 2}\n')
  assert len(results.read_jsonl(path)) == 2  # any object is a line of a JSONL file
  with pytest.raises(results.DamagedFileError, match=r"line 2: .* has no field 'pair'"):
    results.latest_pair_fingerprint(tmp_path)
  analysis = tmp_path / results.ANALYSIS_FILE
  assert results.read_analysis(analysis) is None
  analysis.write_text('[{"K": 2}]')
  with pytest.raises(results.DamagedFileError, match=f"{analysis}: damaged .* not a JSON object"):
    results.read_analysis(analysis)


def _full_disk(monkeypatch, how):
  """os.write fails as on a full disk: a short write then ENOSPC, ENOSPC at once, or a
  write that lands and an fsync that reports ENOSPC (as NFS may)."""
  write = os.write
  calls = []

  def short_write(fd, data):
    calls.append(len(data))
    if how == "short" and len(calls) == 1:
      return write(fd, data[: len(data) // 2])
    if how == "fsync":
      return write(fd, data)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def fsync(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "write", short_write)
  if how == "fsync":
    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("how", ["short", "enospc", "fsync"])
def test_full_disk_is_reported_as_such_and_leaves_no_partial_line(tmp_path, monkeypatch, how):
  path = tmp_path / results.RESULTS_FILE
  results.append_record(path, valid_record("a"))
  before = path.read_bytes()
  _full_disk(monkeypatch, how)
  with pytest.raises(OSError, match=rf"could not write {path}: the disk is full") as error:
    results.append_record(path, valid_record("b"))
  assert error.value.errno == errno.ENOSPC
  assert path.read_bytes() == before  # no partial line (it was cut again)
  whole = tmp_path / results.ANALYSIS_FILE
  whole.write_text('{"key": "old"}')
  with pytest.raises(OSError, match=rf"could not write {whole}: the disk is full") as error:
    results.write_whole(whole, '{"key": "new"}')
  assert error.value.errno == errno.ENOSPC
  assert whole.read_text() == '{"key": "old"}' and sorted(os.listdir(tmp_path)) == sorted(
    [results.RESULTS_FILE, results.ANALYSIS_FILE]
  )
