"""Test configuration: 8 fake CPU devices, quick compiles, the slow marker and the
false-alarm budget."""

import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  _flags += " --xla_force_host_platform_device_count=8"
# The suite compiles thousands of small programs and runs each a few times: compiling
# without most of XLA's optimisations (`jax_disable_most_optimizations`: LLVM at -O0)
# makes it about 1.5x faster on CPU. Values can differ from the optimised build in the
# last bits (other instruction choices), and programs run slower unoptimised (loops over
# large vocabularies much slower; a 50k-row engine decode 14 s against 6 s), so the tests
# marked `numerics` (float32 at LLM vocabularies) or `execution_bound` (mostly running
# programs) compile with XLA's default level: `pytest_runtest_setup` switches per test,
# and each module runs its optimised tests last. SPECTR_TEST_OPTIMIZED=1 optimises every
# program. Set in the environment, so subprocesses (the multi-process tests) inherit it.
OPTIMISED_MARKERS = ("numerics", "execution_bound")
_optimise_all = os.environ.get("SPECTR_TEST_OPTIMIZED") == "1"
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0" if _optimise_all else "1"
# XLA's CPU compiler has two code generators for fused operations: the MLIR fusion
# emitters (its default) and the classic elemental ones. The classic ones compile the
# suite's programs about 1.6x faster at either level and run them no slower (the fast
# tier 3:30 against 5:24, back to back; docs/RESULTS.md, "The test suite"), so every test uses them
# unless SPECTR_TEST_OPTIMIZED=1 asks for XLA's default CPU build throughout. They expand
# a batched scatter into a loop over its updates, which can copy its whole operand per
# update (quadratic in rows where the loop sits in a `lax.switch`): the round writes its
# tail caches by selects (`attention.write_tail`). The flag is
# probed first: XLA aborts the process on a flag it does not know, and a later jaxlib
# may drop this one.
CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flag):
  probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
  env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


if not _optimise_all and "xla_cpu_use_fusion_emitters" not in _flags:
  if _xla_accepts(CLASSIC_EMITTERS):
    _flags += " " + CLASSIC_EMITTERS
os.environ["XLA_FLAGS"] = _flags.strip()

import pytest  # noqa: E402

from tests import stats  # noqa: E402


def pytest_addoption(parser):
  parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config):
  """Keeps compiled programs in .pytest_cache (JAX's persistent compilation cache, keyed
  by the program, the XLA flags and the JAX version), so a rerun of the suite loads what
  an earlier run compiled; SPECTR_TEST_COMPILE_CACHE=0 (or -p no:cacheprovider) turns it
  off."""
  cache = getattr(config, "cache", None)
  if cache is None or os.environ.get("SPECTR_TEST_COMPILE_CACHE") == "0":
    return
  import jax

  jax.config.update("jax_compilation_cache_dir", str(cache.mkdir("jax-compiled")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


def _optimised(item):
  return _optimise_all or any(item.get_closest_marker(m) for m in OPTIMISED_MARKERS)


# The heaviest files of the whole suite (`--runslow`), in seconds of test time from a
# `--durations=0` run on this 2-core machine (docs/RESULTS.md, "The test suite"). They are
# collected first, longest first, and scripts/test.sh keeps that order for its two workers
# (`--no-loadscope-reorder`; xdist's default orders files by their number of tests, which
# started the one-test files of the trained pair and the multi-process launches last, to
# run alone at the end). Other files follow in collection order; a stale figure only
# reorders.
HEAVY_FILES = {
  "test_engine.py": 287, "test_harness.py": 174, "test_engine_law.py": 95,
  "test_multiprocess.py": 133, "test_wor.py": 133, "test_sharding.py": 133,
  "test_verify.py": 115, "test_engine_trained.py": 107, "test_profile_round.py": 86,
  "test_traversal.py": 86, "test_experiment.py": 78, "test_pretrained_pair.py": 73,
  "test_draft_tree.py": 72, "test_optimal.py": 69, "test_engine_check.py": 67,
  "test_adaptive.py": 25, "test_train.py": 49, "test_engine_memory.py": 48,
  "test_distill.py": 47, "test_locks.py": 45, "test_models.py": 41,
  "test_node_budget.py": 38, "test_accelerators.py": 105, "test_head.py": 150,
}  # fmt: skip


def pytest_collection_modifyitems(config, items):
  # The heaviest files first (HEAVY_FILES); within each module the optimised tests run
  # last (a stable sort keeps every other order), so a module switches the compile level
  # at most once.
  modules = {}
  for item in items:
    modules.setdefault(item.module, len(modules))

  def module_order(module):
    return (-HEAVY_FILES.get(os.path.basename(module.__file__), 0), modules[module])

  items.sort(key=lambda item: (module_order(item.module), _optimised(item)))
  if config.getoption("--runslow"):
    return
  skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
  for item in items:
    if "slow" in item.keywords:
      item.add_marker(skip_slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """Sets the compile level of the test (see OPTIMISED_MARKERS) before any of its fixtures
  is built. Programs compiled at the other level are dropped: JAX's in-memory caches do
  not key on it (the persistent cache does)."""
  import jax

  from spectr_jax import engine

  unoptimised = not _optimised(item)
  if jax.config.values["jax_disable_most_optimizations"] != unoptimised:
    engine.compiled_program.cache_clear()
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", unoptimised)


@pytest.fixture(scope="session")
def xla_default_build():
  """Compiler options that give one compile XLA's default CPU build (its fusion emitters)
  back, for the tests that inspect the program users get (its copies and memory)."""
  classic = CLASSIC_EMITTERS in os.environ["XLA_FLAGS"]
  return {"xla_cpu_use_fusion_emitters": True} if classic else {}


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: a whole run compiles
  thousands, and keeping them all grows the process by gigabytes."""
  yield
  import jax

  from spectr_jax import engine

  engine.compiled_program.cache_clear()
  jax.clear_caches()


# With pytest-xdist (CI runs `-n 2`) every worker counts its own chi-square tests and
# hands the count to the controller, which checks the whole session's total.
_worker_counts = []


def pytest_testnodedown(node, error):
  _worker_counts.append(node.workeroutput.get("stats_tests", 0))


def pytest_sessionfinish(session, exitstatus):
  """Fails the run if more hypothesis tests ran than the Bonferroni budget allows."""
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None:  # an xdist worker: the controller checks the total
    workeroutput["stats_tests"] = stats.tests_run()
    return
  total = stats.tests_run() + sum(_worker_counts)
  print(f"\nstats: {total} chi-square tests (budget {stats.MAX_TESTS})")
  if total > stats.MAX_TESTS:
    session.exitstatus = 1
    print(
      f"stats: {total} chi-square tests exceed the budget of {stats.MAX_TESTS}; "
      "raise MAX_TESTS (and so lower ALPHA) in tests/stats.py"
    )
