"""Check the house rules of a package: rooms small enough to read, imports one way.

    python scripts/check_house.py hvd_cifar --never testbed   # exit 1 if any rule is broken
    python scripts/check_house.py --max-lines 40 hvd_cifar/report.py

Each problem is one line. The rules, with their limits (flags change them):
  * a function is at most 60 lines (from its `def` line, decorators excluded, to its last line;
    docstring and comments included; a nested function counts towards the one around it and is
    also checked on its own);
  * a class is at most 150 lines, a file at most 450;
  * the package's modules import each other without circles. Every import counts, an import
    inside a function too: one placed there to dodge a circle is still a circle;
  * layers: a sub-package whose docstring has a line ``May import: A, B`` imports, from the rest
    of the package, only A and B (``May import: nothing ...``: none); a module at the package's
    top (a command) may import any of it;
  * the ground floor, a sub-package whose docstring says it ``imports no torch``, imports none of
    NO_TORCH_IMPORTS, and no module of the package imports another top-level package named in
    ``--never`` (the test bench: it imports the product, never the other way round).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

MAX_LINES = 60          # per function
MAX_CLASS_LINES = 150
MAX_FILE_LINES = 450
NO_TORCH_IMPORTS = ("torch", "torchvision", "horovod")


def long_functions(path: Path, max_lines: int = MAX_LINES,
                   max_class_lines: int = MAX_CLASS_LINES) -> list[tuple[str, int, str, int, int]]:
    """(file, line, qualified name, length, limit) of each function or class in `path` longer
    than its limit."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                limit = max_class_lines if isinstance(child, ast.ClassDef) else max_lines
                if length > limit:
                    found.append((str(path), child.lineno, name, length, limit))
                visit(child, name + ".")
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


def module_name(path: Path, package_root: Path) -> str:
    parts = path.relative_to(package_root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that the module `name` (file `path`) imports anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def import_circles(package_root: Path) -> list[list[str]]:
    """Each circle of imports among the package's modules once, as the list of its modules."""
    files = {module_name(f, package_root): f for f in sorted(package_root.rglob("*.py"))}
    graph = {name: imported_modules(f, name, set(files)) for name, f in files.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def strongly_connected(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongly_connected(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            strongly_connected(v)
    return circles


def all_imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def allowed_imports(init: Path) -> list[str] | None:
    """The sub-packages a package's ``May import:`` line names ([] for "nothing"), or None when
    its docstring has no such line."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    for line in doc.splitlines():
        if line.startswith("May import:"):
            rest = line.removeprefix("May import:").strip().rstrip(".")
            return [] if rest.startswith("nothing") else [name.strip() for name in rest.split(",")]
    return None


def layer_problems(package_root: Path, never: list[str]) -> list[str]:
    """Imports that break a sub-package's ``May import:`` line, the ground floor's No torch, or
    reach into a package named in ``never``."""
    found, top = [], package_root.name
    for path in sorted(package_root.rglob("*.py")):
        parts = path.relative_to(package_root).parts
        own = f"{top}.{parts[0]}" if len(parts) > 1 else None
        init = package_root / parts[0] / "__init__.py" if own else None
        allowed = allowed_imports(init) if init and init.is_file() else None
        doc = ast.get_docstring(ast.parse(init.read_text())) or "" if init and init.is_file() else ""
        for line, name in all_imports(path):
            root = name.split(".")[0]
            if root in never:
                found.append(f"{path}:{line}: imports {name.rsplit('.', 1)[0]} ({root} is never imported by {top})")
            elif "imports no torch" in doc and root in NO_TORCH_IMPORTS:
                found.append(f"{path}:{line}: imports {root} ({own} loads no torch)")
            elif allowed is not None and root == top and name.count(".") >= 2:
                target = ".".join(name.split(".")[:2])
                # An entry names a sub-package, or one module of it (the rest of it stays out).
                named = any(name == entry or name.startswith(entry + ".") for entry in allowed)
                if target != own and (package_root / target.split(".")[1]).is_dir() and not named:
                    found.append(f"{path}:{line}: imports {target} ({own} may import: "
                                 f"{', '.join(allowed) or 'nothing of ' + top})")
    return found


def problems(paths: list[str], max_lines: int, max_class_lines: int, max_file_lines: int,
             never: list[str] = ()) -> list[str]:
    lines = []
    for path in python_files(paths):
        for file, line, name, length, limit in long_functions(path, max_lines, max_class_lines):
            lines.append(f"{file}:{line}: {name} is {length} lines (limit {limit})")
        length = len(path.read_text().splitlines())
        if length > max_file_lines:
            lines.append(f"{path}: {length} lines (limit {max_file_lines})")
    for name in paths:
        path = Path(name)
        if (path / "__init__.py").is_file():
            for circle in import_circles(path):
                lines.append(f"{path}: import circle: {' -> '.join(circle + circle[:1])}")
            lines.extend(layer_problems(path, list(never)))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="Python files or folders (a package folder is also checked for import circles)")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES, help="per function")
    parser.add_argument("--max-class-lines", type=int, default=MAX_CLASS_LINES)
    parser.add_argument("--max-file-lines", type=int, default=MAX_FILE_LINES)
    parser.add_argument("--never", nargs="*", default=[], metavar="PACKAGE",
                        help="top-level packages the checked package must never import (the test bench)")
    args = parser.parse_args(argv)
    found = problems(args.paths, args.max_lines, args.max_class_lines, args.max_file_lines, args.never)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
