"""Every data set file a run reads is checked before use, and a bad one ends the run with one line
naming the file. Here: the generated ``shapes`` set (its checksums, written with it; its labels),
scikit-learn's digits file, sizes beyond the machine's memory, and the temp files of a write that
was killed. Real CIFAR-10/100 batches: tests/test_data.py. Files are written in each set's own
format; the 2-rank jobs are judged by the fault drill's own criteria (testbed.drill.run_bad_input:
exit 2, no traceback, exactly one ``hvd_cifar:`` line, holding what the case expects)."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch

from conftest import ROOT
from hvd_cifar.core import files
from hvd_cifar.workload import data, shapes
from hvd_cifar.workload.data import DataError

from testbed import drill

SIZES = (1000, 200, 0)  # the small generated set every case here starts from
FOLDER = "shapes-seed0-1000-200"


def made(work: Path) -> Path:
    """The small generated set, made by the loader itself into work/data; returns its folder."""
    data.load("shapes", str(work / "data"), shapes_sizes=SIZES)
    return work / "data" / FOLDER


def batch_path(root: Path, file: str) -> Path:
    return root / "cifar-10-batches-py" / file


def flip_pixels(root: Path, file: str, image: int = 5) -> None:
    """16 bytes inside image ``image``'s pixels in ``file`` inverted, the file's size kept."""
    path = batch_path(root, file)
    raw = bytearray(path.read_bytes())
    with open(path, "rb") as f:
        pixels = pickle.load(f, encoding="latin1")["data"][image].tobytes()
    at = raw.find(pixels) + 1000
    assert raw.find(pixels) > 0
    raw[at:at + 16] = bytes(255 - b for b in raw[at:at + 16])
    path.write_bytes(bytes(raw))


def mislabel(root: Path, file: str, image: int, label: int) -> None:
    """``file`` written again with image ``image`` labelled ``label``, and its checksum in the
    set's checksums.json brought up to date: only the label itself is wrong."""
    path = batch_path(root, file)
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    batch["labels"][image] = label
    raw = pickle.dumps(batch, protocol=4)
    path.write_bytes(raw)
    manifest = json.loads((root / "checksums.json").read_text())
    manifest["files"][file] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    (root / "checksums.json").write_text(json.dumps(manifest))


def one_line(tmp_path: Path, **sizes) -> str:
    with pytest.raises(DataError) as err:
        data.load("shapes", str(tmp_path / "data"), shapes_sizes=SIZES, **sizes)
    assert "\n" not in str(err.value)
    return str(err.value)


# ----------------------------------------------------------------------------- the generated set
def test_the_set_is_written_with_the_checksums_of_its_files(tmp_path):
    root = made(tmp_path)
    manifest = json.loads((root / "checksums.json").read_text())
    assert manifest["about"] == {"dataset": "shapes", "seed": 0, "train": 1000, "test": 200,
                                 "classes": list(shapes.CLASSES)}
    folder = root / "cifar-10-batches-py"
    assert sorted(manifest["files"]) == sorted(p.name for p in folder.iterdir())
    for name, entry in manifest["files"].items():
        raw = (folder / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}


def test_flipped_pixel_bytes_are_one_line_naming_the_file(tmp_path):
    flip_pixels(made(tmp_path), "data_batch_3")
    line = one_line(tmp_path)
    assert "cifar-10-batches-py/data_batch_3 is not the file written: its checksum differs" in line, line
    assert "delete it and run again" in line


def test_a_label_outside_the_classes_is_one_line_naming_the_file(tmp_path):
    mislabel(made(tmp_path), "data_batch_4", 17, 99)
    line = one_line(tmp_path)
    assert "data_batch_4: image 17 has label 99, not one of the 10 classes (0-9)" in line, line


def test_a_damaged_manifest_is_one_line_naming_it(tmp_path):
    root = made(tmp_path)
    text = (root / "checksums.json").read_text()
    (root / "checksums.json").write_text(text[:len(text) // 2])
    assert "checksums.json is truncated or not a manifest of checksums" in one_line(tmp_path)
    manifest = json.loads(text)
    del manifest["files"]["test_batch"]
    (root / "checksums.json").write_text(json.dumps(manifest))
    assert "checksums.json does not hold a sha256 and a size for each of" in one_line(tmp_path)


def test_a_set_without_its_manifest_is_made_anew(tmp_path):
    """The manifest is written last: a folder without one (a run killed while making it) is not
    a whole set, so the next run makes it again, over whatever it finds."""
    root = made(tmp_path)
    (root / "checksums.json").unlink()
    flip_pixels(root, "test_batch")
    loaded = data.load("shapes", str(tmp_path / "data"), shapes_sizes=SIZES)
    xt, yt = shapes.generate(200, 0, "test")
    assert torch.equal(loaded.test_images, torch.from_numpy(xt)) and torch.equal(loaded.test_labels, torch.from_numpy(yt))
    assert (root / "checksums.json").exists()


# ----------------------------------------------------------------------------- svhn
def test_an_svhn_label_beyond_its_classes_is_one_line(tmp_path, monkeypatch):
    """SVHN's own files (MATLAB: X 32 x 32 x 3 x N uint8, y N x 1 labels 1-10, 10 meaning 0),
    written here, their md5 sums given to torchvision: a label 11 is one line naming the file."""
    import scipy.io
    import torchvision.datasets as tvd

    rng = np.random.default_rng(0)

    def write(train_labels: list[int]) -> None:
        split_list = {}
        for split, labels in (("train", train_labels), ("test", [2, 10, 5, 7])):
            path = tmp_path / f"{split}_32x32.mat"
            scipy.io.savemat(path, {"X": rng.integers(0, 256, (32, 32, 3, 4), dtype=np.uint8),
                                    "y": np.array(labels, dtype=np.uint8)[:, None]})
            split_list[split] = ["", path.name, hashlib.md5(path.read_bytes()).hexdigest()]
        monkeypatch.setattr(tvd.SVHN, "split_list", split_list)

    write([1, 10, 3, 9])
    assert data.load("svhn", str(tmp_path)).train_labels.tolist() == [1, 0, 3, 9]
    write([1, 10, 11, 3])
    with pytest.raises(DataError, match=r"svhn in .* is corrupt \(train_32x32.mat holds images of torch.uint8 "
                                        r"\(4, 3, 32, 32\) and 4 labels, not .* N labels 0-9\)"):
        data.load("svhn", str(tmp_path))


# ----------------------------------------------------------------------------- memory
def test_a_size_beyond_the_machines_memory_is_refused_before_anything_is_allocated(tmp_path):
    images = 10**9  # 3 KiB each: about 2.9 TiB of bare pixels
    with pytest.raises(DataError) as err:
        data.load("synthetic", "", synthetic_size=images)
    line = str(err.value)
    need, available = (float(v) for v in re.search(r"need ([\d.]+) GiB of memory, this machine has "
                                                   r"([\d.]+) GiB available; give a smaller --synthetic-size", line).groups())
    assert need >= images * 3072 / 2**30 and need > available
    assert abs(available - psutil.virtual_memory().available / 2**30) < 2.0, line


def test_every_rank_on_the_host_is_counted(tmp_path, monkeypatch):
    """On a machine with 100 MiB free, a small set fits one rank and not four, and the refusal
    comes before the set is made."""
    monkeypatch.setattr(data.psutil, "virtual_memory", lambda: SimpleNamespace(available=100 * 2**20))
    sizes = (2000, 500, 0)
    with pytest.raises(DataError) as err:
        data.load("shapes", str(tmp_path / "data"), shapes_sizes=sizes, ranks_here=4)
    assert "GiB on each of the 4 ranks on this host), this machine has 0.1 GiB available" in str(err.value)
    assert "give a smaller --shapes-train or --shapes-test" in str(err.value)
    assert not (tmp_path / "data").exists()
    assert len(data.load("shapes", str(tmp_path / "data"), shapes_sizes=sizes, ranks_here=1).train_labels) == 2000


# ----------------------------------------------------------------------------- digits
@pytest.fixture
def digits_file(tmp_path, monkeypatch):
    """A stand-in for scikit-learn's installed package, holding its digits file, which the
    test then writes (gzipped CSV: 64 pixels and a label per line)."""
    package = tmp_path / "sklearn"
    path = package / "datasets" / "data" / "digits.csv.gz"
    path.parent.mkdir(parents=True)
    monkeypatch.setattr(data.importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(package)]))
    return path


def write_digits(path: Path, pixels: np.ndarray, labels: np.ndarray) -> None:
    rows = "".join(",".join(str(v) for v in [*p, y]) + "\n" for p, y in zip(pixels.tolist(), labels.tolist()))
    with gzip.open(path, "wt") as f:
        f.write(rows)


def test_the_digits_file_is_checked(digits_file):
    rng = np.random.default_rng(0)
    pixels, labels = rng.integers(0, 17, (500, 64)), rng.integers(0, 10, 500)
    write_digits(digits_file, pixels, labels)
    assert data.load("digits", "").train_labels.tolist() != []  # a good file loads
    labels[123] = 12
    write_digits(digits_file, pixels, labels)
    with pytest.raises(DataError, match=f"{digits_file} is corrupt \\(a label is not a whole number 0-9\\)"):
        data.load("digits", "")
    pixels[7, 3] = 40
    write_digits(digits_file, pixels, np.minimum(labels, 9))
    with pytest.raises(DataError, match="a pixel is not a whole number 0-16"):
        data.load("digits", "")
    digits_file.write_bytes(gzip.compress(b"1,2,3\n")[:-6])  # cut short
    with pytest.raises(DataError, match="digits.csv.gz is corrupt"):
        data.load("digits", "")


# ----------------------------------------------------------------------------- stale temp files
def killed_mid_write(path: Path) -> Path:
    """A process whose atomic_write of ``path`` is SIGKILLed half-way; the temp file it leaves."""
    code = ("import os, signal, sys; from hvd_cifar.core.files import atomic_write\n"
            "atomic_write(sys.argv[1], lambda f: (f.write(b'x' * 4096), f.flush(), os.kill(os.getpid(), signal.SIGKILL)))")
    before = set(path.parent.iterdir())
    assert subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT).returncode == -signal.SIGKILL
    [temp] = set(path.parent.iterdir()) - before
    assert temp.name.startswith(f".{path.name}.") and temp.name.endswith(".tmp")
    return temp


def test_a_killed_runs_temp_files_are_removed_by_the_next_run(tmp_path):
    """Killed while making the set (a batch half written, no manifest yet): the next load makes
    it and leaves the folder with the set's files alone."""
    root = made(tmp_path)
    (root / "checksums.json").unlink()
    temps = [killed_mid_write(batch_path(root, "data_batch_2")), killed_mid_write(root / "checksums.json")]
    old_style = batch_path(root, ".data_batch_5.k3x9q2ab.tmp")  # an older atomic_write's name: no writer in it
    old_style.write_bytes(b"half a batch")
    data.load("shapes", str(tmp_path / "data"), shapes_sizes=SIZES)
    assert not any(t.exists() for t in [*temps, old_style])
    assert sorted(p.name for p in root.iterdir()) == [".make.lock", "checksums.json", "cifar-10-batches-py"]


def test_a_temp_file_still_being_written_is_kept(tmp_path):
    """Unlocked, ``remove_stale_temps`` removes a temp only when its writer is gone: a live
    writer's is kept (a concurrent run), a killed one's goes, and one of another host (a shared
    folder) goes once untouched for STALE_TEMP_AGE_S."""
    code = ("import sys; from hvd_cifar.core.files import atomic_write\n"
            "atomic_write(sys.argv[1], lambda f: (f.write(b'x'), f.flush(), sys.stdin.read()))")
    writer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "live.json")], cwd=ROOT,
                              stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not [p for p in tmp_path.iterdir() if p.name.startswith(".live.json.")] and time.monotonic() < deadline:
            time.sleep(0.1)
        dead = killed_mid_write(tmp_path / "dead.json")
        other_host = tmp_path / ".cache.json.12345@some-other-host.abcd1234.tmp"
        other_host.write_bytes(b"{")
        old = tmp_path / ".old.json.12345@some-other-host.wxyz5678.tmp"
        old.write_bytes(b"{")
        long_ago = time.time() - files.STALE_TEMP_AGE_S - 60
        os.utime(old, (long_ago, long_ago))
        assert sorted(files.remove_stale_temps(str(tmp_path))) == sorted([dead.name, old.name])
        assert other_host.exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".live.json.")]
    finally:
        writer.communicate(b"", timeout=60)
    assert writer.returncode == 0 and (tmp_path / "live.json").read_bytes() == b"x"


# ----------------------------------------------------------------------------- 2-rank jobs
SHAPES_FLAGS = ("--dataset", "shapes", "--shapes-train", str(SIZES[0]), "--shapes-test", str(SIZES[1]),
                "--data-dir", "{w}/data")
CASES = [
    drill.BadInput("generated data set with pixel bytes flipped", drill.mpirun2_tiny(*SHAPES_FLAGS),
                   f"hvd_cifar: error: dataset: shapes in {{w}}/data/{FOLDER} is corrupt ({{w}}/data/{FOLDER}/"
                   "cifar-10-batches-py/data_batch_3 is not the file written: its checksum differs",
                   lambda w: flip_pixels(made(w), "data_batch_3")),
    drill.BadInput("generated data set with a label outside the classes", drill.mpirun2_tiny(*SHAPES_FLAGS),
                   "test_batch: image 7 has label 99, not one of the 10 classes (0-9)",
                   lambda w: mislabel(made(w), "test_batch", 7, 99)),
    drill.BadInput("generated data set larger than the machine's memory",
                   drill.mpirun2_tiny("--dataset", "shapes", "--shapes-train", "100000000", "--data-dir", "{w}/data"),
                   "hvd_cifar: error: dataset: shapes: 100,000,000 training and 10,000 test images need "),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_two_ranks_end_with_one_line(tmp_path, case):
    if "{w}" in case.expect:
        case = drill.BadInput(case.name, case.argv, case.expect.format(w=tmp_path), case.prepare)
    result = drill.run_bad_input(case, tmp_path, bound_s=drill.SUITE_SLACK * drill.BAD_INPUT_BOUND_S)
    assert result["ok"], f"{result['why']}\n{result['stderr']}"
    assert result["exit"] == 2
    if "memory" in case.name:  # refused before anything was made, counting both ranks
        assert "on each of the 2 ranks on this host" in result["line"], result["line"]
        assert not (tmp_path / "data").exists()
