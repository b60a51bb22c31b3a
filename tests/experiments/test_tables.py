"""spectr_jax.tables: the one markdown table writer."""

from spectr_jax import tables


def test_columns_formats_and_missing_cells():
  rows = [{"a": 1, "b": 0.5, "c": "x"}, {"a": 2, "b": None}]
  columns = [("a", "A", "{}"), ("b", "B", "{:.2f}"), ("c", "C", lambda v: v.upper())]
  assert tables.markdown(rows, columns) == "\n".join(
    ["| A | B | C |", "|---|---|---|", "| 1 | 0.50 | X |", "| 2 | - | - |"]
  )


def test_default_columns_are_the_keys_in_first_seen_order():
  text = tables.markdown([{"x": 1}, {"y": 2.5, "x": 3}])
  assert text.splitlines() == ["| x | y |", "|---|---|", "| 1 | - |", "| 3 | 2.5 |"]


def test_no_rows_is_the_header_alone():
  assert tables.markdown([], [("k", "K", "{}")]) == "| K |\n|---|"
  assert tables.cell(None) == "-" and tables.cell(3, "{:03d}") == "003"
