"""The import structure: layer edges, no cross-module private names.

Parses the imports of every library module, entry point (experiments/, scripts/) and
config with `ast` (nothing is imported). tests/ are not checked: a test may use the
privates of the module it tests.
"""

import ast
import pathlib

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]
_PACKAGE = "spectr_jax"

# Library modules from the bottom up; a module imports only modules before it. The
# packages data/ and models/ count as one module each.
ORDER = (
  "tables",
  "checks",
  "sampling",
  "sharding",
  "metrics",
  "timing",
  "hlo",
  "programs",
  "targets",
  "loops",
  "verdict",
  "acceptance",
  "adaptive",
  "optimal",
  "block",
  "traversal",
  "block_bound",
  "verify",
  "drafting",
  "methods",
  "tree",
  "models",
  "data",
  "schema",
  "lengths",
  "decode_spec",
  "scoring",
  "plan",
  "config",
  "memory",
  "rounds",
  "engine",
  "dryrun",
  "train_config",
  "pair_config",
  "sweep_config",
  "cli",
  "locks",
  "results",
  "runs",
  "distill",
  "train",
  "pairs",
  "experiment",
  "analysis",
  "evaluate",
  "report",
  "testing",
)
# The core (up to the engine) never imports storage, the runner or reporting; the config
# boundary sits below the engine (it validates with the method registry); the report
# reads the results store only (and the latency model, the registry and the table writer).
CORE = set(ORDER[: ORDER.index("engine") + 1])
ONLY = {
  "report": {"results", "metrics", "methods", "tables"},
  "results": {"sweep_config"},
  "metrics": set(),
  # The registry holds the verifiers' and schemes' functions themselves.
  "methods": {
    "acceptance",
    "block",
    "checks",
    "drafting",
    "optimal",
    "traversal",
    "verdict",
    "verify",
  },
}


def _files():
  for folder in (_PACKAGE, "experiments", "scripts", "configs"):
    yield from sorted((_REPO / folder).rglob("*.py"))


def _unit(path: pathlib.Path) -> str:
  """The module a file belongs to: spectr_jax.<name> (a subpackage counts as one)."""
  parts = path.relative_to(_REPO).with_suffix("").parts
  if parts[0] != _PACKAGE:
    return ".".join(parts)
  return ".".join(parts[:2]) if len(parts) > 1 and parts[1] != "__init__" else _PACKAGE


def _target(name: str) -> str | None:
  """The library module of a dotted import name (None outside the package)."""
  parts = name.split(".")
  if parts[0] != _PACKAGE:
    return None
  return ".".join(parts[:2]) if len(parts) > 1 else _PACKAGE


def _is_module(name: str) -> bool:
  path = _REPO / _PACKAGE / name
  return path.with_suffix(".py").is_file() or path.is_dir()


def _imports(path: pathlib.Path):
  """(module imported, private name or None) for each import and private attribute use."""
  tree = ast.parse(path.read_text())
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if (target := _target(alias.name)) is not None:
          aliases[alias.asname or alias.name] = target
          yield target, None
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      target = _target(node.module)
      if target is None:
        continue
      for alias in node.names:
        if target == _PACKAGE and _is_module(alias.name):
          aliases[alias.asname or alias.name] = f"{_PACKAGE}.{alias.name}"
          yield f"{_PACKAGE}.{alias.name}", None
        else:
          yield target, alias.name if alias.name.startswith("_") else None
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in aliases
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
    ):
      yield aliases[node.value.id], node.attr


def _edges():
  for path in _files():
    source = _unit(path)
    for target, private in _imports(path):
      if target != source:
        yield path, source, target, private


def test_every_library_module_has_a_layer():
  units = {_unit(p) for p in (_REPO / _PACKAGE).rglob("*.py")} - {_PACKAGE}
  assert units == {f"{_PACKAGE}.{name}" for name in ORDER}


@pytest.mark.parametrize("path,source,target", [e[:3] for e in _edges() if e[3] is None])
def test_imports_follow_the_layers(path, source, target):
  if not source.startswith(f"{_PACKAGE}."):
    return  # Entry points and configs may import any library module.
  name, imported = source.split(".")[1], target.split(".")[1]
  assert ORDER.index(imported) < ORDER.index(name), f"{path}: {name} imports {imported} (upward)"
  if name in CORE:
    assert imported in CORE, f"{path}: the core module {name} imports {imported}"
  if name in ONLY:
    assert imported in ONLY[name], f"{path}: {name} may import only {sorted(ONLY[name])}"


def test_no_cross_module_private_imports():
  found = {(source, target, private) for _, source, target, private in _edges() if private}
  assert not found, sorted(found)


def test_the_checker_sees_private_imports(tmp_path, monkeypatch):
  bad = tmp_path / "bad.py"
  bad.write_text(
    "from spectr_jax import engine\nfrom spectr_jax.verify import _walk\n"
    "import spectr_jax.rounds as r\nengine._compiled(1)\nr._Emitted\n"
  )
  assert {(t, p) for t, p in _imports(bad) if p} == {
    ("spectr_jax.verify", "_walk"),
    ("spectr_jax.engine", "_compiled"),
    ("spectr_jax.rounds", "_Emitted"),
  }


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: str(p.relative_to(_REPO)))
def test_nothing_outside_the_tests_imports_them(path):
  """The library, scripts, experiments and configs import nothing from tests/ (references
  a script needs live in `spectr_jax.testing`)."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      assert node.module.split(".")[0] != "tests", f"{path}: from {node.module} import"
    elif isinstance(node, ast.Import):
      assert all(a.name.split(".")[0] != "tests" for a in node.names), path
