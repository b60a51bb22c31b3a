"""The entry points' command line: absl flag parsing with clear errors for config overrides."""

import importlib.util
import sys
from collections.abc import Sequence

import ml_collections

__all__ = ["parse_flags"]


def _config_file(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of a `--config PATH[:ARG]` value (as ml_collections loads it)."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_config_file", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(*([arg] if arg else []))


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing for the entry points (`app.run(main, flags_parser=parse_flags)`),
  with a clear error for an override of a field the config does not have
  (`--config.decoding.foo=1`, which ml_collections reports as AttributeError: "'foo'").

  Returns:
    The arguments left after the flags (as `flags.FLAGS(argv)`).
  """
  from absl import flags  # the entry points' parser (absl is not needed to build configs)

  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    args = [a.partition("=") for a in argv[1:]]
    files = {  # --config=FILE or --config FILE
      name[2:]: value if eq else (argv[i + 2] if i + 2 < len(argv) else "")
      for i, (name, eq, value) in enumerate(args)
      if name.startswith("--") and "." not in name
    }
    for name, _, _ in args:
      flag, _, path = name[2:].partition(".")
      if not path or flag not in files:
        continue
      node, where = _config_file(files[flag]), f"--{flag}"
      for key in path.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or key not in node:
          fields = ", ".join(sorted(node)) if isinstance(node, ml_collections.ConfigDict) else ""
          sys.exit(f"{name}: {where} has no field {key!r}" + (f" ({fields})" if fields else ""))
        node, where = node[key], f"{where}.{key}"
    raise error
