"""A run folder (or report folder) that cannot be written: no space left, read-only, no
permission. Each write fails as one line naming the file and the OS's reason; the file as it
was stays (the last checkpoint still loads); no temp file is left behind; a training job ends,
non-zero, seconds after its one line. The full and read-only file systems are real: a small
tmpfs mounted for the test (root only; unmounted after it)."""
import errno
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, ROOT
from hvd_cifar.runfolder import checkpoint, writer
from test_stopping import MPIRUN_SH, HOROVODRUN_SH, alive, job_tree, start, stop_leftovers

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
CHECKPOINT_BYTES = 780_000  # the tiny config's checkpoint (smallcnn, weights + momentum) is ~774 kB
ERROR = re.compile(r"^(\[[\d,]+\]<stderr>:)?hvd_cifar: error: ")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size_kb) -> a fresh tmpfs of that size under tmp_path; read_only(path) remounts it."""
    mounted = []

    def mount(size_kb: int) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield mount
    for point in mounted:  # lazily if a failed test left a file open there: detached now, freed when closed
        if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(point)], check=True)


def read_only(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Take every free byte of the file system that holds ``folder`` but ``leave`` pages (of
    4 kB, tmpfs's unit; written unbuffered, so nothing else is left over)."""
    (folder / "spare").write_bytes(b"\0" * 4096 * leave)
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    (folder / "spare").unlink()


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- the writers
@AS_ROOT
def test_a_checkpoint_that_does_not_fit_keeps_the_last_one(tmpfs):
    """torch.save reports a full disk as RuntimeError('[enforce fail at inline_container.cc...');
    the line must still say which file and why, and the previous checkpoint must load."""
    folder = tmpfs(1200)
    checkpoint.save_checkpoint(str(folder), {"epoch": 1, "w": torch.zeros(150_000)})
    with pytest.raises(writer.RunError) as caught:
        checkpoint.save_checkpoint(str(folder), {"epoch": 2, "w": torch.ones(250_000)})
    assert str(caught.value) == f"cannot write {folder}/checkpoint_last.pt (No space left on device, ENOSPC)"
    assert temp_files(folder) == []
    assert torch.load(folder / "checkpoint_last.pt", weights_only=True)["epoch"] == 1


@AS_ROOT
def test_the_os_error_is_found_when_the_writer_reports_another(tmpfs):
    """A writer that, like torch.save's C++ side, turns a failed write into a RuntimeError of
    its own that carries no OSError: the line still gives the OS's reason."""
    folder = tmpfs(64)
    fill(folder)

    def torch_like(f):
        failed = False
        try:
            f.write(b"x" * 100_000)
        except OSError:
            failed = True
        if failed:  # raised outside the handler: no __context__ leads back to the OSError
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    with pytest.raises(writer.RunError, match=re.escape(f"cannot write {folder}/x.pt (No space left on device, "
                                                        f"ENOSPC)")):
        writer.atomic_write(str(folder / "x.pt"), torch_like)


@AS_ROOT
def test_json_yaml_and_metrics_on_a_full_disk(tmpfs):
    folder = tmpfs(64)
    writer.write_json(str(folder / "meta.json"), {"first": True})
    writer.append_metrics(str(folder), {"epoch": 0})
    fill(folder, leave=1)  # room for part of each write below: they fail part-way
    for write, name in ((lambda: writer.write_json(str(folder / "meta.json"), {"x": "y" * 10_000}), "meta.json"),
                        (lambda: writer.write_text(str(folder / "config.yaml"), "a: 1\n" * 2_000), "config.yaml"),
                        (lambda: writer.append_metrics(str(folder), {"epoch": 1, "x": "y" * 10_000}), "metrics.jsonl")):
        with pytest.raises(writer.RunError, match=re.escape(f"cannot write {folder}/{name} (No space left "
                                                            f"on device, ENOSPC)")):
            write()
    assert temp_files(folder) == [] and not (folder / "config.yaml").exists()
    assert (folder / "meta.json").read_text() == '{\n  "first": true\n}\n'
    assert (folder / "metrics.jsonl").read_text() == '{"epoch": 0}\n'  # no torn second line


@AS_ROOT
def test_a_read_only_file_system(tmpfs):
    folder = tmpfs(2048)
    checkpoint.save_checkpoint(str(folder), {"epoch": 1})
    read_only(folder)
    for write, name in ((lambda: checkpoint.save_checkpoint(str(folder), {"epoch": 2}), "checkpoint_last.pt"),
                        (lambda: writer.append_metrics(str(folder), {"epoch": 2}), "metrics.jsonl"),
                        (lambda: writer.RankLog(str(folder), 0, echo=False), "rank0.log")):
        with pytest.raises(writer.RunError, match=re.escape(f"cannot write {folder}/{name} (Read-only file "
                                                            f"system, EROFS)")):
            write()
    assert torch.load(folder / "checkpoint_last.pt", weights_only=True)["epoch"] == 1


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_no_permission():
    """Root may write anywhere, so the writer runs as user nobody, in a folder that nobody may
    enter and read but only root may write (in /tmp: pytest's own folders are closed to others)."""
    folder = tempfile.mkdtemp(prefix="hvd_cifar-readonly-")
    os.chmod(folder, 0o755)
    code = ("import sys; from hvd_cifar.runfolder import writer\n"
            "try: writer.write_json(sys.argv[1] + '/meta.json', {})\n"
            "except writer.RunError as exc: print(exc)\n")
    try:
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PYTHON, "-c", code,
                               folder], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert os.listdir(folder) == []
    finally:
        os.rmdir(folder)
    assert proc.stdout == f"cannot write {folder}/meta.json (Permission denied, EACCES)\n", proc.stderr[-2000:]


@AS_ROOT
def test_a_rank_log_that_cannot_be_written_is_one_warning_and_the_run_goes_on(tmpfs, capsys):
    folder = tmpfs(64)
    log = writer.RankLog(str(folder), 1, echo=True)
    log("first")
    fill(folder)
    log("x" * 10_000)
    log("third")
    log.close()
    out, err = capsys.readouterr()
    assert out == "first\n" + "x" * 10_000 + "\nthird\n"  # rank 0's lines still print
    assert err == (f"hvd_cifar: warning: rank 1: cannot write {folder}/rank1.log (No space left on device, "
                   f"ENOSPC); its log stops here\n")
    assert (folder / "rank1.log").read_text().endswith("[rank 1] first\n")


def test_a_write_error_keeps_the_writers_own_bugs_as_they_are(tmp_path):
    """Only OS errors become one line; a writer's own bug keeps its exception (and traceback)."""
    def broken_writer(f):
        raise RuntimeError("not about files")

    with pytest.raises(TypeError):
        writer.atomic_write(str(tmp_path / "x"), lambda f: f.write("text, not bytes"))
    with pytest.raises(RuntimeError, match="not about files") as caught:
        writer.atomic_write(str(tmp_path / "x"), broken_writer)
    assert not isinstance(caught.value, writer.RunError)
    assert list(tmp_path.iterdir()) == []


@AS_ROOT
def test_a_report_on_a_full_disk_is_one_line(tmpfs, tiny_run):
    out = tmpfs(100)  # room for some of the five figures, not all
    proc = subprocess.run([PYTHON, "-m", "hvd_cifar.report", str(tiny_run().run), "--out", str(out / "report")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert re.fullmatch(rf"hvd_cifar: error: cannot write {out}/report/\w+\.png \(No space left on device, ENOSPC\)",
                        line), line
    assert temp_files(out / "report") == []


# ----------------------------------------------------------------------------- real jobs
def end_of_job(job, tree, stderr: Path, bound_s: float) -> tuple[list[str], float]:
    """Wait for the job to end by itself; its stderr lines, and the seconds from our first
    error line to the end of the last process (failing after ``bound_s``)."""
    error_at, deadline = None, time.monotonic() + 600
    while job.poll() is None or alive(tree):
        if error_at is None and "hvd_cifar: error:" in stderr.read_text():
            error_at = time.monotonic()
        assert error_at is None or time.monotonic() - error_at <= bound_s, f"still running {bound_s} s after the error"
        assert time.monotonic() < deadline, "the job never failed"
        time.sleep(0.2)
    took = time.monotonic() - (error_at or time.monotonic())
    return stderr.read_text().splitlines(), took


def assert_one_line(lines: list[str], expected: str) -> None:
    """One error line, ours, as expected; no traceback. Other ranks may only say that they
    stopped because another did (train.main's line for a rank whose collective lost its peer),
    or that their own log file could not be written either."""
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [ERROR.sub("", line) for line in lines if ERROR.match(line)]
    assert errors == [expected], "\n".join(lines)
    others = [line for line in lines if "hvd_cifar" in line and not ERROR.match(line)]
    assert all("stopped: another rank failed or left" in line or
               re.search(r"hvd_cifar: warning: rank \d+: cannot write .*rank\d+\.log", line) for line in others), others


@pytest.mark.slow
@AS_ROOT
@pytest.mark.parametrize("launcher", ["mpirun.sh", "horovodrun.sh --gloo"])
def test_a_full_disk_in_the_training_loop_ends_the_job_in_one_line(tmpfs, launcher):
    """Rank 0's second checkpoint does not fit beside the first (temp file + rename needs room
    for both): the job ends soon after one line, and the first checkpoint still loads."""
    work = tmpfs(CHECKPOINT_BYTES * 3 // 2 // 1024)
    stderr = work.parent / "stderr.txt"
    command = {"mpirun.sh": [MPIRUN_SH, "-np", "2"], "horovodrun.sh --gloo": [HOROVODRUN_SH, "-np", "2", "--gloo"]}
    job = start(command[launcher], work, stderr=stderr)
    tree = []
    try:
        tree = job_tree(job, work, stderr=stderr)
        lines, _ = end_of_job(job, tree, stderr, bound_s=30)
    finally:
        stop_leftovers(job, tree)
    assert job.returncode == 2  # every rank stopped on rank 0's error, none by a broken collective
    run = work / "run"
    assert_one_line(lines, f"cannot write {run}/checkpoint_last.pt (No space left on device, ENOSPC)")
    assert not [line for line in lines if "stopped: another rank failed" in line], lines
    assert torch.load(run / "checkpoint_last.pt", weights_only=True)["epoch"] == 1
    assert temp_files(run) == []


@pytest.mark.slow
@AS_ROOT
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_resuming_into_a_folder_that_cannot_be_written(tmpfs, tiny_run, fault):
    """--resume of a run whose folder is full (rank 0 cannot rewrite config.yaml) or read-only
    (no rank can open its log): one line, exit != 0, the checkpoint as it was."""
    work = tmpfs(4096)
    run = tiny_run().copy_to(work)  # a run of 2 epochs
    before = (run / "checkpoint_last.pt").read_bytes()
    fill(work) if fault == "full" else read_only(work)
    stderr = work.parent / "stderr.txt"
    job = start([MPIRUN_SH, "-np", "2"], work, flags=["--resume", str(run), "--epochs", "3"], stderr=stderr)
    try:
        lines, _ = end_of_job(job, [], stderr, bound_s=30)
    finally:
        stop_leftovers(job, [])
    assert job.returncode == 2
    assert not [line for line in lines if "stopped: another rank failed" in line], lines
    expected = {"full": f"cannot write {run}/config.yaml (No space left on device, ENOSPC)",
                "read-only": f"cannot write {run}/rank0.log (Read-only file system, EROFS)"}[fault]
    assert_one_line(lines, expected)
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert torch.load(run / "checkpoint_last.pt", weights_only=True)["epoch"] == 2
