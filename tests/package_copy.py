"""A copy of the package with one module added and its entry appended to a registry, and commands
run from that copy: how tests/test_method_registry.py and tests/test_scheme_registry.py show
that a sync method, or a compression scheme, is one file and one registry entry."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import PYTHON, ROOT
from hvd_cifar.launch import commands


def package_copy(root: Path, module: str, text: str, registry: str, table: str, entry: str) -> Path:
    """The package copied under ``root``; ``module`` (a path inside the package, e.g.
    ``sync/toy.py``) written with ``text``; ``entry`` appended to the dict ``table`` of
    ``registry`` (e.g. ``core/methods.py``, ``METHODS: dict[str, Method]``). Returns ``root``."""
    shutil.copytree(ROOT / "hvd_cifar", root / "hvd_cifar", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "hvd_cifar" / module).write_text(text)
    path = root / "hvd_cifar" / registry
    source = path.read_text()
    end = source.index("\n}\n", source.index(f"{table} = {{"))
    path.write_text(source[:end + 1] + entry + source[end + 1:])
    return root


def run(copy: Path, argv: list[str], np: int = 1, launcher: str = "single") -> subprocess.CompletedProcess:
    """``argv`` (a module and its arguments) from the copy: its folder first on the path."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    program = commands.argv(launcher, np, [PYTHON, "-m", *argv[:1]]) + argv[1:]
    return subprocess.run(program, cwd=copy, env=env, text=True, capture_output=True, timeout=300)


def registry_seen(copy: Path, module: str, table: str) -> str:
    """What the copy's ``module`` (dotted) is, and its ``table``'s names, as a process run there sees them."""
    out = subprocess.run([PYTHON, "-c", f"import {module} as r; print(r.__file__, list(r.{table}))"],
                         cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy)), text=True, capture_output=True)
    return out.stdout + out.stderr
