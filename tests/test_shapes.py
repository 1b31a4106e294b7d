"""dataset: shapes, the generated CIFAR-shaped data set (hvd_cifar/workload/shapes.py), and CIFAR's
own file format it is stored in and read back through (hvd_cifar/workload/cifar_format.py), the
reader real CIFAR-10 goes through. Small sizes here; the full size is benchmarks/data_difficulty.py."""
from __future__ import annotations

import hashlib
import json
import pickle

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

from conftest import TINY, read_metrics, run_train
from hvd_cifar.workload import cifar_format, data, shapes
from hvd_cifar.workload.data import DataError


def test_the_same_seed_gives_the_same_bytes_and_every_class_a_tenth():
    a, la = shapes.generate(400, 7, "train")
    b, lb = shapes.generate(400, 7, "train")
    assert a.shape == (400, 3, 32, 32) and a.dtype == np.uint8
    assert a.tobytes() == b.tobytes() and np.array_equal(la, lb)
    assert np.bincount(la, minlength=10).tolist() == [40] * 10
    other, _ = shapes.generate(400, 8, "train")
    assert other.tobytes() != a.tobytes()
    # the test split is its own stream: the same whatever the training size
    t1, _ = shapes.generate(100, 7, "test")
    assert not np.array_equal(t1, a[:100])
    assert shapes.generate(100, 7, "test")[0].tobytes() == t1.tobytes()


def test_a_linear_model_on_the_pixels_stays_near_chance():
    """Ridge regression to one-hot labels on 3,000 images, scored on 1,000 others: measured at
    about 0.11 here (chance 0.10; scikit-learn's logistic regression on 10,000 images: 0.112).
    The bound, 0.20, is 7 binomial standard errors (1.0 point at 0.11 on 1,000 images) above
    that: a generator that put a class at a fixed place or colour would pass it."""
    x, y = shapes.generate(3000, 0, "train")
    xt, yt = shapes.generate(1000, 0, "test")
    features = lambda a: np.c_[a.reshape(len(a), -1).astype(np.float64) / 255 - 0.5, np.ones(len(a))]  # noqa: E731
    f = features(x)
    weights = np.linalg.solve(f.T @ f + 30.0 * np.eye(f.shape[1]), f.T @ np.eye(10)[y])
    accuracy = float((features(xt) @ weights).argmax(1).__eq__(yt).mean())
    assert accuracy < 0.20, f"a linear model reached {accuracy:.3f} on 1,000 test images"


def test_the_cifar_files_round_trip_through_the_loader_real_cifar10_uses(tmp_path, monkeypatch):
    """Written in CIFAR-10's layout, read back by data.load("shapes") and, the same folder taken
    for real CIFAR-10 (its md5 sums pointed at these files), by data.load("cifar10"): the same
    images and labels as generated, in NCHW, with CIFAR's file sizes per image."""
    loaded = data.load("shapes", str(tmp_path), shapes_sizes=(500, 100, 3))
    x, y = shapes.generate(500, 3, "train")
    xt, yt = shapes.generate(100, 3, "test")
    assert torch.equal(loaded.train_images, torch.from_numpy(x)) and torch.equal(loaded.train_labels, torch.from_numpy(y))
    assert torch.equal(loaded.test_images, torch.from_numpy(xt)) and loaded.num_classes == 10
    root = tmp_path / "shapes-seed3-500-100"
    folder = root / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["batches.meta", "test_batch", *[f"data_batch_{i}" for i in range(1, 6)]])
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(tvd.CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                              "md5": md5["batches.meta"]})
    as_cifar = data.load("cifar10", str(root))
    assert torch.equal(as_cifar.train_images, loaded.train_images) and torch.equal(as_cifar.test_labels, loaded.test_labels)
    with open(folder / "data_batch_1", "rb") as f:  # CIFAR's own keys and row layout: R, G, B planes
        batch = pickle.load(f, encoding="latin1")
    assert batch["data"].shape == (100, 3072) and batch["data"][0, 1024 + 1] == x[0, 1, 0, 1]


def test_a_truncated_batch_is_one_line_naming_the_file(tmp_path):
    data.load("shapes", str(tmp_path), shapes_sizes=(200, 50, 0))
    batch = tmp_path / "shapes-seed0-200-50" / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:5000])
    with pytest.raises(DataError) as err:
        data.load("shapes", str(tmp_path), shapes_sizes=(200, 50, 0))
    text = str(err.value)
    assert "\n" not in text and "data_batch_2 is truncated" in text and "delete it" in text


def test_a_batch_that_asks_to_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            import os
            return os.system, ("touch " + str(tmp_path / "ran"),)

    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": Evil(), "labels": [0]}))
    with pytest.raises(cifar_format.FormatError, match="posix.system|os.system"):
        cifar_format.read_batch(str(path), "labels")
    assert not (tmp_path / "ran").exists()


def test_two_ranks_train_on_it_and_a_corrupt_file_is_one_line(tmp_path):
    """A real 2-rank job on a small generated set (made by one rank, read by both, sharded); then
    the same job after a batch file was cut short: exit 2, one line from one rank."""
    flags = ["--config", TINY, "--dataset", "shapes", "--shapes-train", "1000", "--shapes-test", "200",
             "--data-dir", str(tmp_path / "data"), "--log-dir", str(tmp_path / "logs"), "--epochs", "1",
             "--max-steps-per-epoch", "4", "--no-tensorboard"]
    run_train([*flags, "--run-name", "ok"], launcher="mpirun", np=2)
    record = read_metrics(tmp_path / "logs" / "ok")[0]
    assert record["steps"] == 4 and record["world_size"] == 2
    meta = json.loads((tmp_path / "logs" / "ok" / "meta.json").read_text())
    assert meta["world_size"] == 2
    batch = tmp_path / "data" / "shapes-seed0-1000-200" / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(batch.read_bytes()[:1000])
    proc = run_train([*flags, "--run-name", "bad"], launcher="mpirun", np=2, check=False)
    ours = [line for line in proc.stderr.splitlines() if "hvd_cifar:" in line]
    assert proc.returncode == 2 and len(ours) == 1 and "test_batch is truncated" in ours[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
