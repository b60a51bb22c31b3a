"""Two processes x 4 CPU devices joined by jax.distributed: decoding, a sweep, a killed peer.

Each launch (`tests.multiprocess.launch`) starts 2 worker processes
(`tests.multiprocess_worker`); the tests compare what they wrote with this process's own
results (one process, one device). One launch serves the decoding and sweep checks; all
launches share a compilation cache, so the killed and resumed sweeps compile nothing.
"""

import numpy as np
import pytest

from spectr_jax import experiment, results
from tests import multiprocess, multiprocess_worker
from tests.test_experiment import random_pair

pytestmark = pytest.mark.slow

# Seconds a launch may take (compiling on 2 busy CPU cores included) before it is killed.
LAUNCH_TIMEOUT = 420
# Seconds the surviving process may take to exit after its peer is killed: the heartbeat
# timeout of `sharding.maybe_initialize_distributed` (30 s) and a margin.
DETECTION_LIMIT = 60
# The fields of a sweep record that do not depend on the devices or the time taken.
DECODED = (
  "key",
  "cell",
  "emitted",
  "rounds",
  "draft_calls",
  "tokens_per_round",
  "reached",
  "hits",
  "accepted",
  "survivors",
  "nonfinite",
  "block_efficiency",
)


def _launch(out, *args):
  """Launches the workers on `out` with the module's compilation cache; their exits."""
  cache = out.parent / "compilation_cache"
  return multiprocess.launch(
    [*args, "--out", str(out), "--compilation-cache", str(cache)], timeout=LAUNCH_TIMEOUT
  )


def _assert_ok(finished):
  assert all(f.returncode == 0 for f in finished), multiprocess.describe(finished)


def _records(out):
  return list(results.read_jsonl(out / "results" / results.RESULTS_FILE))


def _ran(out, process):
  path = out / f"sweep-{process}.txt"
  return path.read_text().split() if path.exists() else []


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
  """The folder of one launch running the "generate" and "sweep" checks, both ok."""
  out = tmp_path_factory.mktemp("multiprocess") / "first"
  out.mkdir()
  _assert_ok(_launch(out, "generate", "sweep"))
  return out


def test_generate_across_processes_matches_one_process(launched):
  expected = multiprocess_worker.decode(mesh=None)
  for process in (0, 1):
    with np.load(launched / f"generate-{process}.npz") as saved:
      for data, model in multiprocess_worker.MESHES:
        for name, value in expected.items():
          np.testing.assert_array_equal(
            saved[f"{data}x{model}/{name}"], value, err_msg=f"{name}, mesh ({data}, {model})"
          )


def test_sweep_across_processes_writes_each_cell_once(launched, tmp_path):
  config = multiprocess_worker.sweep(tmp_path, shard=False)
  local = experiment.run_sweep(config, random_pair())
  split = _records(launched)
  assert [r["num_devices"] for r in split] == [8] * len(local)
  assert [{f: r[f] for f in DECODED} for r in split] == [{f: r[f] for f in DECODED} for r in local]
  keys = [r["key"] for r in split]
  assert _ran(launched, 0) == _ran(launched, 1) == keys  # every process ran every cell
  provenance = results.read_jsonl(launched / "results" / results.PROVENANCE_FILE)
  assert len(list(provenance)) == 1  # process 0 alone writes


def test_killed_process_stops_the_other_and_a_relaunch_resumes(launched):
  out = launched.parent / "killed"
  killed = _launch(out, "sweep", "--kill-at-cell", "1")
  survivor, victim = killed
  detection = survivor.seconds - victim.seconds
  print(f"process 0 exited {detection:.1f} s after process 1 was killed")
  assert victim.returncode == -9, multiprocess.describe(killed)
  assert survivor.returncode != 0 and not survivor.timed_out, multiprocess.describe(killed)
  assert 0 < detection < DETECTION_LIMIT, multiprocess.describe(killed)
  before = _records(out)
  total = len(experiment.expand(multiprocess_worker.sweep(out), random_pair().fingerprint))
  assert len(before) == 1 < total and _ran(out, 0) == [before[0]["key"]]

  _assert_ok(_launch(out, "sweep"))
  after = _records(out)
  keys = [r["key"] for r in after]
  assert after[:1] == before and len(keys) == len(set(keys)) == total
  assert _ran(out, 0)[1:] == keys[1:]  # the relaunch ran the cells left, and only those
  runs = [r["run"] for r in results.read_jsonl(out / "results" / results.PROVENANCE_FILE)]
  assert len(runs) == 2 and {r["run"] for r in after} == set(runs)
