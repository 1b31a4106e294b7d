"""No function in the package is longer than about a screen (60 lines): scripts/check_function_length.py
over all of hvd_cifar/, and the checker itself on functions either side of the limit."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

CHECKER = ROOT / "scripts" / "check_function_length.py"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_no_function_in_the_package_is_longer_than_60_lines():
    proc = check("hvd_cifar")
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_the_checker_names_a_long_function_and_passes_a_short_one(tmp_path):
    def body(indent: int) -> str:  # 59 lines: with its def line, a function of 60
        return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(59))
    (tmp_path / "mod.py").write_text(
        f"def short():\n{body(4)}\n\n"
        f"class Holder:\n    def long(self):\n{body(8)}        return 1\n\n"  # 61 lines
        f"def outer():\n    def inner():\n{body(8)}    return inner\n")      # inner 60, outer 62
    proc = check(str(tmp_path))
    assert proc.returncode == 1
    found = sorted(line.split(": ", 1)[1] for line in proc.stdout.splitlines())
    assert found == ["Holder.long is 61 lines (limit 60)", "outer is 62 lines (limit 60)"], proc.stdout
