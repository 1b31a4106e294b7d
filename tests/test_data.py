import hashlib
import pickle

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd

from hvd_cifar.workload import data
from hvd_cifar.workload.data import DataError, ShardedLoader


def write_cifar10(root, n_train=50, n_test=20, seed=0):
    """CIFAR-10's own on-disk format: pickled batches in cifar-10-batches-py/. Returns the
    files' md5 sums so torchvision's integrity check can be pointed at them."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    expected = {}

    def batch(name, n):
        images = rng.integers(0, 256, (n, 3072), dtype=np.uint8)   # rows: R plane, G plane, B plane
        labels = rng.integers(0, 10, n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": images, "labels": labels}, f)
        expected[name] = (images, labels)

    for i in range(1, 6):
        batch(f"data_batch_{i}", n_train // 5)
    batch("test_batch", n_test)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    return expected, md5


@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
    expected, md5 = write_cifar10(tmp_path)
    # The real torchvision loader checks the official md5 sums; point it at our files' sums.
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(tvd.CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                              "md5": md5["batches.meta"]})
    return tmp_path, expected


def test_cifar10_loads_through_torchvision(fake_cifar):
    root, expected = fake_cifar
    ds = data.load("cifar10", str(root))
    assert ds.train_images.shape == (50, 3, 32, 32) and ds.train_images.dtype == torch.uint8
    assert ds.test_images.shape == (20, 3, 32, 32) and ds.num_classes == 10 and ds.hflip
    raw, labels = expected["data_batch_1"]
    # pixel (row 0, col 1) of image 0: channel c lives at c*1024 + 0*32 + 1 in the flat row
    for c in range(3):
        assert ds.train_images[0, c, 0, 1].item() == raw[0, c * 1024 + 1]
    assert ds.train_labels[:10].tolist() == labels


def test_missing_dataset_says_what_to_do(tmp_path):
    with pytest.raises(DataError) as err:
        data.load("cifar10", str(tmp_path))
    assert "not found" in str(err.value) and "--download true" in str(err.value)
    assert "\n" not in str(err.value)


def test_corrupt_dataset_is_reported(fake_cifar):
    root, _ = fake_cifar
    with open(root / "cifar-10-batches-py" / "data_batch_3", "r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    with pytest.raises(DataError, match="corrupt"):
        data.load("cifar10", str(root))


def rewrite(root, name, batch, monkeypatch, cls=tvd.CIFAR10, folder="cifar-10-batches-py"):
    """``name`` written anew as ``batch`` (pickled, as CIFAR's files are), and torchvision's md5
    sums pointed at it: the checksum passes, only what the file holds is wrong."""
    path = root / folder / name
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    md5 = hashlib.md5(path.read_bytes()).hexdigest()
    for key in ("train_list", "test_list"):
        monkeypatch.setattr(cls, key, [[n, md5 if n == name else m] for n, m in getattr(cls, key)])


@pytest.mark.parametrize("batch, expect", [
    ({"labels": [3] * 9 + [99]}, "data_batch_2: image 9 has label 99, not one of the 10 classes (0-9)"),
    ({"labels": [-1] + [3] * 9}, "data_batch_2: image 0 has label -1, not one of the 10 classes (0-9)"),
    ({"labels": [3.0] * 10}, "data_batch_2 holds labels of dtype float64 and shape (10,); a CIFAR batch holds a list "
                             "of whole numbers"),
    ({"labels": [3] * 9}, "data_batch_2 holds 10 images and 9 labels"),
    ({"data": np.zeros((10, 3072), dtype=np.int64)}, "data_batch_2 holds data of dtype int64 and shape (10, 3072); "
                                                      "a CIFAR batch holds N x 3072 uint8 values"),
    ({"data": np.zeros((10, 1024), dtype=np.uint8)}, "data_batch_2 holds data of dtype uint8 and shape (10, 1024)"),
], ids=["label 99", "label -1", "float labels", "labels missing", "int64 pixels", "one channel"])
def test_a_cifar10_batch_is_checked_before_use(fake_cifar, monkeypatch, batch, expect):
    """Files whose md5 sums torchvision accepts (pointed at them), holding what no CIFAR batch
    holds: one line naming the file and what is wrong."""
    root, _ = fake_cifar
    good = {"data": np.zeros((10, 3072), dtype=np.uint8), "labels": [3] * 10}
    rewrite(root, "data_batch_2", {**good, **batch}, monkeypatch)
    with pytest.raises(DataError) as err:
        data.load("cifar10", str(root))
    assert "\n" not in str(err.value) and expect in str(err.value), str(err.value)
    rewrite(root, "data_batch_2", good, monkeypatch)
    assert data.load("cifar10", str(root)).train_labels[10:20].tolist() == [3] * 10


def test_a_cifar100_label_beyond_its_100_classes_is_one_line(tmp_path, monkeypatch):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)], "coarse_label_names": ["x"] * 20}, f)
    monkeypatch.setattr(tvd.CIFAR100, "train_list", [["train", ""]])
    monkeypatch.setattr(tvd.CIFAR100, "test_list", [["test", ""]])
    monkeypatch.setattr(tvd.CIFAR100, "meta", {"filename": "meta", "key": "fine_label_names",
                                               "md5": hashlib.md5((folder / "meta").read_bytes()).hexdigest()})
    images = np.zeros((10, 3072), dtype=np.uint8)
    for name, labels in (("train", [99] * 10), ("test", [99] * 9 + [100])):
        rewrite(tmp_path, name, {"data": images, "fine_labels": labels, "coarse_labels": [0] * 10}, monkeypatch,
                tvd.CIFAR100, "cifar-100-python")
    with pytest.raises(DataError, match=r"cifar-100-python/test: image 9 has label 100, not one of the 100 "
                                        r"classes \(0-99\)"):
        data.load("cifar100", str(tmp_path))


def test_digits_is_a_fixed_split():
    a, b = data.load("digits", ""), data.load("digits", "")
    assert a.train_images.shape == (1437, 3, 32, 32) and a.test_images.shape == (360, 3, 32, 32)
    assert torch.equal(a.test_labels, b.test_labels) and torch.equal(a.train_images, b.train_images)
    assert not a.hflip
    assert a.train_images.max() == 255 and a.train_images.min() == 0


def _loader(ds, rank, world, batch=64, **kw):
    mean, std = ds.channel_stats()
    return ShardedLoader(ds.train_images, ds.train_labels, batch, rank, world, seed=3, mean=mean, std=std, **kw)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_together_see_every_image_once_per_epoch(world):
    ds = data.load("digits", "")
    # tag every image with its index so a batch can be traced back to the images in it
    ds.train_images = torch.zeros(len(ds.train_labels), 3, 32, 32, dtype=torch.uint8)
    ds.train_labels = torch.arange(len(ds.train_labels))
    seen, steps = [], set()
    for rank in range(world):
        loader = _loader(ds, rank, world)
        batches = list(loader.epoch(0))
        steps.add(len(batches))
        seen += [i for _, y in batches for i in y.tolist()]
    assert len(steps) == 1                                   # same number of steps on every rank
    assert sorted(seen) == list(range(len(ds.train_labels)))  # each image exactly once
    other = [i for _, y in _loader(ds, 0, world).epoch(1) for i in y.tolist()]
    assert other != [i for _, y in _loader(ds, 0, world).epoch(0) for i in y.tolist()]


@pytest.mark.parametrize("world", [1, 2])
def test_an_epoch_continued_mid_way_repeats_the_unbroken_pass(world):
    """A pass continued after ``steps_done`` steps, from the images consumed by then (where a
    preempted run resumes), yields the batches of the unbroken pass from there, augmentation
    included."""
    ds = data.load("digits", "")
    steps_done = 5
    for rank in range(world):
        loader = _loader(ds, rank, world, batch=32, augment=True, hflip=True)
        whole = list(loader.epoch(2))
        rest = list(loader.epoch(2, start=steps_done * 32 * world, steps_done=steps_done))
        assert len(rest) == len(whole) - steps_done > 0
        for (x, y), (x_rest, y_rest) in zip(whole[steps_done:], rest):
            assert torch.equal(y, y_rest) and torch.equal(x, x_rest)


@pytest.mark.parametrize("flip", [False, True])
def test_augmentation_is_a_crop_of_the_reflect_padded_image(flip):
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = data.crop_flip(x, 4, flip, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == x.shape
    padded = torch.nn.functional.pad(x.float(), (4, 4, 4, 4), mode="reflect").to(torch.uint8)
    shifts, mirrored = set(), 0
    for i in range(len(x)):
        windows = {(dy, dx): padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)}
        plain = [k for k, win in windows.items() if torch.equal(out[i], win)]
        flipped = [k for k, win in windows.items() if torch.equal(out[i], win.flip(2))]
        assert plain or (flip and flipped), i
        shifts.update(plain or flipped)
        mirrored += bool(flipped) and not plain
    assert len(shifts) > 20                       # the windows vary
    assert (mirrored > 10) == flip                # about half are mirrored when flipping


def test_normalised_batches_have_unit_scale():
    ds = data.load("digits", "")
    x, y = next(_loader(ds, 0, 1, batch=512, augment=True).epoch(0))
    assert x.dtype == torch.float32 and x.shape == (512, 3, 32, 32)
    assert abs(x.mean().item()) < 0.2 and 0.8 < x.std().item() < 1.2


def test_batch_larger_than_the_data_set_is_an_error():
    ds = data.load("digits", "")
    with pytest.raises(DataError, match="larger than the 1437 training images"):
        _loader(ds, 0, 2, batch=1000)


def test_digits_are_scikit_learns_without_importing_it():
    """data.digits_arrays reads scikit-learn's digits file itself: the same images and labels as
    sklearn.datasets.load_digits (that a trainer never imports scikit-learn: test_startup.py)."""
    from sklearn.datasets import load_digits
    images, labels = data.digits_arrays()
    reference = load_digits()
    assert images.dtype == reference.images.dtype and np.array_equal(images, reference.images)
    assert labels.dtype == reference.target.dtype and np.array_equal(labels, reference.target)
