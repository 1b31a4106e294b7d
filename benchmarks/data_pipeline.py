"""Data pipeline throughput: hvd_cifar's in-memory tensor loader vs a torchvision DataLoader
with per-sample PIL transforms, same images, same augmentation, same batch, one process.

    .venv/bin/python benchmarks/data_pipeline.py [--images 10000] [--batch-size 128] [--workers 2] [--threads 1]

Prints images/s for each and the ratio (target: tensor loader >= 20x the DataLoader).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from hvd_cifar import data
from hvd_cifar.tables import Column, markdown_table, num


class PILDataset(Dataset):
    """What a classic CIFAR pipeline does per sample: uint8 HWC array -> PIL -> transforms."""

    def __init__(self, images_hwc: np.ndarray, labels: np.ndarray, transform):
        self.images, self.labels, self.transform = images_hwc, labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def images_per_s(batches, epochs: int) -> float:
    count, start = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in batches():
            count += len(x)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the tensor loader (a training rank on a CPU host usually has 1)")
    args = parser.parse_args()
    # Batched ops on 32x32 images are too small to gain from threads; more threads than free
    # cores make OpenMP spin and can slow them down tenfold.
    torch.set_num_threads(args.threads)

    ds = data.load("synthetic", "", synthetic_size=args.images, seed=0)
    mean, std = ds.channel_stats()
    loader = data.ShardedLoader(ds.train_images, ds.train_labels, args.batch_size, 0, 1, 0, mean, std,
                                augment=True, hflip=True)
    tensor_rate = images_per_s(lambda: loader.epoch(0), args.epochs)

    transform = T.Compose([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(),
                           T.ToTensor(), T.Normalize(mean.tolist(), std.tolist())])
    pil = PILDataset(ds.train_images.permute(0, 2, 3, 1).numpy(), ds.train_labels.numpy(), transform)
    dl = DataLoader(pil, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                    drop_last=True, persistent_workers=args.workers > 0)
    pil_rate = images_per_s(lambda: dl, args.epochs)

    rows = [{"pipeline": f"hvd_cifar tensor loader (pad-4 crop + flip + normalise, batched), {args.threads} thread(s)",
             "images_per_s": tensor_rate},
            {"pipeline": f"torchvision DataLoader, PIL transforms, {args.workers} workers", "images_per_s": pil_rate}]
    print(markdown_table([Column("pipeline", "pipeline"), num("images/s", "images_per_s", ",.0f")], rows), end="")
    print(f"ratio tensor/DataLoader: {tensor_rate / pil_rate:.1f}x  "
          f"({args.images} images x {args.epochs} epochs, batch {args.batch_size})")


if __name__ == "__main__":
    main()
