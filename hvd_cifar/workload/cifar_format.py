"""CIFAR-10's and CIFAR-100's own python format, read (real data sets, after torchvision's download)
and written (the generated ``shapes`` data set), so both go through one reader.

A folder (``cifar-10-batches-py``) holds pickled dicts: ``data_batch_1`` .. ``data_batch_5`` and
``test_batch`` with ``data`` (N x 3072 uint8, each row 1024 red, 1024 green, 1024 blue values)
and ``labels``; ``batches.meta`` with ``label_names``. CIFAR-100 (``cifar-100-python``) holds
``train`` and ``test`` with ``fine_labels``, and ``meta``. The reader unpickles with an allow-list
(a numpy array, its dtype, plain containers): a file that asks for anything else is refused, never
run. A missing, truncated or malformed file is a ``DataError`` naming the file.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from hvd_cifar.core.files import atomic_write

FORMATS = {  # folder, training files, test files, labels key, meta file
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels",
                "batches.meta"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", "meta"),
}
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class FormatError(ValueError):
    """A batch file that is not what the format says; the message names the file."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which a data batch never holds")


def read_batch(path: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: images (N, 3, 32, 32) uint8 and labels (N,) int64."""
    try:
        with open(path, "rb") as f:
            batch = _DataOnly(f, encoding="latin1").load()
        data = np.asarray(batch["data"], dtype=np.uint8)
        labels = np.asarray(batch[labels_key], dtype=np.int64)
    except FileNotFoundError:
        raise FormatError(f"{path} is missing") from None
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError, IndexError,
            AttributeError, ImportError) as exc:
        raise FormatError(f"{path} is truncated or not a CIFAR batch ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise FormatError(f"{path} holds data of shape {data.shape} and {len(labels)} labels; a CIFAR batch "
                          f"holds N x 3072 bytes and N labels")
    return data.reshape(-1, 3, 32, 32), labels


def read(name: str, root: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(train images, train labels, test images, test labels, class names) of the data set
    ``name``'s folder under ``root``."""
    folder, train_files, test_files, labels_key, meta = FORMATS[name]
    path = os.path.join(root, folder)
    train = [read_batch(os.path.join(path, f), labels_key) for f in train_files]
    test = [read_batch(os.path.join(path, f), labels_key) for f in test_files]
    try:
        with open(os.path.join(path, meta), "rb") as f:
            info = _DataOnly(f, encoding="latin1").load()
        names = list(info.get("label_names") or info.get("fine_label_names"))
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError) as exc:
        raise FormatError(f"{os.path.join(path, meta)} is missing or not a CIFAR meta file "
                          f"({type(exc).__name__})") from None
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
            np.concatenate([x for x, _ in test]), np.concatenate([y for _, y in test]), names)


def write(root: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
          names: list[str]) -> str:
    """Both splits as CIFAR-10's files under ``root``/cifar-10-batches-py: the training images
    over five batches, each file written whole or not at all. Returns the folder."""
    folder = os.path.join(root, FORMATS["cifar10"][0])
    os.makedirs(folder, exist_ok=True)
    (x, y), parts = train, np.array_split(np.arange(len(train[1])), 5)
    batches = [(f"data_batch_{i + 1}", x[idx], y[idx]) for i, idx in enumerate(parts)]
    for file, images, labels in [*batches, ("test_batch", *test)]:
        batch = {"batch_label": file, "labels": [int(v) for v in labels],
                 "data": np.ascontiguousarray(images.reshape(len(images), -1), dtype=np.uint8),
                 "filenames": [f"{file}_{i:05d}.png" for i in range(len(labels))]}
        atomic_write(os.path.join(folder, file), lambda f, b=batch: pickle.dump(b, f, protocol=4))
    meta = {"label_names": list(names), "num_cases_per_batch": len(parts[0]), "num_vis": 3 * 32 * 32}
    atomic_write(os.path.join(folder, "batches.meta"), lambda f: pickle.dump(meta, f, protocol=4))
    return folder
