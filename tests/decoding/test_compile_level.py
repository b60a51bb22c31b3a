"""The suite's compile levels (tests/conftest.py): unmarked tests compile without most
of XLA's optimisations, those marked `numerics` or `execution_bound` with its default
build, and a module runs its optimised tests last; every test uses the classic fusion
emitters unless SPECTR_TEST_OPTIMIZED=1."""

import os

import jax
import pytest

_ran = []
_quick = os.environ.get("SPECTR_TEST_OPTIMIZED") != "1"


def _quick_compiles():
  return jax.config.values["jax_disable_most_optimizations"]


@pytest.mark.numerics
def test_numerics_tests_compile_optimised(request):
  _ran.append("numerics")
  assert not _quick_compiles()
  selected = {item.name for item in request.session.items}
  if _quick and "test_unmarked_tests_compile_quickly" in selected:  # moved after it
    assert _ran == ["unmarked", "numerics"]


def test_unmarked_tests_compile_quickly():
  _ran.append("unmarked")
  assert _quick_compiles() == _quick
  assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == str(int(_quick))  # subprocesses


@pytest.mark.execution_bound
def test_execution_bound_tests_compile_optimised():
  assert not _quick_compiles()


def test_the_suite_compiles_with_the_classic_fusion_emitters():
  """XLA_FLAGS (inherited by the subprocesses) picks XLA's classic CPU fusion emitters
  unless SPECTR_TEST_OPTIMIZED=1 asks for XLA's default build (tests/conftest.py)."""
  flags = os.environ["XLA_FLAGS"]
  if not _quick:
    assert "xla_cpu_use_fusion_emitters" not in flags
  elif "xla_cpu_use_fusion_emitters=false" not in flags:
    pytest.skip("this jaxlib has no classic fusion emitters: the suite compiles about 1.6x slower")
