"""Sweeps: the grid, cell keys, resumable results (also after a kill), provenance, launchers."""

import dataclasses
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import lm1b_spectr, rho_ablation
from spectr_jax import checks, drafting, engine, experiment, memory, methods, pairs, report, results
from spectr_jax.data import TokenizedSplit
from spectr_jax.decode_spec import DecodeSpec
from spectr_jax.models import ModelBundle, get_model_config, init_params
from spectr_jax.sweep_config import SWEEP_BRANCHINGS, Prompts, RhoAblationConfig, SweepConfig
from spectr_jax.sweep_config import cell_record as sweep_cell_record
from tests.experiments.test_results import valid_record

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V = 16


def random_pair(seed: int = 0) -> pairs.Pair:
  """Random-weight test models (V = 16) and 40 random held-out sentences."""
  draft_config = get_model_config("draft-test", V, max_len=32)
  target_config = get_model_config("target-test", V, max_len=32)
  draft = ModelBundle(draft_config, init_params(draft_config, jax.random.key(seed)))
  target = ModelBundle(target_config, init_params(target_config, jax.random.key(seed + 1)))
  rng = np.random.default_rng(seed)
  heldout = TokenizedSplit.from_ids(
    [list(rng.integers(4, V, rng.integers(1, 8))) for _ in range(40)]
  )
  return pairs.make_pair(draft, target, heldout, what="random")


def sweep_config(tmp_path, **changes) -> SweepConfig:
  """The "test" sweep with results in tmp_path (models come from `random_pair`)."""
  config = SweepConfig.from_dict(lm1b_spectr.get_config("test").to_dict())
  return dataclasses.replace(config, results_dir=str(tmp_path / "results"), **changes)


@pytest.fixture(scope="module")
def pair():
  return random_pair()


@pytest.mark.parametrize(
  "arg", [None, "runlocal", "test", "source=lm1b_text,path=/data/lm1b", "runlocal,plain_draft"]
)
def test_configs_convert(arg):
  sweep = SweepConfig.from_dict(lm1b_spectr.get_config(arg).to_dict())
  ablation = RhoAblationConfig.from_dict(rho_ablation.get_config(arg).to_dict())
  assert ablation.sweep.name != sweep.name
  assert set(sweep.methods) <= set(methods.names())
  if arg is None:
    assert (sweep.num_drafts, sweep.draft_lens, sweep.seeds) == ((1, 2, 4, 8), (2, 4, 8), (0, 1, 2))
    assert (sweep.prompts.num_prompts, sweep.decode.temperature) == (1000, 1.0)
    assert ("optimal" in sweep.methods) == ("optimal" in methods.names())
  if arg and "lm1b_text" in arg:
    assert sweep.pair.draft.data.source == "lm1b_text"
    assert sweep.pair.draft.data.path == "/data/lm1b"
    assert sweep.pair.draft_workdir == "draft-distill-lm1b_text"
    assert sweep.pair.draft.distill.init_workdir == "draft-lm1b_text"
  if arg == "runlocal":
    assert sweep.pair.draft_workdir == "draft-distill-runlocal"
    assert sweep.pair.draft.distill.target_workdir == sweep.pair.target_workdir == "target"
    assert sweep.pair.draft_base.num_steps == 300 and sweep.prompts.num_prompts < 100
  if arg and "plain_draft" in arg:
    assert sweep.pair.draft_workdir == "draft" and sweep.pair.draft_base is None
  assert not sweep.pair.train_missing and sweep.pair.kind == "embedded"


def test_config_errors(tmp_path):
  with pytest.raises(ValueError, match="unknown methods"):
    sweep_config(tmp_path, methods=("autoregressive", "beam"))
  with pytest.raises(ValueError, match="rho must be"):
    sweep_config(tmp_path, rhos=(0.5,))
  ablation = rho_ablation.get_config("test").to_dict()
  ablation["analysis"]["num_drafts"] = (0,)
  with pytest.raises(ValueError, match="analysis.num_drafts must be an integer >= 1, got 0"):
    RhoAblationConfig.from_dict(ablation)


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(temperature=-1.0), "temperature must be finite and >= 0, got -1.0"),
    (dict(temperature=float("inf")), "temperature must be finite"),
    (dict(top_k=-1), "top_k must be an integer >= 0, got -1"),
    (dict(top_k=10**6), r"decode: top_k = 1000000 exceeds the vocabulary"),
    (dict(top_p=1.5), r"top_p must lie in \(0, 1\], got 1.5"),
    (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
    (dict(max_new_tokens=10**4), "exceeds the target's max_len"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(prompt_len=2.5), "prompt_len must be an integer"),
    (dict(draft_lens=[0]), r"draft_lens must be an integer >= 1, got 0"),
    (dict(num_drafts=[2.5]), "num_drafts must be an integer"),
    (dict(seeds=[0.5]), r"seeds must be an integer >= 0, got 0.5"),
  ],
)
def test_whole_grid_is_checked_when_the_config_is_built(change, message):
  # Issue 13: these failed only at the first cell, after the pair was loaded (or trained).
  values = lm1b_spectr.get_config("test").to_dict()
  for name, value in change.items():
    block = "prompts" if name == "prompt_len" else "decode"
    target = values if name in ("draft_lens", "num_drafts", "seeds") else values[block]
    target[name] = value
  with pytest.raises(ValueError, match=message):
    SweepConfig.from_dict(values)


def test_grid_is_checked_against_the_pair_folders(tmp_path, monkeypatch):
  # A "trained" pair's max_len is read from its run folder's config.json, before loading.
  monkeypatch.setenv("SPECTR_WORKDIR", str(tmp_path))
  values = lm1b_spectr.get_config("test").to_dict()
  values["pair"].update(kind="trained", draft=None, target=None)
  SweepConfig.from_dict(values)  # no folders yet: nothing to check against
  saved = lm1b_spectr.get_config("test").pair.target.to_dict()
  saved["model_overrides"] = dict(saved["model_overrides"], max_len=12)
  (tmp_path / values["pair"]["target_workdir"]).mkdir()
  (tmp_path / values["pair"]["target_workdir"] / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="exceeds the target's max_len 12"):
    SweepConfig.from_dict(values)


def test_typo_in_a_pair_folder_is_an_error_not_a_training_run(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECTR_WORKDIR", str(tmp_path))
  monkeypatch.setattr(pairs.train, "train", lambda *a, **k: pytest.fail("trained a model"))
  pair = dataclasses.replace(sweep_config(tmp_path).pair, target_workdir="target-tset")
  with pytest.raises(pairs.MissingPairError, match="target-tset"):
    pairs.load_pair(pair)  # The target comes first (a distilled draft needs it).
  assert not (tmp_path / "target-tset").exists()


def test_missing_pair_is_an_error_naming_folders_and_command(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECTR_WORKDIR", str(tmp_path))
  pair = sweep_config(tmp_path).pair
  assert pair.kind == "embedded" and not pair.train_missing
  with pytest.raises(pairs.MissingPairError) as error:
    pairs.load_pair(pair)  # trains nothing: no checkpoint there
  message = str(error.value)
  assert str(tmp_path / pair.target_workdir) in message and "configs/target.py" in message
  assert "train_missing=True" in message and not (tmp_path / pair.target_workdir).exists()
  trained = dataclasses.replace(pair, kind="trained")
  with pytest.raises(pairs.MissingPairError, match="config.json is missing"):
    pairs.load_pair(trained)
  with pytest.raises(
    ValueError, match="is not a directory: a pretrained model is read from a local"
  ):
    pairs.load_pair(dataclasses.replace(pair, kind="pretrained"))
  with pytest.raises(ValueError, match="train_missing needs"):
    dataclasses.replace(trained, train_missing=True)
  with pytest.raises(ValueError, match="unknown pair kind"):
    dataclasses.replace(pair, kind="hub")


def test_expand_grid(tmp_path):
  config = sweep_config(
    tmp_path,
    methods=("autoregressive", "sd", "kseq", "specinfer"),
    num_drafts=(1, 2, 4),
    draft_lens=(2, 4),
    rhos=("star", "k", 3.0),
    seeds=(0, 1),
  )
  cells = experiment.expand(config, "pair")
  grid = {(c.method, c.num_drafts, c.draft_len, c.rho) for c in cells}
  kseq = {(k, rho) for m, k, _, rho in grid if m == "kseq"}
  assert kseq == {(2, "star"), (2, "k"), (4, "star"), (4, "k"), (4, 3.0)}  # rho 3 > K = 2 skipped
  assert {(m, k, n) for m, k, n, _ in grid if m != "kseq"} == {
    ("autoregressive", 1, 0),
    ("sd", 1, 2),
    ("sd", 1, 4),
    ("specinfer", 2, 2),
    ("specinfer", 2, 4),
    ("specinfer", 4, 2),
    ("specinfer", 4, 4),
  }
  assert len(cells) == 2 * len(grid) == len({c.key for c in cells})
  # Seeds are the inner loop: cells that share a compiled decoder run in a row.
  assert [c.seed for c in cells[:4]] == [0, 1, 0, 1]
  with pytest.raises(ValueError, match="twice"):
    experiment.expand(dataclasses.replace(config, seeds=(0, 0)), "pair")


def test_cell_key_hashes_every_field():
  spec = DecodeSpec("kseq", 4, 4, max_new_tokens=16)
  cell = experiment.Cell("kseq", 4, 4, "star", 0, spec, Prompts(8, 8, False), "abc")
  assert cell.key == dataclasses.replace(cell).key
  # The key of the flat record, as before the decoding settings were grouped (and before
  # they became a `DecodeSpec` template and `Prompts`).
  assert cell.key == "5169e11dd42760e1"
  changed = dict(
    method="specinfer",
    num_drafts=8,
    draft_len=2,
    rho="k",
    seed=1,
    temperature=0.5,
    top_k=5,
    top_p=0.9,
    num_prompts=9,
    prompt_len=4,
    max_new_tokens=17,
    stop_at_eos=True,
    dedup=True,
    branching="proportional",
    pair="abd",
  )
  # `dedup` (stored as "tree") and `branching` (added after results were stored) are in
  # the record only where they are set.
  assert set(changed) - {"dedup"} == set(cell.as_record()) | {"branching"}
  assert sweep_cell_record(spec.replace(dedup=True), Prompts())["tree"] is True

  def changed_cell(name, value):
    if name == "branching":  # a tree drafting scheme's
      shaped = DecodeSpec("rrs", 4, 4, max_new_tokens=16, branching=value)
      return dataclasses.replace(cell, spec=shaped)
    if name in ("temperature", "top_k", "top_p", "max_new_tokens", "dedup"):
      return dataclasses.replace(cell, spec=spec.replace(**{name: value}))
    if name in ("num_prompts", "prompt_len", "stop_at_eos"):
      return dataclasses.replace(cell, prompts=dataclasses.replace(cell.prompts, **{name: value}))
    return dataclasses.replace(cell, **{name: value})

  keys = {changed_cell(name, value).key for name, value in changed.items()}
  assert len(keys) == len(changed) and cell.key not in keys


def test_a_branching_applies_to_the_cells_of_schemes_that_draw_trees(tmp_path):
  """The template's branching reaches the cells of "rrs" (drafts without replacement)
  with drafts; the other cells keep the keys of a sweep without it; bad values are
  refused."""
  config = sweep_config(tmp_path, methods=("autoregressive", "kseq", "rrs"))
  shaped = config.replace(branching="proportional")
  plain = {(c.method, c.num_drafts, c.draft_len, c.seed): c for c in experiment.expand(config, "p")}
  for cell in experiment.expand(shaped, "p"):
    same = plain[(cell.method, cell.num_drafts, cell.draft_len, cell.seed)]
    if cell.method == "rrs":
      assert cell.spec.branching == "proportional" and cell.key != same.key
      assert cell.as_record()["branching"] == "proportional"
    else:
      assert cell.key == same.key and "branching" not in cell.as_record()
  assert shaped.cell_spec("rrs", 4, 2).branching == "proportional"
  assert shaped.cell_spec("kseq", 4, 2).branching == ""
  assert config.cell_spec("rrs", 4, 2).branching == ""
  with pytest.raises(ValueError, match="branching"):
    config.replace(branching="4-2-1-1")
  # The config names the shape itself (it imports no JAX code): the same as drafting's.
  assert SWEEP_BRANCHINGS == ("", drafting.PROPORTIONAL)
  # A config written before `dedup` was named so still reads (as records still store it).
  with pytest.warns(DeprecationWarning, match="decoding is deprecated"):
    old = SweepConfig.from_dict({**config.to_dict(), "decoding": {"tree": True}})
  assert old.decode.dedup and sweep_cell_record(old.cell_spec("kseq", 4, 2), Prompts())["tree"]


@pytest.mark.slow
def test_dedup_cells_decode_the_tails_tokens_on_fewer_target_positions(pair, tmp_path):
  """Issue 27: a sweep with `decoding.dedup` stores its cells with drafts under their own
  keys (the record's "tree") beside the tails' cells (whose records do not name it) and
  shares the autoregressive cells; on this pair the dedup cells emit the same tokens per
  prompt and round on fewer target positions, and the report names them apart."""
  tails = sweep_config(tmp_path, methods=("autoregressive", "kseq"), shard=False)
  trees = tails.replace(dedup=True)
  before = experiment.run_sweep(tails, pair)
  after = experiment.run_sweep(trees, pair)
  assert len(before) == len(after) == 4
  assert len(results.read_jsonl(tails.results_path / results.RESULTS_FILE)) == 6
  for a, b in zip(before, after, strict=True):
    assert "tree" not in a["cell"]
    assert (a["emitted"], a["rounds"]) == (b["emitted"], b["rounds"])
    scored = [sum(r["target_positions"]) for r in (a, b)]
    drafted = [sum(r["draft_positions"]) for r in (a, b)]
    if a["cell"]["draft_len"]:
      assert b["cell"]["tree"] is True and a["key"] != b["key"] and scored[1] < scored[0]
      assert drafted[1] < drafted[0]  # the pending tokens once, not once per tail
    else:
      assert b["key"] == a["key"] and scored[1] == scored[0] and drafted == [0, 0]
  rows = {r["label"]: r for r in report.summarize(before + after[2:])}
  assert rows["kseq (dedup)"]["dedup"] and not rows["kseq"]["dedup"]
  assert rows["kseq (dedup)"]["positions_per_round"] < rows["kseq"]["positions_per_round"] == 6
  dedup_drafted = rows["kseq (dedup)"]["draft_positions_per_round"]
  assert dedup_drafted < rows["kseq"]["draft_positions_per_round"] == 6
  assert rows["kseq (dedup)"]["block_efficiency"] == rows["kseq"]["block_efficiency"]
  assert rows["kseq (dedup)"]["speedup"] is not None  # over the shared autoregressive cells


def test_pair_fingerprint_tracks_parameters_and_text(pair):
  same = pairs.make_pair(pair.draft, pair.target, pair.heldout, other="description")
  assert same.fingerprint == pair.fingerprint
  target = ModelBundle(pair.target.config, jax.tree.map(lambda x: x * 1.5, pair.target.params))
  assert pairs.make_pair(pair.draft, target, pair.heldout).fingerprint != pair.fingerprint
  heldout = TokenizedSplit.from_ids([[5, 6]] + [list(pair.heldout.sentence(i)) for i in range(39)])
  assert pairs.make_pair(pair.draft, pair.target, heldout).fingerprint != pair.fingerprint


@pytest.mark.parametrize("name", [results.RESULTS_FILE, results.PROVENANCE_FILE])
def test_partial_last_line_is_skipped_by_readers_and_cut_by_the_writer(tmp_path, name):
  path = tmp_path / name
  lines = [
    json.dumps(valid_record(k, x=i, pair={"fingerprint": k})) + "\n" for i, k in enumerate("aab")
  ]
  path.write_text("".join(lines) + '{"key": "c", "x"')
  assert [r["key"] for r in results.read_jsonl(path)] == ["a", "a", "b"]
  assert results.latest_pair_fingerprint(tmp_path) == ("b" if "prov" in name else None)
  records = results.load_results(tmp_path)
  if name == results.RESULTS_FILE:
    assert sorted(records) == ["a", "b"] and records["a"]["x"] == 0  # the first record of a key
  assert path.read_text().endswith('"x"')  # a reader repairs nothing (it may not hold the lock)
  last = valid_record("d", pair={"fingerprint": "d"})
  results.append_record(path, last)  # the writer cuts it
  assert path.read_text() == "".join(lines) + json.dumps(last) + "\n"
  assert results.load_results(tmp_path / "missing") == {}


def test_damaged_middle_line_is_an_error_naming_file_and_line(tmp_path):
  path = tmp_path / results.RESULTS_FILE
  a, b = (json.dumps(valid_record(key)) for key in "ab")
  path.write_text(f'{a}\n{{"key": \n{b}\n')
  with pytest.raises(results.DamagedFileError, match=rf"{path}, line 2: damaged record"):
    results.load_results(tmp_path)


@pytest.mark.slow
def test_run_cell_does_not_depend_on_batching(pair):
  spec = DecodeSpec("sd", 1, 2, max_new_tokens=6)
  cell = experiment.Cell("sd", 1, 2, None, 3, spec, Prompts(5, 4, False), pair.fingerprint)
  one = experiment.run_cell(cell, pair, batch_size=5)
  split = experiment.run_cell(cell, pair, batch_size=2)
  for field in ("emitted", "rounds", "draft_calls", "tokens_per_round", "reached", "hits"):
    assert one[field] == split[field], field
  assert len(one["emitted"]) == 5 and sum(one["emitted"]) == 5 * 6
  assert one["timed_prompts"] == 5 and split["timed_prompts"] == 3  # batch 0 is the warm-up
  assert split["timed_tokens"] == 3 * 6 and split["decode_seconds"] > 0
  assert split["load_average"] >= 0  # the host's load as the timed decodes start


def test_sweep_writes_one_line_per_cell_and_resumes(pair, tmp_path, monkeypatch):
  config = sweep_config(tmp_path, methods=("autoregressive", "sd"), shard=False)
  records = experiment.run_sweep(config, pair, provenance_config={"name": "test"})
  path = config.results_path / results.RESULTS_FILE
  lines = path.read_text().splitlines()
  assert len(records) == len(lines) == 4
  assert [json.loads(line)["key"] for line in lines] == [r["key"] for r in records]
  first = json.loads(lines[0])
  assert first["cell"]["pair"] == pair.fingerprint and first["device_kind"]
  assert first["draft_params"] == pair.description["draft_params"]
  provenance = json.loads((config.results_path / results.PROVENANCE_FILE).read_text())
  assert provenance["config"] == {"name": "test"} and provenance["run"] == first["run"]
  assert {"jax", "numpy"} <= set(provenance["versions"]) and provenance["git_revision"]
  assert provenance["device_kind"] and provenance["num_devices"] == len(jax.devices())

  # Drop the last cell and a half-written line: a rerun runs that cell only, once.
  path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
  ran = []
  run_cell = experiment.run_cell
  monkeypatch.setattr(
    experiment, "run_cell", lambda cell, *a: ran.append(cell) or run_cell(cell, *a)
  )
  again = experiment.run_sweep(config, pair)
  assert [c.key for c in ran] == [records[3]["key"]]
  assert path.read_text().splitlines()[:3] == lines[:3]
  assert len(path.read_text().splitlines()) == 4
  for before, after in zip(records, again, strict=True):
    assert before["emitted"] == after["emitted"] and before["rounds"] == after["rounds"]
  assert experiment.run_sweep(config, pair) and len(ran) == 1  # nothing left to run


def test_sweep_that_does_not_fit_stops_before_decoding(pair, tmp_path, monkeypatch):
  config = sweep_config(tmp_path, methods=("sd",), shard=False, device_memory="0.0001")
  monkeypatch.setattr(experiment, "run_cell", lambda *a: pytest.fail("decoded"))
  with pytest.raises(memory.DoesNotFitError, match="mesh_model > 1"):
    experiment.run_sweep(config, pair)
  plan = experiment.memory_plan(config, pair.draft.config, pair.target.config, None)
  assert (plan.method, plan.num_drafts, plan.draft_len) == ("sd", 1, max(config.draft_lens))


@pytest.mark.slow
def test_sharded_sweep_matches_one_device(pair, tmp_path):
  config = sweep_config(tmp_path, methods=("sd",), seeds=(0,), batch_size=3)
  local = experiment.run_sweep(dataclasses.replace(config, shard=False), pair)
  sharded = experiment.run_sweep(
    dataclasses.replace(config, shard=True, results_dir=str(tmp_path / "sharded")), pair
  )
  assert sharded[0]["num_devices"] == len(jax.devices()) == 8
  assert sharded[0]["emitted"] == local[0]["emitted"] and sharded[0]["hits"] == local[0]["hits"]


def _lines(path):
  return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_killed_sweep_resumes_and_runs_no_cell_twice(tmp_path):
  """Kills `experiments.sweep` after its first cell, reruns it, checks the results_file file.

  The first run also trains the tiny test pair (its checkpoints are missing).
  """
  env = dict(os.environ, SPECTR_WORKDIR=str(tmp_path))
  command = [sys.executable, "-m", "experiments.sweep", "--config", "configs/lm1b_spectr.py:test"]
  command.append("--config.pair.train_missing=True")
  results_file = tmp_path / "experiments" / "lm1b_spectr-test" / results.RESULTS_FILE
  process = subprocess.Popen(command, cwd=_REPO, env=env, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and process.poll() is None and not _lines(results_file):
    time.sleep(0.02)
  process.send_signal(signal.SIGKILL)
  process.wait()
  before = _lines(results_file)
  total = len(lm1b_spectr.get_config("test").seeds) * 3
  assert 1 <= len(before) < total, "the sweep was not killed mid-way"
  subprocess.run(command, cwd=_REPO, env=env, check=True, stderr=subprocess.DEVNULL)
  after = _lines(results_file)
  keys = [json.loads(line)["key"] for line in after]
  assert after[: len(before)] == before
  assert len(after) == len(set(keys)) == total
  runs = _lines(results_file.parent / results.PROVENANCE_FILE)
  assert len(runs) == 2 and {json.loads(line)["run"] for line in after} == {
    json.loads(run)["run"] for run in runs
  }


def _script(name, *args):
  return subprocess.run(
    ["bash", f"scripts/{name}", *args], cwd=_REPO, capture_output=True, text=True, timeout=30
  )


def test_launch_tpu_pod_dry_run():
  run = _script(
    "launch_tpu_pod.sh",
    "--dry-run",
    "--tpu=my-pod",
    "--zone=us-central2-b",
    "--copy",
    "--mesh-model=4",
    "--",
    "python",
    "-m",
    "experiments.sweep",
    "--config",
    "configs/lm1b_spectr.py",
  )
  assert run.returncode == 0, run.stderr
  archive, *lines = run.stdout.splitlines()
  assert archive.startswith("git archive")
  assert all(line.startswith("gcloud compute tpus tpu-vm ") for line in lines)
  assert all("--worker=all" in line and "--zone=us-central2-b" in line for line in lines)
  assert "scp" in lines[0] and "scripts/setup.sh" in lines[1] and "jax[tpu]" in lines[1]
  assert "python -m experiments.sweep --config configs/lm1b_spectr.py" in lines[-1]
  assert lines[-1].endswith("--config.mesh_model=4'")  # appended to the command
  assert _script("launch_tpu_pod.sh", "--dry-run", "--", "true").returncode != 0  # no --tpu
  bad = _script(
    "launch_tpu_pod.sh", "--dry-run", "--tpu=p", "--zone=z", "--mesh-model=0", "--", "x"
  )
  assert bad.returncode == 2 and "--mesh-model" in bad.stderr


def test_launch_gpu_host_dry_run():
  run = _script("launch_gpu_host.sh", "--dry-run", "--", "python", "-m", "experiments.sweep")
  assert run.returncode == 0, run.stderr
  assert "python -m experiments.sweep" in run.stdout
  run = _script("launch_gpu_host.sh", "--dry-run", "--mesh-model=2", "--", "python", "-m", "x")
  assert run.returncode == 0, run.stderr
  assert "python -m x --config.mesh_model=2" in run.stdout


def test_unwritable_results_file_stops_the_sweep_before_any_line(pair, tmp_path, monkeypatch):
  """results.jsonl read-only: a clear error before the provenance line or any decoding."""
  config = sweep_config(tmp_path, methods=("autoregressive",), seeds=(0,), shard=False)
  path = config.results_path / results.RESULTS_FILE
  config.results_path.mkdir(parents=True)
  path.write_text("")
  path.chmod(0o444)  # enough unless the tests run as root, which the patch below covers
  real_open = os.open

  def read_only_open(file, flags, *args):
    if str(file) == str(path) and flags & (os.O_WRONLY | os.O_RDWR):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
    return real_open(file, flags, *args)

  monkeypatch.setattr(os, "open", read_only_open)
  monkeypatch.setattr(experiment, "run_cell", lambda *a: pytest.fail("decoded"))
  with pytest.raises(PermissionError, match=rf"{path} cannot be written .* nothing was run"):
    experiment.run_sweep(config, pair)
  assert not (config.results_path / results.PROVENANCE_FILE).exists()
  assert path.read_text() == ""


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(num_drafts=()), "num_drafts is empty"),
    (dict(rhos=()), "rhos is empty"),
    (dict(seeds=()), "seeds is empty"),
    (dict(methods=()), "methods is empty"),
    (dict(draft_lens=()), "draft_lens is empty"),
    (dict(num_drafts=(1, 2, 2)), "num_drafts lists a value twice"),
    (dict(rhos=(3.0,)), r"rhos \(3.0,\) give method 'kseq' no cell at K = 2"),
    (dict(num_drafts=(1,)), "num_drafts \\(1,\\) gives method 'kseq' no cell"),
  ],
)
def test_grids_that_drop_cells_are_errors_before_any_pair_is_loaded(change, message):
  """Issue 24: these dropped K-SEQ's cells silently, or failed after the pair was loaded
  with `max() arg is an empty sequence`."""
  values = lm1b_spectr.get_config("test").to_dict()
  values.update(change)
  with pytest.raises(ValueError, match=message):
    SweepConfig.from_dict(values)


def test_an_unknown_config_override_is_named():
  """Issue 24: `--config.decode.foo=1` was AttributeError: "'foo'"."""
  out = subprocess.run(
    [sys.executable, "-m", "experiments.report", "--config", "configs/lm1b_spectr.py:test",
     "--config.decode.foo=1"],
    cwd=_REPO, capture_output=True, text=True,
  )  # fmt: skip
  assert out.returncode != 0
  fields = "(adaptive, branching, dedup, draft_len, drafting, eos_ids, layer_stack, max_new_tokens"
  assert f"--config.decode has no field 'foo' {fields}" in out.stderr


def test_a_cell_with_non_finite_logits_is_not_saved(pair, tmp_path):
  """Issue 24: a model with NaN weights gave cells of 0 tokens, saved without a word."""
  broken = ModelBundle(pair.target.config, jax.tree.map(lambda x: x * np.nan, pair.target.params))
  bad = dataclasses.replace(pair, target=broken)
  config = sweep_config(tmp_path, methods=("sd",), shard=False)
  with pytest.raises(checks.NonFiniteError, match=r"cell sd K=1 L=2 seed=0: the target model"):
    experiment.run_sweep(config, bad)
  assert (
    not (config.results_path / results.RESULTS_FILE).exists()
    or not (config.results_path / results.RESULTS_FILE).read_text()
  )


@pytest.mark.slow
def test_refuse_inexact_stops_at_an_invalid_rho(pair, tmp_path):
  config = sweep_config(tmp_path, methods=("kseq",), rhos=("star", 1.0), shard=False)
  records = experiment.run_sweep(config, pair)
  invalid = {r["cell"]["rho"]: sum(r["invalid"]) for r in records}
  assert invalid["star"] == 0 and invalid[1.0] > 0
  refusing = dataclasses.replace(config, results_dir=str(tmp_path / "r2"), refuse_inexact=True)
  with pytest.raises(experiment.InexactError, match="rho=1.0 seed=0 is not exact"):
    experiment.run_sweep(refusing, pair)


@pytest.mark.slow
def test_a_new_drafting_scheme_is_swept_against_every_verifier_exact_for_it(pair, tmp_path):
  """A scheme registered in one module (tests/toy_drafting.py, the i.i.d. law) runs with
  every method exact for that law, with no new method record; its cells are labelled with
  it; a method exact for another law is refused at config time, naming the pair and why."""
  from tests import toy_drafting

  exact = methods.exact_for(toy_drafting.SCHEME.name)
  assert set(exact) == {"sd", "kseq", "specinfer", "optimal", "block", "gbv", "gbv_tp"}
  settings = dict(drafting="toy_iid", num_prompts=2, max_new_tokens=4)
  grid = dict(num_drafts=(1, 2), draft_lens=(2,), seeds=(0,))
  every = sweep_config(tmp_path, methods=("autoregressive", *exact), **grid).replace(**settings)
  expanded = experiment.expand(every, pair.fingerprint)
  assert {c.method for c in expanded} == {"autoregressive", *exact}
  # Decoded: a token-level and a block-level verifier (each program compiles apart).
  config = sweep_config(tmp_path, methods=("autoregressive", "kseq", "gbv"), **grid)
  config = config.replace(**settings)
  experiment.run_sweep(config, pair)
  records = results.load_results(config.results_path)
  ran = {r["cell"]["method"]: r["cell"] for r in records.values()}
  assert set(ran) == {"autoregressive", "kseq", "gbv"}
  assert all(c.get("drafting") == "toy_iid" for m, c in ran.items() if m != "autoregressive")
  assert "drafting" not in ran["autoregressive"]  # no drafts, no scheme: its key is kept
  labels = {r["label"] for r in report.summarize(list(records.values()))}
  assert f"{methods.get('kseq').label} (toy_iid)" in labels
  with pytest.raises(ValueError, match=r"method 'rrs' is not exact for drafting scheme 'toy_iid'"):
    sweep_config(tmp_path).replace(methods=("rrs",), **settings)
  with pytest.raises(ValueError, match=r"'specinfer' is not exact for .*'wor'.*: sd, rrs"):
    DecodeSpec(method="specinfer", num_drafts=2, draft_len=2, drafting="wor")


@pytest.mark.slow
def test_a_scheme_of_a_new_law_is_swept_against_every_verifier_exact_for_it(pair, tmp_path):
  """tests/toy_topk.py (trees without replacement from the draft's top 2 tokens, a law no
  registered method names) declares rrs and Traversal exact for it: a sweep decodes both
  on its trees, with dedup and a node budget, labelled with the scheme; a method it does
  not declare is refused at config time."""
  from tests import toy_topk

  name = toy_topk.SCHEME.name
  assert methods.exact_for(name) == ("rrs", "traversal")
  config = sweep_config(
    tmp_path, methods=("rrs", "traversal"), num_drafts=(2,), draft_lens=(2,), seeds=(0,)
  ).replace(drafting=name, dedup=True, node_budget=2.0, num_prompts=2, max_new_tokens=4)
  experiment.run_sweep(config, pair)
  records = results.load_results(config.results_path)
  ran = {r["cell"]["method"]: r["cell"] for r in records.values()}
  assert set(ran) == {"rrs", "traversal"}
  assert all(c["drafting"] == name and c["tree"] and c["node_budget"] == 2.0 for c in ran.values())
  labels = {r["label"] for r in report.summarize(list(records.values()))}
  assert any(name in label for label in labels), labels
  with pytest.raises(ValueError, match=rf"method 'kseq' is not exact for drafting scheme '{name}'"):
    sweep_config(tmp_path).replace(methods=("kseq",), drafting=name)


def test_cells_keep_the_keys_they_had_before_the_drafting_axis():
  """Cells at each method's default scheme keep the keys of results stores written before
  the drafting axis (values computed by the code before it), so stored cells are
  not decoded again; a scheme named explicitly is a new cell."""
  before = {
    ("kseq", 4, 4, "star"): "0f2b69ddadd3824b",
    ("rrs", 2, 2, None): "52673ce678ba1b20",
    ("autoregressive", 1, 0, None): "f2c76a6999a268cd",
  }
  for (method, k, draft_len, rho), key in before.items():
    tree = method == "rrs"
    spec = DecodeSpec(
      method, k, draft_len, rho=rho or "star", max_new_tokens=64, dedup=tree,
      branching="proportional" if tree else "",
    )  # fmt: skip
    cell = experiment.Cell(method, k, draft_len, rho, 0, spec, Prompts(), "abc123")
    assert cell.key == key, method
  # A sweep naming a method's own default scheme keeps its keys too (`expand` stores the
  # default as ""); another scheme is another cell.
  for scheme, same in (("iid", True), ("toy_iid", False)):
    from tests import toy_drafting  # noqa: F401 (registers toy_iid)

    config = SweepConfig(methods=("kseq",), num_drafts=(4,), draft_lens=(4,), seeds=(0,))
    (cell,) = experiment.expand(config.replace(drafting=scheme), "abc123")
    plain = experiment.expand(config, "abc123")[0]
    assert (cell.key == plain.key) == same, scheme


def test_a_results_store_written_before_the_decode_spec_is_resumed_not_redone(
  tmp_path, monkeypatch
):
  """tests/data/store_before_spec: a sweep (autoregressive, kseq, rrs; tree scoring and a
  proportional branching) stored by the code before `DecodeSpec`, when the flag was named
  `tree`. The same sweep now (`dedup`) finds every cell stored and decodes nothing; the
  report reads the records and labels their dedup rounds."""
  store = pathlib.Path(__file__).parents[1] / "data" / "store_before_spec"
  config = sweep_config(tmp_path, methods=("autoregressive", "kseq", "rrs"), shard=False)
  config = dataclasses.replace(config, num_drafts=(2,), draft_lens=(2,), seeds=(0,))
  config = config.replace(dedup=True, branching="proportional", num_prompts=2, max_new_tokens=4)
  config.results_path.mkdir(parents=True)
  shutil.copy(store / results.RESULTS_FILE, config.results_path)

  def decode(*args, **kwargs):
    raise AssertionError("a stored cell was decoded again")

  monkeypatch.setattr(engine, "generate", decode)
  records = experiment.run_sweep(config, random_pair())
  assert len(records) == 3
  labels = {r["label"] for r in report.summarize(records)}
  assert f"{methods.get('rrs').label} (proportional, dedup)" in labels


@pytest.mark.parametrize(
  "store, grid, settings",
  [
    ("tails", ("autoregressive", "kseq", "specinfer"),
     dict(adaptive=0.5, temperature=0.8, top_k=5, layer_stack="unroll")),
    ("tree", ("rrs", "traversal"),
     dict(drafting="wor", dedup=True, node_budget=3.0, stop_at_eos=True)),
  ],
)  # fmt: skip
def test_a_results_store_written_before_the_template_is_resumed_not_redone(
  tmp_path, monkeypatch, store, grid, settings
):
  """tests/data/store_before_plan: two sweeps stored by the code before the sweep's
  `DecodeSpec` template (issue 49), when its settings were a `decoding` block. The same
  sweeps written the new way find every cell stored and decode nothing, and the config
  each run recorded (its old `decoding` block) still loads, to the same cells."""
  stored = pathlib.Path(__file__).parents[1] / "data" / "store_before_plan" / store
  config = sweep_config(tmp_path, methods=grid, shard=False, num_drafts=(2,), draft_lens=(2,))
  config = config.replace(seeds=(0,), num_prompts=2, max_new_tokens=4, **settings)
  config.results_path.mkdir(parents=True)
  shutil.copy(stored / results.RESULTS_FILE, config.results_path)

  def decode(*args, **kwargs):
    raise AssertionError("a stored cell was decoded again")

  monkeypatch.setattr(engine, "generate", decode)
  records = experiment.run_sweep(config, random_pair())
  assert len(records) == len(grid)
  (provenance,) = results.read_jsonl(stored / results.PROVENANCE_FILE)
  assert "decoding" in provenance["config"] and "decode" not in provenance["config"]
  with pytest.warns(DeprecationWarning, match="decoding is deprecated"):
    old = SweepConfig.from_dict(provenance["config"])
  pair = records[0]["cell"]["pair"]
  assert [c.key for c in experiment.expand(old, pair)] == [r["key"] for r in records]
