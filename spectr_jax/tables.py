"""The project's one markdown table writer (reports, benchmarks, scripts, demos).

Imports nothing (the report loads without JAX).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# A column: (key of the rows, title, format). The format is a `str.format` spec ("{:.2f}")
# or a function of the value returning its text.
Column = tuple[str, str, "str | Callable[[Any], str]"]
MISSING = "-"


def cell(value: Any, fmt: "str | Callable[[Any], str]" = "{}") -> str:
  """The text of one value: "-" for None, else `fmt` applied to it."""
  if value is None:
    return MISSING
  return fmt(value) if callable(fmt) else fmt.format(value)


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] | None = None) -> str:
  """A markdown table of `rows`, one column per (key, title, format) of `columns` ("-"
  where a row has no such key or its value is None). Without `columns`, every key of the
  rows in first-seen order, titled by the key and written with `str`.

  >>> print(markdown([{"a": 1, "b": 0.5}, {"a": 2}], [("a", "A", "{}"), ("b", "B", "{:.2f}")]))
  | A | B |
  |---|---|
  | 1 | 0.50 |
  | 2 | - |
  """
  if columns is None:
    columns = [(key, key, "{}") for key in dict.fromkeys(k for row in rows for k in row)]
  lines = ["| " + " | ".join(title for _, title, _ in columns) + " |"]
  lines.append("|" + "---|" * len(columns))
  for row in rows:
    lines.append("| " + " | ".join(cell(row.get(key), fmt) for key, _, fmt in columns) + " |")
  return "\n".join(lines)
