"""How the library reads: module sizes, long functions, registry lookups and prose.

Prints one markdown table of the figures the decoding wing's redesign is judged by
(issue 49): library modules and lines, the largest module, modules over 800 lines, the
longest functions, registry lookups by name outside the registry (calls of `methods.get`,
`methods.scheme`, `methods.get_drafting` and `methods.resolve`, and the modules holding
them), docstring lines as a share of the library's, words per docstring sentence, and
the lines of the README and docs/.

Usage: python scripts/code_stats.py [--root .]
"""

import argparse
import ast
import pathlib
import re

LOOKUPS = ("get", "scheme", "get_drafting", "resolve")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`\"])")


def _docstrings(tree: ast.AST):
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      text = ast.get_docstring(node, clean=True)
      if text:
        yield node, text


def _sentences(text: str) -> list[str]:
  """The prose sentences of a docstring: paragraphs of flowing text, not indented
  blocks (code, tables) nor argument lists' names."""
  prose = []
  for paragraph in re.split(r"\n\s*\n", text):
    lines = [line for line in paragraph.splitlines() if line and not line.startswith("  ")]
    if lines:
      prose.append(" ".join(lines))
  return [s for p in prose for s in SENTENCE_END.split(p) if len(s.split()) >= 3]


def _is_lookup(node: ast.AST) -> bool:
  """A call `methods.get(...)` (or scheme, get_drafting, resolve)."""
  return (
    isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and isinstance(node.func.value, ast.Name)
    and node.func.value.id == "methods"
    and node.func.attr in LOOKUPS
  )


def stats(root: pathlib.Path) -> dict[str, str]:
  files = sorted((root / "spectr_jax").rglob("*.py"))
  sizes, functions, lookups, lookup_files = {}, [], 0, []
  doc_lines, sentences = 0, []
  for path in files:
    text = path.read_text()
    name = str(path.relative_to(root))
    sizes[name] = len(text.splitlines())
    tree = ast.parse(text)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        functions.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))
    for _, doc in _docstrings(tree):
      doc_lines += len(doc.splitlines())
      sentences += _sentences(doc)
    if path.name != "methods.py":  # the registry's own calls of itself are not lookups
      found = sum(_is_lookup(node) for node in ast.walk(tree))
      lookups += found
      if found:
        lookup_files.append(path.stem)
  total = sum(sizes.values())
  functions.sort(reverse=True)
  biggest = max(sizes, key=sizes.get)
  words = [len(s.split()) for s in sentences]
  docs = sorted((root / "docs").glob("*.md"))
  docs_lines = sum(len(p.read_text().splitlines()) for p in docs)
  readme = len((root / "README.md").read_text().splitlines())
  return {
    "library modules (lines)": f"{len(files)} ({total})",
    "largest module": f"{biggest} ({sizes[biggest]})",
    "modules over 800 lines": ", ".join(f"{n} ({s})" for n, s in sizes.items() if s > 800)
    or "none",
    "longest functions": ", ".join(f"{n} ({s})" for s, n in functions[:3]),
    "registry lookups by name outside methods.py: calls (modules)": (
      f"{lookups} ({len(lookup_files)}: {', '.join(lookup_files)})"
    ),
    "docstring lines / library lines": f"{doc_lines} / {total} ({doc_lines / total:.0%})",
    "words per docstring sentence (sentences)": f"{sum(words) / len(words):.1f} ({len(words)})",
    "README lines": str(readme),
    "docs/ lines (files)": f"{docs_lines} ({len(docs)})",
    "docs/ + README lines": str(docs_lines + readme),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=".", help="The repository's root.")
  root = pathlib.Path(parser.parse_args().root)
  print("| figure | value |\n|---|---|")
  for name, value in stats(root).items():
    print(f"| {name} | {value} |")


if __name__ == "__main__":
  main()
