"""Test configuration: 8 fake CPU devices, the slow marker and the false-alarm budget."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import pytest  # noqa: E402

from tests import stats  # noqa: E402


def pytest_addoption(parser):
  parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
  if config.getoption("--runslow"):
    return
  skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
  for item in items:
    if "slow" in item.keywords:
      item.add_marker(skip_slow)


def pytest_sessionfinish(session, exitstatus):
  """Fails the run if more hypothesis tests ran than the Bonferroni budget allows."""
  if stats.tests_run() > stats.MAX_TESTS:
    session.exitstatus = 1
    print(
      f"\nstats: {stats.tests_run()} chi-square tests exceed the budget of {stats.MAX_TESTS}; "
      "raise MAX_TESTS (and so lower ALPHA) in tests/stats.py"
    )
