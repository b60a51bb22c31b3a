"""The runnable examples run (each in its own process: they register methods, and the
registry of this process stays as the suite expects)."""

import os
import pathlib
import subprocess
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # about a minute on CPU: checks, then a 3-cell sweep that compiles
def test_new_verifier_example_runs_quick():
  """examples/new_verifier.py --quick (docs/NEW_VERIFIER.md): the naive rule fails its
  check, the chain rule passes for i.i.d. drafts and fails for drafts without
  replacement, and its sweep cell matches SpecInfer's."""
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
  }
  out = subprocess.run(
    [sys.executable, str(_ROOT / "examples" / "new_verifier.py"), "--quick"],
    cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr[-4000:]
  assert "**naive** for laws iid: FAIL" in out.stdout
  assert "**chain** for laws iid, wor: FAIL" in out.stdout
  assert "| chain (example) | 2 | 2 |" in out.stdout
