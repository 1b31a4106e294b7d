"""Data sets held whole in memory as uint8 tensors, batched augmentation, per-rank shards.

The hot path has no DataLoader and no per-sample PIL work: a batch is an index slice of one
seeded permutation, augmented (pad-4 random crop, horizontal flip where it makes sense) and
normalised with a handful of tensor operations on the training device.
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import importlib.util
import os
import zlib
from dataclasses import dataclass

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from hvd_cifar.core.files import remove_stale_temps
from hvd_cifar.workload import cifar_format, shapes

TORCHVISION_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "svhn": ""}
SVHN_FILES = ("train_32x32.mat", "test_32x32.mat")
DIGITS_TEST_SIZE = 360      # images held out from scikit-learn's 1,797 digits
DIGITS_SPLIT_SEED = 20240   # fixed, so every run and rank sees the same split
IMAGE_BYTES = 3 * 32 * 32   # one uint8 image in memory
LABEL_BYTES = 8             # one int64 label


class DataError(RuntimeError):
    """A data set that is missing, corrupt or too small; the message is one line saying what to do."""


@dataclass
class DataSet:
    name: str
    train_images: torch.Tensor   # (N, 3, 32, 32) uint8
    train_labels: torch.Tensor   # (N,) int64
    test_images: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    hflip: bool                  # mirror images make sense (objects yes, digits no)

    def to(self, device: torch.device) -> "DataSet":
        for key in ("train_images", "train_labels", "test_images", "test_labels"):
            setattr(self, key, getattr(self, key).to(device))
        return self

    def channel_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std of the training images, in [0, 1] units."""
        x = self.train_images.float().div_(255)
        return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3))


# ----------------------------------------------------------------------------- loading
def download(name: str, data_dir: str) -> None:
    """Fetch a torchvision data set into ``data_dir``. Ranks that call it together take turns
    (a lock file in ``data_dir``): the first downloads, the others find the files in place."""
    if name in TORCHVISION_FOLDERS:
        try:
            with taking_turns(data_dir, ".download.lock"):
                _torchvision_sets(name, data_dir, download=True)
        except (OSError, RuntimeError) as exc:  # no network, disk full, bad archive
            raise DataError(f"download: fetching {name} into {data_dir} failed ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); check the network or copy "
                            f"the data set there") from None


@contextlib.contextmanager
def taking_turns(folder: str, lock_name: str):
    """Processes on this host that enter together take turns (an exclusive lock on a file in
    ``folder``, which is made if missing): the first does the work, the others find it done."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, lock_name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def load(name: str, data_dir: str, synthetic_size: int = 2048, seed: int = 0,
         shapes_sizes: tuple[int, int, int] = (50_000, 10_000, 0), ranks_here: int = 1) -> DataSet:
    """The data set ``name``; ``shapes_sizes``: the generated set's (train, test, seed);
    ``ranks_here``: the ranks on this host, each of which holds the whole set."""
    if name == "digits":
        return _digits()
    if name == "synthetic":
        check_memory(name, synthetic_size, max(synthetic_size // 4, 1), ranks_here, "--synthetic-size")
        return _synthetic(synthetic_size, seed)
    if name == "shapes":
        check_memory(name, *shapes_sizes[:2], ranks_here, "--shapes-train or --shapes-test")
        return _shapes(data_dir, *shapes_sizes)
    if name in TORCHVISION_FOLDERS:
        return _torchvision(name, data_dir)
    raise DataError(f"dataset: unknown data set {name!r}")


def memory_needed(n_train: int, n_test: int) -> int:
    """Bytes one rank holds at its peak for a set of these sizes: the set (uint8 images, int64
    labels) and, beside it, the larger of the batch files' arrays while they are joined (the set
    once more) and the float32 copy of the training images that ``channel_stats`` measures."""
    held = (n_train + n_test) * (IMAGE_BYTES + LABEL_BYTES)
    return max(2 * held, held + 4 * IMAGE_BYTES * n_train)


def check_memory(name: str, n_train: int, n_test: int, ranks_here: int, flags: str) -> None:
    """Refuse, before anything is allocated, a set the ranks on this host cannot hold together."""
    each, ranks_here = memory_needed(n_train, n_test), max(ranks_here, 1)
    available = psutil.virtual_memory().available
    if each * ranks_here > available:
        per_rank = f" ({each / 2**30:.1f} GiB on each of the {ranks_here} ranks on this host)" if ranks_here > 1 else ""
        raise DataError(f"dataset: {name}: {n_train:,} training and {n_test:,} test images need "
                        f"{each * ranks_here / 2**30:.1f} GiB of memory{per_rank}, this machine has "
                        f"{available / 2**30:.1f} GiB available; give a smaller {flags}")


def _shapes(data_dir: str, n_train: int, n_test: int, seed: int) -> DataSet:
    """The generated data set (workload/shapes.py), made once into data_dir in CIFAR-10's format
    with its checksums (ranks that load it together take turns on a lock: the first makes it),
    then read by the reader real CIFAR-10 goes through, each file checked against its checksum."""
    root = os.path.join(data_dir, f"shapes-seed{seed}-{n_train}-{n_test}")
    about = {"dataset": "shapes", "seed": seed, "train": n_train, "test": n_test, "classes": list(shapes.CLASSES)}
    try:
        with taking_turns(root, ".make.lock"):
            # Every writer here holds the lock, so a temp file found is a killed run's write.
            for folder in (root, os.path.join(root, cifar_format.FORMATS["cifar10"][0])):
                remove_stale_temps(folder, locked=True)
            if not os.path.exists(os.path.join(root, cifar_format.MANIFEST)):  # written last: the set is whole
                cifar_format.write(root, shapes.generate(n_train, seed, "train"), shapes.generate(n_test, seed, "test"),
                                   list(shapes.CLASSES), about)
    except OSError as exc:
        raise DataError(f"dataset: shapes: cannot make it in {root} ({exc.strerror}); give a --data-dir "
                        f"this process can write to") from None
    try:
        written = cifar_format.read_manifest(root, about)
    except cifar_format.FormatError as exc:
        raise _corrupt("shapes", root, exc) from None
    return _cifar_files("shapes", "cifar10", root, hflip=True, written=written)


def _corrupt(name: str, root: str, exc: Exception) -> DataError:
    return DataError(f"dataset: {name} in {root} is corrupt ({exc}); delete it and "
                     + ("run again to make it anew" if name == "shapes" else "run with --download true"))


def _cifar_files(name: str, layout: str, root: str, hflip: bool, written=None) -> DataSet:
    """A data set in CIFAR's python format under ``root`` (cifar_format.FORMATS[layout]), each file
    checked; ``written``: the checksums its files were written with."""
    try:
        train_x, train_y, test_x, test_y, classes = cifar_format.read(layout, root, written)
    except cifar_format.FormatError as exc:
        raise _corrupt(name, root, exc) from None
    return DataSet(name, torch.from_numpy(train_x), torch.from_numpy(train_y), torch.from_numpy(test_x),
                   torch.from_numpy(test_y), len(classes), hflip=hflip)


def _torchvision_sets(name: str, data_dir: str, download: bool):
    import torchvision.datasets as tvd  # imported here: torchvision is slow to import

    os.makedirs(data_dir, exist_ok=True) if download else None
    if name == "svhn":
        return (tvd.SVHN(data_dir, split="train", download=download),
                tvd.SVHN(data_dir, split="test", download=download))
    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    return cls(data_dir, train=True, download=download), cls(data_dir, train=False, download=download)


def _torchvision(name: str, data_dir: str) -> DataSet:
    folder = os.path.join(data_dir, TORCHVISION_FOLDERS[name])
    present = (all(os.path.exists(os.path.join(data_dir, f)) for f in SVHN_FILES)
               if name == "svhn" else os.path.isdir(folder))
    if not present:
        where = data_dir if name == "svhn" else folder
        raise DataError(f"dataset: {name} not found at {where}; run once with --download true "
                        f"(needs internet) or copy the data set there")
    if name in cifar_format.FORMATS:
        _check_checksums(name, data_dir)
        return _cifar_files(name, name, data_dir, hflip=True)
    try:
        train, test = _torchvision_sets(name, data_dir, download=False)
    except RuntimeError as exc:  # torchvision's checksum test failed
        raise DataError(f"dataset: {name} in {data_dir} is corrupt ({exc}); delete it and run with "
                        f"--download true") from None
    except Exception as exc:  # unreadable despite a good checksum
        raise DataError(f"dataset: {name} in {data_dir} could not be read "
                        f"({type(exc).__name__}: {exc}); delete it and download again") from None

    return DataSet(name, *_svhn_split(train, data_dir, SVHN_FILES[0]), *_svhn_split(test, data_dir, SVHN_FILES[1]),
                   10, hflip=False)


def _svhn_split(ds, data_dir: str, file: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One split as torchvision read it (images NCHW uint8, labels 0-9), checked all the same."""
    x = torch.from_numpy(np.ascontiguousarray(ds.data))
    y = torch.as_tensor(ds.labels, dtype=torch.int64)
    if (x.dtype != torch.uint8 or tuple(x.shape[1:]) != (3, 32, 32) or len(y) != len(x)
            or (len(y) and (int(y.min()) < 0 or int(y.max()) > 9))):
        raise DataError(f"dataset: svhn in {data_dir} is corrupt ({file} holds images of {x.dtype} {tuple(x.shape)} "
                        f"and {len(y)} labels, not N x 3 x 32 x 32 uint8 and N labels 0-9); delete it and run "
                        f"with --download true")
    return x, y


def _check_checksums(name: str, data_dir: str) -> None:
    """Real CIFAR's files against the md5 sums torchvision knows for them."""
    import torchvision.datasets as tvd  # imported here: torchvision is slow to import
    from torchvision.datasets.utils import check_integrity

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    folder = os.path.join(data_dir, TORCHVISION_FOLDERS[name])
    for file, md5 in [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]:
        if not check_integrity(os.path.join(folder, file), md5):
            raise DataError(f"dataset: {name} in {data_dir} is corrupt ({file} is missing or its checksum "
                            f"differs); delete it and run with --download true")


def _digits() -> DataSet:
    """scikit-learn's 1,797 8x8 handwritten digits (shipped with the package, so offline),
    upsampled to 32x32 RGB and split once with a fixed seed."""
    images, target = digits_arrays()
    x = torch.from_numpy(images).float().unsqueeze(1) / 16.0                    # (N,1,8,8) in [0,1]
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    y = torch.from_numpy(target).long()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
    return DataSet("digits", x[train], y[train], x[test], y[test], 10, hflip=False)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits' images (N, 8, 8; values 0-16) and labels, read from the file scikit-learn
    ships (one CSV line per image: 64 pixels, then the label), as its load_digits reads it, but
    without importing scikit-learn: that import costs about a second of CPU on every rank."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.isfile(path):
        raise DataError("dataset: digits: scikit-learn's digits file (sklearn/datasets/data/digits.csv.gz) "
                        "is missing: install scikit-learn (scripts/install.sh does)")
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", ndmin=2)
    except (OSError, EOFError, ValueError, zlib.error) as exc:  # not gzip, cut short, not numbers
        raise DataError(f"dataset: digits: {path} is corrupt ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}); reinstall scikit-learn") from None
    pixels, labels = table[:, :-1], table[:, -1]
    wrong = ("a row is not 64 pixels and a label" if table.shape[1] != 65 else
             f"{len(table)} images, not more than the {DIGITS_TEST_SIZE} held out" if len(table) <= DIGITS_TEST_SIZE else
             "a pixel is not a whole number 0-16" if not _whole_in(pixels, 16) else
             "a label is not a whole number 0-9" if not _whole_in(labels, 9) else "")
    if wrong:
        raise DataError(f"dataset: digits: {path} is corrupt ({wrong}); reinstall scikit-learn")
    return pixels.reshape(-1, 8, 8), labels.astype(int)


def _whole_in(values: np.ndarray, top: int) -> bool:
    return bool(np.all((values == np.round(values)) & (values >= 0) & (values <= top)))


def _synthetic(size: int, seed: int) -> DataSet:
    """Random images and labels: a stand-in of CIFAR's shape for throughput benchmarks."""
    g = torch.Generator().manual_seed(seed)
    test_size = max(size // 4, 1)
    x = torch.randint(0, 256, (size + test_size, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (size + test_size,), generator=g)
    return DataSet("synthetic", x[:size], y[:size], x[size:], y[size:], 10, hflip=True)


# ----------------------------------------------------------------------------- batching
class ShardedLoader:
    """Each epoch: one permutation of all N images, seeded by (seed, epoch) and identical on
    every rank; rank r takes ``perm[r::world]``. All ranks run the same number of steps (a
    collective per step needs that), and the last batch takes the remainder, so together the
    ranks see every image exactly once per epoch (unless ``max_steps`` cuts the epoch short).

    Step s of the epoch covers positions [s*b*world, (s+1)*b*world) of the permutation, so an
    epoch can also be continued from a position, with another world size (elastic training:
    ``reshard`` after the ranks change, then ``epoch(e, start=position, steps_done=s)``): the
    images not yet consumed are split over the new ranks, and the epoch still sees each once."""

    def __init__(self, images, labels, batch_size, rank, world_size, seed, mean, std,
                 augment=False, hflip=False, max_steps=0, channels_last=False):
        self.images, self.labels = images, labels
        self.batch_size, self.seed, self.max_steps = batch_size, seed, max_steps
        self.augment, self.hflip, self.channels_last = augment, hflip, channels_last
        # x/255 then (x - mean)/std folded into one multiply-add
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1).to(images.device)
        self.shift = (-mean / std).view(1, 3, 1, 1).to(images.device)
        self.reshard(rank, world_size)

    def reshard(self, rank: int, world_size: int) -> None:
        shard = len(self.images) // world_size
        if shard < self.batch_size:
            raise DataError(f"batch_size: {self.batch_size} x {world_size} ranks is larger than the "
                            f"{len(self.images)} training images")
        self.rank, self.world_size = rank, world_size
        # Whole batches only; the last one also takes the shard's remainder (< batch_size
        # images), so no image is skipped and no batch is too small for BatchNorm.
        self.full_steps = shard // self.batch_size
        self.steps_per_epoch = min(self.full_steps, self.max_steps) if self.max_steps else self.full_steps

    def __len__(self) -> int:
        return self.steps_per_epoch

    def steps_left(self, start: int = 0, steps_done: int = 0) -> int:
        """Steps this epoch still has when ``start`` images were consumed in ``steps_done`` steps."""
        full = (len(self.images) - start) // self.world_size // self.batch_size
        return max(min(full, self.max_steps - steps_done), 0) if self.max_steps else full

    def step_images(self, step_in_pass: int, start: int = 0) -> int:
        """Images all ranks together consume at a step: b x world, the last one the whole rest."""
        full = (len(self.images) - start) // self.world_size // self.batch_size
        if step_in_pass == full - 1:
            return len(self.images) - start - step_in_pass * self.batch_size * self.world_size
        return self.batch_size * self.world_size

    def epoch(self, epoch: int, start: int = 0, steps_done: int = 0):
        """Yield (images, labels) for this rank's shard of ``epoch``, from position ``start``
        after ``steps_done`` steps. A pass continued there (after a preemption, same world size)
        yields exactly the batches, augmentation included, that an unbroken pass yields from there."""
        perm = torch.randperm(len(self.images), generator=torch.Generator().manual_seed(
            self.seed * 1_000_003 + epoch)).to(self.images.device)
        shard = perm[start:][self.rank::self.world_size]
        gen = torch.Generator(device=self.images.device)
        full = (len(self.images) - start) // self.world_size // self.batch_size
        b = self.batch_size
        for step in range(self.steps_left(start, steps_done)):
            last = step == full - 1
            idx = shard[step * b:] if last else shard[step * b:(step + 1) * b]
            images = self.images.index_select(0, idx)  # ~10x faster than images[idx] for uint8 on CPU
            if self.augment:  # on the uint8 images: a quarter of the memory traffic of floats
                # Seeded per step of the epoch, not per pass: where a pass began does not matter.
                gen.manual_seed((self.seed * 1_000_003 + epoch) * 1009 + self.rank + 7919 * (steps_done + step))
                images = crop_flip(images, 4, self.hflip, gen)
            yield self.normalize(images), self.labels.index_select(0, idx)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images -> float, zero mean and unit variance per channel."""
        x = x.float().mul_(self.scale).add_(self.shift)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def crop_flip(x: torch.Tensor, pad: int, flip: bool, gen: torch.Generator | None) -> torch.Tensor:
    """A random HxW window of each image reflect-padded by ``pad``, mirrored left-right with
    probability 1/2 when ``flip``: for the whole batch in one gather. Each output pixel's source
    pixel is computed (shift, reflection at the border, mirror) instead of building padded copies."""
    n, c, h, w = x.shape
    dev = x.device
    dy = torch.randint(-pad, pad + 1, (n, 1), generator=gen, device=dev)
    dx = torch.randint(-pad, pad + 1, (n, 1), generator=gen, device=dev)
    cols = torch.arange(w, device=dev).expand(n, w)
    if flip:
        mirrored = torch.rand(n, 1, generator=gen, device=dev) < 0.5
        cols = torch.where(mirrored, w - 1 - cols, cols)
    rows = _reflect(torch.arange(h, device=dev) + dy, h)          # (n, h) source rows
    cols = _reflect(cols + dx, w)                                  # (n, w) source columns
    index = (rows.unsqueeze(2) * w + cols.unsqueeze(1)).view(n, 1, h * w).expand(-1, c, -1)
    return x.flatten(2).gather(2, index).view(n, c, h, w)


def _reflect(i: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror indices that fall off either edge back inside, like reflect padding (edge not repeated)."""
    return (size - 1) - ((size - 1) - i.abs()).abs()


def eval_batches(images, labels, batch_size, rank, world_size, normalize):
    """This rank's strided shard of the test set, unaugmented; shards may differ by one image."""
    idx = torch.arange(rank, len(images), world_size, device=images.device)
    for start in range(0, len(idx), batch_size):
        part = idx[start:start + batch_size]
        yield normalize(images.index_select(0, part)), labels.index_select(0, part)
