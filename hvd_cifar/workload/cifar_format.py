"""CIFAR-10's and CIFAR-100's own python format, read (real data sets, after torchvision's download)
and written (the generated ``shapes`` data set), so both go through one reader.

A folder (``cifar-10-batches-py``) holds pickled dicts: ``data_batch_1`` .. ``data_batch_5`` and
``test_batch`` with ``data`` (N x 3072 uint8, each row 1024 red, 1024 green, 1024 blue values)
and ``labels``; ``batches.meta`` with ``label_names``. CIFAR-100 (``cifar-100-python``) holds
``train`` and ``test`` with ``fine_labels``, and ``meta``. The reader unpickles with an allow-list
(a numpy array, its dtype, plain containers): a file that asks for anything else is refused, never
run. Each file is checked before use: a batch holds N x 3072 uint8 values and N whole-number
labels, each one of the meta file's classes. A set written here (``shapes``) also carries
``checksums.json`` beside the folder, written after the batches: each file's sha256 and size,
checked on every read. A missing, truncated, altered or malformed file is a ``FormatError``
naming the file and what is wrong.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re

import numpy as np

from hvd_cifar.core.files import atomic_write, write_json

FORMATS = {  # folder, training files, test files, labels key, meta file
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels",
                "batches.meta"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", "meta"),
}
MANIFEST = "checksums.json"  # beside the folder of a set written here: each file's sha256 and size
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


def read_batch(path: str, labels_key: str, num_classes: int = 0,
               written: tuple[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: images (N, 3, 32, 32) uint8 and labels (N,) int64, checked: N rows of 3072
    uint8 values, N whole-number labels, each one of ``num_classes`` classes (0 or less: not
    checked); ``written``: the (sha256, bytes) it was written with, which it must still have."""
    raw = _read_bytes(path, written)
    try:
        batch = _DataOnly(io.BytesIO(raw), encoding="latin1").load()
        data, labels = batch["data"], batch[labels_key]
    except (EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError, IndexError,
            AttributeError, ImportError, OverflowError) as exc:
        raise FormatError(f"{path} is truncated or not a CIFAR batch ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise FormatError(f"{path} holds data of {_described(data)}; a CIFAR batch holds N x 3072 uint8 values")
    return data.reshape(-1, 3, 32, 32), _labels(path, labels, labels_key, len(data), num_classes)


def _labels(path: str, labels, key: str, n: int, num_classes: int) -> np.ndarray:
    """The batch's labels as int64, each checked to be a whole number of the classes."""
    try:
        y = np.asarray(labels) if isinstance(labels, (list, tuple, np.ndarray)) else None
    except ValueError:  # a ragged list
        y = None
    if y is None or y.ndim != 1 or (len(y) and y.dtype.kind not in "iu"):
        raise FormatError(f"{path} holds {key} of {_described(labels if y is None else y)}; a CIFAR batch "
                          f"holds a list of whole numbers")
    if len(y) != n:
        raise FormatError(f"{path} holds {n} images and {len(y)} {key}; a CIFAR batch holds one label per image")
    outside = np.flatnonzero((y < 0) | (y >= num_classes)) if num_classes > 0 and len(y) else []
    if len(outside):
        more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
        raise FormatError(f"{path}: image {outside[0]} has label {int(y[outside[0]])}{more}, not one of the "
                          f"{num_classes} classes (0-{num_classes - 1})")
    return y.astype(np.int64)


def _described(value) -> str:
    if isinstance(value, np.ndarray):
        return f"dtype {value.dtype} and shape {value.shape}"
    return f"type {type(value).__name__}"


def _read_bytes(path: str, written: tuple[str, int] | None) -> bytes:
    """The file's bytes, checked against the (sha256, bytes) it was written with when given."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FormatError(f"{path} is missing") from None
    except OSError as exc:
        raise FormatError(f"{path} cannot be read ({exc.strerror})") from None
    if written and len(raw) < written[1]:
        raise FormatError(f"{path} is truncated ({len(raw):,} of the {written[1]:,} bytes written)")
    if written and (len(raw) != written[1] or hashlib.sha256(raw).hexdigest() != written[0]):
        raise FormatError(f"{path} is not the file written: its checksum differs from the one in {MANIFEST}")
    return raw


def read_meta(path: str, written: tuple[str, int] | None = None) -> list[str]:
    """The class names of a meta file (``label_names``, CIFAR-100's ``fine_label_names``)."""
    raw = _read_bytes(path, written)
    try:
        info = _DataOnly(io.BytesIO(raw), encoding="latin1").load()
        names = info.get("label_names") or info.get("fine_label_names")
    except (EOFError, pickle.UnpicklingError, AttributeError, TypeError, ValueError, IndexError,
            ImportError, OverflowError) as exc:
        raise FormatError(f"{path} is truncated or not a CIFAR meta file ({type(exc).__name__})") from None
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names):
        raise FormatError(f"{path} holds no list of class names (label_names: {_described(names)})")
    return names


def read(name: str, root: str, written: dict[str, tuple[str, int]] | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(train images, train labels, test images, test labels, class names) of the data set
    ``name``'s folder under ``root``, each file checked; ``written``: file -> (sha256, bytes) it
    was written with (``read_manifest``), which each file must still have."""
    folder, train_files, test_files, labels_key, meta = FORMATS[name]
    path, written = os.path.join(root, folder), written or {}
    names = read_meta(os.path.join(path, meta), written.get(meta))
    train = [read_batch(os.path.join(path, f), labels_key, len(names), written.get(f)) for f in train_files]
    test = [read_batch(os.path.join(path, f), labels_key, len(names), written.get(f)) for f in test_files]
    return (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]),
            np.concatenate([x for x, _ in test]), np.concatenate([y for _, y in test]), names)


def write(root: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
          names: list[str], about: dict) -> None:
    """Both splits as CIFAR-10's files under ``root``/cifar-10-batches-py (the training images
    over five batches), each written whole or not at all, then ``root``/checksums.json: each
    file's sha256 and size, and ``about`` (what the set is), written last: the set is whole."""
    folder = os.path.join(root, FORMATS["cifar10"][0])
    os.makedirs(folder, exist_ok=True)
    (x, y), parts = train, np.array_split(np.arange(len(train[1])), 5)
    batches = [(f"data_batch_{i + 1}", x[idx], y[idx]) for i, idx in enumerate(parts)]
    files = {}
    for file, images, labels in [*batches, ("test_batch", *test)]:
        batch = {"batch_label": file, "labels": [int(v) for v in labels],
                 "data": np.ascontiguousarray(images.reshape(len(images), -1), dtype=np.uint8),
                 "filenames": [f"{file}_{i:05d}.png" for i in range(len(labels))]}
        files[file] = _write_pickled(os.path.join(folder, file), batch)
    meta = {"label_names": list(names), "num_cases_per_batch": len(parts[0]), "num_vis": 3 * 32 * 32}
    files["batches.meta"] = _write_pickled(os.path.join(folder, "batches.meta"), meta)
    manifest = {"about": about, "files": {f: {"sha256": digest, "bytes": size} for f, (digest, size) in files.items()}}
    write_json(os.path.join(root, MANIFEST), manifest)


def _write_pickled(path: str, obj) -> tuple[str, int]:
    """``obj`` pickled into ``path``; the (sha256, bytes) of what was written."""
    raw = pickle.dumps(obj, protocol=4)
    atomic_write(path, lambda f: f.write(raw))
    return hashlib.sha256(raw).hexdigest(), len(raw)


def read_manifest(root: str, about: dict) -> dict[str, tuple[str, int]]:
    """file -> (sha256, bytes) from ``root``/checksums.json, which must describe ``about``."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode())
        files = {name: (entry["sha256"], entry["bytes"]) for name, entry in manifest["files"].items()}
        described = manifest["about"]
    except FileNotFoundError:
        raise FormatError(f"{path} is missing") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError(f"{path} is truncated or not a manifest of checksums ({type(exc).__name__})") from None
    _, train_files, test_files, _, meta = FORMATS["cifar10"]
    wanted = [*train_files, *test_files, meta]
    if sorted(files) != sorted(wanted) or not all(
            isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) and type(n) is int and n > 0 for d, n in files.values()):
        raise FormatError(f"{path} does not hold a sha256 and a size for each of {', '.join(wanted)}")
    if described != about:
        raise FormatError(f"{path} describes {described}, not {about}")
    return files
