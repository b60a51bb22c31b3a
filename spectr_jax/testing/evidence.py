"""The evidence of an exactness check: one `Row` per case, and the `Report` of them (a
markdown table, and the power table: what each check detects)."""

import dataclasses
from collections.abc import Sequence

from spectr_jax.testing.power import INFORMATIVE, POWER

__all__ = ["COLUMNS", "Report", "Row"]


@dataclasses.dataclass
class Row:
  """One case of a report. `statistic`: the law's Wald statistic / df (law rows), the
  Pearson statistic / df (chi2 rows) or violations / runs (boundary rows); `pvalue`: the
  smallest p-value of the row's tests (None for deterministic checks); `tokens`: the
  mixture mean of tokens per round (± its standard error); `bound`: the law's LP bound;
  `law_error`: the total variation between the estimated and the target law (law rows;
  its sampling error is part of it)."""

  case: str
  law: str
  num_drafts: int
  draft_len: int
  vocab: int
  kind: str
  statistic: str
  pvalue: float | None = None
  tokens: float | None = None
  tokens_se: float | None = None
  bound: float | None = None
  law_error: float | None = None
  passed: bool = True
  why: str = ""
  # The smallest total variation from the target (law rows; between the binned laws for
  # chi2-32k rows) that the row's test rejects with probability POWER at the report's
  # level (`detectable_tv`); None for deterministic rows.
  detects: float | None = None
  # What `detects` was computed from: the effective draws, degrees of freedom and the
  # target mass of the pooled outcomes (a deviation inside them is not seen).
  effective_draws: float | None = None
  df: int | None = None
  pooled_mass: float = 0.0


COLUMNS = (
  "case",
  "law",
  "K",
  "L",
  "V",
  "check",
  "statistic",
  "TV",
  "detects TV >=",
  "p-value",
  "tokens/round",
  "LP bound",
  "result",
)


def _cells(row: Row) -> dict:
  tokens = "" if row.tokens is None else f"{row.tokens:.4f} ± {row.tokens_se:.4f}"
  return {
    "case": row.case,
    "law": row.law,
    "K": row.num_drafts,
    "L": row.draft_len,
    "V": row.vocab,
    "check": row.kind,
    "statistic": row.statistic,
    "TV": "" if row.law_error is None else f"{row.law_error:.2g}",
    "detects TV >=": "" if row.detects is None else f"{row.detects:.3g}",
    "p-value": "" if row.pvalue is None else f"{row.pvalue:.3g}",
    "tokens/round": tokens,
    "LP bound": "" if row.bound is None else f"{row.bound:.4f}",
    "result": "pass" if row.passed else f"FAIL: {row.why}",
  }


@dataclasses.dataclass
class Report:
  """The evidence of one `check_verifier` call.

  rows: one `Row` per case. alpha: the report's false-alarm budget; every one of its
  `num_tests` statistical tests rejects at `level` = alpha / num_tests (Bonferroni).
  """

  name: str
  laws: tuple[str, ...]
  alpha: float
  rows: list[Row]
  num_tests: int
  # "default", or "quick" (a smoke test: too few draws to be evidence of exactness).
  mode: str = "default"

  @property
  def level(self) -> float:
    return self.alpha / max(self.num_tests, 1)

  def power(self) -> dict[tuple[str, str], float]:
    """{(check, tree kind): the largest `Row.detects` of its rows}: any law at that total
    variation from the target or more fails the check with probability `POWER` (each kind
    at its worst case); a kind's "law" entry, a chi2-32k row's binned laws."""
    table: dict[tuple[str, str], float] = {}
    for row in self.rows:
      if row.detects is not None:
        key = (row.kind, row.case.split()[0] if row.kind == "law" else f"position {row.draft_len}")
        table[key] = max(table.get(key, 0.0), row.detects)
    return table

  def power_markdown(self) -> str:
    """`power` as a markdown table (check, tree kind or position, detectable TV)."""
    cells = [
      {"check": check, "tree kind": kind, "detects TV >=": f"{tv:.3g}"}
      for (check, kind), tv in sorted(self.power().items())
    ]
    return _markdown(cells, ("check", "tree kind", "detects TV >="))

  @property
  def passed(self) -> bool:
    return all(row.passed for row in self.rows)

  @property
  def failures(self) -> list[Row]:
    return [row for row in self.rows if not row.passed]

  def markdown(self) -> str:
    """The rows as a markdown table, under a line naming the verifier and the budget."""
    informative = [
      r.detects
      for r in self.rows
      if r.kind == "law" and r.case.split()[0] in INFORMATIVE
      if r.detects is not None
    ]
    power = (
      f"; its law cases detect any law at TV >= {max(informative):.3g} from the target "
      f"with probability {POWER:g}"
      if informative
      else ""
    )
    quick = (
      "QUICK MODE: a smoke test, too few draws to be evidence of exactness. "
      if self.mode == "quick"
      else ""
    )
    head = (
      f"{quick}**{self.name}** for laws {', '.join(self.laws)}: "
      f"{'PASS' if self.passed else f'FAIL ({len(self.failures)} of {len(self.rows)} cases)'}; "
      f"{self.num_tests} tests, each at alpha / {self.num_tests} = {self.level:.2g} "
      f"(Bonferroni, alpha = {self.alpha:g}){power}"
    )
    cells = [_cells(row) for row in self.rows]
    return head + "\n\n" + _markdown(cells, COLUMNS)

  def __str__(self) -> str:
    return self.markdown()


def _markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
  """The rows (text cells) as a markdown table: the project's writer
  (`spectr_jax.tables.markdown`) where it exists, else the same layout here."""
  try:
    from spectr_jax import tables
  except ImportError:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
  return tables.markdown(rows, [(c, c, "{}") for c in columns])
