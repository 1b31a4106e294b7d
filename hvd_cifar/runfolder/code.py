"""The code a run ran, so that a figure goes stale only when code that made it changed: every
module of the package its processes had loaded by the end, each by a hash of its code alone
(comments, docstrings and layout left out). Rank 0 writes the union over the ranks to
RUN/code.json at the end of the run:

    {"modules": {"hvd_cifar/core/config.py": "3f2a9c...", "hvd_cifar/train.py": "...", ...}}

    record(run_dir, sync.allgather_object, is_main)   # every rank, at the end of the run
    read(run_dir)                 # its modules, or None (a run that stopped early writes none)
    imports_of("benchmarks/bare_horovod.py")          # a program that records nothing itself
    changed({"hvd_cifar/core/config.py": "3f2a9c..."})   # the paths whose code is not that now

A resumed run adds its modules to those of the process before it; a module whose code differed
between them (or between ranks) is MIXED, which no code matches. No torch here.
"""
from __future__ import annotations

import ast
import functools
import gc
import hashlib
import json
import os
import re
import sys
from typing import Any, Callable

from hvd_cifar.core.files import write_json

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
PACKAGE = os.path.basename(PACKAGE_DIR)
ROOT = os.path.dirname(PACKAGE_DIR)  # the checkout: recorded paths are relative to it
CODE_FILE = "code.json"
MIXED = "mixed"  # a module whose code differed between the processes that recorded it
# A module named in a string (a registry's entry, imported by name when a run uses it).
MODULE_NAME = re.compile(rf"^{PACKAGE}(\.[A-Za-z_]\w*)+$")


@functools.lru_cache(maxsize=1024)
def code_hash(source: str) -> str:
    """The hash of a module's code: sha256 of its syntax tree with the docstrings taken out, so
    that comments, docstrings and layout change nothing; of the text itself when it does not
    parse."""
    # Cached by the text itself: a file read again is hashed again only when it changed. The
    # collector is held off meanwhile: in a trainer's heap (torch's objects) each collection
    # that parsing's many new nodes would start costs more than the parse.
    was_on = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse(source)
        _drop_docstrings(tree.body)
        return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]
    except (SyntaxError, ValueError):
        return "text-" + hashlib.sha256(source.encode()).hexdigest()[:16]
    finally:
        if was_on:
            gc.enable()


def _drop_docstrings(body: list, holds_one: bool = True) -> None:
    """Take the docstring out of ``body`` (where ``holds_one``: a module's, a class's, a
    function's) and out of every class and function inside it, however deep (statements only:
    no expression holds one)."""
    if holds_one and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body[:] = body[1:] or [ast.Pass()]
    for node in body:
        defines = isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                _drop_docstrings(inner, defines and field == "body")


def file_hash(path: str) -> str | None:
    """``code_hash`` of a file; None when it is gone or unreadable."""
    source = _read(path)
    return None if source is None else code_hash(source)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=1024)
def _named(source: str, package: str) -> tuple[str, ...]:
    """The package's modules a file's text names: imports (any in a function too) and module
    names in strings."""
    try:
        return tuple(sorted(_names_in(ast.parse(source), package)))
    except (SyntaxError, ValueError):
        return ()


def _package_of(path: str) -> str:
    """The dotted package a file of the checkout is in (for its relative imports)."""
    parts = os.path.relpath(os.path.dirname(path), ROOT).split(os.sep)
    return ".".join(p for p in parts if p not in (".", ""))


def _names_in(tree: ast.AST, package: str) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            names.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            names.add(node.value)
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def _files_of(name: str) -> list[str]:
    """The files importing module ``name`` runs: each package's __init__.py on the way, then the
    module's own (a name that is an attribute, not a module, adds nothing)."""
    parts, files = name.split("."), []
    for i in range(1, len(parts) + 1):
        base = os.path.join(ROOT, *parts[:i])
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                files.append(os.path.realpath(candidate))
                break
    return files


def relative(path: str) -> str:
    return os.path.relpath(os.path.realpath(path), ROOT).replace(os.sep, "/")


def _in_package(path: str) -> bool:
    return path.startswith(PACKAGE_DIR + os.sep) and path.endswith(".py")


def loaded() -> dict[str, str]:
    """This process's modules of the package now loaded (the one run with ``-m`` too): path
    relative to the checkout -> code hash."""
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and _in_package(os.path.realpath(path)):
            found[relative(path)] = file_hash(path) or MIXED
    return dict(sorted(found.items()))


def imports_of(entry: str) -> dict[str, str]:
    """What a program may run of the package, for one that records nothing itself: its file
    (a script, or a module of the package) and every module of the package it names, as an
    import or a module name in a string, and they in turn name; path -> code hash. A superset of
    what it loads."""
    seen: set[str] = set()
    todo = [os.path.realpath(entry)]
    while todo:
        path = todo.pop()
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        for name in _named(_read(path) or "", _package_of(path)):
            todo.extend(_files_of(name))
    return dict(sorted((relative(p), file_hash(p) or MIXED) for p in seen
                       if _in_package(p) or p == os.path.realpath(entry)))


def union(records: list[dict[str, str]]) -> dict[str, str]:
    """Every path any record holds; one whose hashes differ between them is MIXED."""
    merged: dict[str, str] = {}
    for record in records:
        for path, digest in record.items():
            merged[path] = digest if merged.get(path, digest) == digest else MIXED
    return dict(sorted(merged.items()))


def record(run_dir: str, allgather: Callable[[Any], list], is_main: bool) -> None:
    """Every rank at the end of a run: each rank's ``loaded()`` gathered (``allgather``: the sync
    method's allgather_object); rank 0 writes their union, with what a process before a resume
    recorded, to RUN/code.json."""
    ranks = allgather(loaded())
    if is_main:
        write_json(os.path.join(run_dir, CODE_FILE), {"modules": union([read(run_dir) or {}, *ranks])})


def read(run_dir: str) -> dict[str, str] | None:
    """The modules a run's processes loaded (RUN/code.json), or None where it recorded none."""
    try:
        with open(os.path.join(run_dir, CODE_FILE)) as f:
            modules = json.load(f)["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return modules if isinstance(modules, dict) else None


def changed(files: dict[str, str], root: str = ROOT) -> list[str]:
    """The paths (relative to ``root``) whose code now is not the recorded one, or that are gone."""
    return sorted(p for p, digest in files.items() if file_hash(os.path.join(root, p)) != digest)
