"""List the functions longer than a limit (default 60 lines, docstring and comments included).

    python scripts/check_function_length.py hvd_cifar            # exit 1 if any is longer
    python scripts/check_function_length.py --max-lines 40 hvd_cifar/report.py

A function's length runs from its `def` line (decorators excluded) to its last line; a nested
function counts towards the function around it and is also checked on its own.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

MAX_LINES = 60


def long_functions(path: Path, max_lines: int = MAX_LINES) -> list[tuple[str, int, str, int]]:
    """(file, line, qualified name, length) of each function in `path` longer than max_lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                if length > max_lines:
                    found.append((str(path), child.lineno, name, length))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def python_files(paths: list[str]) -> list[Path]:
    files = []
    for name in paths:
        path = Path(name)
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="Python files or folders")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES)
    args = parser.parse_args(argv)
    found = [hit for path in python_files(args.paths) for hit in long_functions(path, args.max_lines)]
    for file, line, name, length in found:
        print(f"{file}:{line}: {name} is {length} lines (limit {args.max_lines})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
