"""What made a figure, and when its table goes stale: a run records the modules its ranks loaded
(RUN/code.json), a results file the code its jobs ran, and a block in the docs is stale only when
code they ran changed: not a module no job loaded, not a comment. On small results files made
here and a temporary copy of the modules they name; one tiny training run."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_cifar.core.methods import METHODS
from hvd_cifar.measure import results
from hvd_cifar.measure.results import Figure, Results
from hvd_cifar.runfolder import code
from testbed import jobs, render_docs

ROOT = Path(__file__).resolve().parent.parent
CONFIG, DATA, PLOTS = "hvd_cifar/core/config.py", "hvd_cifar/workload/data.py", "hvd_cifar/analysis/plots.py"
SCRIPT = "benchmarks/demo.py"


def test_a_run_records_the_modules_its_ranks_loaded(one_epoch_run):
    """RUN/code.json lists the trainer, its config and its sync method's module, each with its
    code's hash; not a module the run never imported (the report's plots)."""
    modules = json.loads((one_epoch_run.run / code.CODE_FILE).read_text())["modules"]
    sync = METHODS[json.loads((one_epoch_run.run / "meta.json").read_text())["sync"]].module
    expected = ["hvd_cifar/train.py", CONFIG, "hvd_cifar/trainer/recording.py", sync.replace(".", "/") + ".py"]
    assert all(path in modules for path in expected), sorted(modules)
    assert PLOTS not in modules and "hvd_cifar/report.py" not in modules
    assert {p: modules[p] for p in expected} == {p: code.file_hash(str(ROOT / p)) for p in expected}
    assert code.read(str(one_epoch_run.run)) == modules


def test_a_hash_ignores_comments_docstrings_and_layout_and_nothing_else():
    source = 'def f(x):\n    return x + 1\n'
    assert code.code_hash('"""A module."""\n# why\ndef f(x):  # one\n    """Adds one."""\n\n    return (x +\n 1)\n') \
        == code.code_hash(source)
    assert code.code_hash(source.replace("1", "2")) != code.code_hash(source)
    assert code.code_hash('def f():\n    """Only this."""\n') == code.code_hash('def f():\n    pass\n')


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A checkout of its own for render_docs: copies of three modules, a benchmark script and
    scripts/install.sh, committed; two results files made at that commit, whose jobs loaded
    config.py and data.py (a), config.py alone (b); neither loaded plots.py."""
    root = tmp_path / "root"
    for path in (CONFIG, DATA, PLOTS, "scripts/install.sh"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, root / path)
    (root / SCRIPT).parent.mkdir()
    (root / SCRIPT).write_text("STEPS = 8\n")
    commit = git_commit(root)  # so that the older rule, were it used, would see every change
    monkeypatch.setattr(render_docs, "ROOT", str(root))
    render_docs.changed_since.cache_clear()
    made = tmp_path / "results"
    for name, loaded in (("a", [CONFIG, DATA]), ("b", [CONFIG])):
        r = Results("demo", argparse.Namespace(results=str(made), tag=name), {"x": Figure("x")}, argv=[])
        r.add(1, "c", {"x": 1.0})
        r.data["command"][0] = SCRIPT
        r.data["commit"] = commit
        r.data["code"] = {"modules": {p: code.file_hash(str(root / p)) for p in loaded},
                          "script": {SCRIPT: code.file_hash(str(root / SCRIPT))},
                          "horovod_fixes": results.horovod_fixes(str(root)), "jobs": 1, "unrecorded": []}
        (made / f"demo-{name}.json").parent.mkdir(exist_ok=True)
        (made / f"demo-{name}.json").write_text(json.dumps(r.data))
    yield root, made
    render_docs.changed_since.cache_clear()


def git_commit(root: Path) -> str:
    def git(*argv):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=root,
                              capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "measured")
    return git("rev-parse", "--short", "HEAD").strip()


DOC = "<!-- results: demo-a.json -->\n<!-- /results -->\n<!-- results: demo-b.json -->\n<!-- /results -->\n"


def stale_lines(made: Path) -> list[str]:
    """The staleness line of each block of DOC ('' where there is none), from the tree as it is now."""
    render_docs.changed_since.cache_clear()
    text = render_docs.render(DOC, str(made))
    blocks = text.split("<!-- /results -->")[:2]
    return [next((line for line in b.splitlines() if line.startswith(render_docs.STALE)), "") for b in blocks]


def edit(root: Path, path: str, old: str, new: str) -> None:
    text = (root / path).read_text()
    assert old in text
    (root / path).write_text(text.replace(old, new, 1))


def test_a_change_to_a_module_no_job_loaded_stales_no_block(tree):
    root, made = tree
    assert stale_lines(made) == ["", ""]
    (root / PLOTS).write_text((root / PLOTS).read_text() + "\nEXTRA = 1\n")
    assert stale_lines(made) == ["", ""]


def test_a_change_to_comments_and_docstrings_alone_stales_nothing(tree):
    root, made = tree
    edit(root, CONFIG, '"""', '"""Said again. ')
    (root / CONFIG).write_text("# a comment of its own\n" + (root / CONFIG).read_text().replace("\n\n\n", "\n\n\n\n"))
    assert stale_lines(made) == ["", ""]


def test_a_change_to_a_module_the_jobs_loaded_stales_each_block_that_ran_it_and_names_it(tree):
    root, made = tree
    (root / CONFIG).write_text((root / CONFIG).read_text() + "\nEXTRA = 1\n")
    a, b = stale_lines(made)
    assert "code these figures ran changed since (1 file: `hvd_cifar/core/config.py`)" in a
    assert a == b
    (root / CONFIG).write_text((ROOT / CONFIG).read_text())
    (root / DATA).unlink()  # gone: what the figures ran is not there now
    a, b = stale_lines(made)
    assert "`hvd_cifar/workload/data.py`" in a and b == ""


def test_the_benchmark_script_and_horovods_fixes_are_code_the_figures_ran(tree):
    root, made = tree
    (root / SCRIPT).write_text("STEPS = 4\n")
    edit(root, "scripts/install.sh", "HOROVOD_FIXES=", "HOROVOD_FIXES=9")
    a, b = stale_lines(made)
    assert "(2 files: `benchmarks/demo.py`, `scripts/install.sh`)" in a and a == b


def test_the_line_names_three_files_then_how_many_more():
    paths = tuple(f"hvd_cifar/m{i}.py" for i in range(5))
    assert render_docs.few(paths) == "`hvd_cifar/m0.py`, `hvd_cifar/m1.py`, `hvd_cifar/m2.py` and 2 more"
    assert render_docs.few(paths[:2]) == "`hvd_cifar/m0.py`, `hvd_cifar/m1.py`"


def test_check_prints_which_files_made_which_block_stale(tree, capsys):
    root, made = tree
    (root / DATA).write_text((root / DATA).read_text() + "\nEXTRA = 1\n")
    doc = root / "doc.md"
    doc.write_text(DOC)
    assert render_docs.main(["--check", str(doc), "--results", str(made)]) == 1
    err = capsys.readouterr().err
    assert "demo-a.json: measured before a change to `hvd_cifar/workload/data.py`" in err
    assert "demo-b.json: measured before" not in err
    doc.write_text(render_docs.render(DOC, str(made)))  # rendered: current, but still measured on older code
    assert render_docs.main(["--check", str(doc), "--results", str(made)]) == 0
    assert "demo-a.json: measured before a change to `hvd_cifar/workload/data.py`" in capsys.readouterr().err


def test_a_results_file_records_the_code_its_jobs_ran(tmp_path, monkeypatch):
    """A training job by its run folder's code.json (read again at the end: a run resumed after
    the job ended), a script by the modules it imports, a command of no program of the checkout
    by nothing, a job run elsewhere that names no run folder as not known."""
    monkeypatch.setattr(results, "_jobs", [])
    run = tmp_path / "logs" / "r"
    run.mkdir(parents=True)
    script = tmp_path / "plain.py"
    script.write_text("def main():\n    from hvd_cifar.core import units\n")
    monkeypatch.setattr(jobs, "ROOT", str(tmp_path))  # the script is in the checkout
    r = Results("demo", argparse.Namespace(results=str(tmp_path), tag="c"), {"x": Figure("x")}, argv=[])
    jobs.note_code("train", [sys.executable, "-m", "hvd_cifar.train", "--log-dir", "logs", "--run-name", "r"],
                   str(tmp_path))
    jobs.note_code("plain", [sys.executable, str(script)], str(tmp_path))
    jobs.note_code("link", ["ip", "link", "show"], str(tmp_path))
    jobs.note_code("elsewhere", lambda: None, str(tmp_path))
    (run / code.CODE_FILE).write_text(json.dumps({"modules": {"hvd_cifar/x.py": "0123"}}))
    r.add(1, "c", {"x": 1.0})
    record = json.loads(Path(r.write()).read_text())["code"]
    assert record["modules"]["hvd_cifar/x.py"] == "0123"
    assert record["modules"]["hvd_cifar/core/units.py"] == code.file_hash(str(ROOT / "hvd_cifar/core/units.py"))
    assert "hvd_cifar/measure/results.py" in record["modules"]  # this process's own
    assert record["jobs"] == 3 and record["unrecorded"] == ["elsewhere"]
    assert record["horovod_fixes"] == results.horovod_fixes() != ""


def test_jobs_whose_code_is_not_known_keep_the_older_rule(tmp_path, monkeypatch):
    """A record naming a job whose code is not known: the files changed after the commit count
    too, and the line says so by the commit."""
    monkeypatch.setattr(render_docs, "changed_since", lambda commit, script="": ("hvd_cifar/core/units.py",))
    data = {"commit": "abc1234", "command": ["benchmarks/demo.py"],
            "code": {"modules": {}, "script": {}, "horovod_fixes": results.horovod_fixes(), "jobs": 1,
                     "unrecorded": ["kill rank 0"]}}
    assert render_docs.code_changes(data) == ("hvd_cifar/core/units.py",)
    assert "changed after commit abc1234 (1 file: `hvd_cifar/core/units.py`)" in render_docs.staleness(data)
    assert render_docs.code_changes({**data, "code": {**data["code"], "unrecorded": []}}) == ()


def test_a_stale_line_says_when_its_figures_were_measured(monkeypatch):
    """The age of stale figures: the day their results file was finished, before what changed."""
    monkeypatch.setattr(code, "changed", lambda modules, root=None: ["hvd_cifar/core/units.py"])
    data = {"commit": "abc1234", "command": ["benchmarks/demo.py"], "finished_utc": "2026-11-28 09:41:14 UTC",
            "code": {"modules": {"hvd_cifar/core/units.py": "0"}, "script": {}, "horovod_fixes": results.horovod_fixes(),
                     "jobs": 1, "unrecorded": []}}
    assert render_docs.staleness(data) == (
        f"{render_docs.STALE} measured 2026-11-28; code these figures ran changed since (1 file: "
        "`hvd_cifar/core/units.py`); rerun the command above to measure the current code.")
    del data["finished_utc"]
    assert render_docs.staleness(data).startswith(f"{render_docs.STALE} code these figures ran changed since (1 file")


def test_a_program_may_import_what_its_imports_and_registries_name():
    """imports_of: imports inside functions, and modules a registry names in a string (a sync
    method's module, imported by name when a run uses it)."""
    found = code.imports_of(str(ROOT / "hvd_cifar/core/methods.py"))
    assert {m.module.replace(".", "/") + ".py" for m in METHODS.values()} <= set(found)
    assert "hvd_cifar/__init__.py" in found and "hvd_cifar/core/__init__.py" in found
    assert all(digest == code.file_hash(str(ROOT / path)) for path, digest in found.items())
    assert not any(p.startswith("hvd_cifar/analysis/") for p in code.imports_of(str(ROOT / "hvd_cifar/core/units.py")))


def test_union_marks_a_module_whose_code_differed_between_processes():
    merged = code.union([{"a.py": "1", "b.py": "2"}, {"a.py": "1", "b.py": "3", "c.py": "4"}])
    assert merged == {"a.py": "1", "b.py": code.MIXED, "c.py": "4"}
    assert code.changed({"hvd_cifar/core/units.py": code.MIXED}) == ["hvd_cifar/core/units.py"]
    assert os.path.isfile(os.path.join(code.ROOT, "hvd_cifar", "train.py"))
