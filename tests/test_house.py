"""The house rules hold for the package (scripts/check_house.py over all of hvd_cifar/: functions
of at most 60 lines, classes of 150, files of 450, no import circles), the checker itself finds
each kind of breach, and the modules that read and tabulate runs load neither torch nor
matplotlib."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

CHECKER = ROOT / "scripts" / "check_house.py"


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_the_package_keeps_the_house_rules():
    proc = check("hvd_cifar", "--never", "testbed")
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


def test_the_checker_names_a_long_class_and_a_long_file(tmp_path):
    methods = "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(50))  # 150 lines
    (tmp_path / "fits.py").write_text(f"class Fits:\n{methods[:-1]}")                    # 151 - 1: 150
    (tmp_path / "big.py").write_text(f"class Big:\n{methods}    x = 1\n" + "y = 2\n" * 300)  # class 152, file 452
    proc = check(str(tmp_path))
    assert proc.returncode == 1
    found = sorted(line.split(": ", 1)[1] for line in proc.stdout.splitlines())
    assert found == ["452 lines (limit 450)", "Big is 152 lines (limit 150)"], proc.stdout


def test_the_checker_finds_an_import_circle_through_a_function_and_a_subpackage(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.sub.c import x  # dodging the circle\n    return x\n")
    (package / "sub" / "c.py").write_text("from .. import a\nx = 1\n")
    (package / "d.py").write_text("import pkg.a\n")  # imports into the circle, is not in it
    proc = subprocess.run([sys.executable, str(CHECKER), "pkg"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["pkg: import circle: pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"], proc.stdout


def test_reading_and_tabulating_runs_loads_no_torch_and_no_plotting():
    code = ("import sys\nimport hvd_cifar.runfolder.reader, hvd_cifar.analysis.tabulate, hvd_cifar.core.files, hvd_cifar.core.errors, hvd_cifar.analysis.scaling\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'matplotlib', 'horovod', 'mpi4py'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_checker_holds_each_layer_to_its_may_import_line(tmp_path):
    """A sub-package imports only what its docstring's ``May import:`` line names; the ground
    floor that says it imports no torch imports none; nothing imports the package given to
    --never; a top-level module (a command) may import any layer."""
    package = tmp_path / "pkg"
    layers = {"core": '"""Ground floor. It imports no torch.\n\nMay import: nothing of pkg outside core.\n"""\n',
              "mid": '"""Middle.\n\nMay import: pkg.core.\n"""\n',
              "top": '"""Top.\n\nMay import: pkg.core, pkg.mid.\n"""\n'}
    for name, doc in layers.items():
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text(doc)
    (package / "__init__.py").write_text("")
    (package / "core" / "names.py").write_text("X = 1\n")
    (package / "core" / "heavy.py").write_text("def f():\n    import torch\n    return torch\n")
    (package / "mid" / "a.py").write_text("from pkg.core.names import X\n")
    (package / "mid" / "up.py").write_text("from pkg.top import b\n")        # upward: not allowed
    (package / "top" / "b.py").write_text("from pkg.mid import a\nfrom pkg.core import names\n")
    (package / "top" / "bench.py").write_text("import bench.cluster\n")     # the test bench
    (package / "cmd.py").write_text("from pkg.top import b\nfrom pkg.core import names\n")
    proc = subprocess.run([sys.executable, str(CHECKER), "pkg", "--never", "bench"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert sorted(proc.stdout.splitlines()) == [
        "pkg/core/heavy.py:2: imports torch (pkg.core loads no torch)",
        "pkg/mid/up.py:1: imports pkg.top (pkg.mid may import: pkg.core)",
        "pkg/top/bench.py:1: imports bench (bench is never imported by pkg)",
    ], proc.stdout


def test_the_ground_floor_loads_no_torch():
    """Config, names, byte formulas and units are read by the readers, the predictor and the
    launch scripts: importing every module of hvd_cifar.core loads no torch, Horovod or MPI."""
    code = ("import sys, pkgutil, importlib, hvd_cifar.core as core\n"
            "for m in pkgutil.iter_modules(core.__path__): importlib.import_module('hvd_cifar.core.' + m.name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'horovod', 'mpi4py'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
